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
  in the workers and gather on the GPU in the main process. Either way each
  forked worker copies a table pinned in place (Linux copies page-locked
  private memory at fork); tables built with ``copy=True`` (cudaHostAlloc)
  are shared with the workers instead (:mod:`hmgstore.memory.pinned`).
- ``pin_memory=True`` and ``PrefetchLoader`` call ``.pin_memory()`` on every
  tensor of a batch, which is an error for CUDA tensors. CUDA results are
  therefore returned as :class:`ResidentTensor`, a plain tensor (no
  ``__torch_function__`` overhead; results of operations on it are ordinary
  tensors) whose ``pin_memory()`` returns itself: there is nothing to pin.

Tables cross processes (spawned workers) by hmgstore's own rule for tables
(see :mod:`hmgstore.table.tensor`): they are rebuilt where they are first used.
"""
from __future__ import annotations

import dataclasses
import logging
import os

import torch
from torch_geometric.data import FeatureStore, TensorAttr

from hmgstore import HybridTensor, gather_many, resolve_device
from hmgstore.prefetch.pipeline import register_table_finder
from hmgstore.rows import budget, checks, formats, stats
from hmgstore.rows.hotness import order_by_score

from .edge_tables import TABLE_KEYWORDS, EdgeTables, float32_only, take_queued
from .graph_store import check_loaders
from .ranges import as_range, read_range
from .updates import IndexAttr, check_removable, index_none_by_default, is_whole, update

log = logging.getLogger(__name__)

Key = tuple  # (group_name: str | None, attr_name: str)


class ResidentTensor(torch.Tensor):
    """A tensor already on the GPU: ``pin_memory()`` returns ``self``, since there is nothing to pin.

    Made by :func:`resident` (the feature store's CUDA results). Everything
    else behaves as ``torch.Tensor`` (``__torch_function__`` is disabled, so
    operations return plain tensors at no extra cost). ``pin_memory`` takes
    and ignores torch's arguments and returns ``self`` on any device: the
    class marks rows that need no pinning, so build one by hand
    (``t.as_subclass(ResidentTensor)``) only for such rows.

    Raises:
        Nothing of its own: ``pin_memory`` never raises; everything else is ``torch.Tensor``'s.
    """

    # torch's own idiom for a subclass without dispatch; its stubs type the method otherwise
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def pin_memory(self, *args, **kwargs):
        return self


def resident(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a :class:`ResidentTensor` when it is on a GPU, unchanged otherwise (no copy).

    Args:
        tensor: any ``torch.Tensor``, on any device.

    Returns:
        The same memory: a ResidentTensor view on a GPU, ``tensor`` itself elsewhere.

    Raises:
        TypeError: ``tensor`` is not a ``torch.Tensor`` (a numpy array, a list).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"resident takes a torch.Tensor, got {type(tensor).__name__}")
    return tensor.as_subclass(ResidentTensor) if tensor.is_cuda else tensor


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in shared memory: a worker's result then crosses
    to the main process without the copy DataLoader would otherwise make."""
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    # set_ makes the view contiguous without a stride; torch's stubs ask for one
    return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes), 0, shape)  # type: ignore[call-overload]


def _host_layout(layout, group, copied: bool, gpu_rows: dict, hotness: dict | None, orders: dict):
    """The host layout of a node type's table for :meth:`HybridFeatureStore.from_sources`' ``layout``.

    ``"hotness"`` orders the host tier hottest first; ``"auto"`` does so where the host tier is ``copied``
    anyway and the type keeps rows on the GPU; a permutation or None is passed on. ``orders`` caches one sort
    of the scores per node type. Raises ValueError for another string, and for ``"hotness"`` without hotness."""
    if not isinstance(layout, str):
        return layout
    if layout not in ("auto", "hotness"):
        raise ValueError(f"layout is a permutation of the rows, 'hotness', 'auto' or None; got {layout!r}")
    if layout == "hotness" and hotness is None:
        raise ValueError("layout='hotness' needs hotness={node_type: score} and a gpu_budget on a GPU "
                         "(it orders the host tier by the same scores that choose the GPU's rows)")
    hot = gpu_rows.get(group) is not None and len(gpu_rows[group]) > 0
    if not (layout == "hotness" or (hot and copied)):
        return None
    if group not in orders:
        assert hotness is not None  # "hotness" checked above; rows on the GPU needed hotness too
        orders[group] = order_by_score(hotness[group])
    return orders[group]


def _whole(table: HybridTensor) -> torch.Tensor:
    """A whole table as a host tensor: its source, no copy; a read-only source is copied, since
    writing to a tensor over read-only memory crashes the process, and stored formats are decoded."""
    return table.dense()  # the host tier itself unless it keeps a stored format or a layout, or is read-only


class HybridFeatureStore(EdgeTables, FeatureStore):
    """A ``torch_geometric.data.FeatureStore`` of HybridTensors on one device.

    Args:
        device: where gathered rows go (``"cuda"``, ``"cuda:1"``, ``"cpu"``;
            None: the current GPU, or the CPU without one).

    Build one with :meth:`from_sources` (which places hot rows under a GPU
    budget), or empty and ``put_tensor`` whole tables: a host source (torch
    CPU tensor, numpy array, memmap) becomes a table with every row read
    from pinned host memory; a :class:`hmgstore.HybridTensor` on the store's
    device is kept with its own placement. ``put_tensor`` takes whole tensors
    only: an ``index`` other than None raises ValueError, and so does a
    table whose row count differs from the other attributes of its node
    type. ``update_tensor`` writes rows in place or replaces a whole table,
    and a refused update leaves the old one as it was; ``remove_tensor``
    removes whole attributes only (:mod:`hmgstore.plugins.pyg.updates`).

    ``get_tensor``/``multi_get_tensor`` take any index HybridTensor takes
    (integer tensor on any device, numpy array, slice, int; None: every row,
    as the host source itself, or a copy of a read-only source) and return
    ``[len(index), *row_shape]`` tensors of the table's dtype on ``device``. Unknown attributes raise
    KeyError, ids out of range IndexError (before any memory is read).
    A contiguous run of rows (a slice with step 1, or a CPU tensor of
    consecutive ids) is read as one slice of the host tier, not row by row
    (:mod:`hmgstore.plugins.pyg.ranges`). On a CPU store ``get_tensor``
    (and ``store[...]``) returns a view of host memory for a run of rows,
    both calls for a whole table; ``multi_get_tensor``, which PyG's loaders
    fill batches with, copies a run: a batch never aliases the table.

    Edge attributes (one table per edge type and name, rows in edge-id
    order) are held too, for :func:`hmgstore.plugins.pyg.edge_features`:
    see :class:`~hmgstore.plugins.pyg.edge_tables.EdgeTables`.
    """

    def __init__(self, device=None):
        super().__init__(tensor_attr_cls=IndexAttr)  # numpy indices too
        check_loaders()
        self.device = resolve_device(device)
        self._tables: dict[Key, HybridTensor] = {}
        self._edge_tables: dict[Key, HybridTensor] = {}  # (edge_type, attr_name) -> rows in edge-id order
        self._host: tuple[int, dict[Key, HybridTensor]] | None = None  # (pid, CPU tables) in workers

    @classmethod
    def from_sources(cls, sources: dict, device=None, *, gpu_budget=None, hotness: dict | None = None,
                     max_sms: int | None = None, progress: bool = True, gpu_whole="auto",
                     **options) -> HybridFeatureStore:
        """A store holding ``sources``, the hottest rows of every node type kept on the GPU under one budget.

        Args:
            sources: ``{(node_type or None, attr_name): host array}``, each ``[num_nodes_of_type, *row_shape]``
                (torch CPU tensor, numpy array or memmap; used in place, never copied on the host).
            device: where gathered rows go (None: the current GPU, or the CPU).
            gpu_budget: bytes (int or ``"8GB"``) of GPU memory for the hottest rows by ``hotness``, a row of a
                type costing all its attributes' (stored) bytes; ``"auto"``: the lesser of all the tables' bytes
                and half the GPU's free memory; None: no resident rows. CUDA only, read on every device
                (:func:`hmgstore.rows.budget.resident_rows`).
            hotness: node type -> score per node (higher is hotter), needed with a budget.
            max_sms: passed to every HybridTensor, as is ``progress``.
            progress: show progress bars while tables are pinned or copied.
            gpu_whole: node attribute names whose tables are kept whole in GPU memory on a GPU (``("y",)``:
                a batch's labels never cross PCIe), whatever ``gpu_budget`` (None included); with a budget
                their bytes come out of it first. ``"auto"`` (the default): the tables of rows of at most 16
                bytes (labels), when together they take at most a quarter of the budget
                (:func:`hmgstore.rows.budget.small_tables`); ``()``: none.
            **options: host memory of every table (``copy``, ``host_dtype``, ``compress``, ``layout``,
                ``backing``, ``split``), as HybridTensor takes them; ``host_dtype`` and ``compress`` apply to
                float32 sources only. ``layout`` also takes ``"hotness"`` (each node type's host tier hottest
                first, so that the rows the GPU tier misses lie in few 2 MiB host pages) and ``"auto"`` (the
                default: ``"hotness"`` for the tables whose host tier is copied anyway and that keep rows on
                the GPU, id order for the rest).

        Returns:
            The store.

        Raises:
            ValueError: for a ``gpu_whole`` name no source has, whole tables larger than the budget, a budget
                or ``layout="hotness"`` without ``hotness``, and an unknown ``layout``; and what HybridTensor
                raises for unusable sources.

        Example:
            >>> store = HybridFeatureStore.from_sources({(None, "x"): x, (None, "y"): y}, "cuda",
            ...                                         gpu_budget="2GB", hotness={None: in_degree},
            ...                                         gpu_whole=("y",))  # doctest: +SKIP
        """
        checks.keywords("HybridFeatureStore.from_sources", options, TABLE_KEYWORDS, checks.takes(cls.from_sources))
        store = cls(device)
        host_dtype, compress = options.pop("host_dtype", None), options.pop("compress", None)
        layout = options.pop("layout", "auto")
        stored = formats.get(compress)
        costs = [budget.Cost(group, source.shape[0], budget.row_bytes(source, float32_only(source, stored)),
                             False, attr) for (group, attr), source in sources.items()]
        gpu_budget = budget.resolve(costs, gpu_budget, store.device)  # bytes from here on ("auto" read once)
        if isinstance(gpu_whole, str) and gpu_whole == "auto":  # narrow tables (labels) whole where they fit
            whole_attrs = budget.small_tables(costs, gpu_budget, store.device)
        else:
            whole_attrs = {gpu_whole} if isinstance(gpu_whole, str) else set(gpu_whole or ())
        unknown = whole_attrs - {attr for _, attr in sources}
        if unknown:
            raise ValueError(f"gpu_whole names {sorted(unknown)}, which no source has; the attributes are "
                             f"{sorted({attr for _, attr in sources})}")
        cuda = store.device.type == "cuda"
        costs = [dataclasses.replace(c, whole=c.name in whole_attrs) for c in costs]
        gpu_rows = budget.resident_rows(costs, gpu_budget, store.device, hotness)
        orders: dict = {}  # node type -> its rows hottest first, made once for all its tables
        for (group, attr), source in sources.items():
            table_dtype, table_compress = float32_only(source, host_dtype), float32_only(source, compress)
            whole = attr in whole_attrs and cuda  # every row in GPU memory: no host reads, so no host layout
            copied = bool(options.get("copy")) or table_dtype is not None or table_compress is not None
            table_layout = None if whole else _host_layout(layout, group, copied, gpu_rows, hotness, orders)
            table = HybridTensor(source, store.device, max_sms=max_sms,
                                 gpu_rows=torch.arange(source.shape[0]) if whole else gpu_rows.get(group),
                                 progress=progress, host_dtype=table_dtype, compress=table_compress,
                                 layout=table_layout, **options)
            store._add((group, attr), table)
        return store

    def _add(self, key: Key, table: HybridTensor) -> None:
        for (group, attr), other in self._tables.items():
            if group == key[0] and attr != key[1] and other.num_rows != table.num_rows:
                raise ValueError(
                    f"attribute {key[1]!r} of node type {group!r} has {table.num_rows} rows, but {attr!r} of the "
                    f"same type has {other.num_rows}; every attribute of a node type has one row per node")
        self._tables[key] = table
        self._host = None

    # ---- tables of this process ----------------------------------------------
    def worker_tables(self) -> dict[Key, HybridTensor]:
        """CPU tables over the same host sources, for DataLoader worker processes."""
        if self.device.type == "cpu":
            return self._tables
        if self._host is None or self._host[0] != os.getpid():
            log.warning("hmgstore: a DataLoader worker is gathering features on the CPU (a worker cannot use "
                        "the GPU of its parent). Pass filter_per_worker=False to the loader so that workers "
                        "only sample and the main process gathers on %s.", self.device)
            edges = {("edge", *key): t for key, t in self._edge_tables.items()}  # 3-tuples: apart from nodes'
            self._host = (os.getpid(), {key: HybridTensor.over_host_tier(t.source, "cpu", t.dtype, fmt=t.host_format,
                                                                      shape=tuple(t.shape), layout=t.layout,
                                                                      progress=False)
                                        for key, t in {**self._tables, **edges}.items()})  # half-width rows widen
        return self._host[1]

    def tables(self) -> dict:
        """``{(group_name, attr_name): HybridTensor}`` of every table the store holds."""
        return dict(self._tables)

    def table(self, group_name, attr_name: str) -> HybridTensor:
        """The HybridTensor holding ``(group_name, attr_name)`` (KeyError if absent)."""
        return self._lookup(self._tables, TensorAttr(group_name, attr_name))

    def _lookup(self, tables: dict, attr: TensorAttr) -> HybridTensor:
        try:
            return tables[(attr.group_name, attr.attr_name)]
        except KeyError:
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}) in the feature store; "
                           f"it holds {sorted(self._tables, key=str)}") from None

    # ---- PyG's FeatureStore interface -----------------------------------------
    def put_tensor(self, tensor, *args, **kwargs) -> bool:
        """PyG's ``put_tensor``, with ``index`` defaulting to None (the whole table)."""
        return super().put_tensor(tensor, *args, **index_none_by_default(args, kwargs, "put_tensor"))

    def update_tensor(self, tensor, *args, **kwargs) -> bool:
        """PyG's ``update_tensor`` (``index`` defaulting to None), which never loses the old attribute:
        :func:`hmgstore.plugins.pyg.updates.update` says what it does and raises."""
        attr = self._tensor_attr_cls.cast(*args, **index_none_by_default(args, kwargs, "update_tensor"))
        return update(self, tensor, attr)

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        if not is_whole(attr.index):
            raise ValueError("put_tensor takes whole tensors (index=None): tables are read-only to it once built; "
                             "overwrite rows of a stored one with update_tensor(rows, group, name, index=ids)")
        if isinstance(tensor, HybridTensor):
            if tensor.device != self.device:
                raise ValueError(f"the table is on {tensor.device}, the store on {self.device}")
            table = tensor
        else:
            table = HybridTensor(tensor, self.device)
        self._add((attr.group_name, attr.attr_name), table)
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._read([attr], views=True)[0]  # a run of rows may be a view, as docs/pyg.md promises

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        # PyG's loaders fill batches with it: copies, as stock PyG's, so an in-place transform spares data.x
        return self._read(attrs, views=False)

    def _read(self, attrs: list[TensorAttr], views: bool, ranges: bool = True) -> list[torch.Tensor]:
        """One :func:`hmgstore.gather_many` for every attribute of every node type asked for.

        A whole table (``index=None``) is answered with its host source (see :func:`_whole`):
        gathering it to the GPU could exhaust GPU memory, and PyG's CPU sampler reads such
        tables (node times) on the CPU. Contiguous rows are read as slices of host memory where the
        host tier keeps rows in id order, handed out as views on a CPU store only with ``views`` (and
        never in a worker); ``ranges=False``: gathered (the rows of a table with a layout).
        """
        in_worker = torch.utils.data.get_worker_info() is not None
        tables = self.worker_tables() if in_worker else self._tables
        whole = [attr.index is None for attr in attrs]
        if all(whole):
            return [_whole(self._lookup(tables, attr)) for attr in attrs]
        if any(whole):
            parts = iter(self._read([a for a, w in zip(attrs, whole) if not w], views))
            return [_whole(self._lookup(tables, a)) if w else next(parts) for a, w in zip(attrs, whole)]
        spans = [as_range(attr.index, self._lookup(tables, attr).num_rows) if ranges else None for attr in attrs]
        if any(r is not None for r in spans):  # contiguous rows: slices of host memory (ranges.py)
            read = [None if r is None else read_range(self._lookup(tables, a), *r, copy=in_worker or not views)
                    for a, r in zip(attrs, spans)]
            # what was not read as a slice is gathered: a range of a laid-out table as its ids, never asked
            # for as a range again (that would recurse for ever)
            rest = [a if r is None else dataclasses.replace(a, index=torch.arange(*r))
                    for a, r, got in zip(attrs, spans, read) if got is None]
            parts = iter(self._read(rest, views, ranges=False) if rest else [])
            return [next(parts) if r is None else resident(r) for r in read]
        ride = take_queued(self)  # a batch's edge rows, queued by edge_features: read in the same gather
        requests, outs = [], []
        for attr in attrs:
            table = self._lookup(tables, attr)
            index = attr.index
            requests.append((table, index))
            shared = in_worker and isinstance(index, torch.Tensor) and index.dim() == 1 and index.dtype != torch.bool
            outs.append(_shared_empty((index.numel(), *table.row_shape), table.dtype) if shared else None)
        for key, table, ids in (ride.requests if ride is not None else []):
            table = tables.get(("edge", *key), table)  # a CUDA store's worker: its CPU table
            requests.append((table, ids))
            outs.append(_shared_empty((ids.numel(), *table.row_shape), table.dtype) if in_worker else None)
        rows = [resident(out) for out in gather_many(requests, outs=outs)]
        if ride is not None:
            ride.rows = rows[len(attrs):]
        return rows[:len(attrs)]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        check_removable(attr)  # PyG's default would drop the whole table for an index of rows
        self._host = None
        return self._tables.pop((attr.group_name, attr.attr_name), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        table = self._tables.get((attr.group_name, attr.attr_name))
        return None if table is None else tuple(table.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Fresh ``TensorAttr(group_name, attr_name)`` objects (PyG sets their index)."""
        return [self._tensor_attr_cls(group, attr) for group, attr in self._tables]

    # ---- statistics -------------------------------------------------------------
    def reset_stats(self, counting: bool = True) -> None:
        """Start counting, for every table, the rows each tier serves (see :mod:`hmgstore.rows.stats`);
        ``counting=False``: stop counting (a gather then does no counting work)."""
        for table in [*self._tables.values(), *self._edge_tables.values()]:
            table.reset_stats(counting)

    def stats(self, group_name=..., attr_name=None) -> dict:
        """Every table's statistics merged (GPU hit ratio, GB/s, rows and bytes per tier); or one
        table's, with ``group_name`` and ``attr_name``. Raises RuntimeError when not counting."""
        if group_name is not ...:
            return self.table(group_name, attr_name).stats()
        return stats.merge(t.stats() for t in [*self._tables.values(), *self._edge_tables.values()])

    # ---- lifetime ---------------------------------------------------------------
    def close(self) -> None:
        """Free every table's GPU memory and host registration (the store is unusable after)."""
        for table in [*self._tables.values(), *self._edge_tables.values()]:
            table.close()

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_host"] = None  # CPU tables of a worker are the worker's own
        return state

    def __repr__(self) -> str:
        rows = ", ".join(f"{k}: {tuple(t.shape)}" for k, t in self._tables.items())
        edges = "".join(f", edge {k}: {tuple(t.shape)}" for k, t in self._edge_tables.items())
        return f"HybridFeatureStore(device={self.device}, {rows}{edges})"


def loader_tables(loader) -> list | None:
    """The tables of the :class:`HybridFeatureStore` a PyG loader reads (``loader.data``, a store pair), or None
    for a loader over no such store: how :class:`hmgstore.Pipeline` finds them (``max_sms="auto"``,
    ``fuse="auto"``)."""
    data = getattr(loader, "data", None)
    stores = [s for s in (data if isinstance(data, (tuple, list)) else [data]) if isinstance(s, HybridFeatureStore)]
    return [table for store in stores for table in store.tables().values()] if stores else None


register_table_finder(loader_tables)
