"""Power-law graphs made directly in CSC form: a papers100M-shaped topology in seconds, on a GPU.

Real citation and web graphs have Zipf-like in-degrees: a few hubs, a long
tail. :func:`power_law_csc` draws the degrees from that law over a random
ranking of the nodes and the neighbours uniformly (or Zipf over the same
ranking), with no sort and no edge list, so that 111M nodes and 1.6B edges
(ogbn-papers100M's shape) take seconds on a GPU. The benchmarks and
``examples/multi_gpu_pyg.py --graph papers:111M:1.6B`` train on it.
"""
from __future__ import annotations

import torch

from ..graph import CSC


def power_law_csc(num_nodes: int, num_edges: int, skew: float, seed: int = 0, device=None,
                  source_skew: float | None = None) -> CSC:
    """A CSC topology with Zipf(``skew``) in-degrees over permuted node ids.

    Neighbours are uniform, or with ``source_skew`` drawn Zipf(``source_skew``)
    over the same ranking (hubs cite and are cited: in- and out-degree
    correlate, as in undirected graphs). Built directly in CSC form (no
    sort), on ``device`` when given (fast) and returned in host memory:
    ``row`` int32 when the node count allows.
    """
    g = torch.Generator(device or "cpu").manual_seed(seed)
    weight = (torch.arange(1, num_nodes + 1, dtype=torch.float64, device=device) ** -skew)
    degree = torch.floor(weight / weight.sum() * num_edges).long()
    short = num_edges - int(degree.sum())
    degree[:short] += 1  # the rounding remainder goes to the hottest nodes
    rank_to_node = torch.randperm(num_nodes, generator=g, device=device)
    degree = degree[torch.argsort(rank_to_node)]  # node rank_to_node[r] gets the r-th largest in-degree
    colptr = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(degree, 0, out=colptr[1:])
    dtype = torch.int32 if num_nodes < 2**31 else torch.int64
    if source_skew is None:
        row = torch.randint(0, num_nodes, (num_edges,), generator=g, dtype=dtype, device=device)
    else:
        cdf = torch.cumsum(torch.arange(1, num_nodes + 1, dtype=torch.float64, device=device) ** -source_skew, 0)
        cdf /= cdf[-1].clone()
        row = torch.empty(num_edges, dtype=dtype, device=device)
        step = 1 << 26
        for start in range(0, num_edges, step):  # pieces: the draws' float64 would not fit at once
            u = torch.rand(min(step, num_edges - start), generator=g, dtype=torch.float64, device=device)
            ranks = torch.searchsorted(cdf, u).clamp_(max=num_nodes - 1)
            row[start:start + len(u)] = rank_to_node[ranks].to(dtype)
    return CSC(row.cpu(), colptr.cpu(), None, (num_nodes, num_nodes))
