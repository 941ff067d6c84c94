"""``attach``: serve node (and edge) features of an existing ``DGLGraph`` from hmgstore tables.

:func:`attach` re-classes the graph in place to :class:`HybridDGLGraph`, whose
``get_node_storage``/``get_edge_storage`` return a
:class:`~hmgstore.plugins.dgl.storage.HybridFeatureStorage` for the attached
keys and DGL's own ``ndata``/``edata`` column for every other key; its
``ndata``/``edata`` read attached keys through their tables (:mod:`.views`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from hmgstore import FeatureTable, HybridTensor, resolve_device
from hmgstore.rows import checks

from ._compat import import_dgl
from .attached_keys import detach, grown, not_stale, popped, same_rows, written
from .renumber import edges_moved, tag_edges, untag_edges
from .storage import HybridFeatureStorage
from .subgraphs import CarriesAttached
from .views import AttachedEdgeDataView, AttachedNodeDataView

dgl: Any = import_dgl()  # untyped: its classes are subclassed here


class HybridDGLGraph(CarriesAttached, dgl.DGLGraph):
    """A ``DGLGraph`` some of whose node features are served by hmgstore tables.

    Made by :func:`attach`, which re-classes an existing graph; everything
    else is DGL's. Pickles (with its tables) and works in DataLoader workers.
    ``g.ndata[key]``/``g.edata[key]`` (and ``g.srcdata``/``g.dstdata``) of an
    attached key that the graph's frames lack read the whole table
    (:mod:`hmgstore.plugins.dgl.views`); a key the frames have is served
    from them, to the loader too. ``local_scope`` undoes attach and detach
    inside it, as it undoes DGL's own writes. Its subgraph methods (``subgraph``, ``sample_neighbors``, ...)
    carry the attached features to the new graph as DGL carries ``ndata`` (:mod:`.subgraphs`).

    What reads only the graph's frames does not see attached keys: message
    passing (``update_all``, ``apply_edges``, ``apply_nodes``: copy
    ``g.ndata[key]`` into a plain key first) and a heterograph's
    ``g.nodes[ntype].data`` (read ``g.ndata[key][ntype]``), both DGL's
    KeyError; ``dgl.to_half``/``to_float``/``to_double`` cast the frames,
    not the tables (cast the table and attach it again); ``dgl.save_graphs``
    refuses the class (save ``dgl.graph(g.edges(), num_nodes=...)`` and the
    tables apart, and attach again after loading).

    ``remove_nodes``/``remove_edges`` renumber the ids that name the
    attached tables' rows, so they mark stale the node features of the
    types whose nodes they removed and the edge features of every type
    whose edges they removed or moved to other ids (removing nodes, of any
    type, rebuilds every edge type from a CSR or CSC, which can reorder the
    edges' ids at the same count: each edge's old id is carried through the
    removal as DGL carries ``g.edata``); ``attach`` again serves them anew.

    Raises:
        ValueError: from ``get_node_storage``/``get_edge_storage`` (what DGL's DataLoader calls before every
            fetch), an attached feature whose ids the graph renumbered since ``attach`` (``remove_nodes``,
            ``remove_edges``), or whose table's row count no longer matches the graph's nodes or edges
            (``add_nodes``, ...); an attached feature asked for through DGL's ``gpu_cache``.
            From a write of some rows of an attached feature (``g.nodes[ids].data[key] = ...``); a whole
            write (``g.ndata[key] = x``) or ``del``/``pop`` detaches the key instead, as DGL's last write wins.
        RuntimeError: from ``get_node_storage``/``get_edge_storage`` and ``g.ndata[key]``, the decoded copy
            that ``g.ndata[key]`` returned for a compressed or read-only table edited in place
            (:meth:`HybridFeatureStorage.whole`).
        KeyError: a key neither attached nor in ``g.ndata``/``g.edata`` (DGL's own).
        dgl.DGLError: a node or edge type the graph does not have (DGL's own).
    """

    def add_nodes(self, num, data=None, ntype=None):
        """DGL's ``add_nodes``; ``data`` for an attached feature is refused (ValueError: see
        :func:`~hmgstore.plugins.dgl.attached_keys.grown`)."""
        grown(self, "_hmgstore_storages", "node", self.ntypes[self.get_ntype_id(ntype)], data, "add_nodes")
        return super().add_nodes(num, data, ntype)

    def add_edges(self, u, v, data=None, etype=None):
        """DGL's ``add_edges``; ``data`` for an attached feature is refused (ValueError: see
        :func:`~hmgstore.plugins.dgl.attached_keys.grown`)."""
        canonical = self.canonical_etypes[self.get_etype_id(etype)]
        grown(self, "_hmgstore_edge_storages", "edge", canonical, data, "add_edges")
        return super().add_edges(u, v, data, etype)

    def remove_nodes(self, *args, **kwargs):
        """DGL's ``remove_nodes``; the attached features of the node and edge types it renumbered go stale. A
        keyword DGL's does not take raises TypeError naming this method (and the closest one)."""
        checks.keywords("HybridDGLGraph.remove_nodes", kwargs, checks.takes(dgl.DGLGraph.remove_nodes))
        return self._renumbering(super().remove_nodes, *args, **kwargs)

    def remove_edges(self, *args, **kwargs):
        """DGL's ``remove_edges``; the attached features of the edge type it renumbered go stale. A keyword DGL's
        does not take raises TypeError naming this method (and the closest one)."""
        checks.keywords("HybridDGLGraph.remove_edges", kwargs, checks.takes(dgl.DGLGraph.remove_edges))
        return self._renumbering(super().remove_edges, *args, **kwargs)

    def _renumbering(self, remove, *args, **kwargs):
        nodes = {t: self.num_nodes(t) for t in self.ntypes}
        edge_types = sorted({etype for _, etype in self.__dict__.get("_hmgstore_edge_storages", {})}, key=str)
        edges = {etype: self.num_edges(etype) for etype in edge_types}
        frames, tagged = self._edge_frames, None
        self._hmgstore_renumbering = True  # DGL removes through subgraph(): the tables are marked stale, not carried
        try:
            tagged = tag_edges(self, edge_types)
            result = remove(*args, **kwargs)
            moved = {etype: edges_moved(self, etype, edges[etype]) for etype in edge_types}
        finally:
            untag_edges(self, frames, tagged)
            self.__dict__.pop("_hmgstore_renumbering", None)
        stale = dict(self.__dict__.get("_hmgstore_stale", {}))  # a new dict: copies of the graph keep theirs
        for (key, ntype) in self.__dict__.get("_hmgstore_storages", {}):
            if self.num_nodes(ntype) != nodes[ntype]:  # DGL keeps the nodes left in order: same count, same ids
                stale[("node", key, ntype)] = f"g.remove_nodes renumbered the nodes of type {ntype!r}"
        for (key, etype) in self.__dict__.get("_hmgstore_edge_storages", {}):
            if moved[etype] is not None:
                stale[("edge", key, etype)] = f"g.{remove.__name__} renumbered the edges of type {etype}{moved[etype]}"
        self._hmgstore_stale = stale
        return result

    def _set_n_repr(self, ntid, u, data):
        """DGL's node-feature write; writing a whole attached key detaches it (the new tensor wins, as in DGL)."""
        name = self.ntypes[ntid]
        written(self, "_hmgstore_storages", "node", name, u, data, f"node type {name!r}")
        super()._set_n_repr(ntid, u, data)
        detach(self, "_hmgstore_storages", "node", name, data)

    def _set_e_repr(self, etid, edges, data):
        """DGL's edge-feature write; writing a whole attached key detaches it (the new tensor wins, as in DGL)."""
        canonical = self.canonical_etypes[etid]
        written(self, "_hmgstore_edge_storages", "edge", canonical, edges, data, f"edge type {canonical}")
        super()._set_e_repr(etid, edges, data)
        detach(self, "_hmgstore_edge_storages", "edge", canonical, data)

    def _pop_n_repr(self, ntid, key):
        """DGL's ``del g.ndata[key]``/``pop``: detaches an attached key, and drops the frame's column if any."""
        return popped(self, "_hmgstore_storages", "node", self.ntypes[ntid], self._node_frames[ntid], key)

    def _pop_e_repr(self, etid, key):
        """DGL's ``del g.edata[key]``/``pop``: detaches an attached key, and drops the frame's column if any."""
        canonical = self.canonical_etypes[etid]
        return popped(self, "_hmgstore_edge_storages", "edge", canonical, self._edge_frames[etid], key)

    @property
    def ndata(self):
        """DGL's ``ndata``, reading attached keys through their tables (see :mod:`hmgstore.plugins.dgl.views`)."""
        return _node_view(self, self.ntypes, self.get_ntype_id)

    @property
    def edata(self):
        """DGL's ``edata``, reading attached keys through their tables (see :mod:`hmgstore.plugins.dgl.views`)."""
        if len(self.canonical_etypes) == 1:
            return AttachedEdgeDataView(self, None, dgl.ALL)
        return AttachedEdgeDataView(self, self.canonical_etypes, dgl.ALL)

    @property
    def srcdata(self):
        """DGL's ``srcdata`` (``ndata`` of the source node types), reading attached keys as ``ndata`` does."""
        return _node_view(self, self.srctypes, self.get_ntype_id_from_src)

    @property
    def dstdata(self):
        """DGL's ``dstdata`` (``ndata`` of the destination node types), reading attached keys as ``ndata`` does."""
        return _node_view(self, self.dsttypes, self.get_ntype_id_from_dst)

    @contextlib.contextmanager
    def local_scope(self):
        """DGL's ``local_scope``, which also undoes what ``attach`` and the detaching writes did inside it.

        DGL restores the graph's frames on leaving the scope; the attached keys
        live beside them, so they are restored too: a key detached inside
        (``g.ndata[key] = x``, as DGL's ``SAGEConv``/``GraphConv`` write
        ``srcdata`` inside their scope, or ``del``) is attached again after it,
        and a key attached inside is detached again, its old ``g.ndata`` column
        back. Raises what the body raises (the graph restored all the same).
        Renumbering inside (``remove_nodes``) is not undone, by DGL either,
        so the stale marks it left stay.
        """
        saved = {name: self.__dict__.get(name) for name in _STATE}
        stale = self.__dict__.get("_hmgstore_stale", {})
        try:
            with super().local_scope():
                yield
        finally:
            for name, value in saved.items():
                if value is None:
                    self.__dict__.pop(name, None)
                else:
                    setattr(self, name, value)
            self._hmgstore_stale = {**stale, **self.__dict__.get("_hmgstore_stale", {})}

    def get_edge_storage(self, key, etype=None):
        """Where DGL fetches edge feature ``key`` of ``etype`` from: the graph's own ``edata`` column if it has
        one (as ``g.edata`` reads it), else the attached table."""
        attached = self.__dict__.get("_hmgstore_edge_storages")
        if attached:
            etid = self.get_etype_id(etype)
            canonical = self.canonical_etypes[etid]
            storage = attached.get((key, canonical))
            if storage is not None and key not in self._edge_frames[etid].keys():
                storage._unedited(f"g.edata[{key!r}]")
                same_rows(storage, self.num_edges(canonical), f"edge feature {key!r} of edge type {canonical}", "edges")
                not_stale(self, ("edge", key, canonical), f"edge feature {key!r} of edge type {canonical}")
                if any(k == key for k, _ in getattr(self, "_gpu_caches", {}).get("edge", {})):
                    raise ValueError(f"edge feature {key!r} is served by hmgstore, which does not work with DGL's "
                                     "gpu_cache (it needs fetch() to return a tensor)")
                return storage
        return super().get_edge_storage(key, etype)

    def get_node_storage(self, key, ntype=None):
        """Where DGL fetches node feature ``key`` of ``ntype`` from: the graph's own ``ndata`` column if it has
        one (as ``g.ndata`` reads it; ``attach`` inside a plain graph's ``local_scope`` leaves both), else the
        attached table."""
        attached = self.__dict__.get("_hmgstore_storages")
        if attached:
            ntid = self.get_ntype_id(ntype)
            name = self.ntypes[ntid]
            storage = attached.get((key, name))
            if storage is not None and key not in self._node_frames[ntid].keys():
                storage._unedited(f"g.ndata[{key!r}]")
                same_rows(storage, self.num_nodes(name), f"node feature {key!r} of node type {name!r}", "nodes")
                not_stale(self, ("node", key, name), f"node feature {key!r} of node type {name!r}")
                if (key, name) in getattr(self, "_gpu_caches", {}).get("node", {}):
                    raise ValueError(
                        f"node feature {key!r} is served by hmgstore, which does not work with DGL's "
                        "gpu_cache (it needs fetch() to return a tensor). Keep hot rows on the GPU with "
                        "HybridTensor(x, 'cuda', gpu_budget=..., hot_order=...) instead of gpu_cache")
                return storage
        return super().get_node_storage(key, ntype)

    def __repr__(self) -> str:
        attached = sorted(self.__dict__.get("_hmgstore_storages", {}))
        edges = sorted(self.__dict__.get("_hmgstore_edge_storages", {}), key=str)
        return (f"{super().__repr__()}\n      hmgstore node features (key, ntype)={attached}"
                + (f"\n      hmgstore edge features (key, etype)={edges}" if edges else ""))


#: The adapter's state beside DGL's frames: what ``local_scope`` saves and restores (stale marks it merges).
_STATE = ("_hmgstore_storages", "_hmgstore_edge_storages")


def _node_view(graph, ntypes: list, type_id) -> AttachedNodeDataView:
    """``g.ndata``-like view of ``ntypes`` (``type_id``: the graph's ``get_ntype_id`` or its src/dst variant)."""
    if len(ntypes) == 1:
        return AttachedNodeDataView(graph, ntypes[0], type_id(ntypes[0]), dgl.ALL)
    return AttachedNodeDataView(graph, list(ntypes), [type_id(t) for t in ntypes], dgl.ALL)


def _node_type(graph, ntype, key: str) -> str:
    try:
        return graph.ntypes[graph.get_ntype_id(ntype)]
    except dgl.DGLError:
        if ntype is None:
            raise ValueError(
                f"the graph has node types {graph.ntypes}: attach node feature {key!r} per type, "
                f"as {{{key!r}: {{ntype: table, ...}}}}") from None
        raise ValueError(f"node type {ntype!r} (of node feature {key!r}) is not one of {graph.ntypes}") from None


def _as_table(table, device) -> FeatureTable:
    if isinstance(table, FeatureTable):  # any kind of hmgstore table (hmgstore.FeatureTable)
        return table
    try:
        return HybridTensor(table, device)
    except TypeError as err:
        raise TypeError(f"attach takes hmgstore tables (any FeatureTable), torch CPU tensors or numpy arrays: "
                        f"{err}") from None


def attach(graph, features: Mapping | None = None, *, edata: Mapping | None = None, device=None):
    """Serve node (and edge) features of ``graph`` from hmgstore tables, for DGL's DataLoader.

    ``graph``: a ``dgl.DGLGraph`` (not a block or a subclass of DGLGraph); it
    is changed in place into a :class:`HybridDGLGraph` and returned, so
    ``attach(g, ...)`` alone is enough.
    ``features``: ``{key: table}`` for a graph with one node type, or
    ``{key: {ntype: table, ...}}`` per node type (as ``g.ndata[key] = {...}``).
    A table is a :class:`hmgstore.HybridTensor` with one row per node of its
    type, a :class:`hmgstore.distributed.ClusterTensor` (the rows of a graph
    partitioned over machines, ``graph`` the whole topology on every rank;
    fetches are then collective: every rank runs the same batches), or a
    torch CPU tensor / numpy array, wrapped in ``HybridTensor(table, device)``.
    ``edata``: edge features the same way, ``{key: table}`` or ``{key:
    {etype: table}}`` (``etype`` a name or a canonical ``(src, rel, dst)``),
    one row per edge in the graph's edge-id order (``g.edata``'s order: the
    ids DGL's blocks carry as ``dgl.EID``); the sampler's
    ``prefetch_edge_feats=[key]`` then fetches them in the same gather as
    the node features.
    ``device``: for wrapped tables only; None means the current GPU if torch
    sees one, else the CPU. A device that does not exist raises, as for
    every table, even where every table is already a HybridTensor.

    ``g.ndata[key]``/``g.edata[key]`` keep working: a key the graph's frames
    lack reads the whole table (:mod:`hmgstore.plugins.dgl.views`).

    Attached keys replace ``g.ndata``/``g.edata`` columns of the same name
    (dropped from the graph's frames); other keys keep coming from
    ``g.ndata``. Calling ``attach`` again adds or replaces keys. Afterwards,
    as in DGL, the last write wins: ``g.ndata[key] = x`` (all nodes) detaches
    ``key`` and the loader serves ``x``; ``del g.ndata[key]``/``pop`` detaches
    it; writing some rows of an attached key (``g.nodes[ids].data[key] = ...``)
    raises ValueError. Same for ``g.edata``. Raises TypeError for other graph or table types and
    ValueError for unknown node types or a row count that does not match the
    graph; nothing changes then. A graph changed in place afterwards
    (``g.remove_nodes``, ``g.add_edges``) so that an attached table's rows
    no longer match its nodes or edges makes the next fetch of that feature
    raise ValueError (attach the tables again).
    """
    if type(graph) not in (dgl.DGLGraph, HybridDGLGraph):
        raise TypeError(f"attach takes a dgl.DGLGraph (not a block or subclass), got {type(graph).__name__}")
    if features is None and edata is None or features is not None and not isinstance(features, Mapping):
        raise TypeError("features must be a dict {key: table} or {key: {ntype: table}} (or pass edata=)")
    if edata is not None and not isinstance(edata, Mapping):
        raise TypeError("edata must be a dict {key: table} or {key: {etype: table}}")
    if not features and not edata:
        raise TypeError("nothing to attach: features (and edata) are empty")
    device = None if device is None else resolve_device(device)  # checked even when no table needs it
    storages, edge_storages = {}, _edge_storages(graph, edata or {}, device)
    features = features or {}
    for key, value in features.items():
        if not isinstance(key, str):
            raise TypeError(f"feature keys are strings (as in g.ndata), got {key!r}")
        for ntype, table in (value.items() if isinstance(value, Mapping) else [(None, value)]):
            name = _node_type(graph, ntype, key)
            table = _as_table(table, device)
            if table.shape[0] != graph.num_nodes(name):
                raise ValueError(
                    f"the table for node feature {key!r} of node type {name!r} has {table.shape[0]} rows; "
                    f"the graph has {graph.num_nodes(name)} nodes of that type")
            storages[key, name] = HybridFeatureStorage(table)
    _drop_shadowed(graph, storages, edge_storages)
    graph.__class__ = HybridDGLGraph
    # A new dict: copies of the graph (g.local_var(), copy.copy) share the old one.
    graph._hmgstore_storages = {**graph.__dict__.get("_hmgstore_storages", {}), **storages}
    graph._hmgstore_edge_storages = {**graph.__dict__.get("_hmgstore_edge_storages", {}), **edge_storages}
    graph._hmgstore_stale = {k: v for k, v in graph.__dict__.get("_hmgstore_stale", {}).items()
                             if (k[1], k[2]) not in (storages if k[0] == "node" else edge_storages)}
    return graph


def _drop_shadowed(graph, storages: dict, edge_storages: dict) -> None:
    """Drop the frames' columns that newly attached keys replace, so ``g.ndata``/``g.edata`` read what the
    loader serves. The frames are shallow copies in new lists, so copies of the graph keep their columns."""
    for attr, keys, type_id in (("_node_frames", storages, graph.get_ntype_id),
                                ("_edge_frames", edge_storages, graph.get_etype_id)):
        shadowed = [(key, type_id(t)) for key, t in keys if key in getattr(graph, attr)[type_id(t)].keys()]
        if shadowed:
            frames = [frame.clone() for frame in getattr(graph, attr)]
            for key, i in shadowed:
                frames[i].pop(key)
            setattr(graph, attr, frames)


def _edge_storages(graph, edata: Mapping, device) -> dict:
    """``{(key, canonical etype): HybridFeatureStorage}`` of ``attach``'s ``edata``, each table checked."""
    storages = {}
    for key, value in edata.items():
        if not isinstance(key, str):
            raise TypeError(f"edge feature keys are strings (as in g.edata), got {key!r}")
        for etype, table in (value.items() if isinstance(value, Mapping) else [(None, value)]):
            try:
                canonical = graph.to_canonical_etype(etype) if etype is not None else graph.canonical_etypes[
                    graph.get_etype_id(None)]
            except dgl.DGLError:
                raise ValueError(f"edge type {etype!r} (of edge feature {key!r}) is not one of "
                                 f"{graph.canonical_etypes}; with several edge types attach "
                                 f"{{{key!r}: {{etype: table}}}}") from None
            table = _as_table(table, device)
            if table.shape[0] != graph.num_edges(canonical):
                raise ValueError(f"the table for edge feature {key!r} of {canonical} has {table.shape[0]} rows; the "
                                 f"graph has {graph.num_edges(canonical)} edges of that type")
            storages[key, canonical] = HybridFeatureStorage(table)
    return storages
