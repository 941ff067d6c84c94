"""Writes to an attached DGL graph: the last write wins, in ``g.ndata``/``g.edata`` and the DataLoader alike.

``g.ndata[key] = x`` (all nodes) after ``attach`` detaches ``key``, so the
loader serves ``x`` as plain DGL would; ``del``/``pop`` detach it; a write of
some rows of an attached key raises; ``attach`` drops the frame column it
replaces. Graphs DGL derives from an attached graph (``dgl.node_subgraph``,
``dgl.reverse``, ...) are plain ``DGLGraph``s that carry no tables (docs/dgl.md).
"""
from __future__ import annotations

import pytest
import torch

import hmgstore

hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")

# isort: split
import dgl  # noqa: E402  (after the plugin, which makes dgl importable on this torch)

pytestmark = pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
X = torch.arange(16.0).view(8, 2)
W = torch.arange(24.0).view(8, 3)


def _ring() -> dgl.DGLGraph:
    src = torch.arange(8)
    g = dgl.graph((src, (src + 1) % 8), num_nodes=8)
    return hdgl.attach(g, {"feat": hmgstore.HybridTensor(X, "cpu")}, edata={"w": hmgstore.HybridTensor(W, "cpu")})


def _batch(g, **prefetch):
    sampler = dgl.dataloading.NeighborSampler([-1], **prefetch)
    return next(iter(dgl.dataloading.DataLoader(g, torch.tensor([0, 1]), sampler, batch_size=2)))


def test_assigning_an_attached_node_key_replaces_it_in_the_loader():
    g = _ring()
    new = torch.full((8, 2), -5.0)
    g.ndata["feat"] = new
    input_nodes, _, blocks = _batch(g, prefetch_node_feats=["feat"])
    assert torch.equal(g.ndata["feat"], new)
    assert torch.equal(blocks[0].srcdata["feat"], new[input_nodes])
    assert ("feat", "_N") not in g._hmgstore_storages and ("w", g.canonical_etypes[0]) in g._hmgstore_edge_storages


def test_assigning_an_attached_edge_key_replaces_it_in_the_loader():
    g = _ring()
    new = -torch.ones(8, 3)
    g.edata["w"] = new
    _, _, blocks = _batch(g, prefetch_edge_feats=["w"])
    assert torch.equal(g.edata["w"], new)
    assert torch.equal(blocks[0].edata["w"], new[blocks[0].edata[dgl.EID].long()])
    assert torch.equal(g.ndata["feat"], X)  # the other attached key stays


def test_copies_keep_their_attached_key():
    g = _ring()
    kept = g.local_var()
    g.ndata["feat"] = torch.zeros(8, 2)
    assert torch.equal(kept.ndata["feat"], X)


def test_writing_some_rows_of_an_attached_key_raises():
    g = _ring()
    with pytest.raises(ValueError, match="assign the whole feature"):
        g.nodes[torch.tensor([0, 1])].data["feat"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="attach"):
        g.edges[torch.tensor([0])].data["w"] = torch.zeros(1, 3)
    assert torch.equal(g.ndata["feat"], X) and "feat" not in g._node_frames[0].keys()


@pytest.mark.parametrize("how", ["pop", "del"])
def test_pop_and_del_detach_an_attached_key(how):
    g = _ring()
    if how == "pop":
        assert torch.equal(g.ndata.pop("feat"), X)
        assert torch.equal(g.edata.pop("w"), W)
    else:
        del g.ndata["feat"]
        del g.edata["w"]
    assert "feat" not in g.ndata and "w" not in g.edata
    with pytest.raises(KeyError):
        g.ndata["feat"]  # noqa: B018
    with pytest.raises(KeyError):
        g.get_node_storage("feat")
    g.ndata["feat"] = X + 1  # DGL's own column from now on
    input_nodes, _, blocks = _batch(g, prefetch_node_feats=["feat"])
    assert torch.equal(blocks[0].srcdata["feat"], (X + 1)[input_nodes])


def test_del_detaches_per_type_in_a_heterograph():
    g = dgl.heterograph({("a", "to", "b"): (torch.tensor([0, 1]), torch.tensor([1, 0]))})
    hdgl.attach(g, {"feat": {"a": torch.ones(2, 2), "b": torch.zeros(2, 2)}}, device="cpu")
    del g.ndata["feat"]
    assert g.ndata["feat"] == {} and "feat" not in g.ndata.keys()


def test_attach_replaces_the_frame_column_it_shadows():
    g = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 0])))
    g.ndata["feat"] = torch.zeros(2, 2)
    hdgl.attach(g, {"feat": torch.ones(2, 2)}, device="cpu")
    assert torch.equal(g.ndata["feat"], torch.ones(2, 2))  # what the loader serves, too


@pytest.mark.parametrize("derive", [lambda g: dgl.node_subgraph(g, [0, 1, 2]), dgl.reverse, dgl.to_simple])
def test_derived_graphs_carry_no_tables(derive):
    derived = derive(_ring())  # DGL builds a plain DGLGraph: attach it again with its own rows (docs/dgl.md)
    assert type(derived) is dgl.DGLGraph and "feat" not in derived.ndata


@pytest.mark.parametrize("what", ["nodes", "edges"])
def test_growing_the_graph_with_data_for_an_attached_key_is_refused_and_changes_nothing(what):
    """DGL's add_nodes/add_edges keep the new rows of a key in the graph's own column, beside zeros for the old
    ones, which would hide the attached table: refused, the graph left as it was and the table still served."""
    g = _ring()
    with pytest.raises(ValueError, match=r"g\.add_" + what + " cannot grow.*attach\\(g, \\.\\.\\.\\) again"):
        if what == "nodes":
            g.add_nodes(2, {"feat": torch.full((2, 2), 9.0)})
        else:
            g.add_edges(torch.tensor([3]), torch.tensor([0]), {"w": torch.full((1, 3), 7.0)})
    assert g.num_nodes() == 8 and g.num_edges() == 8
    assert torch.equal(g.ndata["feat"], X) and torch.equal(g.edata["w"], W)
    _, _, blocks = _batch(g, prefetch_node_feats=["feat"], prefetch_edge_feats=["w"])
    assert torch.equal(blocks[0].srcdata["feat"], X[blocks[0].srcdata[dgl.NID]])
    g.add_nodes(1)  # no data for the key: the graph grows, and the table no longer fits it
    with pytest.raises(ValueError, match="the graph has 9 nodes now"):
        g.ndata["feat"]
