"""The attached keys of a :class:`~hmgstore.plugins.dgl.graph.HybridDGLGraph`: when a table may serve a key, and
what each of DGL's writes, pops and growths does to it."""
from __future__ import annotations

from typing import Any

from ._compat import import_dgl

dgl: Any = import_dgl()


def same_rows(storage, count: int, what: str, unit: str) -> None:
    """Refuse to serve a table whose rows no longer match the graph (changed in place after ``attach``)."""
    rows = storage.table.shape[0]
    if rows != count:
        raise ValueError(f"the graph has {count} {unit} now, but the table attached for {what} has {rows} rows: "
                         f"the graph changed after attach (g.remove_nodes, g.add_edges, ...), so its ids no longer "
                         "name the table's rows. Call attach(g, ...) again with tables for the graph as it is")


def not_stale(graph, which: tuple, what: str) -> None:
    """Refuse to serve a table whose rows the graph's ids stopped naming (renumbered after ``attach``)."""
    why = graph.__dict__.get("_hmgstore_stale", {}).get(which)
    if why is not None:
        raise ValueError(f"{why} after attach, so its ids no longer name the rows of the table attached for "
                         f"{what}; call attach(g, ...) again with tables for the graph as it is")


def written(graph, attr: str, kind: str, type_, ids, data, where: str) -> None:
    """Refuse a write of some rows (``g.nodes[ids].data[key] = ...``) to an attached key: the table would keep
    serving the old rows to the loader. A whole write (``g.ndata[key] = x``) detaches the key instead."""
    if isinstance(ids, str) and ids == dgl.ALL:  # DGL's is_all
        return
    attached = graph.__dict__.get(attr, {})
    for key in data:
        if (key, type_) in attached:
            raise ValueError(f"{kind} feature {key!r} of {where} is served by an attached hmgstore table, so "
                             f"writing some of its rows would not reach the DataLoader: assign the whole "
                             f"feature (g.{kind[0]}data[{key!r}] = x, which replaces the table), or call "
                             f"attach(g, ...) again with the updated table")


def detach(graph, attr: str, kind: str, type_, keys) -> None:
    """Stop serving ``keys`` of ``type_`` from attached tables (new dicts: copies of the graph keep theirs)."""
    attached = graph.__dict__.get(attr, {})
    if not any((key, type_) in attached for key in keys):
        return
    setattr(graph, attr, {k: v for k, v in attached.items() if not (k[1] == type_ and k[0] in keys)})
    graph._hmgstore_stale = {k: v for k, v in graph.__dict__.get("_hmgstore_stale", {}).items()
                             if not (k[0] == kind and k[2] == type_ and k[1] in keys)}


def popped(graph, attr: str, kind: str, type_, frame, key):
    """``_pop_*_repr``: the frame's column (DGL's pop), else the attached table; the key detached."""
    storage = graph.__dict__.get(attr, {}).get((key, type_))
    if storage is None or key in frame.keys():
        value = frame.pop(key)  # DGL's own KeyError for a key neither attached nor in the frame
    else:
        value = storage.table  # DGL's views discard it; reading it whole could copy a large table
    detach(graph, attr, kind, type_, [key])
    return value


def grown(graph, attr: str, kind: str, type_, data, method: str) -> None:
    """Refuse ``g.add_nodes``/``g.add_edges`` with ``data`` for an attached key of ``type_``: DGL stores the new
    rows in the graph's own column, beside zeros for every existing node or edge, and that column would then hide
    the attached table's rows from ``g.ndata`` and the loader. Without data for the key, the graph grows and the
    table is refused when next read (:func:`same_rows`)."""
    attached = graph.__dict__.get(attr, {})
    for key in data or ():
        if (key, type_) in attached:
            raise ValueError(f"{kind} feature {key!r} of {kind} type {type_!r} is served by an attached hmgstore "
                             f"table, which g.{method} cannot grow: DGL would keep the new rows beside zeros for "
                             f"every existing {kind}, hiding the table's rows. Add the {kind}s without {key!r} in "
                             f"data, then call attach(g, ...) again with a table for the graph as it is")
