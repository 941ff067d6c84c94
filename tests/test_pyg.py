"""The PyG adapter: CSCGraphStore, HybridFeatureStore and stock PyG loaders over them.

Every check compares with PyG fed the plain ``Data``/``HeteroData``: batches
hold ``data.x[n_id]`` and ``data.y[n_id]``, the same seeds sample the same
batches, and a GraphSAGE trained through the stores has the same losses.
The graph builders and the GraphSAGE at the top are shared with
test_pyg_gpu.py.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_sparse")  # PyG's stock sampler needs it (or pyg-lib)

from torch_geometric.data import Data, EdgeAttr, HeteroData, TensorAttr  # noqa: E402
from torch_geometric.index import index2ptr  # noqa: E402
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader, PrefetchLoader  # noqa: E402
from torch_geometric.nn import SAGEConv  # noqa: E402
from torch_geometric.sampler.utils import to_csc as pyg_to_csc  # noqa: E402

import hmgstore  # noqa: E402
from hmgstore.plugins import pyg as hpyg  # noqa: E402
from hmgstore.plugins.pyg import feature_store as pyg_feature_store  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")

NUM_AUTHORS = 500


# ---- graphs and a model, shared with test_pyg_gpu.py ----------------------------------
def as_data(graph) -> Data:
    """A Data over a NodeGraph's tensors (no copies)."""
    return Data(x=graph.x, y=graph.y, edge_index=graph.edge_index)


def as_hetero(graph, seed: int = 0) -> HeteroData:
    """Papers (the NodeGraph) citing papers and written by authors, with reverse edges."""
    g = torch.Generator().manual_seed(seed)
    data = HeteroData()
    data["paper"].x, data["paper"].y = graph.x, graph.y
    data["author"].x = torch.randn(NUM_AUTHORS, 8, generator=g)
    writes = torch.stack([torch.randint(0, NUM_AUTHORS, (4 * NUM_AUTHORS,), generator=g),
                          torch.randint(0, graph.num_nodes, (4 * NUM_AUTHORS,), generator=g)])
    data["paper", "cites", "paper"].edge_index = graph.edge_index
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    return data


class SAGE(torch.nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.conv1, self.conv2 = SAGEConv(in_dim, hidden), SAGEConv(hidden, out_dim)

    def forward(self, x, edge_index):
        x = F.dropout(F.relu(self.conv1(x, edge_index)), p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def train_losses(source, graph, device, *, epochs: int = 2, seed: int = 0, **loader_kwargs) -> list[float]:
    """Per-batch losses of a GraphSAGE fed from ``source`` (a Data or a store pair).

    Model init, shuffling, neighbour draws and dropout are all seeded from
    ``seed``: two sources holding the same graph must give the same losses.
    """
    torch.manual_seed(seed)
    model = SAGE(graph.x.shape[1], 32, int(graph.y.max()) + 1).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = NeighborLoader(source, num_neighbors=[10, 5], input_nodes=graph.train_idx, batch_size=256,
                            shuffle=True, **loader_kwargs)
    losses = []
    for _ in range(epochs):
        model.train()
        for batch in loader:
            batch = batch.to(device)
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def assert_batches_match(store_loader, data_loader, data, seed: int = 0) -> int:
    """Same seed, same batches; store batches hold data's rows. Returns the batch count."""
    torch.manual_seed(seed)
    ours = list(store_loader)
    torch.manual_seed(seed)
    theirs = list(data_loader)
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert torch.equal(a.e_id, b.e_id)
        assert torch.equal(a.x.cpu(), data.x[a.n_id]) and torch.equal(a.y.cpu(), data.y[a.n_id])
    return len(ours)


@pytest.fixture(scope="module")
def data(small_graph) -> Data:
    return as_data(small_graph)


@pytest.fixture(scope="module")
def hetero(small_graph) -> HeteroData:
    return as_hetero(small_graph)


# ---- CSCGraphStore -------------------------------------------------------------------
def test_csc_from_coo_is_what_pyg_builds_from_data(data):
    _, graph_store = hpyg.from_data(data, device="cpu")
    colptr, row, perm = pyg_to_csc(data, device="cpu")
    ours = graph_store.csc()
    assert torch.equal(ours[0], row) and torch.equal(ours[1], colptr) and torch.equal(ours[2], perm)
    (attr,) = graph_store.get_all_edge_attrs()
    assert attr.edge_type is None and attr.size == (data.num_nodes, data.num_nodes)
    attr.size = (1, 1)  # PyG may mutate what it gets: the store must not see it
    assert graph_store.get_all_edge_attrs()[0].size == (data.num_nodes, data.num_nodes)


def test_csc_and_csr_inputs(data):
    n, (src, dst) = data.num_nodes, data.edge_index
    reference = hpyg.to_csc(data.edge_index, "coo", (n, n))
    # CSC in: held as given, no copy, no permutation
    store = hpyg.CSCGraphStore()
    store.put_edge_index((reference.row, reference.colptr), edge_type=None, layout="csc", size=(n, n))
    row, colptr, perm = store.csc()
    assert row.data_ptr() == reference.row.data_ptr() and colptr.data_ptr() == reference.colptr.data_ptr()
    assert perm is None
    # CSR in: same colptr; perm maps CSC edges back to CSR positions
    order = torch.sort(src, stable=True).indices
    rowptr, col = index2ptr(src[order], n), dst[order]
    store = hpyg.CSCGraphStore()
    store.put_edge_index((rowptr, col), edge_type=None, layout="csr", size=(n, n))
    row, colptr, perm = store.csc()
    assert torch.equal(colptr, reference.colptr)
    assert torch.equal(row, src[order][perm]) and torch.equal(index2ptr(col[perm], n), colptr)
    # COO sorted by destination: row kept as a view, no sort
    sorted_ei = data.edge_index[:, torch.sort(dst, stable=True).indices]
    csc = hpyg.to_csc(sorted_ei, "coo", (n, n), is_sorted=True)
    assert csc.perm is None and csc.row.data_ptr() == sorted_ei[0].data_ptr()
    # COO answers come back in the order the edges were put (CSR order here), so edge labels line up
    coo_row, coo_col = store.get_edge_index(EdgeAttr(None, "coo"))
    assert torch.equal(coo_row, src[order]) and torch.equal(coo_col, dst[order])
    store = hpyg.CSCGraphStore()
    store.put_edge_index(torch.tensor([[0, 1, 2], [2, 0, 1]]), edge_type=None, layout="coo", size=(3, 3))
    assert torch.equal(torch.stack(store.get_edge_index(EdgeAttr(None, "coo"))), torch.tensor([[0, 1, 2], [2, 0, 1]]))


def test_bad_edges_are_clear_errors(data):
    n = data.num_nodes
    with pytest.raises(IndexError, match="outside"):
        hpyg.to_csc(torch.tensor([[0, n], [1, 1]]), "coo", (n, n))
    with pytest.raises(TypeError, match="integer"):
        hpyg.to_csc(data.edge_index.float(), "coo", (n, n))
    with pytest.raises(ValueError, match=r"\[2, num_edges\]"):
        hpyg.to_csc(data.edge_index[:1], "coo", (n, n))
    with pytest.raises(ValueError, match="not sorted"):
        hpyg.to_csc(data.edge_index, "coo", (n, n), is_sorted=True)
    with pytest.raises(ValueError, match="colptr"):
        hpyg.to_csc((torch.tensor([0, 1]), torch.tensor([0, 3])), "csc", (2, 1))
    store = hpyg.CSCGraphStore()
    store.put_edge_index(data.edge_index, edge_type=None, layout="coo", size=(n, n))
    with pytest.raises(ValueError, match="not both"):
        store.put_edge_index(data.edge_index, edge_type=("a", "to", "a"), layout="coo", size=(n, n))
    assert store.remove_edge_index(edge_type=None, layout="csc") and store.get_all_edge_attrs() == []


def test_hetero_graph_store(hetero):
    _, graph_store = hpyg.from_data(hetero, device="cpu")
    rows, colptrs, perms = graph_store.csc()
    for edge_type in hetero.edge_types:
        colptr, row, perm = pyg_to_csc(hetero[edge_type], device="cpu")
        assert torch.equal(rows[edge_type], row) and torch.equal(colptrs[edge_type], colptr)
        assert torch.equal(perms[edge_type], perm)
    sizes = {a.edge_type: a.size for a in graph_store.get_all_edge_attrs()}
    assert sizes[("author", "writes", "paper")] == (NUM_AUTHORS, hetero["paper"].num_nodes)
    degree = graph_store.in_degree()
    assert torch.equal(degree["author"], torch.bincount(hetero["paper", "rev_writes", "author"].edge_index[1],
                                                        minlength=NUM_AUTHORS))


# ---- HybridFeatureStore ----------------------------------------------------------------
def test_put_get_size_remove(small_graph):
    store = hpyg.HybridFeatureStore("cpu")
    x, y = small_graph.x, small_graph.y
    store.put_tensor(x, group_name=None, attr_name="x", index=None)
    store.put_tensor(y.numpy(), group_name=None, attr_name="y", index=None)
    store.put_tensor(hmgstore.HybridTensor(x[:, :4], "cpu"), group_name="t", attr_name="x")  # index: whole
    idx = torch.tensor([5, 0, 1999, 5])
    assert torch.equal(store.get_tensor(None, "x", idx), x[idx])
    assert torch.equal(store.get_tensor(None, "y", idx.int()), y[idx])  # (PyG's TensorAttr rejects numpy)
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


def test_one_gather_per_batch_for_every_type(hetero, monkeypatch):
    calls = []

    def counting(requests, **kwargs):
        calls.append([(table.num_rows, len(index)) for table, index in requests])
        return hmgstore.gather_many(requests, **kwargs)

    feature_store, graph_store = hpyg.from_data(hetero, device="cpu")
    monkeypatch.setattr(pyg_feature_store, "gather_many", counting)
    loader = NeighborLoader((feature_store, graph_store), num_neighbors=[5, 5], batch_size=400,
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


# ---- stock loaders over the stores ------------------------------------------------------
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
