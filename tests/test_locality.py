"""Locality (hmgstore.graph.locality): layouts of the host tier, batches from few parts, pages touched.

Tables laid out by a layout read exactly ``x[idx]`` on the CPU and (gpu marker) on a GPU, with a GPU tier,
a stored format, writes and pickling; the orders are permutations that keep planted communities together;
locality-aware batches visit every seed once per epoch, from few parts, through a stock PyG loader.
"""
from __future__ import annotations

import importlib.util
import pickle

import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore.data import synthetic
from hmgstore.graph import NeighborSampler, Topology, locality, to_csc

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def graph():
    """20k nodes in 200 planted communities of one class each (most edges inside one)."""
    return synthetic(num_nodes=20_000, avg_degree=8, feat_dim=8, num_classes=4, communities=200, seed=2)


@pytest.fixture(scope="module")
def csc(graph):
    return to_csc(graph.edge_index, "coo", (graph.num_nodes, graph.num_nodes))


def is_permutation(order, n) -> bool:
    return len(order) == n and torch.equal(torch.sort(order).values, torch.arange(n))


# ---- orders ---------------------------------------------------------------------------------------------------
def test_label_propagation_keeps_edges_inside_its_communities(graph, csc):
    labels = locality.label_propagation(csc, generator=torch.Generator().manual_seed(0), progress=False)
    src, dst = graph.edge_index
    inside = (labels[src] == labels[dst]).float().mean()
    assert 50 <= torch.unique(labels).numel() <= 5000  # found communities, neither one blob nor singletons
    assert inside > 0.5  # most edges stay inside a found community (a random split keeps ~1/communities)


def test_community_order_puts_neighbours_close(graph, csc):
    order = locality.community_order(csc, generator=torch.Generator().manual_seed(0), progress=False)
    assert is_permutation(order, graph.num_nodes)
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order))
    src, dst = graph.edge_index
    near = ((position[src] - position[dst]).abs() < 1000).float().mean()
    by_id = ((src - dst).abs() < 1000).float().mean()
    assert near > 0.4 and near > 5 * by_id


@pytest.mark.skipif(importlib.util.find_spec("pymetis") is None, reason="pymetis not installed")
def test_metis_order_groups_its_parts(graph, csc):
    order, part = locality.metis_order(csc, 16)
    assert is_permutation(order, graph.num_nodes) and part.shape == (graph.num_nodes,)
    assert bool((part[order].diff() >= 0).all())  # parts in order, each one contiguous
    src, dst = graph.edge_index
    assert (part[src] == part[dst]).float().mean() > 0.3  # a 16-way random split keeps 1/16


def test_metis_order_without_pymetis_says_how_to_get_it(monkeypatch, csc):
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError("no")) if name == "pymetis"
                        else real(name, *a, **k))
    with pytest.raises(ImportError, match="pip install pymetis"):
        locality.metis_order(csc, 4)


def test_coaccess_order_lays_out_nodes_in_first_touch_order(graph, csc):
    topo = Topology(csc, "cpu", progress=False)
    sampler = NeighborSampler({None: topo}, {None: graph.num_nodes}, [4, 2])
    seeds = graph.train_idx[:300]
    torch.manual_seed(0)
    first = sampler.sample({None: seeds[:100]}).node[None]  # what batch 0 touches, drawn as the order will
    torch.manual_seed(0)
    order = locality.coaccess_order(sampler, seeds, batch_size=100, progress=False)
    assert is_permutation(order, graph.num_nodes)
    assert torch.equal(order[:len(first)].sort().values, first.sort().values)  # batch 0's rows come first
    with pytest.raises(TypeError, match="NeighborSampler"):
        locality.coaccess_order(object(), seeds)


def test_pages_touched_counts_distinct_pages():
    rows = locality.rows_per_page(1024)  # 2048 rows of 1 KiB a page
    assert rows == 2048
    ids = torch.tensor([0, 1, 2047, 2048, 10 * 2048 + 5])
    assert locality.pages_touched(ids, 1024) == 3
    layout = torch.arange(20 * 2048).flip(0)  # the same rows, laid out backwards
    assert locality.pages_touched(ids, 1024, layout) == 3
    assert locality.pages_touched(torch.arange(0, 20 * 2048, 2048), 1024) == 20
    together = torch.arange(0, 20 * 2048, 2048)
    layout = torch.cat([together, torch.tensor([i for i in range(20 * 2048) if i % 2048])])
    assert locality.pages_touched(together, 1024, layout) == 1  # laid out together: one page


# ---- locality-aware batches ------------------------------------------------------------------------------------
def test_locality_batches_visit_every_seed_once_from_few_parts():
    n, parts = 10_000, 20
    node_part = torch.randint(0, parts, (n,), generator=torch.Generator().manual_seed(1))
    seeds = torch.randperm(n, generator=torch.Generator().manual_seed(2))[:6000]
    sampler = locality.LocalityBatchSampler(seeds, node_part, 256, window=4, generator=torch.Generator().manual_seed(3))
    epoch = list(sampler)
    assert len(epoch) == len(sampler) == -(-6000 // 256)
    assert sorted(p for b in epoch for p in b) == list(range(6000))  # every position once
    spans = [len(torch.unique(node_part[seeds[torch.tensor(b)]])) for b in epoch]
    assert max(spans) <= 8  # a window of 4 parts, or two at a window's end
    again = list(sampler)
    assert again != epoch  # a new shuffle every epoch
    same = locality.LocalityBatchSampler(seeds, node_part, 256, window=4, generator=torch.Generator().manual_seed(3))
    assert list(same) == epoch  # reproducible from its generator
    dropping = locality.LocalityBatchSampler(seeds, node_part, 256, window=4, drop_last=True)
    assert all(len(b) == 256 for b in dropping) and len(dropping) == 6000 // 256


def test_locality_batches_refuse_bad_arguments():
    with pytest.raises(ValueError, match="at least 1"):
        locality.LocalityBatchSampler(torch.arange(10), torch.zeros(10, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="has none"):
        locality.LocalityBatchSampler(torch.tensor([3, 20]), torch.zeros(10, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="at least 1"):
        locality.parts_of(torch.arange(10), 0)


def test_locality_batches_drive_a_stock_pyg_loader(graph):
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    stores = from_data(Data(x=graph.x, y=graph.y, edge_index=graph.edge_index), progress=False)
    sampler = HybridNeighborSampler(stores, [4, 2], progress=False)
    part = locality.parts_of(torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(4)), 500)
    batches = locality.LocalityBatchSampler(graph.train_idx, part, 512, 4, generator=torch.Generator().manual_seed(5))
    loader = NeighborLoader(stores, [4, 2], neighbor_sampler=sampler, input_nodes=graph.train_idx,
                            batch_sampler=batches)
    seeds = []
    for batch in loader:
        seeds.append(batch.n_id[:batch.batch_size].cpu())
        assert_same(batch.x.cpu(), graph.x[batch.n_id.cpu()])
    assert len(seeds) == len(loader) and torch.equal(torch.cat(seeds).sort().values, graph.train_idx.sort().values)


# ---- tables laid out by locality -------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compress", [None, "int8"])
@pytest.mark.parametrize("resident", [True, False], ids=["gpu-tier", "host-only"])
def test_a_laid_out_table_reads_x_idx_from_every_tier(device, compress, resident):
    x = random_table(30_000, (24,), torch.float32, seed=6)
    fmt = None if compress is None else hmgstore.rows.formats.get(compress)
    want = x if compress is None else fmt.decode(fmt.encode(x), (24,))
    layout = torch.randperm(30_000, generator=torch.Generator().manual_seed(7))
    gpu_rows = torch.arange(0, 30_000, 4) if device == "cuda" and resident else None
    t = hmgstore.HybridTensor(x, device, layout=layout, compress=compress, gpu_rows=gpu_rows, progress=False)
    assert torch.equal(t.layout, layout)
    idx = torch.randint(0, 30_000, (20_000,), generator=torch.Generator().manual_seed(8))
    out = torch.full((20_000, 24), float("nan"), device=t.device)
    t.gather(idx, out=out)
    assert_same(out.cpu(), want[idx])
    assert_same(t[idx.to(t.device)].cpu(), want[idx])
    assert_same(t.dense(), want)
    t[torch.tensor([5, 29_999])] = 2.0
    assert_same(t[torch.tensor([29_999, 5])].cpu(), torch.full((2, 24), 2.0))
    back = pickle.loads(pickle.dumps(t))
    assert_same(back[idx].cpu(), t[idx].cpu())


def test_a_layout_must_be_a_permutation():
    x = torch.ones(10, 2)
    with pytest.raises(ValueError, match="10 ids, got 9"):
        hmgstore.HybridTensor(x, "cpu", layout=torch.arange(9))
    with pytest.raises(ValueError, match="row 8 is listed 2 times"):
        hmgstore.HybridTensor(x, "cpu", layout=torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 8]))
    with pytest.raises(IndexError):
        hmgstore.HybridTensor(x, "cpu", layout=torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 10]))


@pytest.mark.gpu
def test_a_laid_out_table_splits_and_groups_by_its_host_positions(cuda_device):
    x = random_table(150_000, (32,), torch.float32, seed=9)
    layout = torch.randperm(150_000, generator=torch.Generator().manual_seed(10))
    t = hmgstore.HybridTensor(x, cuda_device, layout=layout, split=0.5, gpu_rows=torch.arange(0, 150_000, 5),
                              progress=False)
    idx = torch.randint(0, 150_000, (60_000,), generator=torch.Generator().manual_seed(11))
    assert_same(t[idx].cpu(), x[idx])  # CPU ids: split between the CPU (host positions) and the kernel
    assert_same(t[idx.to(cuda_device)].cpu(), x[idx])
