"""DGL adapter on a GPU: CUDA tables fed by DGL's CPU sampler (a CPU build of DGL works here).

Ids come from DGL's own NeighborSampler on the CPU; ``fetch(ids, cuda)``
must return ``x[ids]`` on the GPU, with every fetch of a batch served by one
kernel launch at the first ``wait()``.
"""
from __future__ import annotations

import pickle
import threading

import pytest
import torch

import hmgstore
from hmgstore.plugins import dgl as hdgl

import dgl  # noqa: E402  (after the plugin, which makes dgl importable on this torch)

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")]


def _graph(small_graph, idtype=torch.int64) -> dgl.DGLGraph:
    return dgl.graph(tuple(small_graph.edge_index), num_nodes=small_graph.num_nodes, idtype=idtype)


def _sampled_batch(graph, small_graph):
    """(input_nodes, output_nodes) of one batch of DGL's CPU NeighborSampler, in the graph's idtype."""
    sampler = dgl.dataloading.NeighborSampler([5, 5])
    loader = dgl.dataloading.DataLoader(graph, small_graph.train_idx.to(graph.idtype), sampler, batch_size=256,
                                        shuffle=True)
    input_nodes, output_nodes, _ = next(iter(loader))
    return input_nodes, output_nodes


@pytest.fixture
def launches(monkeypatch):
    from hmgstore import _cuda

    count = [0]
    launch = _cuda.launch_gather

    def counting(*args, **kwargs):
        count[0] += 1
        return launch(*args, **kwargs)

    monkeypatch.setattr(_cuda, "launch_gather", counting)
    return count


@pytest.mark.parametrize("idtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("ids_on", ["cpu", "cuda"])
@pytest.mark.parametrize("hot", [False, True], ids=["host-only", "hot-rows-on-gpu"])
def test_fetch_to_cuda_equals_rows_in_one_launch(small_graph, cuda_device, launches, idtype, ids_on, hot):
    x, y = small_graph.x, small_graph.y
    gpu_rows = torch.arange(0, small_graph.num_nodes, 2) if hot else None
    g = hdgl.attach(_graph(small_graph, idtype), {"feat": hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows),
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


def test_fetch_from_a_prefetch_thread_on_a_side_stream(small_graph, cuda_device):
    """As DGL's prefetch thread does: fetch and wait in another thread, under its stream."""
    x = small_graph.x
    g = hdgl.attach(_graph(small_graph), {"feat": hmgstore.HybridTensor(x, cuda_device)})
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


def test_cpu_table_to_cuda_through_pinned_staging(small_graph, cuda_device):
    x = small_graph.x
    g = hdgl.attach(_graph(small_graph), {"feat": hmgstore.HybridTensor(x, "cpu")})
    input_nodes, _ = _sampled_batch(g, small_graph)
    rows = g.get_node_storage("feat").fetch(input_nodes, cuda_device, True).wait()
    assert rows.device == cuda_device
    assert torch.equal(rows.cpu(), x[input_nodes])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cpu_loader_with_cuda_tables(small_graph, cuda_device, num_workers):
    """A CPU build of DGL trains on the CPU; the CUDA table still serves its loader (rows come back)."""
    x = small_graph.x
    g = hdgl.attach(_graph(small_graph), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    loader = dgl.dataloading.DataLoader(g, small_graph.train_idx, sampler, batch_size=512, num_workers=num_workers)
    for input_nodes, _, blocks in loader:
        assert blocks[0].srcdata["feat"].device.type == "cpu"
        assert torch.equal(blocks[0].srcdata["feat"], x[input_nodes])


def test_loader_to_cuda_needs_a_cuda_build_of_dgl(small_graph, cuda_device):
    x = small_graph.x
    g = hdgl.attach(_graph(small_graph), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    loader = dgl.dataloading.DataLoader(g, small_graph.train_idx, sampler, device=cuda_device, batch_size=256)
    if hdgl.dgl_supports_cuda():
        input_nodes, _, blocks = next(iter(loader))
        assert torch.equal(blocks[0].srcdata["feat"].cpu(), x[input_nodes.cpu()])
    else:  # what the docs say: a CPU build of DGL cannot move blocks to CUDA
        with pytest.raises(dgl.DGLError, match="(?i)cuda"):
            next(iter(loader))


def test_pickled_graph_rebuilds_its_cuda_table_on_first_fetch(small_graph, cuda_device):
    x = small_graph.x
    g = hdgl.attach(_graph(small_graph), {"feat": hmgstore.HybridTensor(x, cuda_device)})
    copy = pickle.loads(pickle.dumps(g))
    assert "not built yet" in repr(copy.get_node_storage("feat"))
    ids = torch.tensor([3, 1999, 0, 3])
    rows = copy.get_node_storage("feat").fetch(ids, cuda_device, None).wait()
    assert torch.equal(rows.cpu(), x[ids])
