"""HybridNeighborSampler's options beyond uniform sampling under PyG's loaders: ``weight_attr``,
``subgraph_type="induced"``, on the CPU and (gpu marker) a GPU.

Induced subgraphs are compared with PyG's own sampler where sampling is deterministic (every
neighbour, ``-1``), and otherwise with every edge of the graph between the batch's nodes.
"""
import importlib.util
import warnings

import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402

from hmgstore.plugins.pyg import HybridNeighborSampler  # noqa: E402

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
HAS_PYG_SAMPLER = any(importlib.util.find_spec(m) is not None for m in ("pyg_lib", "torch_sparse"))


def graph(num_nodes=300, num_edges=2400, seed=0) -> Data:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    weight = torch.where(torch.rand(num_edges, generator=g) < 0.4, 0.0, torch.rand(num_edges, generator=g) + 0.5)
    return Data(x=torch.randn(num_nodes, 4, generator=g), edge_index=ei, edge_weight=weight, num_nodes=num_nodes)


def edge_set(batch) -> set:
    n_id = batch.n_id.cpu()
    ei = batch.edge_index.cpu()
    return set(zip(n_id[ei[0]].tolist(), n_id[ei[1]].tolist(), batch.e_id.cpu().tolist()))


def all_edges_between(data, nodes) -> set:
    inside = torch.zeros(data.num_nodes, dtype=torch.bool)
    inside[nodes] = True
    src, dst = data.edge_index
    keep = (inside[src] & inside[dst]).nonzero().view(-1)
    return set(zip(src[keep].tolist(), dst[keep].tolist(), keep.tolist()))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_attr_leaves_out_zero_weight_edges(device):
    data = graph()
    positive = torch.zeros(data.num_nodes, dtype=torch.long).index_add_(0, data.edge_index[1],
                                                                       (data.edge_weight > 0).long())
    sampler = HybridNeighborSampler(data, [2, 2], device=device, weight_attr="edge_weight")
    assert all(t.weighted for t in sampler.topologies.values())
    loader = NeighborLoader(data, [2, 2], neighbor_sampler=sampler, input_nodes=torch.arange(200), batch_size=50)
    zeros = total = 0
    for batch in loader:
        e_id = batch.e_id.cpu()
        dst = data.edge_index[1, e_id]
        zero = data.edge_weight[e_id] == 0
        assert bool((positive[dst[zero]] < 2).all())  # only to fill the fanout of a node short of weight
        n_id = batch.n_id.cpu()
        assert torch.equal(n_id[batch.edge_index.cpu()], data.edge_index[:, e_id])
        zeros, total = zeros + int(zero.sum()), total + len(e_id)
    assert zeros < 0.05 * total  # 40% of the edges weigh 0, but few nodes have fewer than 2 positive ones


@pytest.mark.parametrize("device", DEVICES)
def test_induced_holds_every_edge_between_the_nodes(device):
    data = graph()
    sampler = HybridNeighborSampler(data, [3, 2], device=device, subgraph_type="induced")
    loader = NeighborLoader(data, [3, 2], neighbor_sampler=sampler, input_nodes=torch.arange(120), batch_size=40)
    for batch in loader:
        assert edge_set(batch) == all_edges_between(data, batch.n_id.cpu())
        assert batch.edge_index.shape[1] == len(edge_set(batch))  # no edge twice


@pytest.mark.parametrize("device", DEVICES)
def test_induced_gives_every_copy_of_a_repeated_seed_its_edges(device):
    """A batch's seeds may repeat (PyG keeps them, n_id too): as in PyG's induced subgraph, each copy of a node is
    a destination of all its in-edges from the batch's nodes (each copy is a seed with a label and a loss), and a
    source is the first position of its id."""
    data = graph()
    sampler = HybridNeighborSampler(data, [3, 2], device=device, subgraph_type="induced")
    seeds = torch.tensor([5, 5, 9, 17, 9, 5])
    loader = NeighborLoader(data, [3, 2], neighbor_sampler=sampler, input_nodes=seeds, batch_size=len(seeds))
    batch = next(iter(loader))
    n_id = batch.n_id.cpu()
    assert torch.equal(n_id[:len(seeds)], seeds)
    assert edge_set(batch) == all_edges_between(data, n_id)
    first = {int(v): i for i, v in reversed(list(enumerate(n_id.tolist())))}
    src, dst = batch.edge_index.cpu()
    assert all(first[int(n_id[i])] == i for i in src.tolist())
    e_id, inside = batch.e_id.cpu(), set(n_id.tolist())
    for pos, node in enumerate(n_id.tolist()):  # every copy: all the node's in-edges from the batch, each once
        want = [e for e, (u, v) in enumerate(data.edge_index.t().tolist()) if v == node and u in inside]
        assert sorted(e_id[dst == pos].tolist()) == want


@pytest.mark.skipif(not HAS_PYG_SAMPLER, reason="needs pyg-lib or torch-sparse for PyG's own sampler")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("repeats", [0, 7])
def test_induced_matches_pyg_with_every_neighbour(device, repeats):
    """The same nodes and the same edges, each at the same seed position, with seeds that repeat too."""
    data = graph(num_nodes=500, num_edges=900)
    seeds = torch.arange(0, 500, 25)
    seeds = torch.cat([seeds, seeds[3:3 + repeats]])
    n = len(seeds)
    sampler = HybridNeighborSampler(data, [-1, -1], device=device, subgraph_type="induced")
    ours = next(iter(NeighborLoader(data, [-1, -1], neighbor_sampler=sampler, input_nodes=seeds, batch_size=n)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = next(iter(NeighborLoader(data, [-1, -1], subgraph_type="induced", input_nodes=seeds,
                                          batch_size=n)))
    assert set(ours.n_id.cpu().tolist()) == set(theirs.n_id.tolist())
    assert torch.equal(ours.n_id[:n].cpu(), theirs.n_id[:n])
    assert edge_set(ours) == edge_set(theirs)

    def into_seeds(batch):  # (source id, seed position, edge id): which copy of a seed each edge reaches
        ei, n_id = batch.edge_index.cpu(), batch.n_id.cpu()
        at = ei[1] < n
        return sorted(zip(n_id[ei[0][at]].tolist(), ei[1][at].tolist(), batch.e_id.cpu()[at].tolist()))

    assert into_seeds(ours) == into_seeds(theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_hetero_weighted_and_induced(device):
    g = torch.Generator().manual_seed(1)
    data = HeteroData()
    data["paper"].x = torch.randn(200, 4, generator=g)
    data["author"].x = torch.randn(100, 4, generator=g)
    writes = torch.stack([torch.randint(0, 100, (800,), generator=g), torch.randint(0, 200, (800,), generator=g)])
    data["author", "writes", "paper"].edge_index = writes
    data["author", "writes", "paper"].w = (torch.arange(800) % 2).float()  # every other edge weight 0
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 200, (2, 900), generator=g)
    fanout = [2, 1]
    sampler = HybridNeighborSampler(data, fanout, device=device, weight_attr="w")
    assert sampler.topologies[("author", "writes", "paper")].weighted
    assert not sampler.topologies[("paper", "cites", "paper")].weighted  # no weights: uniform
    for batch in NeighborLoader(data, fanout, neighbor_sampler=sampler, input_nodes=("paper", torch.arange(64)),
                                batch_size=32):
        e_id = batch["author", "writes", "paper"].e_id.cpu()
        paper = writes[1, e_id]
        short = torch.zeros(200, dtype=torch.long).index_add_(0, writes[1], (torch.arange(800) % 2))
        assert bool((short[paper[(e_id % 2) == 0]] < 2).all())
    sampler = HybridNeighborSampler(data, fanout, device=device, subgraph_type="induced")
    batch = next(iter(NeighborLoader(data, fanout, neighbor_sampler=sampler,
                                     input_nodes=("paper", torch.arange(32)), batch_size=32)))
    for et in data.edge_types:
        src_ids, dst_ids = batch[et[0]].n_id.cpu(), batch[et[-1]].n_id.cpu()
        ei = batch[et].edge_index.cpu()
        got = set(zip(src_ids[ei[0]].tolist(), dst_ids[ei[1]].tolist()))
        s, d = data[et].edge_index
        inside = torch.isin(s, src_ids) & torch.isin(d, dst_ids)
        assert got == set(zip(s[inside].tolist(), d[inside].tolist()))


def temporal_data(level: str, n=300, m=2400, seed=2) -> Data:
    data = graph(n, m, seed)
    g = torch.Generator().manual_seed(seed)
    if level == "node":
        data.time = torch.randint(0, 100, (n,), generator=g)
    else:
        data.etime = torch.randint(0, 100, (m,), generator=g)
    return data


def check_in_the_past(batch, data, level, seed_time):
    """Every sampled edge is no later than the seed time of the tree it belongs to."""
    e_id, ei = batch.e_id.cpu(), batch.edge_index.cpu()
    tree = batch.batch.cpu()[ei[1]]
    if level == "node":
        when = data.time[batch.n_id.cpu()[ei[0]]]
    else:
        when = data.etime[e_id]
    assert bool((when <= seed_time[tree]).all())
    assert torch.equal(tree, batch.batch.cpu()[ei[0]])  # disjoint trees


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("level", ["node", "edge"])
@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_temporal_neighbor_loader(device, level, strategy):
    data = temporal_data(level)
    attr = "time" if level == "node" else "etime"
    sampler = HybridNeighborSampler(data, [4, 3], device=device, time_attr=attr, temporal_strategy=strategy)
    seeds = torch.arange(0, 300, 3)
    input_time = torch.randint(20, 100, (len(seeds),), generator=torch.Generator().manual_seed(3))
    loader = NeighborLoader(data, [4, 3], neighbor_sampler=sampler, input_nodes=seeds, input_time=input_time,
                            time_attr=attr, batch_size=25)
    batches = list(loader)
    for i, batch in enumerate(batches):
        check_in_the_past(batch, data, level, input_time[25 * i:25 * (i + 1)])
    if strategy == "last":  # deterministic: the same batches again
        again = list(NeighborLoader(data, [4, 3], neighbor_sampler=sampler, input_nodes=seeds,
                                    input_time=input_time, time_attr=attr, batch_size=25))
        assert all(torch.equal(a.e_id, b.e_id) for a, b in zip(batches, again))


@pytest.mark.parametrize("device", DEVICES)
def test_temporal_seed_times_default_to_node_times(device):
    data = temporal_data("node")
    sampler = HybridNeighborSampler(data, [4], device=device, time_attr="time")
    batch = next(iter(NeighborLoader(data, [4], neighbor_sampler=sampler, input_nodes=torch.arange(40),
                                     batch_size=40)))
    check_in_the_past(batch, data, "node", data.time[:40])
    edge_level = HybridNeighborSampler(temporal_data("edge"), [4], device=device, time_attr="etime")
    with pytest.raises(ValueError, match="input_time"):
        next(iter(NeighborLoader(data, [4], neighbor_sampler=edge_level, input_nodes=torch.arange(4),
                                 batch_size=4)))


@pytest.mark.parametrize("device", DEVICES)
def test_temporal_link_neighbor_loader(device):
    from torch_geometric.loader import LinkNeighborLoader

    data = temporal_data("edge")
    sampler = HybridNeighborSampler(data, [3, 2], device=device, time_attr="etime")
    label_index, label_time = data.edge_index[:, :200], data.etime[:200]
    loader = LinkNeighborLoader(data, [3, 2], neighbor_sampler=sampler, edge_label_index=label_index,
                                edge_label_time=label_time, time_attr="etime", batch_size=50, neg_sampling="binary")
    for batch in loader:
        n_id = batch.n_id.cpu()
        pos = batch.edge_label.cpu() == 1
        assert torch.equal(n_id[batch.edge_label_index.cpu()[:, pos]], label_index[:, batch.input_id.cpu()])
        seed_time = torch.cat([label_time[batch.input_id.cpu()]] * 4)  # src, dst, then the negatives' ends
        check_in_the_past(batch, data, "edge", seed_time)


def test_temporal_option_errors():
    data = temporal_data("node")
    with pytest.raises(ValueError, match="neither a node-level nor an edge-level"):
        HybridNeighborSampler(data, [3], time_attr="when")
    with pytest.raises(ValueError, match="weights and times"):
        HybridNeighborSampler(data, [3], time_attr="time", weight_attr="edge_weight")
    with pytest.raises(ValueError, match="cannot be disjoint or temporal"):
        HybridNeighborSampler(data, [3], time_attr="time", subgraph_type="induced")


@pytest.mark.parametrize("device", DEVICES)
def test_labor_under_neighbor_loader(device):
    data = graph()
    sampler = HybridNeighborSampler(data, [4, 3], device=device, labor=True)
    for batch in NeighborLoader(data, [4, 3], neighbor_sampler=sampler, input_nodes=torch.arange(100),
                                batch_size=50):
        n_id = batch.n_id.cpu()
        assert torch.equal(n_id[batch.edge_index.cpu()], data.edge_index[:, batch.e_id.cpu()])
        assert sum(batch.num_sampled_edges) == batch.edge_index.shape[1]
    hetero = HeteroData()
    hetero["paper"].x, hetero["author"].x = torch.randn(200, 4), torch.randn(50, 4)
    g = torch.Generator().manual_seed(6)
    authors = torch.stack([torch.randperm(50, generator=g)[:25] for _ in range(200)]).reshape(-1)
    writes = torch.stack([authors, torch.arange(200).repeat_interleave(25)])  # 25 of the 50 authors a paper
    hetero["author", "writes", "paper"].edge_index = writes
    hetero["paper", "cites", "paper"].edge_index = torch.randint(0, 200, (2, 900), generator=g)
    sizes = {}
    for labor in (False, True):
        sampler = HybridNeighborSampler(hetero, [3, 2], device=device, labor=labor,
                                        generator=torch.Generator().manual_seed(0))
        batch = next(iter(NeighborLoader(hetero, [3, 2], neighbor_sampler=sampler,
                                         input_nodes=("paper", torch.arange(100)), batch_size=100)))
        ei = batch["author", "writes", "paper"].edge_index.cpu()
        got = torch.stack([batch["author"].n_id.cpu()[ei[0]], batch["paper"].n_id.cpu()[ei[1]]])
        assert torch.equal(got, writes[:, batch["author", "writes", "paper"].e_id.cpu()])
        sizes[labor] = len(batch["author"].n_id)
    assert sizes[True] < 0.6 * sizes[False]  # uniform: 3 of 25 for 100 papers, nearly all 50; LABOR: ~3/25 of them


@pytest.mark.parametrize("device", DEVICES)
def test_hetero_temporal_neighbor_loader(device):
    """Node times on a HeteroData: every sampled edge's source is no later than its tree's seed."""
    g = torch.Generator().manual_seed(4)
    data = HeteroData()
    data["paper"].x, data["paper"].time = torch.randn(200, 4, generator=g), torch.randint(0, 100, (200,), generator=g)
    data["author"].x, data["author"].time = torch.randn(100, 4, generator=g), torch.randint(0, 100, (100,), generator=g)
    data["author", "writes", "paper"].edge_index = torch.stack([torch.randint(0, 100, (800,), generator=g),
                                                               torch.randint(0, 200, (800,), generator=g)])
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 200, (2, 900), generator=g)
    data["paper", "rev_writes", "author"].edge_index = data["author", "writes", "paper"].edge_index.flip(0)
    sampler = HybridNeighborSampler(data, [3, 2], device=device, time_attr="time", temporal_strategy="last")
    seeds = torch.arange(64)
    for batch in NeighborLoader(data, [3, 2], neighbor_sampler=sampler, input_nodes=("paper", seeds),
                                batch_size=32, time_attr="time"):
        seed_time = data["paper"].time[batch["paper"].n_id[:32].cpu()]  # seed times: the seeds' node times
        for et in data.edge_types:
            ei = batch[et].edge_index.cpu()
            src_time = data[et[0]].time[batch[et[0]].n_id.cpu()[ei[0]]]
            tree = batch[et[-1]].batch.cpu()[ei[1]]
            assert bool((src_time <= seed_time[tree]).all())
            assert torch.equal(tree, batch[et[0]].batch.cpu()[ei[0]])


@pytest.mark.parametrize("device", DEVICES)
def test_hetero_edge_times(device):
    """Edge times on some edge types of a HeteroData: those respect the seed times, the others are free."""
    g = torch.Generator().manual_seed(8)
    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(200, 4, generator=g), torch.randn(100, 4, generator=g)
    writes = ("author", "writes", "paper")
    data[writes].edge_index = torch.stack([torch.randint(0, 100, (800,), generator=g),
                                           torch.randint(0, 200, (800,), generator=g)])
    data[writes].etime = torch.randint(0, 100, (800,), generator=g)
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 200, (2, 900), generator=g)
    sampler = HybridNeighborSampler(data, [4, 2], device=device, time_attr="etime")
    assert sampler.topologies[writes].temporal and not sampler.topologies[("paper", "cites", "paper")].temporal
    input_time = torch.randint(0, 100, (64,), generator=g)
    sampled = 0
    for i, batch in enumerate(NeighborLoader(data, [4, 2], neighbor_sampler=sampler, time_attr="etime",
                                             input_nodes=("paper", torch.arange(64)), input_time=input_time,
                                             batch_size=32)):
        tree = batch["paper"].batch.cpu()[batch[writes].edge_index.cpu()[1]]
        when = data[writes].etime[batch[writes].e_id.cpu()]
        assert bool((when <= input_time[32 * i:32 * (i + 1)][tree]).all())
        sampled += len(when)
    assert sampled > 0
