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

import torch

from hmgstore import HybridTensor
from hmgstore.rows import budget, checks, formats

_queued = threading.local()  # .rides: {id(store): Ride}
#: The keywords :meth:`HybridFeatureStore.from_sources` and :meth:`EdgeTables.put_edge_tables` pass on to every
#: table (their ``options``): the constructor's, less those they fill in themselves.
TABLE_KEYWORDS = checks.takes(HybridTensor, without=("source", "device", "gpu_rows", "max_sms", "progress"))


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
        """Store edge attributes, each a HybridTensor on the store's device.

        Args:
            sources: ``{(edge_type, attr_name): host array [num_edges, ...]}`` (torch CPU tensor, numpy array
                or memmap, used in place unless ``copy``/``host_dtype`` ask for a copy).
            gpu_budget: GPU memory (bytes, ``"8GB"`` or ``"auto"``; CUDA only) for the hottest edge rows of
                every edge type (:func:`hmgstore.rows.budget.resident_rows`).
            hotness: edge type -> score per edge [num_edges] (higher is hotter), required with a budget.
            max_sms: passed to every table, as is ``progress``.
            progress: show progress bars while tables are pinned or copied.
            **options: as :meth:`HybridFeatureStore.from_sources` takes them (``layout`` does not apply to
                edges and is ignored); ``host_dtype`` and ``compress`` apply to float32 sources only.

        Raises:
            ValueError: for a budget without hotness, a score of the wrong length, or two attributes of one
                edge type with different row counts.
            TypeError: naming this method, for a keyword it does not take (and the closest one it takes).
        """
        checks.keywords(f"{type(self).__name__}.put_edge_tables", options, TABLE_KEYWORDS,
                        checks.takes(EdgeTables.put_edge_tables))
        options.pop("layout", None)
        host_dtype, compress = options.pop("host_dtype", None), options.pop("compress", None)
        stored = formats.get(compress)
        costs = [budget.Cost(edge_type, source.shape[0], budget.row_bytes(source, float32_only(source, stored)))
                 for (edge_type, _), source in sources.items()]
        gpu_budget = budget.resolve(costs, gpu_budget, self.device)  # bytes, or None on a CPU
        gpu_rows = budget.resident_rows(costs, gpu_budget, self.device, hotness, what="edge type")
        for (edge_type, name), source in sources.items():
            table = HybridTensor(source, self.device, gpu_rows=gpu_rows.get(edge_type), max_sms=max_sms,
                                 progress=progress, host_dtype=float32_only(source, host_dtype),
                                 compress=float32_only(source, compress), **options)
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


def float32_only(source, fmt):
    """``fmt`` (a ``host_dtype`` or ``compress`` setting) for a float32 ``source``, None for any other: labels
    and other attributes keep their width."""
    return fmt if str(source.dtype) in ("torch.float32", "float32") else None


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
