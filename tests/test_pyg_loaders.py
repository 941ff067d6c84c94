"""Stock PyG loaders over the adapter's stores (hmgstore.plugins.pyg): from_data and from_tensors.

Every check compares with PyG fed the plain ``Data``/``HeteroData``:
batches hold ``data.x[n_id]`` and ``data.y[n_id]``, the same seeds sample the
same batches (NeighborLoader, LinkNeighborLoader, workers, ``pin_memory``,
``PrefetchLoader``), and a GraphSAGE trained through the stores has the same
losses. Tests marked ``gpu`` build CUDA stores: batches come back on the GPU
(as ResidentTensor, so pinning is a no-op), whichever tier a row lives in.
The graphs and the model are in helpers.py, the ``data`` and ``hetero``
fixtures in conftest.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torch_sparse")  # PyG's stock sampler needs it (or pyg-lib)

from torch_geometric.loader import LinkNeighborLoader, NeighborLoader, PrefetchLoader  # noqa: E402

from helpers import NUM_AUTHORS, ROW_BYTES, assert_batches_match, train_losses, write_fake_products  # noqa: E402
from hmgstore.plugins import pyg as hpyg  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")


@pytest.mark.parametrize("num_workers, filter_per_worker", [(0, None), (2, None), (2, False)])
def test_neighbor_loader_batches_equal_data(data, small_graph, num_workers, filter_per_worker):
    stores = hpyg.from_data(data, device="cpu")
    kwargs = dict(num_neighbors=[5, 5], input_nodes=small_graph.train_idx, batch_size=256, shuffle=True,
                  num_workers=num_workers)
    if filter_per_worker is not None:
        kwargs["filter_per_worker"] = filter_per_worker
    assert assert_batches_match(NeighborLoader(stores, **kwargs), NeighborLoader(data, **kwargs), data) == 5


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hetero_neighbor_loader(hetero, num_workers):
    stores = hpyg.from_data(hetero, device="cpu")
    seeds = torch.arange(0, 2000, 3)
    loader = NeighborLoader(stores, num_neighbors=[5, 5], input_nodes=("paper", seeds), batch_size=256,
                            shuffle=True, num_workers=num_workers)
    count = 0
    for batch in loader:
        count += 1
        for node_type in ("paper", "author"):
            assert torch.equal(batch[node_type].x, hetero[node_type].x[batch[node_type].n_id])
        assert torch.equal(batch["paper"].y, hetero["paper"].y[batch["paper"].n_id])
        assert batch["author"].num_nodes > 0
    assert count == 3


def test_link_neighbor_loader(data, hetero):
    stores = hpyg.from_data(data, device="cpu")
    label_index = data.edge_index[:, :600]
    loader = LinkNeighborLoader(stores, num_neighbors=[5, 5], edge_label_index=(None, label_index),
                                batch_size=128, neg_sampling_ratio=1.0, shuffle=True)
    for batch in loader:
        assert torch.equal(batch.x, data.x[batch.n_id])
        assert batch.edge_label_index.max() < batch.num_nodes
    stores = hpyg.from_data(hetero, device="cpu")
    loader = LinkNeighborLoader(stores, num_neighbors=[5, 5], edge_label_index=("author", "writes", "paper"),
                                batch_size=512)
    for batch in loader:
        for node_type in ("paper", "author"):
            assert torch.equal(batch[node_type].x, hetero[node_type].x[batch[node_type].n_id])


def test_pin_memory_and_prefetch_loader(data, small_graph):
    stores = hpyg.from_data(data, device="cpu")
    loader = NeighborLoader(stores, num_neighbors=[5], input_nodes=small_graph.train_idx[:512], batch_size=256,
                            pin_memory=torch.cuda.is_available())
    for batch in PrefetchLoader(loader, device="cpu"):
        assert torch.equal(batch.x, data.x[batch.n_id])


def test_from_tensors_csr_csc_and_memmap(data, small_graph, tmp_path):
    n = data.num_nodes
    x_path = tmp_path / "x.npy"
    np.save(x_path, data.x.numpy())
    x = np.load(x_path, mmap_mode="r")  # read-only memmap: used in place
    reference = hpyg.to_csc(data.edge_index, "coo", (n, n))
    kwargs = dict(num_neighbors=[5, 5], input_nodes=small_graph.train_idx, batch_size=256, shuffle=True)
    for topology in (dict(edge_index=data.edge_index), dict(csc=(reference.row, reference.colptr))):
        stores = hpyg.from_tensors(**topology, x=x, y=data.y, device="cpu")
        source = stores[0].table(None, "x").source  # read-only memory comes back as the read-only array itself
        assert isinstance(source, np.ndarray) and source.ctypes.data == np.asarray(x).ctypes.data
        loader = NeighborLoader(stores, **kwargs)
        for batch in loader:
            assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
    with pytest.raises(ValueError, match="topology once"):
        hpyg.from_tensors(edge_index=data.edge_index, csc=(reference.row, reference.colptr), x=x)
    with pytest.raises(ValueError, match="rows for a graph"):
        hpyg.from_tensors(edge_index=data.edge_index, x=x, y=data.y[:10])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_graphsage_losses_equal_through_stores(data, small_graph, num_workers):
    expected = train_losses(data, small_graph, "cpu", num_workers=num_workers)
    got = train_losses(hpyg.from_data(data, device="cpu"), small_graph, "cpu", num_workers=num_workers)
    assert len(got) == len(expected) == 10
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert expected[-1] < expected[0]  # it learns


def test_stores_from_ogb_files_serve_batches(tmp_path):
    pytest.importorskip("ogb")
    from hmgstore.data import ogb as hogb

    write_fake_products(tmp_path)
    g = hogb.load_node_dataset(tmp_path, "ogbn-products")
    feature_store, graph_store = hpyg.from_tensors(edge_index=g.edge_index, x=g.x, y=g.y, device="cpu")
    loader = NeighborLoader((feature_store, graph_store), num_neighbors=[4, 4], input_nodes=g.train_idx,
                            batch_size=8)
    for batch in loader:
        assert torch.equal(batch.x, g.x[batch.n_id]) and torch.equal(batch.y, g.y[batch.n_id])


# ---- on a CUDA GPU ------------------------------------------------------------------------------
def loader_kwargs(graph, **extra):
    return dict(num_neighbors=[5, 5], input_nodes=graph.train_idx, batch_size=256, shuffle=True, **extra)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [None, 500 * ROW_BYTES, "1GB"])  # host only, both tiers, all on GPU
def test_batches_on_gpu_equal_data(data, small_graph, cuda_device, budget):
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=budget)
    kwargs = loader_kwargs(small_graph)
    for batch in NeighborLoader(stores, **kwargs):
        assert batch.x.device == cuda_device and isinstance(batch.x, hpyg.ResidentTensor)
        break
    assert_batches_match(NeighborLoader(stores, **kwargs), NeighborLoader(data, **kwargs), data)


@pytest.mark.gpu
def test_hetero_on_gpu(hetero, cuda_device):
    stores = hpyg.from_data(hetero, device=cuda_device, gpu_budget=300 * ROW_BYTES)
    resident = {t: stores[0].table(t, "x").num_gpu_rows for t in ("paper", "author")}
    assert sum(resident.values()) > 0
    loader = NeighborLoader(stores, num_neighbors=[5, 5], input_nodes=("paper", torch.arange(0, 2000, 3)),
                            batch_size=256, shuffle=True)
    for batch in loader:
        for node_type in ("paper", "author"):
            x = batch[node_type].x
            assert x.device == cuda_device
            assert torch.equal(x.cpu(), hetero[node_type].x[batch[node_type].n_id])
        assert torch.equal(batch["paper"].y.cpu(), hetero["paper"].y[batch["paper"].n_id])


@pytest.mark.gpu
@pytest.mark.parametrize("filter_per_worker, on_gpu", [(None, False), (False, True)])
def test_workers_on_gpu(data, small_graph, cuda_device, filter_per_worker, on_gpu):
    """Default: workers gather on the CPU (correct, warned); filter_per_worker=False: main process on GPU."""
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    kwargs = loader_kwargs(small_graph, num_workers=2)
    if filter_per_worker is not None:
        kwargs["filter_per_worker"] = filter_per_worker
    for batch in NeighborLoader(stores, **kwargs):
        assert batch.x.is_cuda == on_gpu
    assert_batches_match(NeighborLoader(stores, **kwargs), NeighborLoader(data, **kwargs), data)


@pytest.mark.gpu
def test_spawned_workers_never_touch_cuda(data, small_graph, cuda_device):
    stores = hpyg.from_data(data, device=cuda_device)
    loader = NeighborLoader(stores, **loader_kwargs(small_graph, num_workers=1, multiprocessing_context="spawn"))
    for batch in loader:
        assert not batch.x.is_cuda and torch.equal(batch.x, data.x[batch.n_id])


@pytest.mark.gpu
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_and_prefetch_loader_on_gpu(data, small_graph, cuda_device, num_workers):
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    loader = NeighborLoader(stores, **loader_kwargs(small_graph, pin_memory=True, num_workers=num_workers))
    for batch in loader:  # pinning a CUDA tensor would raise
        assert torch.equal(batch.x.cpu(), data.x[batch.n_id])
    for batch in PrefetchLoader(loader, device=cuda_device):
        assert batch.x.device == cuda_device and batch.edge_index.device == cuda_device
        assert torch.equal(batch.x.cpu(), data.x[batch.n_id.cpu()])


@pytest.mark.gpu
def test_link_neighbor_loader_on_gpu(data, hetero, cuda_device):
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    loader = LinkNeighborLoader(stores, num_neighbors=[5, 5], edge_label_index=(None, data.edge_index[:, :600]),
                                batch_size=128, neg_sampling_ratio=1.0, shuffle=True)
    for batch in loader:
        assert batch.x.is_cuda and torch.equal(batch.x.cpu(), data.x[batch.n_id])
    stores = hpyg.from_data(hetero, device=cuda_device)
    loader = LinkNeighborLoader(stores, num_neighbors=[5, 5], edge_label_index=("author", "writes", "paper"),
                                batch_size=512)
    for batch in loader:
        assert batch["author"].num_nodes <= NUM_AUTHORS
        for node_type in ("paper", "author"):
            assert torch.equal(batch[node_type].x.cpu(), hetero[node_type].x[batch[node_type].n_id])


@pytest.mark.gpu
def test_graphsage_losses_equal_on_gpu(data, small_graph, cuda_device):
    expected = train_losses(data, small_graph, cuda_device)
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    got = train_losses(stores, small_graph, cuda_device)
    # CUDA scatter-adds are not bit-reproducible run to run; wrong batches would differ by far more.
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
