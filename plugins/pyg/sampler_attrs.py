"""The edge and node attributes a :class:`HybridNeighborSampler` samples by: weights and times.

PyG names them by attribute (``weight_attr``, ``time_attr``) and reads them
from a ``Data``, a ``HeteroData``, or a ``(FeatureStore, GraphStore)``
pair; these functions do the same, so the sampler holds the same values
as PyG's ``NeighborSampler`` would.
"""
from __future__ import annotations

from torch_geometric.data import Data, HeteroData


def _edge_values(data, attr: str, edges: dict, what: str) -> dict:
    """Edge type -> the edge attribute ``attr`` (one value per edge, in the given edge order) of the edge types
    that have it. Raises ValueError when none has it."""
    found: dict = {}
    if isinstance(data, Data):
        if getattr(data, "edge_index", None) is None:
            raise ValueError(f"{what}={attr!r} needs the graph as edge_index (the edges' order), not adj_t")
        if attr in data:
            found[None] = data[attr]
    elif isinstance(data, HeteroData):
        found = {et: data[et][attr] for et in data.edge_types if attr in data[et]}
    else:
        feature_store = data[0]
        for et in edges:
            try:
                found[et] = feature_store.get_tensor(group_name=et, attr_name=attr, index=None)
            except (KeyError, ValueError, TypeError, AttributeError):
                continue
    if not found:
        raise ValueError(f"no edge type holds the edge attribute {attr!r} given as {what}; store one value per edge "
                         f"under that name (data.{attr} = ..., or data[edge_type].{attr} = ...)")
    return found


def _node_values(data, attr: str, num_nodes: dict) -> dict:
    """Node type -> the node attribute ``attr`` of the node types that have it."""
    if isinstance(data, Data):
        return {None: data[attr]} if attr in data and data.is_node_attr(attr) else {}
    if isinstance(data, HeteroData):
        return {nt: data[nt][attr] for nt in data.node_types if attr in data[nt]}
    found = {}
    for nt in num_nodes:
        try:
            found[nt] = data[0].get_tensor(group_name=nt, attr_name=attr, index=None)
        except (KeyError, ValueError, TypeError, AttributeError):
            continue
    return found


def times_of(data, attr: str, edges: dict, num_nodes: dict) -> tuple[dict, dict]:
    """``(node type -> node times, edge type -> edge times)`` for ``time_attr=attr``: one of them empty,
    as PyG reads node-level or edge-level times. Raises ValueError when neither or both hold ``attr``."""
    node_time = _node_values(data, attr, num_nodes)
    edge_time = {}
    try:
        edge_time = _edge_values(data, attr, edges, "time_attr")
    except ValueError:
        if not node_time:
            raise ValueError(f"the time attribute {attr!r} (time_attr) is neither a node-level nor an edge-level "
                             f"attribute: store one int64 time per node or per edge under that name") from None
    if isinstance(data, Data) and node_time:
        edge_time = {}  # data[attr] is one tensor: a node attribute when it has one value per node
    if node_time and edge_time:
        raise ValueError(f"the time attribute {attr!r} is held by nodes and by edges; use one of them (as PyG)")
    return node_time, edge_time
