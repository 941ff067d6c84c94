"""hmgstore.plugins.pyg.HybridNeighborSampler under PyG's stock loaders, on the CPU and (gpu marker) a GPU.

These tests need neither pyg-lib nor torch-sparse; the one that compares with PyG's own sampler
skips without them.
"""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data, HeteroData  # noqa: E402
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader  # noqa: E402

import hmgstore.plugins.pyg as hpyg  # noqa: E402
from helpers import SAGE  # noqa: E402
from hmgstore.plugins.pyg import HybridNeighborSampler  # noqa: E402

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
HAS_PYG_SAMPLER = any(importlib.util.find_spec(m) is not None for m in ("pyg_lib", "torch_sparse"))


@pytest.fixture(scope="module")
def data(small_graph):
    return Data(x=small_graph.x, y=small_graph.y, edge_index=small_graph.edge_index)


def check_batch(batch, data):
    """Features, labels and edges of a batch are those of the graph."""
    n_id = batch.n_id.cpu()
    assert torch.equal(batch.x.cpu(), data.x[n_id]) and torch.equal(batch.y.cpu(), data.y[n_id])
    ei = batch.edge_index.cpu()
    original = data.edge_index[:, batch.e_id.cpu()]  # e_id names the caller's edges
    assert torch.equal(n_id[ei], original)
    assert sum(batch.num_sampled_edges) == ei.shape[1] and sum(batch.num_sampled_nodes) == len(n_id)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("topology_budget", [None, "all"], ids=["host-topology", "gpu-topology"])
def test_neighbor_loader_over_hmgstore_stores(data, small_graph, device, topology_budget):
    stores = hpyg.from_data(data, device=device)
    sampler = HybridNeighborSampler(stores, [10, 5], device=device,
                                    gpu_budget=2**40 if topology_budget == "all" else None)
    loader = NeighborLoader(stores, [10, 5], neighbor_sampler=sampler, input_nodes=small_graph.train_idx,
                            batch_size=300, shuffle=True)
    seen = 0
    for batch in loader:
        assert batch.n_id.device.type == device and batch.x.device.type == device  # ids never left the device
        assert torch.equal(batch.n_id[:batch.batch_size].cpu(), small_graph.train_idx[batch.input_id.cpu()])
        check_batch(batch, data)
        seen += batch.batch_size
    assert seen == len(small_graph.train_idx)
    sampler.close()


def test_neighbor_loader_over_a_data_object_with_workers(data, small_graph):
    sampler = HybridNeighborSampler(data, [5, 5], device="cpu", disjoint=True, subgraph_type="bidirectional")
    loader = NeighborLoader(data, [5, 5], neighbor_sampler=sampler, input_nodes=small_graph.train_idx[:200],
                            batch_size=50, num_workers=2)
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id]) and batch.batch is not None
        assert torch.equal(batch.batch[:batch.batch_size], torch.arange(batch.batch_size))
        ei = batch.edge_index
        assert torch.equal(batch.batch[ei[0]], batch.batch[ei[1]])  # disjoint: edges stay in their tree


@pytest.mark.parametrize("device", DEVICES)
def test_hetero_loader(device):
    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["paper"].x = torch.randn(400, 8, generator=g)
    data["paper"].y = torch.randint(0, 3, (400,), generator=g)
    data["author"].x = torch.randn(200, 4, generator=g)
    data["author", "writes", "paper"].edge_index = torch.stack([torch.randint(0, 200, (1500,), generator=g),
                                                                torch.randint(0, 400, (1500,), generator=g)])
    data["paper", "written_by", "author"].edge_index = data["author", "writes", "paper"].edge_index.flip(0)
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 400, (2, 2000), generator=g)
    stores = hpyg.from_data(data, device=device)
    fanout = {("author", "writes", "paper"): [4, 2], ("paper", "written_by", "author"): [3, 2],
              ("paper", "cites", "paper"): [2, 2]}
    sampler = HybridNeighborSampler(stores, fanout, device=device)
    loader = NeighborLoader(stores, fanout, neighbor_sampler=sampler, input_nodes=("paper", torch.arange(100)),
                            batch_size=32)  # the loader's fanout as the sampler's: no warning that they differ
    for batch in loader:
        assert batch["paper"].batch_size == 32 or batch["paper"].batch_size == 4
        for nt in ("paper", "author"):
            n_id = batch[nt].n_id.cpu()
            assert torch.equal(batch[nt].x.cpu(), data[nt].x[n_id])
        for et in data.edge_types:
            ei = batch[et].edge_index.cpu()
            src, dst = batch[et[0]].n_id.cpu()[ei[0]], batch[et[-1]].n_id.cpu()[ei[1]]
            assert torch.equal(torch.stack([src, dst]), data[et].edge_index[:, batch[et].e_id.cpu()])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("neg", ["binary", "triplet"])
def test_link_neighbor_loader(data, device, neg):
    stores = hpyg.from_data(data, device=device)
    sampler = HybridNeighborSampler(stores, [5, 3], device=device)
    label_index = data.edge_index[:, :400]
    loader = LinkNeighborLoader(stores, [5, 3], neighbor_sampler=sampler, edge_label_index=(None, label_index),
                                neg_sampling=neg, batch_size=100)
    for batch in loader:
        check_batch(batch, data)
        n_id = batch.n_id.cpu()
        if neg == "binary":
            pos = batch.edge_label.cpu() == 1
            assert torch.equal(n_id[batch.edge_label_index.cpu()[:, pos]], label_index[:, batch.input_id.cpu()])
        else:
            assert torch.equal(n_id[batch.src_index.cpu()], label_index[0, batch.input_id.cpu()])
            assert torch.equal(n_id[batch.dst_pos_index.cpu()], label_index[1, batch.input_id.cpu()])


@pytest.mark.parametrize("device", DEVICES)
def test_bad_seeds_raise(data, device):
    sampler = HybridNeighborSampler(data, [3], device=device)
    data = data.clone().to(device)  # Data.to() moves in place: leave the shared fixture alone
    loader = NeighborLoader(data, [3], neighbor_sampler=sampler,
                            input_nodes=torch.tensor([0, data.num_nodes]), batch_size=2)
    with pytest.raises(IndexError, match="out of range"):
        next(iter(loader))
    loader = NeighborLoader(data, [3], neighbor_sampler=sampler, input_nodes=torch.tensor([1, 2]), batch_size=2)
    assert next(iter(loader)).n_id[:2].tolist() == [1, 2]  # still usable


@pytest.mark.parametrize("device", DEVICES)
def test_closed_sampler_refuses(data, device):
    """As the README says: after close(), a sampler refuses with an error saying so, whatever the loader."""
    sampler = HybridNeighborSampler(data, [3], device=device)
    loader = NeighborLoader(data, [3], neighbor_sampler=sampler, input_nodes=torch.tensor([1, 2]), batch_size=2)
    next(iter(loader))
    sampler.close()
    with pytest.raises(RuntimeError, match="sampler was closed"):
        next(iter(loader))
    with pytest.raises(RuntimeError, match="sampler was closed"):
        next(iter(LinkNeighborLoader(data, [3], neighbor_sampler=sampler, edge_label_index=data.edge_index[:, :4],
                                     batch_size=2)))


def test_options_the_graph_cannot_serve_say_so(data):
    with pytest.raises(ValueError, match="time attribute 'time'"):
        HybridNeighborSampler(data, [3], time_attr="time")
    with pytest.raises(ValueError, match="edge attribute 'w'"):
        HybridNeighborSampler(data, [3], weight_attr="w")
    with pytest.raises(ValueError, match="cannot be disjoint"):
        HybridNeighborSampler(data, [3], subgraph_type="induced", disjoint=True)
    with pytest.raises(TypeError, match="takes a Data"):
        HybridNeighborSampler(data.x, [3])


@pytest.mark.gpu
def test_gpu_sampler_refuses_worker_processes(data):
    sampler = HybridNeighborSampler(data, [3], device="cuda")
    with pytest.raises(TypeError, match="num_workers=0"):
        import pickle
        pickle.dumps(sampler)


def train_and_test(loader_of, small_graph, device) -> float:
    torch.manual_seed(0)
    model = SAGE(small_graph.x.shape[1], 32, small_graph.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        for batch in loader_of(small_graph.train_idx, True):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(batch.x, batch.edge_index)[:batch.batch_size], batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
    correct = total = 0
    with torch.no_grad():
        for batch in loader_of(small_graph.test_idx, False):
            pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
    return correct / total


@pytest.mark.parametrize("device", DEVICES)
def test_graphsage_learns_as_with_pyg_sampler(data, small_graph, device):
    stores = hpyg.from_data(data, device=device)
    sampler = HybridNeighborSampler(stores, [10, 5], device=device)
    ours = train_and_test(lambda ids, shuffle: NeighborLoader(stores, [10, 5], neighbor_sampler=sampler,
                                                              input_nodes=ids, batch_size=256, shuffle=shuffle),
                          small_graph, device)
    assert ours > 0.9  # the synthetic task is learnable to ~0.98 (examples/pyg_graphsage.py)
    if HAS_PYG_SAMPLER:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = train_and_test(lambda ids, shuffle: NeighborLoader(data, [10, 5], input_nodes=ids,
                                                                        batch_size=256, shuffle=shuffle),
                                    small_graph, "cpu")
        assert abs(ours - theirs) < 0.05, (ours, theirs)
