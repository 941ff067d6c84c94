"""LABOR-0 sampling (``labor=True``): each edge taken with probability min(1, k / degree), one variate per
source node shared by the hop's seeds, fewer distinct nodes than uniform sampling; CPU and (gpu) GPU."""
import pytest
import torch
from stats_helpers import chi2_critical

from hmgstore.graph import NeighborSampler, Topology, to_csc
from hmgstore.graph.labor import node_variates, sample_hop_labor

DEVICES = [pytest.param(("cpu", None), id="cpu"),
           pytest.param(("cuda", None), id="cuda-host", marks=pytest.mark.gpu),
           pytest.param(("cuda", 1.0), id="cuda-gpu", marks=pytest.mark.gpu)]


def bipartite(num_src=40, num_dst=200, degree=10, seed=0):
    """Every destination has ``degree`` distinct in-neighbours among ``num_src`` sources (ids 0..num_src-1;
    destinations are num_src.. so sources never are seeds)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.stack([torch.randperm(num_src, generator=g)[:degree] for _ in range(num_dst)]).reshape(-1)
    dst = (num_src + torch.arange(num_dst)).repeat_interleave(degree)
    n = num_src + num_dst
    return to_csc(torch.stack([src, dst]), "coo", (n, n)), n


def topology(placement, **kwargs):
    device, share = placement
    csc, n = bipartite(**kwargs)
    budget = None if share is None else 2**40
    return Topology(csc, device, gpu_budget=budget, progress=False), n


@pytest.mark.parametrize("placement", DEVICES)
def test_each_edge_with_probability_k_over_degree(placement):
    """Over many hop keys, each edge is taken 3/10 of the time. Edges from one source are taken together
    (every seed has degree 10), so the chi-square runs over sources: independent Binomial(runs, 0.3)."""
    topo, n = topology(placement, num_dst=60)
    seeds = torch.arange(40, 100, device=topo.device)
    runs, p = 120, 0.3
    taken = torch.zeros(topo.num_edges, dtype=torch.int64)
    for key in range(runs):
        nbr, eid, counts = sample_hop_labor(topo, seeds, 3, key * 7919 + 1)
        taken.index_add_(0, eid.cpu(), torch.ones(len(eid), dtype=torch.int64))
    row = topo.row.long()
    out_degree = torch.bincount(row, minlength=40)[:40]
    per_source = torch.zeros(40, dtype=torch.int64).index_add_(0, row, taken)
    passes = per_source // out_degree.clamp(min=1)
    assert torch.equal(taken, passes[row])  # all or nothing per source
    used = out_degree > 0
    stat = float(((passes[used] - runs * p) ** 2 / (runs * p * (1 - p))).sum())
    assert stat < chi2_critical(int(used.sum()))
    wrong = float(((passes[used] - runs * 0.4) ** 2 / (runs * 0.4 * 0.6)).sum())
    assert wrong > chi2_critical(int(used.sum()))  # the check tells 0.3 from 0.4


@pytest.mark.parametrize("placement", DEVICES)
def test_seeds_share_their_neighbours(placement):
    """Seeds of equal degree take a shared neighbour together: with one variate per source node, an edge
    (t -> s) is taken exactly when r_t <= k / d."""
    topo, n = topology(placement)
    seeds = torch.arange(40, 240, device=topo.device)
    nbr, eid, counts = sample_hop_labor(topo, seeds, 3, 99)
    r = node_variates(99, torch.arange(40))
    chosen = set(zip(nbr.cpu().tolist(), eid.cpu().tolist()))
    row = topo.row.long()
    expected = {(int(row[e]), e) for e in range(topo.num_edges) if float(r[row[e]]) * 10 <= 3}
    assert chosen == expected


@pytest.mark.parametrize("placement", DEVICES)
def test_fewer_nodes_than_uniform_sampling(placement):
    topo, n = topology(placement)
    seeds = torch.arange(40, 240, device=topo.device)
    sizes = {}
    for labor in (False, True):
        sampler = NeighborSampler({None: topo}, {None: n}, [3], labor=labor,
                                  generator=torch.Generator().manual_seed(0))
        out = sampler.sample({None: seeds})
        sizes[labor] = out.num_sampled_nodes[None][1]
        assert len(out.row[None]) == len(out.col[None]) == len(out.edge[None])
    assert sizes[True] < 0.75 * sizes[False]  # 40 sources: uniform finds nearly all, LABOR ~ 40 * 0.3 + spread


def test_labor_refuses_what_it_does_not_define():
    csc, n = bipartite()
    topo = Topology(csc, "cpu", progress=False)
    with pytest.raises(ValueError, match="LABOR"):
        NeighborSampler({None: topo}, {None: n}, [3], labor=True, replace=True)
