"""The PyG adapter on a GPU: the checks of test_pyg.py with CUDA stores.

Batches come back on the GPU (as ResidentTensor, so pinning is a no-op),
equal to ``data.x[n_id]`` whichever tier a row lives in; a GPU budget keeps
the highest in-degree rows resident; workers, ``pin_memory`` and
``PrefetchLoader`` behave; GraphSAGE losses match the plain ``Data``.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_sparse")

from torch_geometric.loader import LinkNeighborLoader, NeighborLoader, PrefetchLoader  # noqa: E402

import hmgstore  # noqa: E402
from hmgstore.plugins import pyg as hpyg  # noqa: E402
from test_pyg import NUM_AUTHORS, as_data, as_hetero, assert_batches_match, train_losses  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")]

ROW_BYTES = 16 * 4 + 8  # small_graph: 16 float32 features and an int64 label per node


@pytest.fixture(scope="module")
def data(small_graph):
    return as_data(small_graph)


@pytest.fixture(scope="module")
def hetero(small_graph):
    return as_hetero(small_graph)


def loader_kwargs(graph, **extra):
    return dict(num_neighbors=[5, 5], input_nodes=graph.train_idx, batch_size=256, shuffle=True, **extra)


def test_budget_keeps_highest_in_degree_rows(data, cuda_device):
    feature_store, graph_store = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    order = hmgstore.placement.order_by_score(graph_store.in_degree()[None])
    for name in ("x", "y"):
        table = feature_store.table(None, name)
        assert table.device == cuda_device and table.num_gpu_rows == 500
        assert torch.equal(table.placement.gpu_rows, order[:500])
    custom = torch.arange(data.num_nodes, dtype=torch.float32)  # caller's hotness: highest ids hottest
    feature_store, _ = hpyg.from_data(data, device=cuda_device, gpu_budget=10 * ROW_BYTES, hotness=custom)
    assert sorted(feature_store.table(None, "x").placement.gpu_rows.tolist()) == list(range(1990, 2000))


@pytest.mark.parametrize("budget", [None, 500 * ROW_BYTES, "1GB"])  # host only, both tiers, all on GPU
def test_batches_on_gpu_equal_data(data, small_graph, cuda_device, budget):
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=budget)
    kwargs = loader_kwargs(small_graph)
    for batch in NeighborLoader(stores, **kwargs):
        assert batch.x.device == cuda_device and isinstance(batch.x, hpyg.ResidentTensor)
        break
    assert_batches_match(NeighborLoader(stores, **kwargs), NeighborLoader(data, **kwargs), data)


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


@pytest.mark.xfail(reason="known failure (2026-11-21, H100, Python 3.12): spawning the worker fails with "
                   "'bad value(s) in fds_to_keep' from torch's fd-sharing pickler; fork works", strict=False)
def test_spawned_workers_never_touch_cuda(data, small_graph, cuda_device):
    stores = hpyg.from_data(data, device=cuda_device)
    loader = NeighborLoader(stores, **loader_kwargs(small_graph, num_workers=1, multiprocessing_context="spawn"))
    for batch in loader:
        assert not batch.x.is_cuda and torch.equal(batch.x, data.x[batch.n_id])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_and_prefetch_loader(data, small_graph, cuda_device, num_workers):
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    loader = NeighborLoader(stores, **loader_kwargs(small_graph, pin_memory=True, num_workers=num_workers))
    for batch in loader:  # pinning a CUDA tensor would raise
        assert torch.equal(batch.x.cpu(), data.x[batch.n_id])
    for batch in PrefetchLoader(loader, device=cuda_device):
        assert batch.x.device == cuda_device and batch.edge_index.device == cuda_device
        assert torch.equal(batch.x.cpu(), data.x[batch.n_id.cpu()])


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


def test_graphsage_losses_equal_on_gpu(data, small_graph, cuda_device):
    expected = train_losses(data, small_graph, cuda_device)
    stores = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    got = train_losses(stores, small_graph, cuda_device)
    # CUDA scatter-adds are not bit-reproducible run to run; wrong batches would differ by far more.
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
