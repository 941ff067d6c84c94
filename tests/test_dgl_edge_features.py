"""DGL edge features and full-graph reads after attach (hmgstore.plugins.dgl: graph, views, storage).

``attach(g, ..., edata={...})`` serves blocks' ``edata`` by their ``dgl.EID``
(``prefetch_edge_feats``), in the node features' gather; ``g.ndata[key]`` and
``g.edata[key]`` keep working after ``attach`` (the table's host rows, no
copy when they read as stored; decoded once otherwise).
"""
from __future__ import annotations

import copy
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


def _changes():
    """Removals after attach, each leaving every edge type with as many edges as before or fewer."""
    return {
        "remove an isolated node": lambda g: g.remove_nodes(torch.tensor([g.num_nodes() - 1])),
        "remove a node": lambda g: g.remove_nodes(torch.tensor([3])),
        "remove edges": lambda g: g.remove_edges(torch.tensor([0, 7])),
        "remove then add self loops": lambda g: dgl.add_self_loop(dgl.remove_self_loop(g)),
    }


# DGL removes edges only from a graph that keeps its COO (a CSR-only graph: "CSR only support Edges of order
# 'srcdst'"), so the edge removals run on the default and COO formats.
@pytest.mark.parametrize(("change", "fmt"), [(c, f) for c in _changes() for f in (None, "coo", "csr", "csc")
                                             if f in (None, "coo") or "node" in c])
def test_edge_rows_after_a_removal_follow_their_edges_or_are_refused(change, fmt):
    """Never the old rows under new edge ids: DGL's own column of the same rows is the truth. Removing a
    node, even an isolated one, rebuilds the edges from a CSR or CSC and can reorder the ids of the edges
    left at the same count, which a count check alone missed."""
    order = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    src, dst = torch.arange(40)[order] % 10, (torch.arange(40)[order] * 7 + 1) % 10  # self loops, node 10 alone
    g = dgl.graph((src, dst), num_nodes=11)
    g = g if fmt is None else g.formats(fmt)
    w = random_table(g.num_edges(), (EDGE_DIM,), torch.float32, seed=2)
    g.edata["truth"] = w.clone()  # DGL's own frame: reindexed by DGL itself
    hdgl.attach(g, edata={"w": w}, device="cpu")
    shared = copy.copy(g)  # shares g's frames: the tag hmgstore puts on them must never show there
    changed = _changes()[change](g) or g
    assert "_hmgstore_edge_id_before" not in {*changed.edata.keys(), *shared.edata.keys(), *g.edata.keys()}
    try:
        storage = changed.get_edge_storage("w")
    except ValueError as err:
        assert ("renumbered the edges" in str(err) or "edges now" in str(err)) and "attach(g, ...) again" in str(err)
        return
    rows = storage.fetch(torch.arange(changed.num_edges()), "cpu").wait()
    assert torch.equal(rows, changed.edata["truth"])


def test_removing_an_isolated_node_that_reorders_edge_ids_is_refused():
    src, dst = torch.tensor([2, 0, 5, 3, 1, 4, 2, 4]), torch.tensor([2, 1, 0, 3, 1, 5, 3, 4])
    g = dgl.graph((src, dst), num_nodes=7)  # node 6 has no edge
    w = torch.arange(8, dtype=torch.float32)[:, None]
    g.edata["truth"] = w.clone()
    hdgl.attach(g, edata={"w": w}, device="cpu")
    g.remove_nodes(torch.tensor([6]))
    assert g.num_edges() == 8 and not torch.equal(g.edata["truth"], w)  # DGL moved the edges' ids
    with pytest.raises(ValueError, match=r"g.remove_nodes renumbered the edges of type \('_N', '_E', '_N'\) "
                                         r"\(as many edges as before, under other ids\) after attach.*'w'"):
        g.get_edge_storage("w")
    with pytest.raises(ValueError, match="as many edges as before, under other ids"):
        g.edata["w"]  # noqa: B018
    hdgl.attach(g, edata={"w": g.edata["truth"].clone()}, device="cpu")  # tables for the graph as it is
    assert torch.equal(g.get_edge_storage("w").fetch(torch.arange(8), "cpu").wait(), g.edata["truth"])


def test_removing_nodes_of_one_type_checks_the_edge_ids_of_every_type():
    """DGL rebuilds every edge type when nodes of one type go: ``cites`` (papers only) moves too."""
    gen = torch.Generator().manual_seed(0)
    cites = torch.randint(0, 20, (2, 60), generator=gen)
    writes = torch.stack([torch.randint(0, 6, (30,), generator=gen), torch.randint(0, 20, (30,), generator=gen)])
    g = dgl.heterograph({("paper", "cites", "paper"): tuple(cites), ("author", "writes", "paper"): tuple(writes)},
                        num_nodes_dict={"paper": 20, "author": 6})
    tables = {et: random_table(g.num_edges(et), (EDGE_DIM,), torch.float32, seed=k)
              for k, et in enumerate(g.canonical_etypes)}
    for et, table in tables.items():
        g.edges[et].data["truth"] = table.clone()
    hdgl.attach(g, edata={"w": tables}, device="cpu")
    g.remove_nodes(torch.tensor([5]), ntype="author")
    for et in g.canonical_etypes:
        try:
            rows = g.get_edge_storage("w", et).fetch(torch.arange(g.num_edges(et)), "cpu").wait()
        except ValueError as err:
            assert f"renumbered the edges of type {et}" in str(err) or "edges now" in str(err)
            continue
        assert torch.equal(rows, g.edges[et].data["truth"])
