"""One interface for every kind of table: :class:`FeatureTable`.

hmgstore has four kinds of table: :class:`~hmgstore.HybridTensor` (one GPU
and host memory), :class:`~hmgstore.ShardedTensor` (several GPUs of one
process), :class:`hmgstore.distributed.DistributedTensor` (one process per
GPU of a node) and :class:`hmgstore.distributed.ClusterTensor` (a graph
partitioned over machines). Each answers the same questions, so an adapter
holding "a table" needs no branch on its kind to read it: its shape, dtype
and row shape, the device its rows land on, ``gather`` (and ``table[ids]``),
and ``close``. What differs is only how several tables are read together,
and each kind says that itself through ``gather_batch``: HybridTensors in one
launch (:func:`hmgstore.gather_many`), ClusterTensors in one exchange among
machines (:func:`hmgstore.distributed.gather_many`), the other kinds one by
one (:func:`gather_each`). An adapter groups a batch's requests by kind and
hands each group to its kind's ``gather_batch``.
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
    ``gather_batch(requests, outs=None, stream=None)`` reads ``[(table, ids)]``
    pairs whose tables are all of this kind, together, and returns
    ``[table.gather(ids) for table, ids in requests]``; ``outs`` (a destination
    or None per request) and ``stream`` are used where the kind gathers into
    given buffers on a given stream (a ClusterTensor's exchange returns new
    tensors).
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

    def gather_batch(self, requests, /, *, outs=None, stream=None) -> list[torch.Tensor]: ...

    def close(self) -> None: ...


def gather_each(requests, *, outs=None, stream=None) -> list[torch.Tensor]:
    """The ``gather_batch`` of a kind that reads one table at a time: each request through its table's gather.

    Args:
        requests: ``[(table, ids)]`` pairs; each table's ``gather`` takes ``out=`` and ``stream=``.
        outs: a destination or None per request (None: every result allocated).
        stream: the CUDA stream to gather on (None: the current one).

    Returns:
        ``[table.gather(ids) for table, ids in requests]``.
    """
    outs = [None] * len(requests) if outs is None else list(outs)
    return [table.gather(ids, out=out, stream=stream) for (table, ids), out in zip(requests, outs)]
