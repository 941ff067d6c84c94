"""hmgstore.graph: neighbour sampling over topology in tiers, on the CPU and (gpu marker) on a GPU.

Every placement of the topology is tried on the GPU: all lists on the host (zero-copy), some on the
GPU, all on the GPU. CPU and GPU draw the same samples from the same generator seed.
"""
import itertools

import pytest
import torch

from hmgstore.graph import NeighborSampler, Topology, to_csc
from hmgstore.graph.hop import draw

# (device, share of the topology's bytes given to the GPU)
PLACEMENTS = [pytest.param(("cpu", None), id="cpu"),
              pytest.param(("cuda", None), id="cuda-host", marks=pytest.mark.gpu),
              pytest.param(("cuda", 0.3), id="cuda-mixed", marks=pytest.mark.gpu),
              pytest.param(("cuda", 1.0), id="cuda-gpu", marks=pytest.mark.gpu)]


def power_law_graph(num_nodes=3000, num_edges=30000, seed=0):
    """A directed graph with a heavy-tailed in-degree, some nodes without in-edges, no duplicate edges."""
    g = torch.Generator().manual_seed(seed)
    dst = (torch.rand(num_edges, generator=g) ** 3 * num_nodes).long()
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    pairs = torch.unique(src * num_nodes + dst)
    return torch.stack([pairs // num_nodes, pairs % num_nodes])


def build(edge_index, num_nodes, placement, narrow=True, **kwargs):
    device, share = placement
    csc = to_csc(edge_index, "coo", (num_nodes, num_nodes))
    budget = None if share is None else int(share * csc.num_edges * (4 if narrow else 8))
    topo = Topology(csc, device, gpu_budget=budget, narrow=narrow, progress=False)
    return NeighborSampler({None: topo}, {None: num_nodes}, kwargs.pop("num_neighbors", [5, 3]), **kwargs), csc


def edges_of(out):
    """Global (source, destination, CSC position) of every sampled edge, on the CPU."""
    node = out.node[None].cpu()
    return node[out.row[None].cpu()], node[out.col[None].cpu()], out.edge[None].cpu()


def check_edges_exist(out, csc):
    src, dst, eid = edges_of(out)
    assert torch.equal(csc.row[eid], src)  # the edge at that CSC position joins exactly these nodes
    assert torch.equal(torch.searchsorted(csc.colptr, eid, right=True) - 1, dst)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("narrow", [True, False], ids=["int32-ids", "int64-ids"])
def test_samples_are_edges_of_the_graph_with_the_right_counts(placement, replace, narrow):
    n = 3000
    ei = power_law_graph(n)
    sampler, csc = build(ei, n, placement, narrow, num_neighbors=[6, 4], replace=replace)
    torch.manual_seed(3)
    seeds = torch.randperm(n)[:300]
    out = sampler.sample({None: seeds})
    node = out.node[None].cpu()
    assert torch.equal(node[:300], seeds)  # seeds first, as given
    assert len(torch.unique(node)) == len(node)  # each node once
    check_edges_exist(out, csc)
    degree = csc.colptr.diff()
    nodes_hop, edges_hop = out.num_sampled_nodes[None], out.num_sampled_edges[None]
    assert sum(nodes_hop) == len(node) and sum(edges_hop) == len(out.edge[None]) and nodes_hop[0] == 300
    src, dst, eid = edges_of(out)
    start = 0
    for hop, k in enumerate([6, 4]):
        first = sum(nodes_hop[:hop])
        frontier = node[first:first + nodes_hop[hop]]  # the nodes found in the previous hop (the seeds first)
        hop_dst, hop_eid = dst[start:start + edges_hop[hop]], eid[start:start + edges_hop[hop]]
        counts = torch.zeros(n, dtype=torch.int64).index_add_(0, hop_dst, torch.ones_like(hop_dst))
        want = torch.where(degree > 0, k, 0) if replace else degree.clamp(max=k)
        assert torch.equal(counts[frontier], want[frontier])  # min(k, degree), or k with replacement
        if not replace:  # no neighbour twice for one seed
            assert len(torch.unique(hop_eid)) == len(hop_eid)
        start += edges_hop[hop]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_degree_zero_all_neighbours_and_huge_degree(placement):
    n, hub = 80_000, 7
    others = torch.arange(n)[torch.arange(n) != hub]
    ei = torch.cat([torch.stack([others, torch.full_like(others, hub)]),  # hub: n - 1 > 65,536 in-neighbours
                    torch.tensor([[1, 2, 3], [5, 5, 6]])], dim=1)
    sampler, csc = build(ei, n, placement, num_neighbors=[-1])
    out = sampler.sample({None: torch.tensor([hub, 5, 6, 9])})  # 9 has no in-edge
    src, dst, _ = edges_of(out)
    assert (dst == hub).sum() == n - 1 and torch.equal(torch.sort(src[dst == hub]).values, others)
    assert sorted(src[dst == 5].tolist()) == [1, 2] and src[dst == 6].tolist() == [3] and not (dst == 9).any()
    check_edges_exist(out, csc)
    for k, replace in ((10, False), (100, False), (10, True)):
        sampler.num_neighbors = {None: [k]}
        sampler.replace = replace
        out = sampler.sample({None: torch.tensor([hub, 9])})
        src, dst, eid = edges_of(out)
        assert (dst == hub).sum() == k and not (dst == 9).any()
        assert replace or len(torch.unique(eid)) == k
        check_edges_exist(out, csc)


def chi_square(counts: torch.Tensor) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


# chi-square quantiles at p = 0.999: a uniform sampler fails a test 1 time in 1000
CHI2_999 = {5: 20.52, 6: 22.46, 14: 36.12}


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_uniform_subsets_without_replacement(placement):
    n = 10
    ei = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0]])  # node 0 has 6 in-neighbours
    sampler, _ = build(ei, n, placement, num_neighbors=[2])
    torch.manual_seed(0)
    draws = 30_000
    out = sampler.sample({None: torch.zeros(draws, dtype=torch.long)})  # node 0 as 30,000 seeds
    src, _, _ = edges_of(out)
    pairs = torch.sort(src.view(draws, 2), dim=1).values  # every seed's 2 neighbours, as a set
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(1, 7), 2))}
    codes = torch.tensor([subsets[tuple(p)] for p in pairs.tolist()])
    counts = torch.bincount(codes, minlength=15).double()
    assert chi_square(counts) < CHI2_999[14], counts


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_uniform_draws_with_replacement(placement):
    ei = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 0, 0]])
    sampler, _ = build(ei, 10, placement, num_neighbors=[3], replace=True)
    out = sampler.sample({None: torch.zeros(10_000, dtype=torch.long)})
    src, _, _ = edges_of(out)
    counts = torch.bincount(src, minlength=8)[1:].double()
    assert chi_square(counts) < CHI2_999[6], counts


def test_draws_are_uniform_and_reproducible():
    n = torch.full((60_000,), 6)
    values = draw(12345, torch.arange(60_000), 0, n)
    assert values.min() >= 0 and values.max() < 6
    assert chi_square(torch.bincount(values).double()) < CHI2_999[5]
    assert torch.equal(values, draw(12345, torch.arange(60_000), 0, n))
    assert not torch.equal(values, draw(12346, torch.arange(60_000), 0, n))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_reproducible_under_manual_seed_and_generator(placement):
    ei = power_law_graph()
    sampler, _ = build(ei, 3000, placement, num_neighbors=[5, 5])
    seeds = torch.arange(0, 3000, 7)
    torch.manual_seed(11)
    a = sampler.sample({None: seeds})
    torch.manual_seed(11)
    b = sampler.sample({None: seeds})
    c = sampler.sample({None: seeds})
    assert torch.equal(a.node[None], b.node[None]) and torch.equal(a.edge[None], b.edge[None])
    assert not torch.equal(a.edge[None], c.edge[None])
    sampler.generator = torch.Generator().manual_seed(5)
    d = sampler.sample({None: seeds})
    sampler.generator = torch.Generator().manual_seed(5)
    assert torch.equal(d.edge[None], sampler.sample({None: seeds}).edge[None])


@pytest.mark.gpu
@pytest.mark.parametrize("share", [None, 0.3, 1.0], ids=["host", "mixed", "gpu"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("dedup", ["sort", "hash"])
@pytest.mark.parametrize("disjoint", [False, True])
def test_gpu_draws_the_cpu_samples_bit_for_bit(share, replace, dedup, disjoint):
    ei = power_law_graph()
    cpu, _ = build(ei, 3000, ("cpu", None), num_neighbors=[8, 4, -1], replace=replace, disjoint=disjoint)
    gpu, _ = build(ei, 3000, ("cuda", share), num_neighbors=[8, 4, -1], replace=replace, disjoint=disjoint,
                   dedup=dedup)
    seeds = torch.cat([torch.randperm(3000)[:500], torch.tensor([7, 7])])  # a repeated seed too
    torch.manual_seed(21)
    a = cpu.sample({None: seeds})
    torch.manual_seed(21)
    b = gpu.sample({None: seeds.cuda()})
    assert b.node[None].is_cuda
    for field in ("node", "row", "col", "edge") + (("batch",) if disjoint else ()):
        assert torch.equal(getattr(a, field)[None], getattr(b, field)[None].cpu()), field
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


@pytest.mark.gpu
def test_hash_relabelling_grows_its_table():
    from hmgstore.graph.relabel import HashNodeSet, SortedNodeSet

    g = torch.Generator().manual_seed(4)
    seeds = torch.randint(0, 5000, (300,), generator=g)
    hashed, sorted_ = HashNodeSet(seeds.cuda(), capacity=1), SortedNodeSet(seeds)
    for _ in range(6):  # far past the first table's size: it must grow and keep every id
        cand = torch.randint(0, 5000, (4000,), generator=g)
        assert torch.equal(hashed.add(cand.cuda()).cpu(), sorted_.add(cand))
    assert torch.equal(hashed.keys.cpu(), sorted_.keys) and hashed.count == sorted_.count


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_disjoint_trees_per_seed(placement):
    ei = power_law_graph()
    sampler, csc = build(ei, 3000, placement, num_neighbors=[4, 3], disjoint=True)
    seeds = torch.tensor([5, 5, 17])  # a repeated seed grows two trees
    out = sampler.sample({None: seeds})
    node, batch = out.node[None].cpu(), out.batch[None].cpu()
    assert torch.equal(node[:3], seeds) and batch[:3].tolist() == [0, 1, 2]
    src_local, dst_local = out.row[None].cpu(), out.col[None].cpu()
    assert torch.equal(batch[src_local], batch[dst_local])  # edges stay inside their seed's tree
    pairs = batch * 3000 + node
    assert len(torch.unique(pairs)) == len(pairs)  # a node appears once per tree
    check_edges_exist(out, csc)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_heterogeneous_with_edge_types_missing_from_a_batch(placement):
    device, share = placement
    g = torch.Generator().manual_seed(2)
    sizes = {"paper": 500, "author": 300, "venue": 7}
    edges = {("author", "writes", "paper"): torch.stack([torch.randint(0, 300, (2000,), generator=g),
                                                          torch.randint(0, 500, (2000,), generator=g)]),
             ("paper", "cites", "paper"): torch.stack([torch.randint(0, 500, (3000,), generator=g),
                                                       torch.randint(0, 500, (3000,), generator=g)]),
             ("paper", "in", "venue"): torch.stack([torch.arange(500), torch.arange(500) % 7])}
    topologies, cscs = {}, {}
    for et, ei in edges.items():
        cscs[et] = to_csc(ei, "coo", (sizes[et[0]], sizes[et[-1]]))
        budget = None if share is None else int(share * cscs[et].num_edges * 4)
        topologies[et] = Topology(cscs[et], device, gpu_budget=budget, progress=False)
    sampler = NeighborSampler(topologies, sizes, {("author", "writes", "paper"): [3, 2],
                                                  ("paper", "cites", "paper"): [2, 2],
                                                  ("paper", "in", "venue"): [4, 0]})
    out = sampler.sample({"author": torch.tensor([1, 2, 3])})  # no edge type points to authors: nothing sampled
    assert out.node["author"].tolist() == [1, 2, 3] and len(out.node["paper"]) == 0
    assert all(len(e) == 0 for e in out.edge.values())
    assert out.num_sampled_nodes["author"] == [3, 0, 0]
    out = sampler.sample({"paper": torch.tensor([0, 10, 20]), "venue": torch.tensor([3])})
    for et, csc in cscs.items():
        src = out.node[et[0]].cpu()[out.row[et].cpu()]
        dst = out.node[et[-1]].cpu()[out.col[et].cpu()]
        eid = out.edge[et].cpu()
        assert torch.equal(csc.row[eid], src) and torch.equal(torch.searchsorted(csc.colptr, eid, right=True) - 1, dst)
        assert sum(out.num_sampled_edges[et]) == len(eid)
    assert out.num_sampled_edges[("paper", "in", "venue")][1] == 0  # fanout 0 in hop 2
    assert out.node["venue"][0] == 3 and out.node["paper"][:3].tolist() == [0, 10, 20]
    with pytest.raises(KeyError, match="topic"):
        sampler.sample({"topic": torch.tensor([0])})


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_bad_seeds_are_refused_before_sampling(placement):
    sampler, _ = build(power_law_graph(), 3000, placement)
    device = torch.device(placement[0])
    for bad in (torch.tensor([0, 3000]), torch.tensor([-1]), torch.tensor([2**40])):
        for where in ("cpu", device):
            with pytest.raises(IndexError, match="out of range"):
                sampler.sample({None: bad.to(where)})
    with pytest.raises(TypeError):
        sampler.sample({None: torch.tensor([0.5])})
    out = sampler.sample({None: torch.tensor([1, 2])})  # still works (on a GPU: the context is alive)
    assert out.node[None][:2].tolist() == [1, 2]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_closed_sampler_refuses_to_sample(placement):
    sampler, _ = build(power_law_graph(), 3000, placement)
    sampler.sample({None: torch.tensor([1, 2])})
    sampler.close()
    sampler.close()  # idempotent
    with pytest.raises(RuntimeError, match="sampler was closed.*build a new one"):
        sampler.sample({None: torch.tensor([1, 2])})
    other, _ = build(power_law_graph(), 3000, placement)
    other.topologies[None].close()  # a topology closed on its own: its sampler refuses too
    with pytest.raises(RuntimeError, match="topology was closed"):
        other.sample({None: torch.tensor([1, 2])})


def test_sampler_checks_its_arguments():
    csc = to_csc(power_law_graph(), "coo", (3000, 3000))
    topo = Topology(csc, "cpu")
    with pytest.raises(ValueError, match="joins"):
        NeighborSampler({None: topo}, {None: 10}, [2])
    with pytest.raises(ValueError, match="edge types"):
        NeighborSampler({None: topo}, {None: 3000}, {("a", "b", "c"): [2]})
    with pytest.raises(ValueError, match="at least one"):
        NeighborSampler({}, {None: 3000}, [2])


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda",
                                                                                 marks=pytest.mark.gpu)])
def test_topology_hot_order_is_checked_on_every_device(device):
    csc = to_csc(power_law_graph(), "coo", (3000, 3000))
    with pytest.raises(TypeError, match=r"hot_order is row ids.*order_by_score"):
        Topology(csc, device, gpu_budget=4000, hot_order=torch.tensor([0.5, 1.7]), progress=False)
    with pytest.raises(ValueError, match=r"lists row \d+ more than once.*order_by_score"):
        Topology(csc, device, gpu_budget=4000, hot_order=csc.colptr.diff(), progress=False)  # degrees, not ids
    with pytest.raises(IndexError, match="hot_order.*index 1000000"):
        Topology(csc, device, gpu_budget=4000, hot_order=[0, 1, 10**6], progress=False)
    Topology(csc, device, gpu_budget=4000, hot_order=torch.randperm(3000), progress=False).close()


def test_cpu_sampler_cost_is_modest():
    """Not a speed test: a guard that the vectorised CPU path does no per-seed Python work."""
    ei = power_law_graph(20_000, 200_000)
    sampler, _ = build(ei, 20_000, ("cpu", None), num_neighbors=[15, 10, 5])
    calls = []
    import hmgstore.graph.hop as mod
    original = mod._draw_mixed  # every draw's last step (draw() and Floyd's loop)
    mod._draw_mixed = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    try:
        sampler.sample({None: torch.randperm(20_000)[:1024]})
    finally:
        mod._draw_mixed = original
    assert 0 < len(calls) <= 15 + 10 + 5  # one vectorised draw per Floyd step of each hop


@pytest.mark.gpu
@pytest.mark.parametrize("disjoint", [False, True])
def test_replayed_cuda_graph_batches_equal_the_cpu_samples(disjoint):
    ei = power_law_graph()
    cpu, _ = build(ei, 3000, ("cpu", None), num_neighbors=[6, 3, 2], disjoint=disjoint)
    gpu, _ = build(ei, 3000, ("cuda", 0.3), num_neighbors=[6, 3, 2], disjoint=disjoint)
    assert gpu.cuda_graphs and gpu.dedup == "hash"
    outputs = []
    for step in range(5):  # eager (warm-up), captured, then replays: each must be a fresh, right batch
        seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(step))[:400]
        torch.manual_seed(100 + step)
        a = cpu.sample({None: seeds})
        torch.manual_seed(100 + step)
        b = gpu.sample({None: seeds.cuda()})
        for field in ("node", "row", "col", "edge"):
            assert torch.equal(getattr(a, field)[None], getattr(b, field)[None].cpu()), (step, field)
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
        outputs.append((a, b))
    assert gpu._graphs  # a graph was captured
    a, b = outputs[2]  # an earlier replay's output is not overwritten by later replays
    assert torch.equal(a.node[None], b.node[None].cpu()) and torch.equal(a.edge[None], b.edge[None].cpu())


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_topology_statistics(placement):
    sampler, csc = build(power_law_graph(), 3000, placement, num_neighbors=[5, 5])
    sampler.reset_stats()
    out = sampler.sample({None: torch.arange(0, 3000, 10)})
    stats = sampler.stats()
    assert stats["rows"] == sum(out.num_sampled_edges[None])
    assert stats["tiers"]["gpu"]["rows"] + stats["tiers"]["host"]["rows"] == stats["rows"]
    device, share = placement
    if device == "cpu" or share is None:
        assert stats["hit_ratio"] == 0.0
    elif share == 1.0:
        assert stats["hit_ratio"] == 1.0
    else:
        assert 0.0 < stats["hit_ratio"] < 1.0
    with pytest.raises(RuntimeError, match="not counting"):
        build(power_law_graph(), 3000, placement)[0].stats()
    sampler.reset_stats(counting=False)  # stopped: sampling goes on, uncounted
    assert not any(t.counting for t in sampler.topologies.values())
    sampler.sample({None: torch.arange(0, 3000, 10)})
    with pytest.raises(RuntimeError, match="not counting"):
        sampler.stats()


@pytest.mark.gpu
def test_the_sampler_captures_its_cuda_graph_again_once_counting_stops(cuda_device):
    """Counting samples eagerly (its graphs dropped); once it stops, a seed count's batches are captured in a
    CUDA graph again (the second one), so a kept loader runs as fast after its statistics were read."""
    sampler, csc = build(power_law_graph(), 3000, (cuda_device, 0.5), num_neighbors=[5, 5])
    seeds = {None: torch.arange(0, 3000, 10, device=cuda_device)}
    sampler.reset_stats()
    for _ in range(3):
        sampler.sample(seeds)
    assert not any(sampler._graphs.values())  # counting: no graph
    sampler.reset_stats(counting=False)
    for _ in range(3):
        sampler.sample(seeds)
    assert any(sampler._graphs.values())  # captured again


def test_presampled_hotness_beats_degree_where_training_is_concentrated():
    from hmgstore.graph import hit_ratio, presample
    from hmgstore.rows import hotness

    n = 20_000
    ei = power_law_graph(n, 200_000, seed=5)
    sampler, csc = build(ei, n, ("cpu", None), num_neighbors=[10, 5])
    train = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:200]  # 1% of nodes, as papers100M
    hot = presample(sampler, train, batch_size=64, generator=torch.Generator().manual_seed(2), progress=False)
    assert hot.batches == 4 and int(hot.features[None].sum()) > 0 and int(hot.topology[None].sum()) > 0
    measured = presample(sampler, train, batch_size=64, generator=torch.Generator().manual_seed(3),
                         progress=False)  # another epoch, other shuffles and draws
    cache = n // 20  # 5%
    by_presample = hotness.order_by_score(hot.features[None])[:cache]
    out_degree = torch.bincount(ei[0], minlength=n)  # how often a node is someone's neighbour
    by_degree = hotness.order_by_score(out_degree)[:cache]
    assert hit_ratio(measured.features[None], by_presample) > hit_ratio(measured.features[None], by_degree)
    with pytest.raises(TypeError, match="NeighborSampler"):
        presample(object(), train)


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"),
                                    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("replace", [False, True])
def test_a_hop_drawn_as_other_seeds_equals_the_owners_sampler(device, replace):
    """sample_hop(index=...) draws each seed as the index-th seed of a requester's frontier: what a machine
    sampling its part for another one computes (hmgstore.distributed.sampling.sample_rows), on any device."""
    from hmgstore.distributed.sampling import sample_rows
    from hmgstore.graph.hop import sample_hop

    n = 3000
    csc = to_csc(power_law_graph(n), "coo", (n, n))
    topo = Topology(csc, device, gpu_budget=None if device == "cpu" else 10**9, progress=False)
    g = torch.Generator().manual_seed(8)
    seeds = torch.randint(0, n, (200,), generator=g)
    index = torch.randperm(5000, generator=g)[:200]  # where the seeds sit in the requester's frontier
    want_nbr, want_counts = sample_rows(csc.colptr, csc.row.long(), seeds, index, 6, replace, key=12345)
    nbr, _, counts = sample_hop(topo, seeds.to(device), 6, replace, 12345, index=index.to(device))
    assert torch.equal(counts.cpu(), want_counts) and torch.equal(nbr.cpu(), want_nbr)
    plain, _, _ = sample_hop(topo, seeds.to(device), 6, replace, 12345)
    assert not torch.equal(plain.cpu(), want_nbr)  # the index does change the draws
    # A part's row may be int32 (a CSC given as is): the neighbours still come back int64, as every answer is sent.
    narrow, _ = sample_rows(csc.colptr, csc.row.int(), seeds, index, -1, False, key=12345)
    assert narrow.dtype == torch.int64


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_heterogeneous_disjoint_trees_are_numbered_by_seed_across_node_types(placement):
    """Every node type's batch numbers trees by the seed they grew from (as PyG's disjoint batches do): an edge
    joins two nodes of one tree whatever their types, and a node appears once per tree of its type."""
    device, share = placement
    g = torch.Generator().manual_seed(4)
    sizes = {"paper": 500, "author": 300}
    edges = {("author", "writes", "paper"): torch.stack([torch.randint(0, 300, (2000,), generator=g),
                                                          torch.randint(0, 500, (2000,), generator=g)]),
             ("paper", "cites", "paper"): torch.stack([torch.randint(0, 500, (3000,), generator=g),
                                                       torch.randint(0, 500, (3000,), generator=g)]),
             ("paper", "written_by", "author"): torch.stack([torch.randint(0, 500, (2000,), generator=g),
                                                             torch.randint(0, 300, (2000,), generator=g)])}
    topologies = {}
    for et, ei in edges.items():
        csc = to_csc(ei, "coo", (sizes[et[0]], sizes[et[-1]]))
        budget = None if share is None else int(share * csc.num_edges * 4)
        topologies[et] = Topology(csc, device, gpu_budget=budget, progress=False)
    sampler = NeighborSampler(topologies, sizes, {et: [3, 2, 2] for et in edges}, disjoint=True)
    seeds = torch.tensor([5, 5, 17, 400])  # a repeated seed grows two trees
    out = sampler.sample({"paper": seeds})
    batch = {nt: b.cpu() for nt, b in out.batch.items()}
    node = {nt: n.cpu() for nt, n in out.node.items()}
    assert torch.equal(node["paper"][:4], seeds) and batch["paper"][:4].tolist() == [0, 1, 2, 3]
    assert len(node["author"]) > 0 and all(bool(((b >= 0) & (b < 4)).all()) for b in batch.values())
    for (src, rel, dst), row in out.row.items():
        col = out.col[(src, rel, dst)].cpu()
        assert torch.equal(batch[src][row.cpu()], batch[dst][col]), rel  # edges stay inside their seed's tree
    for nt in sizes:
        pairs = batch[nt] * sizes[nt] + node[nt]
        assert len(torch.unique(pairs)) == len(pairs), nt
    assert torch.equal(batch["paper"][node["paper"] == 5][:2], torch.tensor([0, 1]))  # both trees of seed 5
