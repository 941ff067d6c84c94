"""Edge attributes on PyG batches from hmgstore's stores (hmgstore.plugins.pyg.edge_features, edge_tables).

Every batch's ``edge_attr`` must equal ``data.edge_attr[batch.e_id]`` exactly,
homogeneous and heterogeneous, with PyG's sampler and hmgstore's, and models
that use edge features (GINEConv, GATConv with ``edge_dim``) must run on the
batches and give what they give on PyG's own batches from the ``Data``.
The rows come from the node attributes' gather (one ``gather_many`` a batch).
"""
from __future__ import annotations

import copy
import importlib
import logging

import pytest
import torch

pytest.importorskip("torch_sparse")  # PyG's stock sampler needs it (or pyg-lib)

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader  # noqa: E402
from torch_geometric.nn import GATConv, GINEConv, HeteroConv  # noqa: E402

from helpers import as_hetero  # noqa: E402
from hmgstore.plugins import pyg as hpyg  # noqa: E402
from hmgstore.plugins.pyg import feature_store as feature_store_mod  # noqa: E402

edge_features_mod = importlib.import_module("hmgstore.plugins.pyg.edge_features")  # the package's name is the function

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")
EDGE_DIM = 5


@pytest.fixture(scope="module")
def edata(small_graph):
    g = torch.Generator().manual_seed(3)
    e = small_graph.edge_index.shape[1]
    return Data(x=small_graph.x, y=small_graph.y, edge_index=small_graph.edge_index,
                edge_attr=torch.randn(e, EDGE_DIM, generator=g), edge_weight=torch.rand(e, generator=g))


@pytest.fixture(scope="module")
def ehetero(small_graph):
    data = as_hetero(small_graph)
    g = torch.Generator().manual_seed(4)
    for et in data.edge_types:
        data[et].edge_attr = torch.randn(data[et].num_edges, EDGE_DIM, generator=g)
    return data


def count_gathers(monkeypatch) -> list:
    """Every gather_many call of the feature store and of the edge hooks' fallback, as ("store"|"fallback", n)."""
    calls = []
    for module, name in ((feature_store_mod, "store"), (edge_features_mod, "fallback")):
        real = module.gather_many

        def counted(requests, *args, _real=real, _name=name, **kwargs):
            calls.append((_name, len(list(requests))))
            return _real(requests, *args, **kwargs)

        monkeypatch.setattr(module, "gather_many", counted)
    return calls


class GINE(torch.nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.gine = GINEConv(torch.nn.Linear(in_dim, out_dim), edge_dim=EDGE_DIM)
        self.gat = GATConv(out_dim, out_dim, heads=2, concat=False, edge_dim=EDGE_DIM)

    def forward(self, x, edge_index, edge_attr):
        return self.gat(self.gine(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


@pytest.mark.parametrize("sampler", ["pyg", "hmgstore"])
def test_homogeneous_batches_carry_edge_attr_in_the_node_gather(edata, small_graph, monkeypatch, sampler):
    stores = hpyg.from_data(edata, device="cpu")
    assert set(stores[0].edge_tables()) == {(None, "edge_attr"), (None, "edge_weight")}
    kwargs = dict(num_neighbors=[5, 5], input_nodes=small_graph.train_idx[:600], batch_size=200)
    if sampler == "hmgstore":
        kwargs["neighbor_sampler"] = hpyg.HybridNeighborSampler(stores, [5, 5])
    calls = count_gathers(monkeypatch)
    torch.manual_seed(0)
    model = GINE(edata.num_features, 8)
    batches = 0
    for batch in NeighborLoader(stores, **kwargs, **hpyg.edge_features(stores)):
        batches += 1
        assert torch.equal(batch.edge_attr, edata.edge_attr[batch.e_id])
        assert torch.equal(batch.edge_weight, edata.edge_weight[batch.e_id])
        assert torch.equal(batch.x, edata.x[batch.n_id])
        out = model(batch.x, batch.edge_index, batch.edge_attr)
        assert out.shape == (batch.num_nodes, 8) and torch.isfinite(out).all()
    assert batches == 3
    assert calls == [("store", 4)] * 3  # x, y and both edge attributes: one gather a batch, no fallback


def test_the_model_sees_what_it_sees_on_pyg_batches_from_the_data(edata, small_graph):
    """Same seeds, PyG's sampler: the stores' batches and PyG's batches from the Data give the same output."""
    stores = hpyg.from_data(edata, device="cpu")
    torch.manual_seed(0)
    model = GINE(edata.num_features, 8)
    kwargs = dict(num_neighbors=[4, 4], input_nodes=small_graph.train_idx[:256], batch_size=128, shuffle=True)
    torch.manual_seed(7)
    ours = [model(b.x, b.edge_index, b.edge_attr) for b in NeighborLoader(stores, **kwargs,
                                                                            **hpyg.edge_features(stores))]
    torch.manual_seed(7)
    theirs = [model(b.x, b.edge_index, b.edge_attr) for b in NeighborLoader(edata, **kwargs)]
    assert len(ours) == len(theirs) == 2
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


class HeteroEdgeModel(torch.nn.Module):
    def __init__(self, edge_types):
        super().__init__()
        self.gat = HeteroConv({et: GATConv((-1, -1), 8, edge_dim=EDGE_DIM, add_self_loops=False) for et in edge_types})
        self.gine = HeteroConv({et: GINEConv(torch.nn.Linear(8, 8), edge_dim=EDGE_DIM) for et in edge_types})

    def forward(self, x, edge_index, edge_attr):
        h = {k: v.relu() for k, v in self.gat(x, edge_index, edge_attr).items()}
        return self.gine(h, edge_index, edge_attr)


@pytest.mark.parametrize("sampler", ["pyg", "hmgstore"])
def test_heterogeneous_batches_carry_edge_attr_per_edge_type(ehetero, monkeypatch, sampler):
    stores = hpyg.from_data(ehetero, device="cpu")
    assert {et for et, _ in stores[0].edge_tables()} == set(ehetero.edge_types)
    kwargs = dict(num_neighbors=[4, 4], input_nodes=("paper", torch.arange(0, 600, 2)), batch_size=100)
    if sampler == "hmgstore":
        kwargs["neighbor_sampler"] = hpyg.HybridNeighborSampler(stores, [4, 4])
    calls = count_gathers(monkeypatch)
    model = HeteroEdgeModel(ehetero.edge_types)
    batches = 0
    for batch in NeighborLoader(stores, **kwargs, **hpyg.edge_features(stores)):
        batches += 1
        for et in ehetero.edge_types:
            assert torch.equal(batch[et].edge_attr, ehetero[et].edge_attr[batch[et].e_id]), et
            assert len(batch[et].edge_attr) == batch[et].edge_index.shape[1]
        out = model(batch.x_dict, batch.edge_index_dict, batch.edge_attr_dict)
        assert out["paper"].shape == (batch["paper"].num_nodes, 8) and torch.isfinite(out["paper"]).all()
    assert batches == 3
    assert [name for name, _ in calls] == ["store"] * 3  # every type's rows in the node gather


def test_worker_processes_and_link_loader(edata, small_graph):
    stores = hpyg.from_data(edata, device="cpu", edge_attrs=["edge_attr"])
    assert list(stores[0].edge_tables()) == [(None, "edge_attr")]
    loader = NeighborLoader(stores, num_neighbors=[5], input_nodes=small_graph.train_idx[:400], batch_size=200,
                            num_workers=2, **hpyg.edge_features(stores))
    assert sum(torch.equal(b.edge_attr, edata.edge_attr[b.e_id]) for b in loader) == 2
    seen = []
    link = LinkNeighborLoader(stores, num_neighbors=[5, 5], edge_label_index=(None, edata.edge_index[:, :256]),
                              batch_size=128, neg_sampling_ratio=1.0,
                              **hpyg.edge_features(stores, transform=lambda b: seen.append(1) or b))
    for batch in link:
        assert torch.equal(batch.edge_attr, edata.edge_attr[batch.e_id])
    assert len(seen) == 2  # the caller's own transform runs after


def test_the_fallback_gathers_by_e_id_when_the_rows_did_not_ride(edata, small_graph, monkeypatch):
    stores = hpyg.from_data(edata, device="cpu")
    hooks = hpyg.edge_features(stores)
    calls = count_gathers(monkeypatch)
    loader = NeighborLoader(stores, num_neighbors=[5], input_nodes=small_graph.train_idx[:200], batch_size=200,
                            transform=hooks["transform"])  # no transform_sampler_output: nothing queued
    batch = next(iter(loader))
    assert torch.equal(batch.edge_attr, edata.edge_attr[batch.e_id])
    assert [name for name, _ in calls] == ["store", "fallback"]


def test_bad_uses_say_what_to_do(small_graph, edata, caplog):
    plain = hpyg.from_data(Data(x=small_graph.x, edge_index=small_graph.edge_index), device="cpu")
    with pytest.raises(ValueError, match="no edge attributes"):
        hpyg.edge_features(plain)
    with pytest.raises(TypeError, match="pair"):
        hpyg.edge_features(plain[0])
    with caplog.at_level(logging.WARNING, logger="hmgstore.plugins.pyg"):
        stores = hpyg.from_data(edata, device="cpu", edge_attrs=[])
    assert not stores[0].edge_tables() and any("'edge_weight'" in r.getMessage() for r in caplog.records)
    stores = hpyg.from_data(edata, device="cpu")
    sampler = hpyg.HybridNeighborSampler(stores, [3], subgraph_type="bidirectional")  # PyG keeps both ids
    loader = NeighborLoader(stores, [3], neighbor_sampler=sampler, input_nodes=small_graph.train_idx[:10],
                            batch_size=10, **hpyg.edge_features(stores))
    batch = next(iter(loader))
    assert torch.equal(batch.edge_attr, edata.edge_attr[batch.e_id])

    def no_edge_ids(out):
        out.edge = None
        return out

    loader = NeighborLoader(stores, [3], input_nodes=small_graph.train_idx[:10], batch_size=10,
                            **hpyg.edge_features(stores, transform_sampler_output=no_edge_ids))
    with pytest.raises(ValueError, match="no e_id"):
        next(iter(loader))


def test_edge_tables_take_the_node_tables_host_options(edata, small_graph):
    stores = hpyg.from_data(edata, device="cpu", host_dtype=torch.bfloat16)
    table = stores[0].edge_table(None, "edge_attr")
    assert table.host_format is not None  # float32 rows kept in 16 bits, as x's
    loader = NeighborLoader(stores, num_neighbors=[5], input_nodes=small_graph.train_idx[:100], batch_size=100,
                            **hpyg.edge_features(stores))
    batch = next(iter(loader))
    want = edata.edge_attr[batch.e_id].to(torch.bfloat16).float()
    assert torch.equal(batch.edge_attr, want)
    with pytest.raises(KeyError, match="edge_attr"):
        stores[0].edge_table(None, "nope")
    copy.deepcopy(hpyg.edge_features(stores)["transform"])  # pickles (workers) without its device cache


@pytest.mark.gpu
def test_cuda_store_and_sampler_edge_rows_on_the_gpu(edata, small_graph, cuda_device):
    stores = hpyg.from_data(edata, device=cuda_device, gpu_budget="40KB", edge_gpu_budget="20KB")
    assert stores[0].edge_table(None, "edge_attr").num_gpu_rows > 0
    sampler = hpyg.HybridNeighborSampler(stores, [5, 5], device=cuda_device)
    loader = NeighborLoader(stores, [5, 5], neighbor_sampler=sampler, input_nodes=small_graph.train_idx[:512],
                            batch_size=256, **hpyg.edge_features(stores))
    for batch in loader:
        assert batch.edge_attr.is_cuda
        assert torch.equal(batch.edge_attr.cpu(), edata.edge_attr[batch.e_id.cpu()])
