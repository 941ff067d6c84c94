"""Temporal sampling (topologies with node or edge times): exact against pyg-lib's definition where it is
deterministic ("last", and every neighbour), equal in distribution where it draws ("uniform").

:func:`reference` restates pyg-lib's CPU temporal sampler (disjoint trees; a node samples its in-edges
no later than its tree's seed time; "last" keeps the latest k) one node at a time in plain Python.
"""
from collections import Counter

import pytest
import torch
from stats_helpers import passes

from hmgstore.graph import NeighborSampler, Topology, to_csc
from hmgstore.graph.temporal import sort_by_time

DEVICES = [pytest.param(("cpu", None), id="cpu"),
           pytest.param(("cuda", None), id="cuda-host", marks=pytest.mark.gpu),
           pytest.param(("cuda", 0.5), id="cuda-mixed", marks=pytest.mark.gpu),
           pytest.param(("cuda", 1.0), id="cuda-gpu", marks=pytest.mark.gpu)]


def temporal_graph(n=200, m=2000, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, m), generator=g)
    return ei, torch.randint(0, 50, (n,), generator=g), torch.randint(0, 50, (m,), generator=g)


def build(ei, n, placement, level, node_time, edge_time, fanout, strategy, **kwargs):
    device, share = placement
    csc = to_csc(ei, "coo", (n, n))
    if level == "node":
        csc = sort_by_time(csc, node_time=node_time)
        times = {"src_time": node_time}
    else:
        csc = sort_by_time(csc, edge_time=edge_time)
        times = {"edge_time": edge_time}
    budget = None if share is None else int(share * csc.num_edges * 4)
    topo = Topology(csc, device, gpu_budget=budget, progress=False, **times)
    sampler = NeighborSampler({None: topo}, {None: n}, fanout, temporal_strategy=strategy, **kwargs)
    return sampler, csc


def reference(csc, time_at, seeds, seed_time, fanout):
    """pyg-lib's temporal sampling with "last" (deterministic): ``(node, row, col, CSC position)`` lists."""
    nodes = [(b, int(s)) for b, s in enumerate(seeds)]
    local = {key: i for i, key in enumerate(nodes)}
    rows, cols, edges = [], [], []
    begin, end = 0, len(nodes)
    for k in fanout:
        for i in range(begin, end):
            b, v = nodes[i]
            lo, hi = int(csc.colptr[v]), int(csc.colptr[v + 1])
            stop = lo
            while stop < hi and time_at(stop) <= seed_time[b]:
                stop += 1
            for pos in range(max(lo, stop - k) if k >= 0 else lo, stop):
                key = (b, int(csc.row[pos]))
                if key not in local:
                    local[key] = len(nodes)
                    nodes.append(key)
                rows.append(local[key])
                cols.append(i)
                edges.append(pos)
        begin, end = end, len(nodes)
    return [v for _, v in nodes], rows, cols, edges


@pytest.mark.parametrize("placement", DEVICES)
@pytest.mark.parametrize("level", ["node", "edge"])
@pytest.mark.parametrize("fanout", [[3, 2], [-1, 2]], ids=["3,2", "all,2"])
def test_last_is_exact(placement, level, fanout):
    ei, node_time, edge_time = temporal_graph()
    sampler, csc = build(ei, 200, placement, level, node_time, edge_time, fanout, "last")
    assert sampler.disjoint  # temporal sampling is disjoint, as PyG's
    seeds = torch.arange(0, 200, 9)
    seed_time = torch.randint(10, 50, (len(seeds),), generator=torch.Generator().manual_seed(1))
    device = placement[0]
    out = sampler.sample({None: seeds.to(device)}, {None: seed_time})
    csc_edge_time = None if level == "node" else edge_time[csc.perm]
    time_at = (lambda p: int(node_time[csc.row[p]])) if level == "node" else (lambda p: int(csc_edge_time[p]))
    node, row, col, edge = reference(csc, time_at, seeds, seed_time.tolist(), fanout)
    assert out.node[None].cpu().tolist() == node
    assert out.row[None].cpu().tolist() == row and out.col[None].cpu().tolist() == col
    assert out.edge[None].cpu().tolist() == edge
    assert out.batch[None][:len(seeds)].cpu().tolist() == list(range(len(seeds)))


@pytest.mark.parametrize("placement", DEVICES)
@pytest.mark.parametrize("level", ["node", "edge"])
def test_uniform_draws_uniformly_from_the_past(placement, level):
    """Node 0 has six in-edges at times 1..6; a seed at time 4 samples 2 of the 4 edges no later than it,
    every pair equally likely."""
    ei = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0]])
    node_time = torch.tensor([0, 1, 2, 3, 4, 5, 6])
    edge_time = torch.tensor([1, 2, 3, 4, 5, 6])
    sampler, csc = build(ei, 7, placement, level, node_time, edge_time, [2], "uniform",
                         generator=torch.Generator().manual_seed(5))
    draws = 3000
    out = sampler.sample({None: torch.zeros(draws, dtype=torch.long, device=placement[0])},
                         {None: torch.full((draws,), 4)})
    src = out.node[None][out.row[None]].cpu().view(draws, 2)  # two per tree, trees in order
    assert out.col[None].cpu().tolist() == torch.arange(draws).repeat_interleave(2).tolist()
    observed = Counter(tuple(sorted(p)) for p in src.tolist())
    assert set(observed) <= {(a, b) for a in range(1, 5) for b in range(a + 1, 5)}
    assert passes(observed, {(a, b): 1 / 6 for a in range(1, 5) for b in range(a + 1, 5)}, draws)
    assert not passes(observed, {(a, b): 1 / 15 for a in range(1, 7) for b in range(a + 1, 7)}, draws)


def test_unsorted_times_and_missing_seed_times_are_refused():
    ei, node_time, edge_time = temporal_graph(n=20, m=100)
    csc = to_csc(ei, "coo", (20, 20))
    with pytest.raises(ValueError, match="sorted by time"):
        Topology(csc, "cpu", edge_time=edge_time, progress=False)
    with pytest.raises(TypeError, match="integer times"):
        Topology(sort_by_time(csc, edge_time=edge_time), "cpu", edge_time=edge_time.double(), progress=False)
    sampler, _ = build(ei, 20, ("cpu", None), "edge", node_time, edge_time, [2], "last")
    with pytest.raises(ValueError, match="seed's time"):
        sampler.sample({None: torch.tensor([1, 2])})
    with pytest.raises(ValueError, match="temporal_strategy"):
        build(ei, 20, ("cpu", None), "edge", node_time, edge_time, [2], "latest")


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_captured_batches_take_each_batchs_seed_times(strategy):
    """The trees' times are a captured batch's input: every replay samples with its own batch's times, as the
    CPU does with the same draw keys."""
    ei, node_time, edge_time = temporal_graph(n=500, m=8000)
    cpu, _ = build(ei, 500, ("cpu", None), "edge", node_time, edge_time, [4, 3], strategy)
    gpu, _ = build(ei, 500, ("cuda", 0.5), "edge", node_time, edge_time, [4, 3], strategy)
    assert gpu.cuda_graphs
    for step in range(5):  # eager (warm-up), captured, then replays, each with new seeds and times
        g = torch.Generator().manual_seed(step)
        seeds = torch.randint(0, 500, (64,), generator=g)
        seed_time = torch.randint(0, 50, (64,), generator=g)
        torch.manual_seed(100 + step)
        a = cpu.sample({None: seeds}, {None: seed_time})
        torch.manual_seed(100 + step)
        b = gpu.sample({None: seeds.cuda()}, {None: seed_time})
        for field in ("node", "row", "col", "edge", "batch"):
            assert torch.equal(getattr(a, field)[None], getattr(b, field)[None].cpu()), (step, field)
    assert any(gpu._graphs.values())  # a graph was captured and replayed


def test_seed_times_outside_int64_and_of_other_kinds_are_refused():
    """Times are int64 (PyG's too): a uint64 time past 2**63 is refused rather than wrapped to a negative one that
    sorts before every other (an edge from the future would be drawn, a seed would see no neighbour); complex
    times are refused, not cut to their real part; seed_time is a dict; an empty batch needs no times' dtype."""
    import numpy as np

    ei, node_time, edge_time = temporal_graph(n=20, m=100)
    csc = to_csc(ei, "coo", (20, 20))
    late = edge_time.numpy().astype(np.uint64)
    late[0] = 2**63 + 1
    with pytest.raises(ValueError, match="2\\*\\*63"):
        sort_by_time(csc, edge_time=late)
    with pytest.raises(ValueError, match="int64's range"):
        sort_by_time(csc, edge_time=[2**64 + 1] * 100)
    sampler, _ = build(ei, 20, ("cpu", None), "edge", node_time, edge_time, [2], "last")
    seeds = {None: torch.tensor([1, 2])}
    with pytest.raises(ValueError, match="2\\*\\*63"):
        sampler.sample(seeds, {None: np.array([5, 2**63 + 5], dtype=np.uint64)})
    with pytest.raises(TypeError, match="integer times"):
        sampler.sample(seeds, {None: torch.tensor([5 + 1j, 7 + 0j])})
    with pytest.raises(TypeError, match="a dict of node type"):
        sampler.sample(seeds, torch.tensor([5, 7]))
    empty = sampler.sample({None: torch.empty(0, dtype=torch.int64)}, {None: torch.empty(0, dtype=torch.int64)})
    assert all(v.numel() == 0 for v in empty.node.values())
    fine = sampler.sample(seeds, {None: np.array([30, 40], dtype=np.uint64)})
    assert fine.node[None].numel() >= 2
