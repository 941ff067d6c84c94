"""``attach``: serve node features of an existing ``DGLGraph`` from hmgstore tables.

:func:`attach` re-classes the graph in place to :class:`HybridDGLGraph`, whose
``get_node_storage`` returns a :class:`~hmgstore.plugins.dgl.storage.HybridFeatureStorage`
for the attached keys and DGL's own ``ndata`` column for every other key.
"""
from __future__ import annotations

from collections.abc import Mapping

from hmgstore import HybridTensor

from ._compat import import_dgl
from .storage import HybridFeatureStorage

dgl = import_dgl()


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
    from hmgstore.distributed import ClusterTensor

    if isinstance(table, (HybridTensor, ClusterTensor)):
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
    type, a :class:`hmgstore.distributed.ClusterTensor` (the rows of a graph
    partitioned over machines, ``graph`` the whole topology on every rank;
    fetches are then collective: every rank runs the same batches), or a
    torch CPU tensor / numpy array, wrapped in ``HybridTensor(table, device)``.
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
            if table.shape[0] != graph.num_nodes(name):
                raise ValueError(
                    f"the table for node feature {key!r} of node type {name!r} has {table.shape[0]} rows; "
                    f"the graph has {graph.num_nodes(name)} nodes of that type")
            storages[key, name] = HybridFeatureStorage(table)
    graph.__class__ = HybridDGLGraph
    # A new dict: copies of the graph (g.local_var(), copy.copy) share the old one.
    graph._hmgstore_storages = {**graph.__dict__.get("_hmgstore_storages", {}), **storages}
    return graph
