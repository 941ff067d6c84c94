"""HybridFeatureStore: a PyG ``FeatureStore`` whose tensors are HybridTensors.

Each node attribute of each node type (``group_name`` = node type, ``None``
when homogeneous; ``attr_name`` = ``"x"``, ``"y"``, ...) is one
:class:`hmgstore.HybridTensor` over the caller's host memory. PyG's loaders
ask for a batch's rows with one ``multi_get_tensor`` call; this store
answers it with one :func:`hmgstore.gather_many`, i.e. one kernel launch on
CUDA for every attribute of every node type, and returns tensors on the
store's device.

Which rows stay resident on the GPU is decided when the store is built
(:meth:`HybridFeatureStore.from_sources`): the hottest rows of all node types
that fit in ``gpu_budget`` bytes, by a per-node score (in-degree by default,
see ``hmgstore.plugins.pyg.from_data``).

Two loader settings need care, and are handled here:

- ``num_workers > 0``: PyG runs the gather in the worker processes by default
  (``filter_per_worker=True``). A forked worker cannot use its parent's CUDA
  context, so a CUDA store gathers there on the CPU from the same host
  tables (into shared memory), which is correct but as slow as stock PyG; it
  logs a warning once per worker. Pass ``filter_per_worker=False`` to sample
  in the workers and gather on the GPU in the main process.
- ``pin_memory=True`` and ``PrefetchLoader`` call ``.pin_memory()`` on every
  tensor of a batch, which is an error for CUDA tensors. CUDA results are
  therefore returned as :class:`ResidentTensor`, a plain tensor (no
  ``__torch_function__`` overhead; results of operations on it are ordinary
  tensors) whose ``pin_memory()`` returns itself: there is nothing to pin.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from hmgstore import HybridTensor, gather_many, placement
from hmgstore.tensor import resolve_device

log = logging.getLogger(__name__)

Key = tuple  # (group_name: str | None, attr_name: str)


class ResidentTensor(torch.Tensor):
    """A tensor already on the GPU: ``pin_memory()`` is a no-op returning ``self``.

    Everything else behaves as ``torch.Tensor`` (``__torch_function__`` is
    disabled, so operations return plain tensors at no extra cost).
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    def pin_memory(self, *args, **kwargs):
        return self


def resident(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a :class:`ResidentTensor` when it is on a GPU, unchanged otherwise (no copy)."""
    return tensor.as_subclass(ResidentTensor) if tensor.is_cuda else tensor


@dataclass(frozen=True)
class _Spec:
    """What a table is built from: enough to rebuild it in another process."""

    source: object  # torch CPU tensor, numpy array or memmap
    gpu_rows: torch.Tensor | None
    max_sms: int | None
    sharded: bool = False  # a view of a table sharded over GPUs: only its own process can use it

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)


def _row_bytes(source) -> int:
    itemsize = source.element_size() if isinstance(source, torch.Tensor) else np.dtype(source.dtype).itemsize
    return math.prod(source.shape[1:]) * itemsize


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in shared memory: a worker's result then crosses
    to the main process without the copy DataLoader would otherwise make."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes), 0, shape)


class HybridFeatureStore(FeatureStore):
    """A ``torch_geometric.data.FeatureStore`` of HybridTensors on one device.

    Args:
        device: where gathered rows go (``"cuda"``, ``"cuda:1"``, ``"cpu"``;
            None: the current GPU, or the CPU without one).

    Build one with :meth:`from_sources` (which places hot rows under a GPU
    budget), or empty and ``put_tensor`` whole tables: a host source (torch
    CPU tensor, numpy array, memmap) becomes a table with every row read
    from pinned host memory; a :class:`hmgstore.HybridTensor` on the store's
    device is kept with its own placement. Tables are read-only: putting
    part of a tensor (``index`` other than None) raises ValueError.

    ``get_tensor``/``multi_get_tensor`` take any index HybridTensor takes
    (int32/int64 tensor on any device, slice, int; None: every row; PyG's
    ``TensorAttr`` itself cannot hold a numpy array) and return ``[len(index), *row_shape]`` tensors of the table's dtype
    on ``device``. Unknown attributes raise KeyError, ids out of range
    IndexError (before any memory is read).
    """

    def __init__(self, device=None):
        super().__init__()
        self.device = resolve_device(device)
        self._specs: dict[Key, _Spec] = {}
        self._tables: dict[Key, HybridTensor] | None = {}  # None after unpickling: rebuilt on first use
        self._host: tuple[int, dict[Key, HybridTensor]] | None = None  # (pid, CPU tables) in workers

    @classmethod
    def from_sources(cls, sources: dict, device=None, *, gpu_budget=None, hotness: dict | None = None,
                     max_sms: int | None = None, progress: bool = True) -> "HybridFeatureStore":
        """A store holding ``sources``: ``{(node_type or None, attr_name): host array}``.

        Each source is ``[num_nodes_of_type, *row_shape]`` (torch CPU tensor,
        numpy array or memmap; used in place, never copied on the host).
        ``gpu_budget`` (bytes or ``"8GB"``; CUDA only) keeps the hottest rows
        by ``hotness`` (node type -> score [num_nodes], higher is hotter)
        resident on the GPU; a row of a type costs all its attributes' bytes.
        ``max_sms`` and ``progress`` are passed to every HybridTensor.
        """
        store = cls(device)
        gpu_rows: dict = {}
        if gpu_budget is not None and store.device.type == "cuda":
            gpu_rows = store._place(sources, gpu_budget, hotness)
        for (group, attr), source in sources.items():
            table = HybridTensor(source, store.device, gpu_rows=gpu_rows.get(group), max_sms=max_sms,
                                 progress=progress)
            store._add((group, attr), table)
        return store

    @staticmethod
    def _place(sources: dict, gpu_budget, hotness: dict | None) -> dict:
        if hotness is None:
            raise ValueError("gpu_budget needs a hotness per node type (e.g. in-degree) to choose the rows "
                             "kept on the GPU; pass hotness={node_type: score}")
        hotness, row_bytes = {g: torch.as_tensor(v) for g, v in hotness.items()}, {}
        for (group, _), source in sources.items():
            if group not in hotness:
                raise ValueError(f"no hotness for node type {group!r}; pass one score per node of every type")
            if hotness[group].numel() != source.shape[0]:
                raise ValueError(f"hotness of node type {group!r} has {hotness[group].numel()} entries for "
                                 f"{source.shape[0]} nodes")
            row_bytes[group] = row_bytes.get(group, 0) + _row_bytes(source)
        return placement.hot_rows_under_budget(hotness, row_bytes, gpu_budget)

    def _add(self, key: Key, table: HybridTensor) -> None:
        gpu_rows = table.placement.gpu_rows if table.num_gpu_rows else None
        self._specs[key] = _Spec(table.source, gpu_rows, table.max_sms, sharded=table.placement.num_shards > 0)
        self._device_tables()[key] = table
        self._host = None

    # ---- tables of this process ----------------------------------------------
    def _device_tables(self) -> dict[Key, HybridTensor]:
        if self._tables is None:  # unpickled: rebuild around the same sources, here
            sharded = [key for key, s in self._specs.items() if s.sharded]
            if sharded:
                raise RuntimeError(
                    f"the tables {sharded} are sharded over several GPUs and were built in another process; "
                    "build the store in each process that gathers (hmgstore.distributed.shard), and pass "
                    "filter_per_worker=False to the loader so that workers only sample")
            self._tables = {key: HybridTensor(s.source, self.device, gpu_rows=s.gpu_rows, max_sms=s.max_sms,
                                              progress=False) for key, s in self._specs.items()}
        return self._tables

    def _worker_tables(self) -> dict[Key, HybridTensor]:
        """CPU tables over the same host sources, for DataLoader worker processes."""
        if self.device.type == "cpu":
            return self._device_tables()
        if self._host is None or self._host[0] != os.getpid():
            log.warning("hmgstore: a DataLoader worker is gathering features on the CPU (a worker cannot use "
                        "the GPU of its parent). Pass filter_per_worker=False to the loader so that workers "
                        "only sample and the main process gathers on %s.", self.device)
            self._host = (os.getpid(), {key: HybridTensor(s.source, "cpu", progress=False)
                                        for key, s in self._specs.items()})
        return self._host[1]

    def table(self, group_name, attr_name: str) -> HybridTensor:
        """The HybridTensor holding ``(group_name, attr_name)`` (KeyError if absent)."""
        return self._lookup(self._device_tables(), TensorAttr(group_name, attr_name))

    def _lookup(self, tables: dict, attr: TensorAttr) -> HybridTensor:
        try:
            return tables[(attr.group_name, attr.attr_name)]
        except KeyError:
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}) in the feature store; "
                           f"it holds {sorted(self._specs, key=str)}") from None

    # ---- PyG's FeatureStore interface -----------------------------------------
    def put_tensor(self, tensor, *args, **kwargs) -> bool:
        """PyG's ``put_tensor``, with ``index`` defaulting to None (the whole table)."""
        if len(args) < 3 and not (args and isinstance(args[0], TensorAttr)) and "index" not in kwargs:
            kwargs["index"] = None
        return super().put_tensor(tensor, *args, **kwargs)

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        if not (attr.index is None or (isinstance(attr.index, slice) and attr.index == slice(None))):
            raise ValueError("hmgstore tables are read-only once built: put whole tensors (index=None), "
                             "or build a new store")
        if isinstance(tensor, HybridTensor):
            if tensor.device != self.device:
                raise ValueError(f"the table is on {tensor.device}, the store on {self.device}")
            table = tensor
        else:
            table = HybridTensor(tensor, self.device)
        self._add((attr.group_name, attr.attr_name), table)
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        """One :func:`hmgstore.gather_many` for every attribute of every node type asked for.

        A whole table (``index=None``) is answered with its host source, no copy: gathering
        it to the GPU could exhaust GPU memory, and PyG's CPU sampler reads such tables
        (node times) on the CPU.
        """
        in_worker = torch.utils.data.get_worker_info() is not None
        tables = self._worker_tables() if in_worker else self._device_tables()
        whole = [attr.index is None for attr in attrs]
        if all(whole):
            return [self._lookup(tables, attr).source for attr in attrs]
        if any(whole):
            parts = iter(self._multi_get_tensor([a for a, w in zip(attrs, whole) if not w]))
            return [self._lookup(tables, a).source if w else next(parts) for a, w in zip(attrs, whole)]
        requests, outs = [], []
        for attr in attrs:
            table = self._lookup(tables, attr)
            index = attr.index
            requests.append((table, index))
            shared = in_worker and isinstance(index, torch.Tensor) and index.dim() == 1 and index.dtype != torch.bool
            outs.append(_shared_empty((index.numel(), *table.row_shape), table.dtype) if shared else None)
        return [resident(out) for out in gather_many(requests, outs=outs)]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        key = (attr.group_name, attr.attr_name)
        if self._tables is not None:
            self._tables.pop(key, None)
        self._host = None
        return self._specs.pop(key, None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        spec = self._specs.get((attr.group_name, attr.attr_name))
        return None if spec is None else spec.shape

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Fresh ``TensorAttr(group_name, attr_name)`` objects (PyG sets their index)."""
        return [self._tensor_attr_cls(group, attr) for group, attr in self._specs]

    # ---- lifetime ---------------------------------------------------------------
    def close(self) -> None:
        """Free every table's GPU memory and host registration (the store is unusable after)."""
        for table in (self._tables or {}).values():
            table.close()

    def __getstate__(self):
        # Tables are rebuilt where they are used: a worker process must not
        # inherit CUDA state, and sources travel as (shared) host tensors.
        state = dict(self.__dict__)
        state["_tables"], state["_host"] = None, None
        if self.device.type == "cuda":
            state["_specs"] = {key: self._sendable(spec) for key, spec in self._specs.items()}
        return state

    @staticmethod
    def _sendable(spec: _Spec) -> _Spec:
        """A spec safe to pickle while this process's tables read its source.

        Sending a torch tensor to another process moves its storage into
        shared memory in place, which would pull the pages out from under a
        table registered in place (its kernels would read unregistered
        memory). A CUDA store therefore sends a copy, unless the source is
        shared already; the default fork start method never pickles.
        """
        source = spec.source
        if not isinstance(source, torch.Tensor) or source.is_shared():
            return spec
        if source.nbytes >= 1 << 30:
            log.warning("hmgstore: sending a CUDA feature store to another process copies its %.2f GB host "
                        "table %s; use the fork start method, or put the source in shared memory "
                        "(tensor.share_memory_()) before building the store", source.nbytes / 1e9,
                        tuple(source.shape))
        return _Spec(source.clone(), spec.gpu_rows, spec.max_sms, spec.sharded)

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self) -> str:
        rows = ", ".join(f"{k}: {tuple(s.shape)}" for k, s in self._specs.items())
        return f"HybridFeatureStore(device={self.device}, {rows})"
