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
from ..rows import checks


def power_law_csc(num_nodes: int, num_edges: int, skew: float, seed: int = 0, device=None,
                  source_skew: float | None = None) -> CSC:
    """A CSC topology with Zipf(``skew``) in-degrees over permuted node ids.

    Neighbours are uniform, or with ``source_skew`` drawn Zipf(``source_skew``)
    over the same ranking (hubs cite and are cited: in- and out-degree
    correlate, as in undirected graphs). Built directly in CSC form (no
    sort), on ``device`` when given (fast) and returned in host memory:
    ``row`` int32 when the node count allows.

    Args:
        num_nodes: an integer >= 0 (>= 1 when there are edges).
        num_edges: an integer >= 0; ``colptr[-1]`` is exactly this.
        skew: the in-degrees' Zipf exponent, a finite real >= 0 (0:
            uniform).
        seed: an integer in ``[0, 2**64)``: the same graph for the same seed.
        device: where it is built (None: the CPU).
        source_skew: None, or the sources' Zipf exponent, as ``skew``.

    Returns:
        A :class:`~hmgstore.graph.CSC` of ``num_nodes`` sources and
        destinations and ``num_edges`` edges.

    Raises:
        TypeError: a count or ``seed`` not an integer (floats and bools
            included); ``skew`` or ``source_skew`` not a real number.
        ValueError: a negative count; edges without nodes; a ``seed``
            outside ``[0, 2**64)``; a skew negative, NaN or infinite.
    """
    num_nodes, num_edges = checks.count(num_nodes, "num_nodes"), checks.count(num_edges, "num_edges")
    if num_edges and not num_nodes:
        raise ValueError(f"num_edges is {num_edges} but num_nodes is 0: edges need nodes to join")
    skew = checks.real(skew, "skew", at_least=0)
    if source_skew is not None:
        source_skew = checks.real(source_skew, "source_skew", at_least=0)
    seed = checks.count(seed, "seed")
    if seed >= 2**64:
        raise ValueError(f"seed is under 2**64 (a torch generator's seed), got {seed}")
    if num_nodes == 0:  # no draws: randint over an empty range refuses to run
        return CSC(torch.empty(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), None, (0, 0))
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
