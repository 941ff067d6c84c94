"""Edge attribute tables of a :class:`~hmgstore.plugins.pyg.HybridFeatureStore`, and the rows that ride along.

An edge attribute (``edge_attr``, ``edge_weight``, ... of a ``Data``, or of
one edge type of a ``HeteroData``) is one :class:`hmgstore.HybridTensor`
with one row per edge, in the order the edges were given (``edge_index``'s
columns). That is the order PyG's ``batch.e_id`` refers to: samplers
return CSC positions (``SamplerOutput.edge``), and the loader maps them to
edge ids with the graph store's permutation (``csc()`` returns ``(row,
colptr, perm)``; ``e_id = perm[edge]``). Tables take the node tables'
host-memory options (``copy``, ``host_dtype``, ``compress``, ``backing``,
``split``) and their own GPU budget, hottest edges first by the hotness of
the node they point to.

PyG's loaders do not ask a feature store for edge rows (its
``filter_custom_store`` leaves a "TODO Support edge features"), so
:mod:`hmgstore.plugins.pyg.edge_features` asks: before a batch's node
attributes are gathered it *queues* the batch's edge rows here
(:func:`queue_edge_rows`), and the store's one ``gather_many`` for the
node attributes reads them too (:func:`take_queued`). The queue is per
thread and per store: PyG's ``filter_fn`` runs the whole join in one thread.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from hmgstore import HybridTensor
from hmgstore.rows import placement

_queued = threading.local()  # .rides: {id(store): Ride}


class Ride:
    """Edge rows to gather along with a batch's node attributes: ``requests`` is ``[(key, table, ids)]``;
    ``rows`` (one tensor per request) is filled by the store's gather."""

    __slots__ = ("requests", "rows")

    def __init__(self, requests: list):
        self.requests = requests
        self.rows: list | None = None


def queue_edge_rows(store, requests: list) -> Ride:
    """Queue ``requests`` (``[(key, HybridTensor, ids)]``) for ``store``'s next gather in this thread.

    A ride queued before and never taken (its batch's node gather did not
    happen) is replaced. Returns the :class:`Ride`, whose ``rows`` the
    gather fills.
    """
    rides = _queued.__dict__.setdefault("rides", {})
    ride = rides[id(store)] = Ride(requests)
    return ride


def take_queued(store) -> Ride | None:
    """The ride queued for ``store`` in this thread (removed from the queue), or None."""
    rides = _queued.__dict__.get("rides")
    return None if not rides else rides.pop(id(store), None)


def drop_queued(store) -> None:
    """Forget a ride queued for ``store`` in this thread (its batch went another way)."""
    take_queued(store)


class EdgeTables:
    """The edge-attribute half of :class:`~hmgstore.plugins.pyg.HybridFeatureStore` (a mixin).

    Tables are keyed ``(edge_type, attr_name)``: ``edge_type`` None when
    homogeneous, a ``(src, rel, dst)`` tuple otherwise. They are not listed
    by ``get_all_tensor_attrs`` (PyG would index them by node ids).
    """

    _edge_tables: dict
    device: torch.device  # the store's, set by the class this is mixed into
    _host: tuple[int, dict] | None  # (pid, CPU tables) in workers, kept by the class this is mixed into

    def put_edge_tables(self, sources: dict, *, gpu_budget=None, hotness: dict | None = None,
                        max_sms: int | None = None, progress: bool = True, **options) -> None:
        """Store edge attributes: ``sources`` is ``{(edge_type, attr_name): host array [num_edges, ...]}``.

        Each source (torch CPU tensor, numpy array or memmap, used in place
        unless ``copy``/``host_dtype`` ask for a copy) becomes a HybridTensor
        on the store's device. ``gpu_budget`` (bytes or ``"8GB"``, CUDA
        only): GPU memory for the hottest edge rows of every edge type,
        ranked by ``hotness[edge_type]``, a score per edge [num_edges]
        (higher is hotter), required with a budget. ``options``: as
        :meth:`from_sources` takes them (``layout`` does not apply to edges
        and is ignored); ``host_dtype`` and ``compress`` apply to float32
        sources only. Raises ValueError for a budget without hotness, a
        score of the wrong length, or two attributes of one edge type with
        different row counts.
        """
        from hmgstore.rows import formats

        options.pop("layout", None)
        host_dtype, compress = options.pop("host_dtype", None), options.pop("compress", None)

        def narrow(source, fmt):
            return fmt if str(source.dtype) in ("torch.float32", "float32") else None

        gpu_rows: dict = {}
        if gpu_budget is not None and self.device.type == "cuda":
            if hotness is None:
                raise ValueError("an edge GPU budget needs a hotness per edge type (a score per edge)")
            rows: dict = {}
            row_bytes: dict = {}
            stored = formats.get(compress)
            for (edge_type, _), source in sources.items():
                rows[edge_type] = source.shape[0]
                elems = int(torch.Size(source.shape[1:]).numel())
                item = torch.empty(0, dtype=_torch_dtype(source)).element_size()
                size = stored.pitch(elems) if stored is not None and narrow(source, stored) else item * elems
                row_bytes[edge_type] = row_bytes.get(edge_type, 0) + size
            checked = placement.check_hotness(hotness, rows)
            gpu_rows = placement.hot_rows_under_budget(checked, row_bytes, gpu_budget)
        for (edge_type, name), source in sources.items():
            table = HybridTensor(source, self.device, gpu_rows=gpu_rows.get(edge_type), max_sms=max_sms,
                                 progress=progress, host_dtype=narrow(source, host_dtype),
                                 compress=narrow(source, compress), **options)
            self.put_edge_table(table, edge_type, name)

    def put_edge_table(self, table, edge_type, attr_name: str) -> None:
        """Store one edge attribute: a HybridTensor on the store's device, or a host array (then every row
        is read from host memory). Raises ValueError for a table on another device, or one whose row count
        differs from another attribute of the same edge type."""
        if not isinstance(table, HybridTensor):
            table = HybridTensor(table, self.device)
        elif table.device != self.device:
            raise ValueError(f"the edge table is on {table.device}, the store on {self.device}")
        for (et, name), other in self._edge_tables.items():
            if et == edge_type and name != attr_name and other.num_rows != table.num_rows:
                raise ValueError(f"edge attribute {attr_name!r} of {edge_type!r} has {table.num_rows} rows, but "
                                 f"{name!r} has {other.num_rows}; every edge attribute has one row per edge")
        self._edge_tables[(edge_type, attr_name)] = table
        self._host = None

    def edge_tables(self) -> dict:
        """``{(edge_type, attr_name): HybridTensor}`` of every edge attribute the store holds."""
        return dict(self._edge_tables)

    def edge_table(self, edge_type, attr_name: str) -> HybridTensor:
        """The HybridTensor of edge attribute ``attr_name`` of ``edge_type`` (None when homogeneous).
        Raises KeyError naming what the store holds."""
        try:
            return self._edge_tables[(edge_type, attr_name)]
        except KeyError:
            raise KeyError(f"no edge attribute {attr_name!r} of edge type {edge_type!r} in the feature store; "
                           f"it holds {sorted(self._edge_tables, key=str)}") from None


def _torch_dtype(source) -> torch.dtype:
    """The torch dtype of a torch tensor or numpy array's elements."""
    if isinstance(source, torch.Tensor):
        return source.dtype
    return torch.from_numpy(np.empty(0, dtype=source.dtype)).dtype


def edge_hotness(graph_store, node_hotness: dict, edge_types) -> dict:
    """Per edge type, a score per edge in the order edges were given: the hotness of the node it points to.

    ``graph_store``: a :class:`~hmgstore.plugins.pyg.CSCGraphStore`;
    ``node_hotness``: node type (None when homogeneous) -> score [num_nodes].
    Returns edge type -> float64 [num_edges] (CPU).
    """
    scores = {}
    for edge_type in edge_types:
        csc = graph_store.edges(edge_type)
        dst = None if edge_type is None else edge_type[-1]
        node_score = torch.as_tensor(node_hotness[dst]).to(torch.float64).reshape(-1)
        per_csc = node_score.repeat_interleave(csc.colptr.diff(), output_size=csc.num_edges)
        if csc.perm is None:
            scores[edge_type] = per_csc
        else:
            score = torch.empty_like(per_csc)
            score[csc.perm] = per_csc
            scores[edge_type] = score
    return scores
