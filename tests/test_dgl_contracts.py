"""Contracts of the DGL adapter that a hostile probe found broken: each test failed before its fix.

- ``local_scope`` undoes attach and detach inside it, as it undoes DGL's own writes (DGL's ``SAGEConv`` and
  ``GraphConv`` write ``srcdata`` inside their scope, which once lost an attached key for good).
- ``g.ndata[key]`` of a compressed or read-only table is a decoded copy: an in-place edit of it is refused at the
  next fetch or read, never served silently beside the table's old rows.
- Each pending fetch gets its own rows or its own error: a bad fetch does not fail the others of its batch.
- A fetch reads the ids as they were at ``fetch``, not the caller's buffer at ``wait()``.
- ``g.srcdata``/``g.dstdata`` read attached keys as ``g.ndata`` does.

Data are random and non-zero; rows are compared bit for bit with ``x[ids]``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hmgstore

hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")

# isort: split
import dgl  # noqa: E402  (after the plugin, which makes dgl importable on this torch)

pytestmark = pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")
N = 60


def _table(n: int = N, dim: int = 4, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, dim, generator=gen) + 0.5  # no zero: an all-zero answer never passes by chance


def _graph(seed: int = 0) -> dgl.DGLGraph:
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, N, (300,), generator=gen), torch.randint(0, N, (300,), generator=gen)
    return dgl.graph((src, dst), num_nodes=N)


def _rows(storage, ids: torch.Tensor) -> torch.Tensor:
    """What DGL's DataLoader gets for ``ids``: a pending fetch waited on, or DGL's own tensor."""
    got = storage.fetch(ids, torch.device("cpu"))
    return got.wait() if hasattr(got, "wait") else got


def _batch(g, key: str):
    sampler = dgl.dataloading.NeighborSampler([4], prefetch_node_feats=[key])
    loader = dgl.dataloading.DataLoader(g, torch.arange(20), sampler, batch_size=20)
    input_nodes, _, blocks = next(iter(loader))
    return input_nodes, blocks[0].srcdata[key]


IDS = torch.tensor([5, 0, 59, 5, 17])


# local_scope


def test_a_whole_write_inside_local_scope_is_undone_after_it():
    x = _table()
    g = hdgl.attach(_graph(), {"feat": x})
    inside = _table(seed=1)
    with g.local_scope():
        g.ndata["feat"] = inside
        assert torch.equal(_rows(g.get_node_storage("feat"), IDS), inside[IDS])  # the last write wins inside
    assert torch.equal(g.ndata["feat"], x)
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), x[IDS])


def test_a_pop_inside_local_scope_is_undone_after_it():
    x = _table()
    g = hdgl.attach(_graph(), {"feat": x})
    with g.local_scope():
        g.ndata.pop("feat")
        assert "feat" not in g.ndata.keys()
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), x[IDS])


def test_local_scope_restores_the_attachment_when_its_body_raises():
    x = _table()
    g = hdgl.attach(_graph(), {"feat": x})
    with pytest.raises(ZeroDivisionError), g.local_scope():
        g.ndata["feat"] = torch.ones(N, 4)
        raise ZeroDivisionError
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), x[IDS])


@pytest.mark.parametrize("layer", ["SAGEConv", "GraphConv"])
def test_a_dgl_layer_on_the_whole_graph_keeps_the_key_for_the_loader(layer):
    # Both write srcdata["h"] (a detaching whole write) inside their own local_scope.
    h = _table(seed=2)
    g = hdgl.attach(_graph(), {"h": h})
    conv = dgl.nn.SAGEConv(4, 2, "mean") if layer == "SAGEConv" else dgl.nn.GraphConv(4, 2, allow_zero_in_degree=True)
    conv(g, g.ndata["h"])
    input_nodes, got = _batch(g, "h")
    assert torch.equal(got, h[input_nodes])
    assert torch.equal(g.ndata["h"], h)


def test_attach_inside_local_scope_of_an_attached_graph_is_undone_after_it():
    old, new, other = _table(seed=3), _table(seed=4), _table(seed=5)
    g = hdgl.attach(_graph(), {"other": other})
    g.ndata["feat"] = old
    with g.local_scope():
        hdgl.attach(g, {"feat": new})
        assert torch.equal(_rows(g.get_node_storage("feat"), IDS), new[IDS])
        assert torch.equal(g.ndata["feat"], new)
    assert torch.equal(g.ndata["feat"], old)
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), old[IDS])
    assert torch.equal(_rows(g.get_node_storage("other"), IDS), other[IDS])


def test_attach_inside_local_scope_of_a_plain_graph_leaves_loader_and_ndata_agreeing():
    # DGL's own local_scope runs (the graph was plain on entry): it brings the old column back, which then wins.
    old, new = _table(seed=3), _table(seed=4)
    g = _graph()
    g.ndata["feat"] = old
    with g.local_scope():
        hdgl.attach(g, {"feat": new})
    assert torch.equal(g.ndata["feat"], old)
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), old[IDS])
    input_nodes, got = _batch(g, "feat")
    assert torch.equal(got, old[input_nodes])


def test_a_renumbering_inside_local_scope_stays_refused_after_it():
    # local_scope does not undo remove_nodes (DGL's frames neither): its stale mark must outlive the scope
    src, dst = torch.tensor([2, 0, 5, 3, 1, 4, 2, 4]), torch.tensor([2, 1, 0, 3, 1, 5, 3, 4])
    g = hdgl.attach(dgl.graph((src, dst), num_nodes=7), edata={"w": torch.rand(8, 2) + 0.5})  # node 6 alone
    with g.local_scope():
        g.remove_nodes(torch.tensor([6]))  # rebuilds the edges: same count, other ids
    with pytest.raises(ValueError, match="as many edges as before, under other ids"):
        g.get_edge_storage("w")


# the decoded copy behind g.ndata


def _decoded_sources():
    x = _table(seed=6)
    frozen = x.numpy().copy()
    frozen.flags.writeable = False
    return [("int8", hmgstore.HybridTensor(x, "cpu", compress="int8")), ("read-only", frozen)]


@pytest.mark.parametrize("name, source", _decoded_sources(), ids=["int8", "read-only"])
def test_an_in_place_edit_of_a_decoded_copy_is_refused_not_served_apart(name, source):
    g = hdgl.attach(_graph(), {"feat": source})
    table = g.get_node_storage("feat").table
    decoded = table[torch.arange(N)]
    assert torch.equal(g.ndata["feat"], decoded) and torch.equal(g.ndata["feat"], decoded)  # read twice: no edit
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), decoded[IDS])
    edited = g.ndata["feat"]
    edited.mul_(0.5)
    with pytest.raises(RuntimeError, match=r"changed in place.*g\.ndata\['feat'\] = edited"):
        g.get_node_storage("feat")  # what DGL's DataLoader asks for before every fetch
    with pytest.raises(RuntimeError, match="changed in place"):
        _batch(g, "feat")
    with pytest.raises(RuntimeError, match="changed in place"):
        g.ndata["feat"]
    g.ndata["feat"] = edited  # the fix the message names: the loader now serves the edited rows
    input_nodes, got = _batch(g, "feat")
    assert torch.equal(got, edited[input_nodes]) and torch.equal(got, decoded[input_nodes] * 0.5)


def test_a_write_to_the_table_after_an_edit_of_the_copy_serves_the_table():
    x = _table(seed=7)
    table = hmgstore.HybridTensor(x, "cpu", compress="float16")
    g = hdgl.attach(_graph(), {"feat": table})
    g.ndata["feat"].add_(1.0)
    with pytest.raises(RuntimeError, match="changed in place"):
        _rows(g.get_node_storage("feat"), IDS)
    table[torch.tensor([3])] = x[3:4] * 2  # writes the table: the kept copy is dropped, the table read anew
    decoded = table[torch.arange(N)]
    assert torch.equal(g.ndata["feat"], decoded)
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), decoded[IDS])


def test_a_storage_kept_by_hand_refuses_a_fetch_after_an_edit_of_its_copy():
    storage = hdgl.HybridFeatureStorage(hmgstore.HybridTensor(_table(), "cpu", compress="int8"))
    storage.whole("feat")[0] += 1
    with pytest.raises(RuntimeError, match="changed in place"):
        storage.fetch(IDS, "cpu")


# one batch, several fetches


def test_a_fetch_of_a_closed_table_fails_alone():
    xa, xb = _table(seed=8), _table(seed=9, dim=3)
    ta, tb = hmgstore.HybridTensor(xa, "cpu"), hmgstore.HybridTensor(xb, "cpu")
    g = hdgl.attach(_graph(), {"a": ta, "b": tb})
    bad = g.get_node_storage("a").fetch(IDS, "cpu")
    ta.close()
    good = g.get_node_storage("b").fetch(IDS, "cpu")
    assert torch.equal(good.wait(), xb[IDS])
    for _ in range(2):
        with pytest.raises(RuntimeError, match="closed"):
            bad.wait()


def test_a_fetch_whose_ids_fail_at_the_gather_fails_alone():
    # GPU ids are checked by the gather, at wait(); on the CPU the same happens to ids changed after the check.
    x = _table(seed=10)
    storage = hdgl.attach(_graph(), {"feat": x}).get_node_storage("feat")
    bad = storage.fetch(torch.tensor([1, 2]), "cpu")
    bad.indices[0] = 10**6
    good = storage.fetch(torch.tensor([3, 4, 58]), "cpu")
    assert torch.equal(good.wait(), x[[3, 4, 58]])
    with pytest.raises(IndexError, match="1000000"):
        bad.wait()
    assert torch.equal(good.wait(), x[[3, 4, 58]])


def test_an_error_no_single_fetch_causes_reaches_every_fetch(monkeypatch):
    # e.g. an earlier gather's deferred GPU id check, reported once by the next gather: never swallowed
    x = _table(seed=11)
    storage = hdgl.attach(_graph(), {"feat": x}).get_node_storage("feat")
    real, calls = hmgstore.HybridTensor.gather_batch, []

    def fails_once(requests, **kwargs):
        calls.append(len(requests))
        if len(calls) == 1:
            raise IndexError("an earlier gather's bad id")
        return real(requests, **kwargs)

    monkeypatch.setattr(hmgstore.HybridTensor, "gather_batch", staticmethod(fails_once))
    first, second = storage.fetch(IDS, "cpu"), storage.fetch(IDS[:2], "cpu")
    for fetch in (second, first, second):
        with pytest.raises(IndexError, match="earlier gather"):
            fetch.wait()
    assert calls == [2, 1, 1]


# the ids a fetch reads


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_a_fetch_reads_the_ids_given_not_the_buffer_at_wait(dtype):
    x = _table(seed=12)
    storage = hdgl.attach(_graph(), {"feat": x}).get_node_storage("feat")
    ids = torch.tensor([1, 2, 3], dtype=dtype)
    first = storage.fetch(ids, "cpu")
    ids[0] = 9
    ids[1] = 10**6  # out of range now: never read
    second = storage.fetch(ids[[0, 2]], "cpu")
    ids[:] = torch.tensor([7, 8, 9], dtype=dtype)
    third = storage.fetch(ids, "cpu")
    ids.fill_(0)
    assert torch.equal(first.wait(), x[[1, 2, 3]])
    assert torch.equal(second.wait(), x[[9, 3]])
    assert torch.equal(third.wait(), x[[7, 8, 9]])


def test_a_fetch_of_a_strided_view_reads_its_rows():
    x = _table(seed=13)
    storage = hdgl.attach(_graph(), {"feat": x}).get_node_storage("feat")
    base = torch.arange(N - 1, -1, -1)
    view = base[::3]
    fetch = storage.fetch(view, "cpu")
    base.zero_()
    assert torch.equal(fetch.wait(), x[torch.arange(N - 1, -1, -1)[::3]])


# srcdata and dstdata


def test_srcdata_and_dstdata_read_attached_keys_as_ndata_does():
    x = _table(seed=14)
    g = hdgl.attach(_graph(), {"feat": x})
    assert torch.equal(g.srcdata["feat"], x) and torch.equal(g.dstdata["feat"], x)
    assert "feat" in g.srcdata.keys() and "feat" in g.dstdata.keys()


def test_srcdata_and_dstdata_of_a_bipartite_graph_read_their_own_types():
    xu, xi = _table(n=5, seed=15), _table(n=3, seed=16)
    g = dgl.heterograph({("u", "r", "i"): (torch.tensor([0, 1, 4]), torch.tensor([0, 0, 2]))},
                        num_nodes_dict={"u": 5, "i": 3})
    hdgl.attach(g, {"f": {"u": xu, "i": np.asarray(xi)}})
    assert torch.equal(g.srcdata["f"], xu) and torch.equal(g.dstdata["f"], xi)


def test_an_in_place_edit_of_host_rows_that_gpus_also_hold_is_refused(monkeypatch):
    """Where GPUs hold copies of some rows (a GPU cache, shards), g.ndata's host rows are not every copy: an edit
    of them in place is refused as a decoded copy's is. The GPU side is stood in for on the CPU by the one
    question the storage asks (tests/test_sharded.py asks it of real GPU tables)."""
    import hmgstore.plugins.dgl.storage as storage_module

    x = _table(seed=8)
    table = hmgstore.HybridTensor(x.clone(), "cpu")
    g = hdgl.attach(_graph(), {"feat": table})
    monkeypatch.setattr(storage_module, "rows_elsewhere", lambda t: t is table)
    host = g.ndata["feat"]
    assert host.data_ptr() == table.source.data_ptr()  # the host rows themselves, no copy
    host[3] += 1.0
    with pytest.raises(RuntimeError, match=r"host rows of its attached table.*GPUs hold copies.*changed in place"):
        g.get_node_storage("feat")
    table[torch.tensor([3])] = x[3:4] * 2  # a write to the table: every copy gets it
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), table[IDS])


def test_an_in_place_edit_of_host_rows_held_nowhere_else_is_served():
    x = _table(seed=9)
    table = hmgstore.HybridTensor(x.clone(), "cpu")
    g = hdgl.attach(_graph(), {"feat": table})
    g.ndata["feat"][IDS] *= 3.0  # the host tier is the only copy: the loader serves the edit, as plain DGL does
    assert torch.equal(_rows(g.get_node_storage("feat"), IDS), x[IDS] * 3.0)
