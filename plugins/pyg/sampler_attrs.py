"""The edge and node attributes a :class:`HybridNeighborSampler` samples by: weights and times.

PyG names them by attribute (``weight_attr``, ``time_attr``) and reads them
from a ``Data``, a ``HeteroData``, or a ``(FeatureStore, GraphStore)``
pair; these functions do the same, so the sampler holds the same values
as PyG's ``NeighborSampler`` would.

One lookup (:func:`_held`) finds an attribute at one level, node or edge,
for both weights and times. In a store pair the group name alone cannot
tell the levels apart: ``None`` names the node type and the edge type of a
homogeneous graph alike. hmgstore's feature store keeps edge tables apart
from node tables (:class:`~hmgstore.plugins.pyg.edge_tables.EdgeTables`,
filled by :func:`~hmgstore.plugins.pyg.from_data`), so the level picks the
tables; another ``FeatureStore`` holds both under its group names (PyG's
convention: node types are strings, edge types tuples), and a tensor under
``None`` counts at the level whose size its rows match.
"""
from __future__ import annotations

from torch_geometric.data import Data, HeteroData

from .feature_store import HybridFeatureStore


def _held(data, attr: str, groups: dict, level: str) -> dict:
    """Group -> the whole attribute ``attr`` of the groups that hold it at ``level``: ``"node"`` (``groups``:
    node type -> node count) or ``"edge"`` (``groups``: edge type -> CSC; one value per edge, in edge-id order).
    Raises ValueError for edge values of a ``Data`` without ``edge_index`` (no edge order to read them in)."""
    if isinstance(data, Data):
        if attr not in data:
            return {}
        if level == "node":
            return {None: data[attr]} if data.is_node_attr(attr) else {}
        if getattr(data, "edge_index", None) is None:
            raise ValueError(f"the edge attribute {attr!r} needs the graph as edge_index (the edges' order), "
                             "not adj_t")
        return {None: data[attr]}  # one tensor: times_of prefers it as node times when it has one per node
    if isinstance(data, HeteroData):
        return {group: data[group][attr] for group in groups if attr in data[group]}
    feature_store = data[0]
    if isinstance(feature_store, HybridFeatureStore):  # node and edge tables apart: the level says which to read
        tables = feature_store.edge_tables() if level == "edge" else feature_store.tables()
        return {group: tables[(group, attr)].dense() for group in groups if (group, attr) in tables}
    found = {}
    for group, size in groups.items():
        try:
            value = feature_store.get_tensor(group_name=group, attr_name=attr, index=None)
        except (KeyError, ValueError, TypeError, AttributeError):
            continue
        rows = size if level == "node" else size.num_edges
        if group is not None or value.shape[0] == rows:  # None: both levels' group; its rows tell which it is
            found[group] = value
    return found


def _fix(data, attr: str, level: str) -> str:
    """How to give the graph ``attr`` per node or per edge (``level``: "node", "edge" or both, "node or edge"),
    for an error message: as the caller's input holds attributes."""
    if isinstance(data, (Data, HeteroData)):
        ways = {"node": f"data[node_type].{attr} = ...", "edge": f"data[edge_type].{attr} = ..."}
        first = f"data.{attr} = ..."
    else:
        ways = {"node": f"feature_store.put_tensor(values, group_name=node_type, attr_name={attr!r})",
                "edge": f"feature_store.put_tensor(values, group_name=edge_type, attr_name={attr!r})"}
        if isinstance(data[0], HybridFeatureStore):  # hmgstore's store: edge attributes are edge tables
            ways["edge"] = f"feature_store.put_edge_table(values, edge_type, {attr!r})"
        first = "from_data keeps a Data's attributes, unless attrs= or edge_attrs= leaves it out"
    return ", or ".join([first, *(ways[part] for part in level.split(" or "))])


def _edge_values(data, attr: str, edges: dict, what: str) -> dict:
    """Edge type -> the edge attribute ``attr`` (one value per edge, in the given edge order) of the edge types
    that have it. Raises ValueError when none has it."""
    found = _held(data, attr, edges, "edge")
    if not found:
        raise ValueError(f"no edge type holds the edge attribute {attr!r} given as {what}; store one value per edge "
                         f"under that name ({_fix(data, attr, 'edge')})")
    return found


def times_of(data, attr: str, edges: dict, num_nodes: dict) -> tuple[dict, dict]:
    """``(node type -> node times, edge type -> edge times)`` for ``time_attr=attr``: one of them empty,
    as PyG reads node-level or edge-level times. Raises ValueError when neither or both hold ``attr``."""
    node_time = _held(data, attr, num_nodes, "node")
    one_tensor = None in node_time and not (isinstance(data, (tuple, list)) and isinstance(data[0], HybridFeatureStore))
    # a Data's data[attr], or another store's group None, is one tensor: node times when it has one per node
    edge_time = {} if one_tensor else _held(data, attr, edges, "edge")
    if not node_time and not edge_time:
        raise ValueError(f"the time attribute {attr!r} (time_attr) is neither a node-level nor an edge-level "
                         f"attribute: store one int64 time per node or per edge under that name "
                         f"({_fix(data, attr, 'node or edge')})")
    if node_time and edge_time:
        raise ValueError(f"the time attribute {attr!r} is held by nodes and by edges; use one of them (as PyG)")
    return node_time, edge_time
