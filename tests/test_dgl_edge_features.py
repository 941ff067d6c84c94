"""DGL edge features and full-graph reads after attach (hmgstore.plugins.dgl: graph, views, storage).

``attach(g, ..., edata={...})`` serves blocks' ``edata`` by their ``dgl.EID``
(``prefetch_edge_feats``), in the node features' gather; ``g.ndata[key]`` and
``g.edata[key]`` keep working after ``attach`` (the table's host rows, no
copy when they read as stored; decoded once otherwise).
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import hmgstore
from helpers import random_table

hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")

# isort: split
import dgl  # noqa: E402  (after the plugin, which makes dgl importable on this torch)
import dgl.nn as dglnn  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
EDGE_DIM = 3


def _graph(small_graph) -> tuple[dgl.DGLGraph, torch.Tensor]:
    src, dst = small_graph.edge_index
    g = dgl.graph((src, dst), num_nodes=small_graph.num_nodes)
    return g, random_table(g.num_edges(), (EDGE_DIM,), torch.float32, seed=5)


def test_blocks_carry_edge_features_in_the_node_gather(small_graph, monkeypatch):
    calls = []
    gather_batch = hmgstore.HybridTensor.gather_batch  # the table kind's batch gather: one gather_many
    monkeypatch.setattr(hmgstore.HybridTensor, "gather_batch",
                        staticmethod(lambda requests, **kw: calls.append(len(requests))
                                     or gather_batch(requests, **kw)))
    g, w = _graph(small_graph)
    hdgl.attach(g, {"feat": small_graph.x}, edata={"w": w}, device="cpu")
    sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"], prefetch_edge_feats=["w"])
    loader = dgl.dataloading.DataLoader(g, small_graph.train_idx[:600], sampler, batch_size=300)
    gine = dglnn.GINEConv(torch.nn.Linear(small_graph.x.shape[1], 8))
    edge_proj = torch.nn.Linear(EDGE_DIM, small_graph.x.shape[1])
    batches = 0
    for input_nodes, _, blocks in loader:
        batches += 1
        assert torch.equal(blocks[0].srcdata["feat"], small_graph.x[input_nodes])
        for block in blocks:
            assert torch.equal(block.edata["w"], w[block.edata[dgl.EID]])
        out = gine(blocks[0], blocks[0].srcdata["feat"], edge_proj(blocks[0].edata["w"]))
        assert out.shape == (blocks[0].num_dst_nodes(), 8) and torch.isfinite(out).all()
    assert batches == 2 and calls == [3] * 2  # feat, and w of both blocks: one gather a batch


def test_heterogeneous_edge_features_by_edge_type(small_graph):
    src, dst = small_graph.edge_index
    n = small_graph.num_nodes
    writer = torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(1))
    g = dgl.heterograph({("paper", "cites", "paper"): (src, dst),
                         ("author", "writes", "paper"): (writer, torch.arange(n)),
                         ("paper", "written_by", "author"): (torch.arange(n), writer)},
                        num_nodes_dict={"paper": n, "author": 50})
    edata = {et: random_table(g.num_edges(et), (EDGE_DIM,), torch.float32, seed=i)
             for i, et in enumerate(g.canonical_etypes)}
    feats = {"paper": small_graph.x, "author": random_table(50, (16,), torch.float32, seed=9)}
    hdgl.attach(g, {"feat": feats}, edata={"w": {"cites": edata[g.canonical_etypes[1]],
                                                 **{et: t for et, t in edata.items() if et[1] != "cites"}}},
                device="cpu")
    sampler = dgl.dataloading.NeighborSampler([3, 3], prefetch_node_feats={"paper": ["feat"], "author": ["feat"]},
                                               prefetch_edge_feats={et: ["w"] for et in g.canonical_etypes})
    loader = dgl.dataloading.DataLoader(g, {"paper": torch.arange(0, 400)}, sampler, batch_size=200)
    for _, _, blocks in loader:
        for block in blocks:
            for et in block.canonical_etypes:
                assert torch.equal(block.edges[et].data["w"], edata[et][block.edges[et].data[dgl.EID]])
    assert set(g.edata["w"]) == set(g.canonical_etypes)
    assert torch.equal(g.edata["w"][("paper", "cites", "paper")], edata[("paper", "cites", "paper")])
    assert torch.equal(g.ndata["feat"]["author"], feats["author"])


def test_ndata_and_edata_read_through_the_tables(small_graph, tmp_path):
    g, w = _graph(small_graph)
    with pytest.raises(KeyError):
        g.ndata["feat"]  # noqa: B018  (stock DGL: nothing there yet)
    half = hmgstore.HybridTensor(small_graph.x, "cpu", host_dtype=torch.bfloat16)
    hdgl.attach(g, {"feat": small_graph.x, "half": half, "label": small_graph.y}, edata={"w": w}, device="cpu")
    assert g.ndata["feat"].data_ptr() == small_graph.x.data_ptr()  # the host rows themselves, no copy
    assert g.edata["w"].data_ptr() == w.data_ptr()
    decoded = g.ndata["half"]
    assert torch.equal(decoded, small_graph.x.to(torch.bfloat16).float())
    assert g.ndata["half"] is decoded  # decoded once, then kept
    assert {"feat", "half", "label"} <= set(g.ndata.keys()) and "feat" in g.ndata and "w" in g.edata
    g.ndata["own"] = torch.ones(g.num_nodes())  # DGL's own columns work as ever, and win over attached keys
    assert torch.equal(g.ndata["own"], torch.ones(g.num_nodes())) and "own" in set(g.ndata)
    with pytest.raises(KeyError):
        g.ndata["missing"]  # noqa: B018
    restored = pickle.loads(pickle.dumps(g))  # workers: the kept copy does not travel
    assert torch.equal(restored.ndata["half"], decoded)
    np.save(tmp_path / "x.npy", small_graph.x.numpy())
    ro = np.load(tmp_path / "x.npy", mmap_mode="r")
    hdgl.attach(g, {"ro": ro})
    assert torch.equal(g.ndata["ro"], small_graph.x)  # read-only memory: a copy, safe to write to


def test_attach_checks_edge_tables(small_graph):
    g, w = _graph(small_graph)
    with pytest.raises(ValueError, match="rows"):
        hdgl.attach(g, {"feat": small_graph.x}, edata={"w": w[:-1]})
    with pytest.raises(ValueError, match="not one of"):
        hdgl.attach(g, edata={"w": {"nope": w}})
    with pytest.raises(TypeError):
        hdgl.attach(g, {}, edata={})
    assert type(g) is dgl.DGLGraph
    hdgl.attach(g, edata={"w": w})  # edge features alone
    assert torch.equal(g.edata["w"], w)
