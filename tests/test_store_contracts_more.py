"""Input contracts of tables and stores: ids past int64, repeated ids in a write, subgraphs of an attached
DGL graph."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hmgstore

N = 10


@pytest.fixture
def table():
    return hmgstore.HybridTensor(torch.arange(N * 4, dtype=torch.float32).reshape(N, 4), "cpu")


@pytest.mark.parametrize("index, value, position", [
    ([1, 2**63 + 5], 2**63 + 5, 1),
    ([[1], [2**64 + 5]], 2**64 + 5, 1),
    ([np.uint64(0), np.uint64(2**63)], 2**63, 1),
    ([-2**63 - 1], -2**63 - 1, 0),
])
def test_an_id_list_past_int64_names_the_id_and_the_range(table, index, value, position):
    """A list of ints torch cannot read as int64 is refused naming the id, not with torch's overflow."""
    with pytest.raises(IndexError, match=rf"^id {value} at position {position} out of range \[0, {N}\)"):
        table[index]
    with pytest.raises(IndexError, match=rf"^id {value} at position {position} out of range \[0, {N}\)"):
        table[index] = 0.0
    with pytest.raises(IndexError, match=rf"^id {value} at position {position} out of range"):
        hmgstore.gather_many([(table, index)])


@pytest.mark.parametrize("index", [2**63 + 5, np.uint64(2**63 + 5)])
def test_a_scalar_id_past_int64_names_the_id_and_the_range(table, index):
    with pytest.raises(IndexError, match=rf"^id {int(index)} out of range \[0, {N}\)"):
        table[index]


def test_a_repeated_id_in_a_write_gets_the_row_given_last():
    """Torch's index_copy_ leaves the winner of a repeated id unspecified (a large write copies in parallel on
    the CPU); a table write stores the row given last for each id, on every device."""
    t = hmgstore.HybridTensor(torch.zeros(1000, 1), "cpu")
    ids = torch.arange(400_000) % 7
    t[ids] = torch.arange(400_000, dtype=torch.float32).reshape(-1, 1)
    assert t[torch.arange(7)].flatten().tolist() == [float(max(range(k, 400_000, 7))) for k in range(7)]
    assert torch.equal(t[torch.arange(7, 1000)], torch.zeros(993, 1))  # the other rows untouched
    t[[3, 5, 3]] = torch.tensor([[1.0], [2.0], [3.0]])
    assert t[[3, 5]].flatten().tolist() == [3.0, 2.0]


def test_a_write_copies_each_row_once(monkeypatch):
    """What makes the last row win on every device and thread count: the copies into the tiers never see a
    repeated position (torch leaves the order of those unspecified, and a GPU's index put has none)."""
    seen = []
    original = torch.Tensor.index_copy_

    def spy(self, dim, index, source):
        seen.append(index.clone())
        return original(self, dim, index, source)

    t = hmgstore.HybridTensor(torch.zeros(20, 2), "cpu")
    monkeypatch.setattr(torch.Tensor, "index_copy_", spy)
    t[[4, 9, 4, 2, 9]] = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    monkeypatch.undo()
    assert seen and all(len(index.unique()) == len(index) for index in seen)
    assert t[[4, 9, 2]].tolist() == [[4.0, 5.0], [8.0, 9.0], [6.0, 7.0]]


def test_a_repeated_id_in_a_write_of_a_compressed_table_gets_its_last_row():
    t = hmgstore.HybridTensor(torch.zeros(50, 8), "cpu", compress="int8")
    t[[4, 9, 4, 4]] = torch.stack([torch.full((8,), v) for v in (1.0, 2.0, 3.0, 0.5)])
    assert torch.allclose(t[[4, 9]], torch.stack([torch.full((8,), 0.5), torch.full((8,), 2.0)]), atol=0.02)


def test_last_writes_keeps_each_id_once_with_its_last_row():
    from hmgstore.rows.ids import last_writes

    ids = torch.tensor([5, 1, 5, 2, 1])
    rows = torch.arange(5).reshape(5, 1)
    kept, kept_rows = last_writes(ids, rows)
    assert dict(zip(kept.tolist(), kept_rows.flatten().tolist())) == {5: 2, 1: 4, 2: 3}
    unique = torch.tensor([3, 0, 2])
    assert last_writes(unique, rows[:3])[0] is unique  # no repeats: as given, no copy


def test_pyg_update_with_a_repeated_id_gets_the_row_given_last():
    hpyg = pytest.importorskip("hmgstore.plugins.pyg")
    store = hpyg.HybridFeatureStore.from_sources({(None, "x"): torch.zeros(100_000, 1)}, "cpu")
    ids = torch.arange(300_000) % 3
    store.update_tensor(torch.arange(300_000, dtype=torch.float32).reshape(-1, 1), group_name=None,
                        attr_name="x", index=ids)
    assert store.get_tensor(None, "x", torch.arange(3)).flatten().tolist() == [299_997.0, 299_998.0, 299_999.0]


# ---- DGL: subgraphs of an attached graph carry its attached features, as DGL carries g.ndata ----------------

def _attached_graph():
    hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")
    import dgl

    x = torch.arange(N * 4, dtype=torch.float32).reshape(N, 4)
    w = torch.arange(6, dtype=torch.float32).reshape(6, 1) * 10
    g = dgl.graph((torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 3, 4, 5, 6])), num_nodes=N)
    g.ndata["own"] = x.clone()
    hdgl.attach(g, {"feat": x}, edata={"w": w})
    return dgl, g, x, w


def test_dgl_node_subgraph_carries_attached_features():
    dgl, g, x, w = _attached_graph()
    nodes = torch.tensor([2, 3, 4, 7])
    sg = g.subgraph(nodes)
    assert torch.equal(sg.ndata["feat"], x[nodes]) and torch.equal(sg.ndata["own"], x[nodes])
    assert torch.equal(sg.edata["w"], w[sg.edata[dgl.EID]])
    bare = g.subgraph(nodes, store_ids=False)  # the caller's choice of ids is kept; the features still come
    assert dgl.NID not in bare.ndata and dgl.EID not in bare.edata
    assert torch.equal(bare.ndata["feat"], x[nodes])


def test_dgl_subgraph_of_a_compressed_table_gathers_its_rows_not_a_decoded_copy_of_all():
    hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")
    import dgl

    import hmgstore

    x = torch.randn(N, 8, generator=torch.Generator().manual_seed(0))
    table = hmgstore.HybridTensor(x, "cpu", compress="int8")
    g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 4])), num_nodes=N)
    hdgl.attach(g, {"feat": table})
    nodes = torch.tensor([4, 1, 3])
    sg = g.subgraph(nodes)
    assert torch.equal(sg.ndata["feat"], table[nodes])  # the int8 rows as the table reads them
    assert g.get_node_storage("feat")._whole is None, "a decoded copy of every row was made for three"


def test_dgl_edge_and_khop_subgraphs_carry_attached_features():
    dgl, g, x, w = _attached_graph()
    sg = g.edge_subgraph(torch.tensor([4, 1]))
    assert torch.equal(sg.ndata["feat"], x[sg.ndata[dgl.NID]]) and torch.equal(sg.edata["w"], w[[4, 1]])
    khop, _ = g.khop_in_subgraph(torch.tensor([4]), 2)
    assert torch.equal(khop.ndata["feat"], x[khop.ndata[dgl.NID]])


def test_dgl_sample_neighbors_and_in_subgraph_serve_the_same_tables():
    dgl, g, x, w = _attached_graph()
    for frontier in (g.sample_neighbors(torch.tensor([3, 5]), 1), g.in_subgraph(torch.tensor([3, 5]))):
        assert torch.equal(frontier.ndata["feat"], x)  # every node kept: the same rows
        assert torch.equal(frontier.get_node_storage("feat").fetch(torch.tensor([6, 2]), "cpu").wait(), x[[6, 2]])
        assert torch.equal(frontier.edata["w"], w[frontier.edata[dgl.EID]])
    plain = g.sample_neighbors(torch.tensor([3]), 1, copy_ndata=False, copy_edata=False)
    assert "feat" not in plain.ndata.keys() and "w" not in plain.edata.keys()  # as DGL's copy_*=False


def test_dgl_fetch_of_a_uint64_id_past_int64_names_it_as_given():
    dgl, g, x, w = _attached_graph()
    ids = torch.tensor([1, 2**63 + 5], dtype=torch.uint64)
    with pytest.raises(IndexError, match=rf"^fetch: index {2**63 + 5} at position 1 is out of range") as err:
        g.get_node_storage("feat").fetch(ids, "cpu")
    assert "-" not in str(err.value).split("range")[0]  # not the int64 the bits read as


def test_a_write_of_the_tables_own_rows_is_refused_as_torch_refuses_it_and_a_clone_is_written():
    import hmgstore

    x = torch.arange(18.0).view(6, 3) + 0.5
    table = hmgstore.HybridTensor(x.clone(), "cpu")
    with pytest.raises(RuntimeError, match="share memory with the table"):
        table[torch.tensor([3, 4])] = table.source[0:2]
    assert torch.equal(table[torch.arange(6)], x), "nothing written"
    table[torch.tensor([3, 4])] = table.source[0:2].clone()
    assert torch.equal(table[torch.tensor([3, 4])], x[0:2])


@pytest.mark.parametrize("compress", [None, "int8"])
def test_dgl_dataloader_over_a_subgraph_method_result_reads_the_parents_rows(compress):
    hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")
    import dgl

    import hmgstore

    n, gen = 300, torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (3000,), generator=gen), torch.randint(0, n, (3000,), generator=gen)
    x = torch.randn(n, 8, generator=gen)
    table = hmgstore.HybridTensor(x, "cpu", compress=compress)
    g = dgl.graph((src, dst), num_nodes=n)
    hdgl.attach(g, {"feat": table})
    every = table[torch.arange(n)]  # the rows as the table reads them (int8: quantised)
    sg = g.subgraph(torch.randperm(n, generator=gen)[:150])
    sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"])
    batches = 0
    for inputs, _, blocks in dgl.dataloading.DataLoader(sg, torch.arange(50), sampler, batch_size=16):
        assert torch.equal(blocks[0].srcdata["feat"], every[sg.ndata[dgl.NID][inputs]])
        batches += 1
    assert batches == 4
