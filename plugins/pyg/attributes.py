"""Which attributes of a PyG ``Data``/``HeteroData`` the stores hold, each checked against its graph's size.

A feature store serves node attributes: tensors with one row per node. PyG
classifies an attribute by its first size alone, so a node attribute of the
wrong length (an ``x`` of 900 rows for 1,000 nodes) silently becomes a
graph-level one that no batch carries, and the user meets ``batch.x is
None`` much later. Here every attribute is read as what its name and
shape say it is, and one that fits nothing raises ValueError naming it,
both sizes and the way out:

- node attributes: tensors or numpy arrays with one row per node: stored;
- edge attributes (``'edge'`` in the name, or one row per edge, as PyG
  reads them; every tensor of a ``HeteroData`` edge type): one row per
  edge, stored as edge tables (PyG's loaders fetch only node attributes from
  a feature store; :func:`hmgstore.plugins.pyg.edge_features` puts them on
  batches); those the caller leaves out are named in a warning, so that
  their absence from batches is not a surprise;
- left alone, never stored: the topology (``edge_index``, ``adj_t``,
  ``adj``), index tensors (a name with ``index`` in it, or ``face``: PyG
  concatenates those along their last dimension; they hold node ids, not
  rows), link-level supervision (``edge_label``, ``edge_label_time``: given
  to ``LinkNeighborLoader``, not stored), graph-level scalars (0-d tensors)
  and values that are not arrays (``num_nodes``, numbers, strings, lists).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger("hmgstore.plugins.pyg")

_TOPOLOGY = ("edge_index", "adj_t", "adj")


def node_attributes(store, names, *, num_nodes: int, num_edges: int | None, where: str, ref: str = "data",
                    strict: bool = True, edges: dict | None = None) -> dict:
    """The node attributes of a ``Data`` or of one node type's store, by name, each checked.

    ``store``: a PyG ``Data``, or ``HeteroData[node_type]`` (then
    ``num_edges`` is None: a node store holds no edges). ``names``: the
    attributes to store (None: every node attribute). ``where``, ``ref``:
    how the messages name the store in words and in code (``"the Data"``,
    ``"data"``; ``"node type 'paper'"``, ``"data['paper']"``).
    ``strict``: every name must be present (a ``HeteroData``'s node types may
    each hold only some). Returns ``{name: tensor or array}``, the caller's
    objects, uncopied. Raises KeyError for a missing name, ValueError for an
    attribute whose rows match neither the node count nor (edge attributes)
    the edge count. ``edges``: a dict that receives the edge attributes
    found (``{name: value}``, only when ``names`` is None); without it they
    are named in a warning, as left out.
    """
    if names is not None:
        missing = [n for n in names if n not in store]
        if missing and strict:
            raise KeyError(f"attributes {missing} are not in {where} (it holds {list(store.keys())})")
        found = {n: store[n] for n in names if n in store}
        for name, value in found.items():
            if not _is_array(value) or value.ndim == 0 or value.shape[0] != num_nodes:
                raise ValueError(_not_per_node(name, value, num_nodes, where, ref, names))
        return found
    found, edge_attrs = {}, []
    for name, value in store.items():
        if not _rows_of_graph(name, value):
            continue
        rows = value.shape[0]
        edge_named = "edge" in name
        if num_edges is not None and rows == num_edges and (edge_named or rows != num_nodes):
            edge_attrs.append(name)
        elif rows == num_nodes:
            found[name] = value
        elif edge_named and num_edges is not None:
            raise ValueError(_not_per_edge(name, rows, num_edges, where, ref))
        else:
            raise ValueError(_not_per_node(name, value, num_nodes, where, ref, None, store))
    if edges is None:
        _log_left_out(edge_attrs, where)
    else:
        edges.update({name: store[name] for name in edge_attrs})
    return found


def check_edge_attributes(store, *, num_edges: int, where: str, ref: str) -> dict:
    """The attributes of one ``HeteroData`` edge type, each checked to have one row per edge.

    Returns ``{name: tensor or array}``, the caller's objects, uncopied.
    ``where``, ``ref``: as for :func:`node_attributes`. Raises ValueError
    naming an attribute whose rows are not ``num_edges``.
    """
    edge_attrs = {}
    for name, value in store.items():
        if not _rows_of_graph(name, value):
            continue
        if value.shape[0] != num_edges:
            raise ValueError(_not_per_edge(name, value.shape[0], num_edges, where, ref))
        edge_attrs[name] = value
    return edge_attrs


def per_edge_attributes(store, *, num_nodes: int, num_edges: int) -> dict:
    """The edge attributes of a homogeneous ``Data``, read as :func:`node_attributes` reads them (one row
    per edge, and ``'edge'`` in the name or a row count other than the node count). Never raises: attributes
    of other sizes are :func:`node_attributes`' to judge. Returns ``{name: value}``, uncopied."""
    found = {}
    for name, value in store.items():
        if _rows_of_graph(name, value) and value.shape[0] == num_edges and ("edge" in name or num_edges != num_nodes):
            found[name] = value
    return found


def keep_edge_attributes(found: dict, names, where: str) -> dict:
    """``found`` (``{name: value}``) limited to ``names`` (None: all); the others are named in a warning."""
    if names is None:
        return found
    _log_left_out([n for n in found if n not in names], where)
    return {n: v for n, v in found.items() if n in names}


def check_features(features: dict, num_nodes: int, given: bool) -> None:
    """:func:`from_tensors`' node attributes: each an array of ``num_nodes`` rows.

    ``given``: ``num_nodes`` was passed (else it is the first feature's row
    count, and a disagreement is between features). Raises ValueError naming
    the feature, its rows and the node count.
    """
    first = next(iter(features))
    for name, value in features.items():
        if not _is_array(value) or value.ndim == 0:
            raise ValueError(f"feature {name!r} is {_describe(value)}: node attributes are arrays with one row per "
                             f"node ([num_nodes, ...]); keep graph-level values out of from_tensors")
        if value.shape[0] != num_nodes:
            source = "num_nodes" if given else f"the row count of {first!r}, the first feature"
            raise ValueError(
                f"feature {name!r} has {value.shape[0]} rows for a graph of {num_nodes} nodes ({source}): a node "
                f"attribute needs one row per node. Give it {num_nodes} rows"
                + ("" if given else ", or pass num_nodes= to say how many nodes the graph has") + ".")


def _rows_of_graph(name: str, value) -> bool:
    """Whether ``value`` is meant to have a row per node or per edge (see the module docstring)."""
    if name in _TOPOLOGY or "index" in name or name == "face" or name.startswith("edge_label"):
        return False
    return _is_array(value) and value.ndim > 0


def _is_array(value) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _describe(value) -> str:
    if not _is_array(value):
        return f"a {type(value).__name__}"
    kind = "tensor" if isinstance(value, torch.Tensor) else "array"
    return f"a {value.ndim}-d {kind} of shape {tuple(value.shape)}"


def _not_per_node(name: str, value, num_nodes: int, where: str, ref: str, names, store=None) -> str:
    if not _is_array(value) or value.ndim == 0:
        what = f"node attribute {name!r} is {_describe(value)}, not one row per node of the {num_nodes}"
    else:
        what = f"node attribute {name!r} has {value.shape[0]} rows, but {where} has {num_nodes} nodes"
    if names is not None:
        keep = [n for n in names if n != name]
        return (f"{what}: PyG would leave it out of every batch. Give it {num_nodes} rows (one per node), or leave "
                f"it out of attrs (attrs={keep}).")
    keep = [n for n, v in store.items() if n != name and _rows_of_graph(n, v) and v.shape[0] == num_nodes]
    batch = "batch" + ref[len("data"):]
    return (f"{what}: PyG would leave it out of every batch ({batch}.{name} would be None). Give it {num_nodes} rows "
            f"(one per node), set {ref}.num_nodes if {num_nodes} is not the true node count, or name the "
            f"attributes to store: from_data(data, attrs={keep}).")


def _not_per_edge(name: str, rows: int, num_edges: int, where: str, ref: str) -> str:
    return (f"edge attribute {name!r} has {rows} rows, but {where} has {num_edges} edges: an edge attribute needs "
            f"one row per edge of edge_index. Give it {num_edges} rows, or delete it (del {ref}.{name}) if it is "
            "not meant per edge.")


def _log_left_out(edge_attrs: list[str], where: str) -> None:
    if edge_attrs:
        log.warning("edge attributes %s of %s are not stored (left out of edge_attrs), so batches will not "
                    "carry them", edge_attrs, where)
