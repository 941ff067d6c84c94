"""One interface for every kind of table: :class:`FeatureTable`.

hmgstore has four kinds of table: :class:`~hmgstore.HybridTensor` (one GPU
and host memory), :class:`~hmgstore.ShardedTensor` (several GPUs of one
process), :class:`hmgstore.distributed.DistributedTensor` (one process per
GPU of a node) and :class:`hmgstore.distributed.ClusterTensor` (a graph
partitioned over machines). Each answers the same questions, so an adapter
holding "a table" needs no branch on its kind to read it: its shape, dtype
and row shape, the device its rows land on, ``gather`` (and ``table[ids]``),
and ``close``. What differs is only how several tables are read together:
the adapters batch HybridTensors into one launch (:func:`hmgstore.gather_many`)
and ClusterTensors into one exchange among machines
(:func:`hmgstore.distributed.gather_many`), and read other kinds one by one.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class FeatureTable(Protocol):
    """What every table kind answers (``isinstance(t, FeatureTable)`` checks that the members are there).

    ``gather(index)`` returns ``[*index.shape, *row_shape]`` rows of
    ``dtype`` on ``device`` (IndexError for ids out of range); ``table[ids]``
    is ``gather`` of one index; ``close()`` frees what the table holds
    (idempotent), after which gathers raise RuntimeError.
    """

    @property
    def shape(self) -> torch.Size: ...

    @property
    def row_shape(self) -> torch.Size: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def num_rows(self) -> int: ...

    def __len__(self) -> int: ...

    def gather(self, index, /) -> torch.Tensor: ...

    def __getitem__(self, index, /) -> torch.Tensor: ...

    def close(self) -> None: ...
