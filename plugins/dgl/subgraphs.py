"""Subgraphs of an attached graph carry its attached features, as DGL's carry ``g.ndata``/``g.edata``.

DGL's ``g.subgraph``, ``g.edge_subgraph``, ``g.in_subgraph``,
``g.out_subgraph``, ``g.khop_in_subgraph``/``khop_out_subgraph`` and
``g.sample_neighbors`` hand the new graph the parent's features: the same
tensors where it keeps every node (``sample_neighbors``, ``in_subgraph``),
else lazy slices by the parent's ids (``dgl.NID``, ``dgl.EID``), copied when
read. The attached keys live beside the frames, so :class:`CarriesAttached`
(a base of :class:`~hmgstore.plugins.dgl.HybridDGLGraph`) does the same for
them: a result that keeps every node of a type (and its ids) serves that
type's attached node keys from the same tables, attached to it; otherwise
each attached key becomes a column of the result's frames: a lazy slice of
the table's host rows by the parent's ids where those are its rows as read
(:meth:`~hmgstore.plugins.dgl.storage.HybridFeatureStorage.whole` without a
copy), else the result's rows gathered at once (a table stored compressed,
laid out or read-only: never a decoded copy of every row for a few).
A key the parent cannot serve any more (renumbered or resized since
``attach``: it refuses them itself) and a ClusterTensor's (its rows live on
several machines: read ``table[sg.ndata[dgl.NID]]``) are not carried.
The module functions (``dgl.node_subgraph(g, ...)``) are DGL's alone:
call the methods.
"""
from __future__ import annotations

import inspect
from typing import Any

from ._compat import import_dgl
from .storage import _cluster_tensor

dgl: Any = import_dgl()
_Column: Any = __import__("dgl.frame", fromlist=["Column"]).Column
_SAMPLE = inspect.signature(dgl.DGLGraph.sample_neighbors)
_FIRST_COPY_FLAG = list(_SAMPLE.parameters).index("copy_ndata") - 1  # its position after self


class CarriesAttached:
    """The subgraph methods of :class:`~hmgstore.plugins.dgl.HybridDGLGraph`: DGL's, whose results also carry
    the attached features (see the module docstring). Each takes and returns what DGL's does."""

    def subgraph(self, *args, **kwargs):
        return _with_ids(self, super().subgraph, args, kwargs)  # type: ignore[misc]

    def edge_subgraph(self, *args, **kwargs):
        return _with_ids(self, super().edge_subgraph, args, kwargs)  # type: ignore[misc]

    def in_subgraph(self, *args, **kwargs):
        return _with_ids(self, super().in_subgraph, args, kwargs)  # type: ignore[misc]

    def out_subgraph(self, *args, **kwargs):
        return _with_ids(self, super().out_subgraph, args, kwargs)  # type: ignore[misc]

    def khop_in_subgraph(self, *args, **kwargs):
        return _with_ids(self, super().khop_in_subgraph, args, kwargs)  # type: ignore[misc]

    def khop_out_subgraph(self, *args, **kwargs):
        return _with_ids(self, super().khop_out_subgraph, args, kwargs)  # type: ignore[misc]

    def sample_neighbors(self, *args, **kwargs):
        # copy_ndata/copy_edata, however passed: by keyword unless they come by position (DGL's samplers call this
        # every hop of every batch, with keywords: the signature is bound only when it must be)
        given = kwargs if len(args) <= _FIRST_COPY_FLAG else _SAMPLE.bind(self, *args, **kwargs).arguments
        result = super().sample_neighbors(*args, **kwargs)  # type: ignore[misc]
        return carry(self, result, given.get("copy_ndata", True), given.get("copy_edata", True))


def _with_ids(graph, method, args: tuple, kwargs: dict):
    """``method(*args, **kwargs)`` with the result carrying the attached features: run with ``store_ids`` (the
    parent's ids name the rows), which are dropped again afterwards when the caller asked for none."""
    if graph.__dict__.get("_hmgstore_renumbering"):  # inside remove_nodes/remove_edges: they mark the keys stale
        return method(*args, **kwargs)
    store_ids = kwargs.pop("store_ids", True)
    result = method(*args, store_ids=True, **kwargs)
    subgraph = result[0] if isinstance(result, tuple) else result  # khop_*: (subgraph, inverse indices)
    carry(graph, subgraph, True, True)
    if not store_ids:
        for frame in (*subgraph._node_frames, *subgraph._edge_frames):
            for name in (dgl.NID, dgl.EID):
                if name in frame.keys():
                    frame.pop(name)
    return result


def carry(parent, result, nodes: bool, edges: bool):
    """``result`` (a graph made from ``parent`` by DGL) with ``parent``'s attached node keys (if ``nodes``) and
    edge keys (if ``edges``) carried over; returned, re-classed to ``parent``'s class when it serves some."""
    storages = parent.__dict__.get("_hmgstore_storages", {}) if nodes else {}
    same: dict = {}
    for (key, ntype), storage in storages.items():
        ntid = result.get_ntype_id(ntype)
        frame = result._node_frames[ntid]
        if key in frame.keys() or key in parent._node_frames[parent.get_ntype_id(ntype)].keys():
            continue  # DGL's own column: DGL carried it
        if dgl.NID not in frame.keys() and result.num_nodes(ntype) == parent.num_nodes(ntype):
            same[key, ntype] = storage  # every node, same ids: the same table serves it
        elif dgl.NID in frame.keys():
            _column(parent.get_node_storage, key, ntype, frame, frame[dgl.NID])
    for key, etype in parent.__dict__.get("_hmgstore_edge_storages", {}) if edges else ():
        frame = result._edge_frames[result.get_etype_id(etype)]
        if key not in frame.keys() and dgl.EID in frame.keys():
            _column(parent.get_edge_storage, key, etype, frame, frame[dgl.EID])
    if same:
        stale = parent.__dict__.get("_hmgstore_stale", {})
        result.__class__ = type(parent)
        result._hmgstore_storages = same
        result._hmgstore_edge_storages = {}
        result._hmgstore_stale = {k: v for k, v in stale.items() if k[0] == "node" and (k[1], k[2]) in same}
    return result


def _column(served, key: str, type_, frame, ids) -> None:
    """Add to ``frame`` the attached ``key``'s rows ``ids`` (the parent's): a lazy DGL column over the whole
    table where that is the host tier itself (no copy), else those rows gathered now (a table stored compressed,
    laid out or read-only has no whole tensor but a decoded copy of every row: a subgraph of three nodes of a
    57 GB table must not make one); nothing when the parent would refuse to serve the key (renumbered or
    resized since attach) or has no whole table of it (a ClusterTensor)."""
    try:
        storage = served(key, type_)
        table = storage.table
        if isinstance(table, _cluster_tensor()):  # rows on several machines: read table[sg.ndata[dgl.NID]]
            return
        free = storage._whole is not None or (table.host_format is None and table.layout is None
                                              and not table.read_only)
        if not free:
            frame[key] = storage.fetch(ids, ids.device).wait()
            return
        rows = storage.whole(key)
    except (ValueError, KeyError):
        return
    frame._columns[key] = _Column(rows).subcolumn(ids.to(rows.device))
