"""The DGL adapter (hmgstore.plugins.dgl): attach(g) feeds DGL's DataLoader the same rows as g.ndata.

Every DataLoader here is DGL's own, unchanged: the adapter is only reached
through ``g.get_node_storage(...).fetch(...)`` and ``.wait()``. Tests marked
``gpu`` use CUDA tables fed by DGL's CPU sampler (a CPU build of DGL works
there): ``fetch(ids, cuda)`` must return ``x[ids]`` on the GPU, with every
fetch of a batch served by one kernel launch at the first ``wait()``.
"""
from __future__ import annotations

import pickle
import threading

import pytest
import torch

import hmgstore
from helpers import random_table

hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")

# isort: split
import dgl  # noqa: E402  (after the plugin, which makes dgl importable on this torch)

pytestmark = pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")


def _homogeneous(small_graph, idtype) -> dgl.DGLGraph:
    src, dst = small_graph.edge_index
    return dgl.graph((src, dst), num_nodes=small_graph.num_nodes, idtype=idtype)


def _heterogeneous(small_graph, idtype) -> tuple[dgl.DGLGraph, dict]:
    """Papers cite papers (the small graph); 500 authors write papers, papers are written by them."""
    src, dst = small_graph.edge_index
    g = torch.Generator().manual_seed(3)
    num_authors = 500
    writer = torch.randint(0, num_authors, (small_graph.num_nodes,), generator=g)
    paper = torch.arange(small_graph.num_nodes)
    graph = dgl.heterograph({
        ("paper", "cites", "paper"): (src, dst),
        ("author", "writes", "paper"): (writer, paper),
        ("paper", "written_by", "author"): (paper, writer),
    }, num_nodes_dict={"paper": small_graph.num_nodes, "author": num_authors}, idtype=idtype)
    features = {"feat": {"paper": small_graph.x, "author": random_table(num_authors, (8,), torch.float32, seed=4)},
                "label": {"paper": small_graph.y}}
    return graph, features


@pytest.fixture(params=[torch.int64, torch.int32], ids=["int64", "int32"])
def idtype(request):
    return request.param


# ---- feeding DGL's DataLoader ------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_homogeneous_loader_matches_ndata(small_graph, idtype, num_workers):
    g = _homogeneous(small_graph, idtype)
    ref = g.clone()
    ref.ndata["feat"], ref.ndata["label"] = small_graph.x, small_graph.y
    hdgl.attach(g, {"feat": hmgstore.HybridTensor(small_graph.x, "cpu"), "label": small_graph.y})
    assert isinstance(g, dgl.DGLGraph) and "feat" not in g._node_frames[0]  # no column copied into the graph
    assert g.ndata["feat"].data_ptr() == small_graph.x.data_ptr()  # g.ndata reads through the table

    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(g, small_graph.train_idx.to(idtype), sampler, batch_size=300,
                                        shuffle=True, num_workers=num_workers)
    batches = 0
    for input_nodes, output_nodes, blocks in loader:
        assert input_nodes.dtype == idtype
        assert torch.equal(blocks[0].srcdata["feat"], ref.ndata["feat"][input_nodes.long()])
        assert torch.equal(blocks[-1].dstdata["label"], ref.ndata["label"][output_nodes.long()])
        batches += 1
    assert batches == 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_heterogeneous_loader_matches_ndata(small_graph, idtype, num_workers):
    g, features = _heterogeneous(small_graph, idtype)
    hdgl.attach(g, features)

    sampler = dgl.dataloading.NeighborSampler(
        [4, 4], prefetch_node_feats={"paper": ["feat"], "author": ["feat"]}, prefetch_labels={"paper": ["label"]})
    loader = dgl.dataloading.DataLoader(g, {"paper": small_graph.train_idx.to(idtype)}, sampler, batch_size=400,
                                        num_workers=num_workers)
    for input_nodes, output_nodes, blocks in loader:
        for ntype in ("paper", "author"):
            ids = input_nodes[ntype].long()
            assert torch.equal(blocks[0].srcdata["feat"][ntype], features["feat"][ntype][ids])
        assert torch.equal(blocks[-1].dstdata["label"]["paper"], small_graph.y[output_nodes["paper"].long()])


def test_one_gather_per_batch(small_graph, monkeypatch):
    calls = []
    gather_batch = hmgstore.HybridTensor.gather_batch  # the table kind's batch gather: one gather_many
    monkeypatch.setattr(hmgstore.HybridTensor, "gather_batch",
                        staticmethod(lambda requests, **kw: calls.append(len(requests))
                                     or gather_batch(requests, **kw)))
    g, features = _heterogeneous(small_graph, torch.int64)
    hdgl.attach(g, features)
    sampler = dgl.dataloading.NeighborSampler(
        [4, 4], prefetch_node_feats={"paper": ["feat"], "author": ["feat"]}, prefetch_labels={"paper": ["label"]})
    loader = dgl.dataloading.DataLoader(g, {"paper": small_graph.train_idx}, sampler, batch_size=400)
    batches = sum(1 for _ in loader)
    assert calls == [3] * batches  # paper feat, author feat, paper label: one call each batch


def test_unattached_keys_come_from_ndata_and_attached_keys_win(small_graph):
    g = _homogeneous(small_graph, torch.int64)
    extra = random_table(small_graph.num_nodes, (3,), torch.float64, seed=5)
    g.ndata["extra"] = extra
    g.ndata["feat"] = torch.zeros_like(small_graph.x)  # shadowed by the attached table
    hdgl.attach(g, {"feat": small_graph.x})
    sampler = dgl.dataloading.NeighborSampler([3], prefetch_node_feats=["feat", "extra"])
    input_nodes, _, blocks = next(iter(dgl.dataloading.DataLoader(g, small_graph.train_idx, sampler, batch_size=64)))
    assert torch.equal(blocks[0].srcdata["feat"], small_graph.x[input_nodes])
    assert torch.equal(blocks[0].srcdata["extra"], extra[input_nodes])
    assert isinstance(g.get_node_storage("extra"), dgl.frame.Column)


# ---- the FeatureStorage contract ------------------------------------------------
@pytest.mark.parametrize("pin_memory", [None, False, True])
def test_fetch_returns_waitable_rows(small_graph, idtype, pin_memory):
    g = hdgl.attach(_homogeneous(small_graph, idtype), {"feat": small_graph.x})
    storage = g.get_node_storage("feat", "_N")
    assert isinstance(storage, dgl.storages.FeatureStorage)
    ids = torch.tensor([5, 0, 1999, 5], dtype=idtype)
    pending = storage.fetch(ids, torch.device("cpu"), pin_memory)
    rows = pending.wait()
    assert rows.device.type == "cpu" and rows.dtype == torch.float32
    assert torch.equal(rows, small_graph.x[ids.long()])
    assert pending.wait() is rows
    assert storage.fetch(torch.empty(0, dtype=idtype), "cpu").wait().shape == (0, 16)


def test_rows_written_between_fetch_and_wait_come_back_as_written():
    """The gather runs at the first wait(), as documented: a write in between is seen (DGL's own storage reads
    at fetch); rows fetched after a wait are read then."""
    from hmgstore.plugins.dgl.storage import HybridFeatureStorage

    table = hmgstore.HybridTensor(torch.arange(20.0).reshape(5, 4))
    storage = HybridFeatureStorage(table)
    pending = storage.fetch(torch.tensor([0, 1]), "cpu")
    table[torch.tensor([0])] = torch.full((1, 4), -1.0)
    assert pending.wait().tolist() == [[-1.0] * 4, [4.0, 5.0, 6.0, 7.0]]
    table[torch.tensor([1])] = torch.zeros(1, 4)
    assert pending.wait()[1].tolist() == [4.0, 5.0, 6.0, 7.0]  # read once, at its first wait()


def test_fetches_of_a_thread_gather_together_and_threads_stay_apart(small_graph, monkeypatch):
    calls = []
    gather_batch = hmgstore.HybridTensor.gather_batch  # the table kind's batch gather: one gather_many
    monkeypatch.setattr(hmgstore.HybridTensor, "gather_batch",
                        staticmethod(lambda requests, **kw: calls.append(len(requests))
                                     or gather_batch(requests, **kw)))
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": small_graph.x, "label": small_graph.y})
    feat, label = g.get_node_storage("feat"), g.get_node_storage("label")
    ids = torch.arange(10)
    mine = [feat.fetch(ids, "cpu"), label.fetch(ids, "cpu"), feat.fetch(ids + 10, "cpu")]
    dropped = feat.fetch(ids, "cpu")  # never waited: not gathered
    del dropped

    def other_thread():
        theirs = label.fetch(ids, "cpu")
        assert torch.equal(theirs.wait(), small_graph.y[:10])

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert calls == [1]  # the other thread gathered only its own fetch
    assert torch.equal(mine[2].wait(), small_graph.x[10:20])
    assert torch.equal(mine[0].wait(), small_graph.x[:10]) and torch.equal(mine[1].wait(), small_graph.y[:10])
    assert calls == [1, 3]


def test_bad_cpu_ids_raise_at_their_own_fetch(small_graph):
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": small_graph.x})
    storage = g.get_node_storage("feat")
    good = storage.fetch(torch.tensor([1, 2]), "cpu")
    with pytest.raises(IndexError, match="2000"):
        storage.fetch(torch.tensor([1, 2000]), "cpu")
    assert torch.equal(good.wait(), small_graph.x[1:3])  # the batch goes on without the refused fetch
    with pytest.raises(TypeError):
        storage.fetch([1, 2], "cpu")
    assert torch.equal(storage.fetch(torch.tensor([3]), "cpu").wait(), small_graph.x[3:4])  # a new batch


# ---- the graph ----------------------------------------------------------------------
def test_fetches_never_waited_on_do_not_pile_up(small_graph):
    from hmgstore.plugins.dgl import storage

    table = hmgstore.HybridTensor(small_graph.x, "cpu")
    feature = hdgl.HybridFeatureStorage(table)
    ids = torch.tensor([1, 2, 3])
    for _ in range(10_000):
        feature.fetch(ids, "cpu")  # dropped without wait(), e.g. by a loader stopped early
    batch = next(iter(storage._open_batches.batches.values()))
    assert len(batch._fetches) <= 2 * storage.PRUNE_AT
    assert torch.equal(feature.fetch(ids, "cpu").wait(), small_graph.x[ids])


def test_graph_pickles_with_its_tables(small_graph):
    g, features = _heterogeneous(small_graph, torch.int32)
    g.ndata["year"] = {"paper": torch.arange(small_graph.num_nodes)}
    hdgl.attach(g, features)
    copy = pickle.loads(pickle.dumps(g))
    assert type(copy) is hdgl.HybridDGLGraph and copy.idtype == torch.int32
    assert torch.equal(copy.nodes["paper"].data["year"], g.nodes["paper"].data["year"])
    ids = torch.tensor([7, 3, 499], dtype=torch.int32)
    rows = copy.get_node_storage("feat", "author").fetch(ids, "cpu").wait()
    assert torch.equal(rows, features["feat"]["author"][ids.long()])


def test_attach_accepts_tables_of_each_kind_and_adds_keys(small_graph):
    g = _homogeneous(small_graph, torch.int64)
    assert hdgl.attach(g, {"feat": small_graph.x.numpy()}) is g
    view = g.local_var()
    hdgl.attach(g, {"label": hmgstore.HybridTensor(small_graph.y, "cpu")})
    assert {k for k, _ in g._hmgstore_storages} == {"feat", "label"}
    assert {k for k, _ in view._hmgstore_storages} == {"feat"}  # copies keep what they had
    ids = torch.tensor([4, 2])
    assert torch.equal(g.get_node_storage("feat").fetch(ids, "cpu").wait(), small_graph.x[ids])
    assert "hmgstore" in repr(g)


def test_attach_checks_its_device_even_when_every_table_is_already_a_hybrid_tensor(small_graph):
    g = _homogeneous(small_graph, torch.int64)
    table = hmgstore.HybridTensor(small_graph.x, "cpu")
    with pytest.raises(ValueError, match="live on 'cpu' or 'cuda' devices"):
        hdgl.attach(g, {"feat": table}, device="meta")
    if not torch.cuda.is_available():  # the GPU-less machine's own error, with its fix
        with pytest.raises(RuntimeError, match="CUDA"):
            hdgl.attach(g, {"feat": table}, device="cuda:7")
    assert not hasattr(g, "_hmgstore_storages")  # nothing attached
    assert hdgl.attach(g, {"feat": table}, device="cpu") is g


def test_attach_refuses_bad_input_and_changes_nothing(small_graph):
    g = _homogeneous(small_graph, torch.int64)
    hetero, features = _heterogeneous(small_graph, torch.int64)
    short = small_graph.x[:-1]
    with pytest.raises(ValueError, match="1999 rows"):
        hdgl.attach(g, {"label": small_graph.y, "feat": short})
    with pytest.raises(TypeError, match="DGLGraph"):
        hdgl.attach(small_graph, {"feat": small_graph.x})
    with pytest.raises(TypeError, match="block"):
        hdgl.attach(dgl.to_block(g), {"feat": small_graph.x})
    with pytest.raises(TypeError):
        hdgl.attach(g, {"feat": "not a table"})
    with pytest.raises(TypeError):
        hdgl.attach(g, {})
    with pytest.raises(ValueError, match="per type"):
        hdgl.attach(hetero, {"feat": small_graph.x})
    with pytest.raises(ValueError, match="'venue'"):
        hdgl.attach(hetero, {"feat": {"venue": small_graph.x}})
    assert type(g) is dgl.DGLGraph and type(hetero) is dgl.DGLGraph
    assert "_hmgstore_storages" not in g.__dict__


# ---- CUDA tables -------------------------------------------------------------------------------
def _sampled_batch(graph, small_graph):
    """(input_nodes, output_nodes) of one batch of DGL's CPU NeighborSampler, in the graph's idtype."""
    sampler = dgl.dataloading.NeighborSampler([5, 5])
    loader = dgl.dataloading.DataLoader(graph, small_graph.train_idx.to(graph.idtype), sampler, batch_size=256,
                                        shuffle=True)
    input_nodes, output_nodes, _ = next(iter(loader))
    return input_nodes, output_nodes


@pytest.fixture
def launches(monkeypatch):
    from hmgstore.cuda import gather  # hmgstore.table.tensor launches through this module

    count = [0]
    launch = gather.run  # one call per kernel launch

    def counting(*args, **kwargs):
        count[0] += 1
        return launch(*args, **kwargs)

    monkeypatch.setattr(gather, "run", counting)
    return count


@pytest.mark.gpu
@pytest.mark.parametrize("idtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("ids_on", ["cpu", "cuda"])
@pytest.mark.parametrize("hot", [False, True], ids=["host-only", "hot-rows-on-gpu"])
def test_fetch_to_cuda_equals_rows_in_one_launch(small_graph, cuda_device, launches, idtype, ids_on, hot):
    x, y = small_graph.x, small_graph.y
    gpu_rows = torch.arange(0, small_graph.num_nodes, 2) if hot else None
    g = hdgl.attach(_homogeneous(small_graph, idtype),
                    {"feat": hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows),
                     "label": hmgstore.HybridTensor(y, cuda_device)})
    input_nodes, output_nodes = _sampled_batch(g, small_graph)
    device = cuda_device if ids_on == "cuda" else torch.device("cpu")
    before = launches[0]  # filling the hot rows launches too

    feat = g.get_node_storage("feat", "_N").fetch(input_nodes.to(device), cuda_device, True)
    label = g.get_node_storage("label", "_N").fetch(output_nodes.to(device), cuda_device, None)
    assert launches[0] == before  # nothing runs before the first wait
    rows, labels = feat.wait(), label.wait()
    assert launches[0] == before + 1  # both fetches: one fused launch
    assert rows.device == cuda_device and labels.device == cuda_device
    assert torch.equal(rows.cpu(), x[input_nodes.long()])
    assert torch.equal(labels.cpu(), y[output_nodes.long()])


@pytest.mark.gpu
def test_fetch_from_a_prefetch_thread_on_a_side_stream(small_graph, cuda_device):
    """As DGL's prefetch thread does: fetch and wait in another thread, under its stream."""
    x = small_graph.x
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    input_nodes, _ = _sampled_batch(g, small_graph)
    side = torch.cuda.Stream(cuda_device)
    out = {}

    def prefetch():
        with torch.cuda.stream(side):
            out["rows"] = g.get_node_storage("feat").fetch(input_nodes, cuda_device, True).wait()

    thread = threading.Thread(target=prefetch)
    thread.start()
    thread.join()
    torch.cuda.current_stream(cuda_device).wait_stream(side)  # what DGL does with its stream
    assert torch.equal(out["rows"].cpu(), x[input_nodes])


@pytest.mark.gpu
def test_cpu_table_to_cuda_through_pinned_staging(small_graph, cuda_device):
    x = small_graph.x
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": hmgstore.HybridTensor(x, "cpu")})
    input_nodes, _ = _sampled_batch(g, small_graph)
    rows = g.get_node_storage("feat").fetch(input_nodes, cuda_device, True).wait()
    assert rows.device == cuda_device
    assert torch.equal(rows.cpu(), x[input_nodes])


@pytest.mark.gpu
@pytest.mark.parametrize("num_workers", [0, 2])
def test_cpu_loader_with_cuda_tables(small_graph, cuda_device, num_workers):
    """A CPU build of DGL trains on the CPU; the CUDA table still serves its loader (rows come back)."""
    x = small_graph.x
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    loader = dgl.dataloading.DataLoader(g, small_graph.train_idx, sampler, batch_size=512, num_workers=num_workers)
    for input_nodes, _, blocks in loader:
        assert blocks[0].srcdata["feat"].device.type == "cpu"
        assert torch.equal(blocks[0].srcdata["feat"], x[input_nodes])


@pytest.mark.gpu
def test_loader_to_cuda_needs_a_cuda_build_of_dgl(small_graph, cuda_device):
    x = small_graph.x
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    loader = dgl.dataloading.DataLoader(g, small_graph.train_idx, sampler, device=cuda_device, batch_size=256)
    if hdgl.dgl_supports_cuda():
        input_nodes, _, blocks = next(iter(loader))
        assert torch.equal(blocks[0].srcdata["feat"].cpu(), x[input_nodes.cpu()])
    else:  # what the docs say: a CPU build of DGL cannot move blocks to CUDA
        with pytest.raises(dgl.DGLError, match="(?i)cuda"):
            next(iter(loader))


@pytest.mark.gpu
def test_pickled_graph_rebuilds_its_cuda_table_on_first_fetch(small_graph, cuda_device):
    x = small_graph.x
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    copy = pickle.loads(pickle.dumps(g))
    assert "not built yet" in repr(copy.get_node_storage("feat"))
    ids = torch.tensor([3, 1999, 0, 3])
    rows = copy.get_node_storage("feat").fetch(ids, cuda_device, None).wait()
    assert torch.equal(rows.cpu(), x[ids])


@pytest.mark.gpu
def test_an_in_place_edit_of_host_rows_a_gpu_cache_also_holds_is_refused(small_graph, cuda_device):
    """The GPU keeps copies of the hot rows: an edit of g.ndata's host rows cannot reach them, so it is refused
    rather than served for the cold rows only."""
    x = small_graph.x.clone()
    table = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, small_graph.num_nodes, 2))
    g = hdgl.attach(_homogeneous(small_graph, torch.int64), {"feat": table})
    assert hdgl.storage.rows_elsewhere(table)
    g.ndata["feat"][:4] += 1.0
    with pytest.raises(RuntimeError, match="GPUs hold copies"):
        g.get_node_storage("feat", "_N")
    ids = torch.arange(4)
    table[ids] = small_graph.x[ids] * 2  # a write to the table reaches the GPU's copies too
    rows = g.get_node_storage("feat", "_N").fetch(ids, cuda_device, None).wait()
    assert torch.equal(rows.cpu(), small_graph.x[ids] * 2)
