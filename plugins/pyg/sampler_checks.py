"""What :class:`~hmgstore.plugins.pyg.HybridNeighborSampler` checks of its graph, fanout and times, in the terms
the caller used: a ``Data``'s ``num_nodes``, a graph store's ``put_edge_index(size=...)``, the ``time_attr``."""
from __future__ import annotations

import torch
from torch_geometric.sampler.base import NumNeighbors


def check_data_ids(data) -> None:
    """Raise when a ``Data``'s ``edge_index`` or ``adj_t`` names nodes beyond ``data.num_nodes``: the fix is
    ``data.num_nodes`` (a ``Data`` has no ``size`` argument). Other faults are left to the CSC's own checks."""
    n = data.num_nodes
    edge_index = getattr(data, "edge_index", None)
    if isinstance(edge_index, torch.Tensor) and edge_index.numel() and not edge_index.is_floating_point() \
            and not edge_index.is_complex() and edge_index.dtype != torch.bool:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0:
            raise IndexError(f"data.edge_index holds the node id {lo}: node ids are 0 or more; fix edge_index")
        if n is None or hi >= n:
            raise IndexError(f"data.edge_index holds the node id {hi}, but data.num_nodes is {n}: set "
                             f"data.num_nodes to the graph's node count (at least {hi + 1}), or fix edge_index")
    adj_t = getattr(data, "adj_t", None)
    if edge_index is None and adj_t is not None and hasattr(adj_t, "sparse_sizes"):
        sizes = tuple(adj_t.sparse_sizes())
        if sizes != (n, n):
            raise ValueError(f"data.adj_t is {sizes[0]} x {sizes[1]}, but data.num_nodes is {n}: set "
                             f"data.num_nodes = {max(sizes)}, or build adj_t with sparse_sizes=({n}, {n})")


def store_node_counts(edges: dict) -> dict:
    """Node type -> node count, read from a graph store's edge types (edge type -> CSC). Raises ValueError when
    two ends of one node type disagree, as an edge type put without ``size`` does (its size is then read from
    its largest ids)."""
    counts: dict = {}
    for et, csc in edges.items():
        if et is None and csc.size[0] != csc.size[1]:
            raise ValueError(f"the graph store's edge_index joins {csc.size[0]} source to {csc.size[1]} destination "
                             "nodes, but a homogeneous graph has one node count (put_edge_index without size reads "
                             "the counts from the largest ids): pass size=(num_nodes, num_nodes) to put_edge_index")
        for nt, n in zip((et[0], et[-1]) if et is not None else (None, None), csc.size):
            if counts.setdefault(nt, (n, et))[0] != n:
                other, seen = counts[nt]
                raise ValueError(
                    f"the graph store's edge types disagree on the number of {nt!r} nodes: edge type {seen!r} "
                    f"gives {other} and edge type {et!r} gives {n} (put_edge_index without size reads the counts "
                    "from the largest ids); pass size=(num_src_nodes, num_dst_nodes) to put_edge_index")
    return {nt: n for nt, (n, _) in counts.items()}


def fanout_values(num_neighbors, hetero: bool) -> NumNeighbors:
    """``num_neighbors`` as PyG's ``NumNeighbors``: an iterator or generator read once into a list. Raises
    TypeError for a dict of edge types on a homogeneous graph."""
    if not isinstance(num_neighbors, (NumNeighbors, dict, list, tuple, str, bytes)) \
            and hasattr(num_neighbors, "__iter__"):
        num_neighbors = list(num_neighbors)
    values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
    if isinstance(values, dict) and not hetero:
        raise TypeError(f"num_neighbors is a dict per edge type ({list(values)}), but the graph is homogeneous: "
                        "a dict fanout needs a heterogeneous graph; pass a list of neighbours per hop such as [15, 10]")
    return num_neighbors if isinstance(num_neighbors, NumNeighbors) else NumNeighbors(num_neighbors)


def check_time_counts(attr: str, node_time: dict, edge_time: dict, num_nodes: dict, edges: dict) -> None:
    """Raise ValueError when the ``time_attr`` ``attr`` holds neither one value per node nor one per edge."""
    for nt, t in node_time.items():
        if _count(t) != num_nodes[nt]:
            of = f" of node type {nt!r}" if nt is not None else ""
            raise ValueError(f"time_attr {attr!r}{of} holds {_count(t)} values; node-level times need one per node "
                             f"({num_nodes[nt]})")
    for et, t in edge_time.items():
        if _count(t) != edges[et].num_edges:
            if et is None:
                raise ValueError(f"time_attr {attr!r} holds {_count(t)} values; node-level times need one per "
                                 f"node ({num_nodes[None]}), edge-level times one per edge ({edges[et].num_edges})")
            raise ValueError(f"time_attr {attr!r} of edge type {et!r} holds {_count(t)} values; edge-level times "
                             f"need one per edge ({edges[et].num_edges})")


def _count(times) -> int:
    return torch.as_tensor(times).numel()


def missing_times(attr: str, missing: list, timed: list) -> str:
    """The message for seeds of node types ``missing`` that have no time, when node types ``timed`` have
    node-level times (empty: the graph's times are edge-level)."""
    loader = "give the loader input_time (NeighborLoader) or edge_label_time (LinkNeighborLoader)"
    if not timed:
        return f"temporal sampling by edge times needs each seed's time: {loader}"
    return (f"the seeds' node types {missing} have no node times: time_attr {attr!r} gives times to the node "
            f"types {timed} only; store one int64 time per node of {missing} under {attr!r} "
            f"(data[node_type].{attr} = ... on a HeteroData), or {loader}")
