"""The PyG adapter's feature store (hmgstore.plugins.pyg.feature_store): HybridFeatureStore.

PyG's FeatureStore contract (put, get, size, remove, attrs), one gather per
batch for every node type, placement under a GPU budget, ResidentTensor,
pickling. Tests marked ``gpu`` build CUDA stores. The ``data`` and ``hetero``
fixtures are in conftest.py.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

from torch_geometric.data import HeteroData, TensorAttr  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402

import hmgstore  # noqa: E402
from helpers import NUM_AUTHORS, ROW_BYTES, assert_same  # noqa: E402
from hmgstore.plugins import pyg as hpyg  # noqa: E402
from hmgstore.plugins.pyg import feature_store as pyg_feature_store  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")


def test_put_get_size_remove(small_graph):
    store = hpyg.HybridFeatureStore("cpu")
    x, y = small_graph.x, small_graph.y
    store.put_tensor(x, group_name=None, attr_name="x", index=None)
    store.put_tensor(y.numpy(), group_name=None, attr_name="y", index=None)
    store.put_tensor(hmgstore.HybridTensor(x[:, :4], "cpu"), group_name="t", attr_name="x")  # index: whole
    idx = torch.tensor([5, 0, 1999, 5])
    assert torch.equal(store.get_tensor(None, "x", idx), x[idx])
    assert torch.equal(store.get_tensor(None, "y", idx.int()), y[idx])
    assert torch.equal(store.get_tensor(None, "x", idx.numpy()), x[idx])  # PyG's own TensorAttr refuses numpy
    assert torch.equal(store[None, "x", idx.numpy().astype("int32")], x[idx])
    plain = TensorAttr(None, "x", idx.numpy())  # PyG's own class, as a caller builds it
    assert torch.equal(store.get_tensor(plain), x[idx]) and torch.equal(store.multi_get_tensor([plain])[0], x[idx])
    assert torch.equal(store[plain], x[idx]) and store.get_tensor_size(plain) == tuple(x.shape)
    whole = store.get_tensor("t", "x", None)  # a whole table is its host source, never a gathered copy
    assert torch.equal(whole, x[:, :4]) and whole.data_ptr() == x.data_ptr()
    got = store.multi_get_tensor([TensorAttr(None, "x", idx), TensorAttr("t", "x", None)])
    assert torch.equal(got[0], x[idx]) and torch.equal(got[1], x[:, :4])
    assert torch.equal(store[None, "x", 7], x[7])
    assert torch.equal(store["t"].x[idx], x[idx, :4])  # PyG's AttrView
    assert store.get_tensor_size(None, "x") == tuple(x.shape)
    attrs = store.get_all_tensor_attrs()
    assert {(a.group_name, a.attr_name) for a in attrs} == {(None, "x"), (None, "y"), ("t", "x")}
    attrs[0].index = idx  # PyG mutates the attrs it gets: the next call must return fresh ones
    assert all(not a.is_set("index") for a in store.get_all_tensor_attrs())
    with pytest.raises(KeyError, match="'z'"):
        store.get_tensor(None, "z", idx)
    with pytest.raises(IndexError, match="out of range"):
        store.get_tensor(None, "x", torch.tensor([2000]))
    with pytest.raises(ValueError, match="read-only"):
        store.put_tensor(x[:2], group_name=None, attr_name="x", index=torch.tensor([0, 1]))
    assert store.remove_tensor(None, "y", None) and not store.remove_tensor(None, "y", None)
    assert store.get_tensor_size(None, "y") is None


def test_put_tensor_refuses_a_row_count_that_differs_within_a_node_type(small_graph):
    store = hpyg.HybridFeatureStore("cpu")
    store.put_tensor(small_graph.x, group_name="paper", attr_name="x")
    with pytest.raises(ValueError, match="one row per node"):
        store.put_tensor(small_graph.y[:100], group_name="paper", attr_name="y")
    store.put_tensor(small_graph.y[:100], group_name="author", attr_name="y")  # another type: its own count


def test_whole_read_only_table_comes_back_as_a_writable_copy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(60, dtype=np.float32).reshape(20, 3))
    store = hpyg.HybridFeatureStore("cpu")
    store.put_tensor(np.load(path, mmap_mode="r"), group_name=None, attr_name="x")
    whole = store.get_tensor(None, "x", None)
    whole[0, 0] = 42.0  # a copy: writing neither crashes nor reaches the file
    assert float(np.load(path)[0, 0]) == 0.0 and torch.equal(store.get_tensor(None, "x", None)[1:], whole[1:])


def test_one_gather_per_batch_for_every_type(hetero, monkeypatch):
    calls = []

    def counting(requests, **kwargs):
        calls.append([(table.num_rows, len(index)) for table, index in requests])
        return hmgstore.gather_many(requests, **kwargs)

    feature_store, graph_store = hpyg.from_data(hetero, device="cpu")
    monkeypatch.setattr(pyg_feature_store, "gather_many", counting)
    sampler = hpyg.HybridNeighborSampler((feature_store, graph_store), [5, 5], device="cpu")
    loader = NeighborLoader((feature_store, graph_store), num_neighbors=[5, 5], batch_size=400,
                            neighbor_sampler=sampler,
                            input_nodes=("paper", hetero["paper"].num_nodes // 2 + torch.arange(800)))
    batches = list(loader)
    assert len(calls) == len(batches) == 2
    for call, batch in zip(calls, batches):  # paper x, paper y and author x in the one call
        assert sorted(call) == sorted([(2000, batch["paper"].num_nodes)] * 2
                                      + [(NUM_AUTHORS, batch["author"].num_nodes)])


def test_budget_on_cpu_is_ignored_and_hotness_is_checked(data, hetero):
    feature_store, _ = hpyg.from_data(data, device="cpu", gpu_budget="1MB")
    assert feature_store.table(None, "x").num_gpu_rows == 0
    with pytest.raises(ValueError, match=r"\{node_type: score\}"):
        hpyg.from_data(hetero, device="cpu", gpu_budget="1MB", hotness=torch.ones(2000))
    bare = HeteroData()
    bare["a"].num_nodes = 3
    bare["b"].x = torch.ones(3, 2)
    bare["a", "to", "b"].edge_index = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match="node type 'a' has no node attributes"):
        hpyg.from_data(bare, device="cpu")


def test_resident_tensor_skips_pinning():
    t = torch.arange(6.0).as_subclass(hpyg.ResidentTensor)
    assert t.pin_memory() is t
    assert type(t * 2) is torch.Tensor and type(t[:2]) is torch.Tensor
    plain = torch.arange(3)
    assert hpyg.resident(plain) is plain  # CPU results stay plain tensors


def test_store_pickles_and_rebuilds_its_tables(data):
    feature_store, graph_store = hpyg.from_data(data, device="cpu")
    clone = pickle.loads(pickle.dumps(feature_store))
    idx = torch.tensor([3, 1, 4])
    assert torch.equal(clone.get_tensor(None, "x", idx), data.x[idx])
    clone_graph = pickle.loads(pickle.dumps(graph_store))
    assert torch.equal(clone_graph.csc()[0], graph_store.csc()[0])


# ---- on a CUDA GPU ------------------------------------------------------------------------------
@pytest.mark.gpu
def test_budget_keeps_the_rows_drawn_most_often(data, cuda_device):
    feature_store, graph_store = hpyg.from_data(data, device=cuda_device, gpu_budget=500 * ROW_BYTES)
    order = hmgstore.hotness.order_by_score(graph_store.expected_draws()[None])
    for name in ("x", "y"):
        table = feature_store.table(None, name)
        assert table.device == cuda_device and table.num_gpu_rows == 500
        assert torch.equal(table.placement.gpu_rows, order[:500])
    custom = torch.arange(data.num_nodes, dtype=torch.float32)  # caller's hotness: highest ids hottest
    feature_store, _ = hpyg.from_data(data, device=cuda_device, gpu_budget=10 * ROW_BYTES, hotness=custom)
    assert sorted(feature_store.table(None, "x").placement.gpu_rows.tolist()) == list(range(1990, 2000))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gpu_whole_keeps_the_labels_whole_on_the_gpu_out_of_the_budget(data, device):
    """gpu_whole=("y",): the labels' table wholly in GPU memory (no host reads), its bytes taken from the budget
    first, the features' hottest rows sharing the rest; gathers exact; on a CPU nothing to place; a name no
    source has is refused, naming the attributes."""
    budget = 500 * ROW_BYTES
    store, graph_store = hpyg.from_data(data, device=device, gpu_budget=budget, gpu_whole=("y",), progress=False)
    x, y = store.table(None, "x"), store.table(None, "y")
    idx = torch.randint(0, data.num_nodes, (300,))
    assert_same(store.get_tensor(None, "x", idx).cpu(), data.x[idx])
    assert_same(store.get_tensor(None, "y", idx).cpu(), data.y[idx])
    if device == "cuda":
        y_bytes = data.num_nodes * data.y.element_size()
        x_row = data.x.shape[1] * data.x.element_size()
        assert y.num_gpu_rows == data.num_nodes and not y.reads_host
        assert x.num_gpu_rows == (budget - y_bytes) // x_row  # what the labels left, hottest first
        order = hmgstore.hotness.order_by_score(graph_store.expected_draws()[None])
        assert torch.equal(x.placement.gpu_rows, order[:x.num_gpu_rows])
        # compressed features laid out hottest first; the whole labels need no host layout
        store, _ = hpyg.from_data(data, device=device, gpu_budget=budget, gpu_whole="y", compress="int8",
                                  progress=False)
        assert store.table(None, "y").layout is None and store.table(None, "x").layout is not None
        assert_same(store.get_tensor(None, "y", idx).cpu(), data.y[idx])
        # no budget: every feature row in host memory, the labels still whole on the GPU
        store, _ = hpyg.from_data(data, device=device, gpu_budget=None, gpu_whole=("y",), progress=False)
        assert store.table(None, "x").num_gpu_rows == 0 and store.table(None, "y").num_gpu_rows == data.num_nodes
        with pytest.raises(ValueError, match="gpu_whole tables \\['y'\\] need 16,000 bytes"):
            hpyg.from_data(data, device=device, gpu_budget=y_bytes - 1, gpu_whole=("y",), progress=False)
    else:
        assert x.num_gpu_rows == y.num_gpu_rows == 0
    with pytest.raises(ValueError, match=r"gpu_whole names \['label'\].*'x', 'y'"):
        hpyg.from_data(data, device=device, gpu_budget=budget, gpu_whole=("label",), progress=False)
    with pytest.raises(ValueError, match=r"gpu_whole names \['label'\]"):  # a string is one name, not letters
        hpyg.from_data(data, device=device, gpu_budget=budget, gpu_whole="label", progress=False)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_from_sources_passes_host_memory_options_to_every_table(device):
    x = torch.randn(500, 8)
    y = torch.arange(500)
    store = hpyg.HybridFeatureStore.from_sources({(None, "x"): x, (None, "y"): y}, device,
                                                 host_dtype=torch.bfloat16, split="auto", progress=False)
    assert store.table(None, "x").host_dtype == torch.bfloat16
    assert store.table(None, "y").host_dtype == torch.int64  # labels keep their width
    ids = torch.tensor([3, 499, 3])
    assert torch.equal(store.get_tensor(None, "x", index=ids).cpu(), x.bfloat16().float()[ids])
    assert torch.equal(store.get_tensor(None, "x", index=None), x.bfloat16().float())  # whole table, widened
    worker = store.worker_tables()[(None, "x")]  # what a DataLoader worker gathers from
    assert torch.equal(worker[ids], x.bfloat16().float()[ids])
    with pytest.raises(ValueError, match="split must be"):
        hpyg.HybridFeatureStore.from_sources({(None, "x"): x}, device, split="often")


@pytest.mark.parametrize("host_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_from_data_with_half_width_host_rows(data, host_dtype):
    feature_store, _ = hpyg.from_data(data, "cpu", host_dtype=host_dtype, progress=False)
    assert feature_store.table(None, "x").host_dtype == host_dtype
    ids = torch.tensor([3, 0, data.num_nodes - 1, 3])
    x = feature_store.get_tensor(group_name=None, attr_name="x", index=ids)
    assert x.dtype == torch.float32 and torch.equal(x, data.x.to(host_dtype).float()[ids])
    assert torch.equal(feature_store.get_tensor(group_name=None, attr_name="y", index=ids), data.y[ids])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_budget_typo_is_refused_on_every_device(data, device):
    """The store read its budget on CUDA only: gpu_budget="16XB" passed on a CPU machine, where HybridTensor and
    HybridNeighborSampler refuse it."""
    with pytest.raises(ValueError, match="cannot read '16XB' as a size"):
        hpyg.from_data(data, device=device, gpu_budget="16XB", progress=False)
    with pytest.raises(ValueError, match="cannot read '16XB' as a size"):
        hpyg.HybridFeatureStore.from_sources({(None, "x"): data.x}, device, gpu_budget="16XB", progress=False)
    with pytest.raises(ValueError, match="cannot read '16XB' as a size"):
        hpyg.from_tensors(edge_index=data.edge_index, x=data.x, device=device, gpu_budget="16XB", progress=False)
    feature_store, _ = hpyg.from_data(data, device=device, gpu_budget="16KB", progress=False)  # a budget that reads
    assert torch.equal(feature_store.get_tensor(None, "x", index=torch.arange(5)).cpu(), data.x[:5])
