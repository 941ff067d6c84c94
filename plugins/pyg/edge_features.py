"""Edge attributes on PyG batches drawn from hmgstore's stores: ``batch.edge_attr == data.edge_attr[batch.e_id]``.

PyG's remote-store path joins node attributes only (``filter_custom_store``:
"TODO Support edge features"). :func:`from_data` stores edge attributes as
tables (:mod:`.edge_tables`); the loader keeps its stock class and takes
two of its own hooks from :func:`edge_features`::

    stores = from_data(data)                                  # edge_attr is stored too
    loader = NeighborLoader(stores, [10, 5], input_nodes=train_idx, batch_size=1024,
                            **edge_features(stores))          # <-- batch.edge_attr, or batch[et].edge_attr
    model = GINEConv(..., edge_dim=data.edge_attr.size(1))    # as with the Data

How, per batch (PyG's ``filter_fn`` runs these in order, in one thread):

1. ``transform_sampler_output``: the sampler's ``out.edge`` (CSC positions)
   becomes edge ids with the graph store's permutation, exactly as the
   loader computes ``e_id`` next; the rows of every edge table are queued
   on the feature store;
2. the feature store's one ``gather_many`` for the batch's node attributes
   reads the queued edge rows too (one kernel launch on a GPU);
3. ``transform``: the rows are put on the batch under their attribute names
   (``batch.edge_attr``; ``batch[edge_type].edge_attr`` when heterogeneous),
   after checking they belong to its ``e_id``; then the caller's own
   ``transform``, if given.

If step 1 did not run or its rows did not reach step 3 (another sampler's
permutation, say), step 3 gathers by ``batch.e_id`` itself: one more gather,
the same rows. Works with ``NeighborLoader`` and ``LinkNeighborLoader``,
PyG's sampler or :class:`HybridNeighborSampler` (CPU or GPU), and worker
processes, ``subgraph_type="bidirectional"`` included (PyG keeps the edge
ids of both directions). A sampler that returns no edge ids
(``out.edge`` None) leaves nothing to gather by: ValueError.
"""
from __future__ import annotations

import logging
import threading

import torch

from hmgstore import gather_many

from .edge_tables import drop_queued, queue_edge_rows

log = logging.getLogger("hmgstore.plugins.pyg")
_rides = threading.local()  # .by_owner: {id(EdgeFeatures): (Ride, {edge_type: ids})}


def edge_features(stores, *, transform=None, transform_sampler_output=None) -> dict:
    """Keyword arguments for PyG's ``NeighborLoader``/``LinkNeighborLoader`` that put edge attributes on batches.

    ``stores``: the ``(HybridFeatureStore, graph_store)`` pair the loader
    reads (from :func:`from_data`, or a store filled with
    ``put_edge_tables``). ``transform``, ``transform_sampler_output``: the
    caller's own loader hooks, run after (``transform``) and before
    (``transform_sampler_output``) hmgstore's. Returns ``{"transform": ...,
    "transform_sampler_output": ...}``. Raises ValueError when the feature
    store holds no edge attributes, TypeError for another store.
    """
    hooks = EdgeFeatures(stores, transform=transform, transform_sampler_output=transform_sampler_output)
    return {"transform": hooks, "transform_sampler_output": hooks.queue}


class EdgeFeatures:
    """The loader hooks of :func:`edge_features`: :meth:`queue` (before the join), ``__call__`` (after it).

    Pickles (DataLoader workers) with the stores; a worker gathers from its
    own tables, as the feature store's node gathers do there.

    Args:
        stores: the ``(HybridFeatureStore, graph_store)`` pair the loader reads; the graph store is
            :class:`CSCGraphStore` or any PyG ``GraphStore`` answering ``csc()``.
        transform: None or the caller's own ``transform``, run after the edge rows are put on the batch.
        transform_sampler_output: None or the caller's own hook, run before the rows are queued.

    Raises:
        TypeError: ``stores`` not a pair, a feature store other than hmgstore's, a hook that is not callable.
        ValueError: a feature store that holds no edge attributes; from ``__call__``, a batch without ``e_id``
            (its sampler returned no edge ids).
        KeyError: a graph store that holds no edges of an edge type the feature store has attributes for.
    """

    def __init__(self, stores, *, transform=None, transform_sampler_output=None):
        if not (isinstance(stores, (tuple, list)) and len(stores) == 2):
            raise TypeError("edge_features takes the (feature_store, graph_store) pair the loader reads")
        for name, hook in (("transform", transform), ("transform_sampler_output", transform_sampler_output)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} is the caller's own loader hook, a callable or None; got {hook!r}")
        self.feature_store, graph_store = stores
        if not hasattr(self.feature_store, "edge_tables"):
            raise TypeError(f"edge attributes are held by hmgstore's HybridFeatureStore, not "
                            f"{type(self.feature_store).__name__}")
        tables = self.feature_store.edge_tables()
        if not tables:
            raise ValueError("the feature store holds no edge attributes: build it with from_data(data) from a "
                             "Data whose edge_attr (or another per-edge tensor) is set, or put_edge_tables(...)")
        self.by_type: dict = {}
        for (edge_type, name), table in tables.items():
            self.by_type.setdefault(edge_type, []).append((name, table))
        self.hetero = None not in self.by_type
        self.perm = _permutations(graph_store, list(self.by_type))
        self._perm_on: dict = {}  # (edge type, device) -> the permutation there
        self.transform, self.before = transform, transform_sampler_output

    # ---- before the join --------------------------------------------------------
    def queue(self, out):
        """PyG's ``transform_sampler_output``: queue the batch's edge rows for the node gather; returns ``out``.

        ``out``: a ``SamplerOutput`` (``out.edge`` int [E] CSC positions, on
        the sampler's device, or None) or a ``HeteroSamplerOutput`` (dicts
        by edge type). Never raises for a missing ``edge``: the batch then
        has no ``e_id`` and ``__call__`` says so.
        """
        if self.before is not None:
            out = self.before(out)
        edges = out.edge if isinstance(out.edge, dict) else {None: out.edge}
        requests, ids_of = [], {}
        for edge_type, named in self.by_type.items():
            edge = edges.get(edge_type) if edges else None
            if edge is None:
                continue
            ids = self._edge_ids(edge_type, edge)
            ids_of[edge_type] = ids
            requests.extend(((edge_type, name), table, ids) for name, table in named)
        if requests:
            ride = queue_edge_rows(self.feature_store, requests)
            _rides.__dict__.setdefault("by_owner", {})[id(self)] = (ride, ids_of)
        return out

    def _edge_ids(self, edge_type, edge: torch.Tensor) -> torch.Tensor:
        """Edge ids (int64, on ``edge``'s device) of CSC positions ``edge``, as PyG's loader maps them."""
        edge = edge.to(torch.int64)
        perm = self.perm.get(edge_type)
        if perm is None:
            return edge
        key = (edge_type, edge.device)
        if key not in self._perm_on:
            self._perm_on[key] = perm.to(edge.device)
        return self._perm_on[key][edge]

    # ---- after the join -----------------------------------------------------------
    def __call__(self, data):
        """PyG's ``transform``: put the edge rows on ``data`` (a ``Data`` or ``HeteroData`` batch), then the
        caller's transform. Rows are ``[num_sampled_edges, *row_shape]`` of each table's dtype, on the feature
        store's device. Raises ValueError when the batch has no ``e_id`` (the sampler returned no edge ids)."""
        ride, ids_of = (_rides.__dict__.get("by_owner") or {}).pop(id(self), (None, {}))
        drop_queued(self.feature_store)  # a ride the node gather never took
        got = iter(ride.rows) if ride is not None and ride.rows is not None else None
        missing = []  # (edge type, name, table, e_id) gathered here
        for edge_type, named in self.by_type.items():
            store = data if not self.hetero else data[edge_type]
            e_id = store.get("e_id") if hasattr(store, "get") else getattr(store, "e_id", None)
            queued = got is not None and edge_type in ids_of
            rows = [next(got) for _ in named] if queued else None
            if e_id is None:
                if self.hetero and "edge_index" not in store:  # no edge of this type was sampled
                    for name, table in named:
                        store[name] = torch.empty((0, *table.row_shape), dtype=table.dtype,
                                                  device=self.feature_store.device)
                    continue
                raise ValueError("the batch has no e_id, so its edge attributes cannot be fetched: the sampler "
                                 "returned no edge ids (its output's edge is None)")
            if rows is not None and not _same_edges(ids_of[edge_type], e_id):
                log.warning("hmgstore: the batch's e_id is not the edge ids the graph store's permutation gives; "
                            "edge attributes are gathered again by e_id (the sampler uses another edge order)")
                rows = None
            if rows is None:
                missing.extend((edge_type, name, table, e_id) for name, table in named)
            else:
                for (name, _), r in zip(named, rows):
                    store[name] = r
        if missing:
            self._gather(data, missing)
        return data if self.transform is None else self.transform(data)

    def _gather(self, data, missing: list) -> None:
        """One gather of ``missing`` (``(edge type, name, table, e_id)``) by ``e_id``, onto ``data``."""
        in_worker = torch.utils.data.get_worker_info() is not None
        tables = self.feature_store.worker_tables() if in_worker else None  # CPU tables of this worker
        requests = [(tables.get(("edge", et, name), table) if tables is not None else table, e_id)
                    for et, name, table, e_id in missing]
        for (edge_type, name, _, _), rows in zip(missing, gather_many(requests)):
            (data if not self.hetero else data[edge_type])[name] = rows

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_perm_on"] = {}
        return state

    def __repr__(self) -> str:
        return f"EdgeFeatures({sorted(self.feature_store.edge_tables(), key=str)})"


def _same_edges(ids: torch.Tensor, e_id: torch.Tensor) -> bool:
    """Whether the ids queued are the batch's ``e_id``: same count; same values when both are on the CPU
    (on a GPU the comparison would wait for it, and both come from the same permutation there)."""
    if ids.numel() != e_id.numel():
        return False
    if ids.device.type == "cpu" and e_id.device.type == "cpu":
        return torch.equal(ids, e_id.to(torch.int64))
    return True


def _permutations(graph_store, edge_types: list) -> dict:
    """Edge type -> CSC position to edge id (int64 CPU, or None: the identity), from the graph store."""
    if hasattr(graph_store, "edges"):  # hmgstore's CSCGraphStore: what it holds, no conversion
        return {et: graph_store.edges(et).perm for et in edge_types}
    _, _, perm = graph_store.csc()
    return perm if isinstance(perm, dict) else {None: perm}
