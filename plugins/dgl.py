"""DGL adapter: an unchanged DGL DataLoader feeds node features from hmgstore tables.

A stock DGL training script changes one line::

    from hmgstore.plugins.dgl import attach
    attach(g, {"feat": table, "label": labels})   # the only change
    sampler = dgl.dataloading.NeighborSampler(
        [15, 10, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(g, train_ids, sampler, device=device, batch_size=1024)

How DGL 2.1's classic DataLoader fetches features (``dgl/dataloading/
dataloader.py``, ``_prefetch``): for each batch it first calls
``graph.get_node_storage(key, ntype).fetch(ids, device, pin_prefetcher)`` for
every prefetched key of every node type (``ids``: the block's ``dgl.NID``,
int32 or int64 like the graph, on the CPU unless sampling runs on the GPU;
``ntype`` is ``"_N"`` on homogeneous graphs; ``pin_prefetcher`` is True, False
or None), then calls ``.wait()`` on every returned object that has one. With
CPU sampling and a CUDA ``device`` this runs in DGL's prefetch thread.

:func:`attach` re-classes ``g`` in place to :class:`HybridDGLGraph`, a
``DGLGraph`` whose ``get_node_storage`` returns a :class:`HybridFeatureStorage`
for the attached keys and DGL's own ``ndata`` column for every other key.
``fetch`` only records the request; the first ``wait()`` gathers every request
that the same thread recorded for the same table device and stream, in one
:func:`hmgstore.gather_many` call (one kernel launch on CUDA), on the stream
that was current when they were recorded. So a batch's features and labels
cost one gather, and the results are ready on the caller's stream.

Importing this module imports DGL, first replacing ``dgl.graphbolt`` by a stub
when GraphBolt cannot load on this torch (DGL 2.1 on torch > 2.2; see
``_dgl_compat``), so import it before ``dgl``, at the top of the script (spawned
DataLoader workers re-import the script and need the same order).

Which DGL build does what:

- a CUDA build of DGL (DGL's own wheel index, not the package registry;
  untested here): GPU training. ``DataLoader(g, ids, sampler, device="cuda")``
  samples on the CPU (or on the GPU with ``use_uva=True``) and hmgstore
  gathers features straight into the GPU.
- a CPU build (the package registry's DGL 2.1.0): CPU sampling and CPU
  blocks, so CPU training. hmgstore tables may live on a GPU and
  ``fetch(ids, "cuda")`` works, but DGL cannot move blocks to CUDA.
  :func:`dgl_supports_cuda` tells the two apart.

Limits: DGL's ``gpu_cache`` option cannot serve attached keys (it needs
``fetch`` to return a tensor; give the table GPU-resident hot rows instead).
``attach`` does not add its keys to ``g.ndata``: full-graph code reads the table.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

import torch

import hmgstore
from hmgstore import HybridTensor
from hmgstore.tensor import resolve_device

from ._dgl_compat import dgl_supports_cuda, import_dgl

dgl = import_dgl()

__all__ = ["attach", "HybridDGLGraph", "HybridFeatureStorage", "PendingFetch", "dgl_supports_cuda"]


class HybridFeatureStorage(dgl.storages.FeatureStorage):
    """A DGL ``FeatureStorage`` over one :class:`hmgstore.HybridTensor`.

    ``table``: ``[N, *row_shape]`` rows of one node feature of one node type.
    Pickles without rebuilding the table: the copy rebuilds it (through
    HybridTensor's own pickling) on its first fetch, so DataLoader worker
    processes, which only sample, never pin memory or create a CUDA context.
    """

    def __init__(self, table: HybridTensor):
        if not isinstance(table, HybridTensor):
            raise TypeError(f"HybridFeatureStorage wraps a HybridTensor, got {type(table).__name__}")
        self._table, self._table_state = table, None
        self._lock = threading.Lock()

    @property
    def table(self) -> HybridTensor:
        with self._lock:
            if self._table is None:
                table = HybridTensor.__new__(HybridTensor)
                table.__setstate__(self._table_state)
                self._table, self._table_state = table, None
            return self._table

    def __getstate__(self):
        return {"table": self._table.__getstate__() if self._table is not None else self._table_state}

    def __setstate__(self, state):
        self._table, self._table_state = None, state["table"]
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HybridFeatureStorage({self._table if self._table is not None else 'not built yet'})"

    def fetch(self, indices, device, pin_memory=False, **kwargs) -> PendingFetch:
        """Request rows ``indices``; ``.wait()`` on the result returns them on ``device``.

        ``indices``: int32 or int64 tensor ``[n]`` on the CPU or a GPU.
        ``device``: where the rows should land (``torch.device`` or str).
        ``pin_memory``: for a CPU table and a CUDA ``device``, stage the rows
        in pinned memory and copy them asynchronously (None counts as False).
        Other keyword arguments of DGL's signature are ignored.

        ``wait()`` returns ``[n, *row_shape]`` of the table's dtype on
        ``device``. The gather happens at the first ``wait()`` of any fetch of
        this thread, for all of them at once; bad ids (out of range,
        non-integer) raise there (IndexError/TypeError), before any memory is
        read, for every fetch of that gather.
        """
        if not isinstance(indices, torch.Tensor):
            raise TypeError(f"fetch takes a tensor of node ids, got {type(indices).__name__}")
        return _record(PendingFetch(self.table, indices, resolve_device(device), bool(pin_memory)))


class PendingFetch:
    """A recorded fetch; ``wait()`` returns its rows, gathering its whole batch the first time."""

    __slots__ = ("table", "indices", "device", "pin_memory", "_batch", "_rows", "__weakref__")

    def __init__(self, table: HybridTensor, indices: torch.Tensor, device: torch.device, pin_memory: bool):
        self.table, self.indices, self.device, self.pin_memory = table, indices, device, pin_memory
        self._batch: _Batch | None = None
        self._rows: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        """The rows ``[n, *row_shape]`` on the requested device (see ``HybridFeatureStorage.fetch``)."""
        if self._rows is None:
            self._batch.run()
        return self._rows


class _Batch:
    """The fetches one thread recorded for one table device and stream since its last gather."""

    def __init__(self, stream):
        self.stream = stream  # torch CUDA stream, or None for CPU tables
        self._fetches: list[weakref.ref] = []  # weak: a fetch dropped unwaited is not gathered
        self._lock = threading.Lock()
        self._done = False
        self._error: Exception | None = None

    def add(self, fetch: PendingFetch) -> bool:
        """Record ``fetch``; False once this batch has been gathered."""
        with self._lock:
            if self._done:
                return False
            self._fetches.append(weakref.ref(fetch))
            fetch._batch = self
            return True

    def run(self) -> None:
        """Gather every live fetch of the batch (once); re-raise its error to every waiter."""
        with self._lock:
            if not self._done:
                self._done = True
                try:
                    self._gather()
                except Exception as err:  # noqa: BLE001 - handed to every fetch of the batch
                    self._error = err
        if self._error is not None:
            raise self._error

    def _gather(self) -> None:
        fetches = [f for f in (ref() for ref in self._fetches) if f is not None]
        self._fetches = []
        outs = [_pinned_staging(f) for f in fetches]
        # gather_many sets the CUDA device itself (DGL's prefetch thread starts on GPU 0).
        rows = hmgstore.gather_many([(f.table, f.indices) for f in fetches], outs=outs, stream=self.stream)
        for fetch, r in zip(fetches, rows):
            if r.device != fetch.device:
                # Into a GPU: ordered on its current stream. Into host memory: blocking, because
                # a non-blocking copy to the CPU returns before the rows have arrived.
                r = r.to(fetch.device, non_blocking=fetch.device.type == "cuda")
            fetch._rows = r
            fetch.table = fetch.indices = None


def _pinned_staging(fetch: PendingFetch) -> torch.Tensor | None:
    """A pinned host buffer for a CPU table's rows bound for a GPU, when pinning was asked for."""
    table = fetch.table
    if not (fetch.pin_memory and table.device.type == "cpu" and fetch.device.type == "cuda"):
        return None
    return torch.empty((*fetch.indices.shape, *table.row_shape), dtype=table.dtype, pin_memory=True)


_open_batches = threading.local()  # per thread: {(table device, stream id): _Batch}


def _record(fetch: PendingFetch) -> PendingFetch:
    device = fetch.table.device
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    key = (device, None if stream is None else stream.cuda_stream)
    batches = _open_batches.__dict__.setdefault("batches", {})
    batch = batches.get(key)
    if batch is None or not batch.add(fetch):
        batch = batches[key] = _Batch(stream)
        batch.add(fetch)
    return fetch


class HybridDGLGraph(dgl.DGLGraph):
    """A ``DGLGraph`` some of whose node features are served by hmgstore tables.

    Made by :func:`attach`, which re-classes an existing graph; everything
    else is DGL's. Pickles (with its tables) and works in DataLoader workers.
    ``attach`` does not put its keys in ``g.ndata``; full-graph code reads
    them from the table (``table.source`` is the host tensor).
    """

    def get_node_storage(self, key, ntype=None):
        """Where DGL fetches node feature ``key`` of ``ntype`` from: the attached table, else ``ndata``."""
        attached = self.__dict__.get("_hmgstore_storages")
        if attached:
            name = self.ntypes[self.get_ntype_id(ntype)]
            storage = attached.get((key, name))
            if storage is not None:
                if (key, name) in getattr(self, "_gpu_caches", {}).get("node", {}):
                    raise ValueError(
                        f"node feature {key!r} is served by hmgstore, which does not work with DGL's "
                        "gpu_cache (it needs fetch() to return a tensor). Keep hot rows on the GPU with "
                        "HybridTensor(x, 'cuda', gpu_budget=..., hot_order=...) instead of gpu_cache")
                return storage
        return super().get_node_storage(key, ntype)

    def __repr__(self) -> str:
        attached = sorted(self.__dict__.get("_hmgstore_storages", {}))
        return f"{super().__repr__()}\n      hmgstore node features (key, ntype)={attached}"


def _node_type(graph, ntype, key: str) -> str:
    try:
        return graph.ntypes[graph.get_ntype_id(ntype)]
    except dgl.DGLError:
        if ntype is None:
            raise ValueError(
                f"the graph has node types {graph.ntypes}: attach node feature {key!r} per type, "
                f"as {{{key!r}: {{ntype: table, ...}}}}") from None
        raise ValueError(f"node type {ntype!r} (of node feature {key!r}) is not one of {graph.ntypes}") from None


def _as_table(table, device) -> HybridTensor:
    if isinstance(table, HybridTensor):
        return table
    try:
        return HybridTensor(table, device)
    except TypeError as err:
        raise TypeError(f"attach takes HybridTensors, torch CPU tensors or numpy arrays: {err}") from None


def attach(graph, features: Mapping, *, device=None):
    """Serve node features of ``graph`` from hmgstore tables, for DGL's DataLoader.

    ``graph``: a ``dgl.DGLGraph`` (not a block or a subclass of DGLGraph); it
    is changed in place into a :class:`HybridDGLGraph` and returned, so
    ``attach(g, ...)`` alone is enough.
    ``features``: ``{key: table}`` for a graph with one node type, or
    ``{key: {ntype: table, ...}}`` per node type (as ``g.ndata[key] = {...}``).
    A table is a :class:`hmgstore.HybridTensor` with one row per node of its
    type, or a torch CPU tensor / numpy array, wrapped in
    ``HybridTensor(table, device)``.
    ``device``: for wrapped tables only; None means the current GPU if torch
    sees one, else the CPU.

    Attached keys take precedence over ``g.ndata`` columns of the same name;
    other keys keep coming from ``g.ndata``. Calling ``attach`` again adds or
    replaces keys. Raises TypeError for other graph or table types and
    ValueError for unknown node types or a row count that does not match the
    graph; nothing changes then.
    """
    if type(graph) not in (dgl.DGLGraph, HybridDGLGraph):
        raise TypeError(f"attach takes a dgl.DGLGraph (not a block or subclass), got {type(graph).__name__}")
    if not isinstance(features, Mapping) or not features:
        raise TypeError("features must be a non-empty dict {key: table} or {key: {ntype: table}}")
    storages = {}
    for key, value in features.items():
        if not isinstance(key, str):
            raise TypeError(f"feature keys are strings (as in g.ndata), got {key!r}")
        for ntype, table in (value.items() if isinstance(value, Mapping) else [(None, value)]):
            name = _node_type(graph, ntype, key)
            table = _as_table(table, device)
            if table.num_rows != graph.num_nodes(name):
                raise ValueError(
                    f"the table for node feature {key!r} of node type {name!r} has {table.num_rows} rows; "
                    f"the graph has {graph.num_nodes(name)} nodes of that type")
            storages[key, name] = HybridFeatureStorage(table)
    graph.__class__ = HybridDGLGraph
    # A new dict: copies of the graph (g.local_var(), copy.copy) share the old one.
    graph._hmgstore_storages = {**graph.__dict__.get("_hmgstore_storages", {}), **storages}
    return graph
