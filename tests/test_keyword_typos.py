"""A misspelt keyword names the function the user called and the keyword meant, on every public entry point
that passes its ``**kwargs`` on to another function or class (which Python's own TypeError would name).

CPU only. Each call raises at its first line, before any work, so the other arguments are the least that
reaches it.
"""
from __future__ import annotations

import re

import pytest
import torch

import hmgstore
from hmgstore import HybridTensor, ShardedTensor
from hmgstore.distributed import DistributedTensor, PartitionBook, load_partition, part_of
from hmgstore.rows import checks

X = torch.arange(12.0).reshape(6, 2)


def refused(call, function: str, bad: str, meant: str) -> None:
    """``call()`` raises TypeError naming ``function``, the ``bad`` keyword and the ``meant`` one."""
    pattern = (rf"^{re.escape(function)}\(\) got an unexpected keyword argument '{bad}'; "
               rf"did you mean '{meant}'\?")
    with pytest.raises(TypeError, match=pattern):
        call()


def test_tables():
    refused(lambda: HybridTensor.empty((4, 2), device="cpu", gpu_bugdet=0), "HybridTensor.empty", "gpu_bugdet",
            "gpu_budget")
    refused(lambda: HybridTensor.empty((4, 2), device="cpu", max_sm=1), "HybridTensor.empty", "max_sm", "max_sms")
    refused(lambda: HybridTensor.over_host_tier(X, "cpu", torch.float32, hot_ordr=None),
            "HybridTensor.over_host_tier", "hot_ordr", "hot_order")
    refused(lambda: hmgstore.load("x.npy", "cpu", gpu_bugdet=0), "hmgstore.load", "gpu_bugdet", "gpu_budget")
    sharded = ShardedTensor(X, ["cpu"], gpu_budget=0, hot_order=torch.arange(len(X)))
    try:
        refused(lambda: sharded.gather(torch.tensor([1]), chek="sync"), "ShardedTensor.gather", "chek", "check")
        refused(lambda: sharded.gather(torch.tensor([1]), devcie="cpu"), "ShardedTensor.gather", "devcie", "device")
        assert torch.equal(sharded.gather(torch.tensor([1]), check="sync"), X[[1]])  # right keywords still pass
    finally:
        sharded.close()


def test_distributed():
    # A DistributedTensor needs a process group to be built; the keyword check comes before the table is read.
    refused(lambda: DistributedTensor.gather(object.__new__(DistributedTensor), torch.tensor([1]), ot=None),
            "DistributedTensor.gather", "ot", "out")
    book = PartitionBook.range(6, 2)
    edges = torch.tensor([[0, 1, 2], [1, 2, 3]])
    refused(lambda: part_of({"x": X}, edges, book, 0, "cpu", progress=False, gpu_bugdet=0), "part_of",
            "gpu_bugdet", "gpu_budget")
    part = part_of({"x": X}, edges, book, 0, "cpu", progress=False, gpu_budget=None)  # right keywords still pass
    assert torch.equal(part.features["x"][[0]], X[[0]])
    for share in (False, True):
        refused(lambda: load_partition("no-such-folder", 0, "cpu", share=share, hotnes=None), "load_partition",
                "hotnes", "hotness")
    refused(lambda: load_partition("no-such-folder", 0, "cpu", shar=True), "load_partition", "shar", "share")


def test_pyg():
    pyg = pytest.importorskip("hmgstore.plugins.pyg")
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    refused(lambda: pyg.from_data(None, "cpu", comprss="int8"), "from_data", "comprss", "compress")
    refused(lambda: pyg.from_tensors(edge_index=edge_index, x=X, device="cpu", comprss="int8"), "from_tensors",
            "comprss", "compress")
    refused(lambda: pyg.HybridFeatureStore.from_sources({(None, "x"): X}, "cpu", backng="auto"),
            "HybridFeatureStore.from_sources", "backng", "backing")
    store = pyg.HybridFeatureStore.from_sources({(None, "x"): X}, "cpu", copy=True)  # right keywords still pass
    refused(lambda: store.put_edge_tables({(None, "w"): X[:3]}, host_dtyp=torch.float16),
            "HybridFeatureStore.put_edge_tables", "host_dtyp", "host_dtype")
    refused(lambda: store.put_tensor(X, group_nme=None, attr_name="z"), "HybridFeatureStore.put_tensor",
            "group_nme", "group_name")
    refused(lambda: store.update_tensor(X, group_name=None, attr_nme="x"), "HybridFeatureStore.update_tensor",
            "attr_nme", "attr_name")
    assert store.put_tensor(X + 1, group_name=None, attr_name="z")
    assert torch.equal(store.get_tensor(group_name=None, attr_name="z", index=None), X + 1)
    refused(lambda: pyg.CSCGraphStore().put_edge_index(edge_index, edge_type=None, layuot="coo", size=(6, 6)),
            "put_edge_index", "layuot", "layout")
    # Checked before the collective, so no process group is needed to see it.
    refused(lambda: pyg.cluster_loader(None, None, torch.arange(4), 2, num_worker=0), "cluster_loader",
            "num_worker", "num_workers")
    refused(lambda: pyg.cluster_loader(None, None, torch.arange(4), 2, shufle=True), "cluster_loader", "shufle",
            "shuffle")


def test_dgl():
    hdgl = pytest.importorskip("hmgstore.plugins.dgl")
    g = hdgl.attach(hdgl.dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])), num_nodes=6),
                    {"feat": HybridTensor(X, "cpu")})
    refused(lambda: g.remove_nodes(torch.tensor([5]), ntyp="_N"), "HybridDGLGraph.remove_nodes", "ntyp", "ntype")
    refused(lambda: g.remove_edges(torch.tensor([0]), etyp="_E"), "HybridDGLGraph.remove_edges", "etyp", "etype")
    g.remove_edges(torch.tensor([0]), etype="_E")  # right keywords still pass
    assert g.num_edges() == 2
    storage = hdgl.HybridFeatureStorage(HybridTensor(X, "cpu"))
    refused(lambda: storage.fetch(torch.tensor([0]), "cpu", pin_memroy=False), "fetch", "pin_memroy", "pin_memory")


def test_the_suggestion_follows_the_signature():
    """The keywords an entry point forwards are read from the signature they go to, so a new one is taken at once."""
    taken = checks.takes(HybridTensor, without=("source",))
    assert "gpu_budget" in taken and "source" not in taken and "self" not in taken
    assert checks.takes(HybridTensor.gather) == ("index", "out", "stream", "check")
