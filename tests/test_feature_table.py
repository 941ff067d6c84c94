"""One interface for the table kinds (hmgstore.FeatureTable), and the DGL adapter reading any of them."""
from __future__ import annotations

import pytest
import torch

import hmgstore
from helpers import random_table
from hmgstore.distributed.cluster import ClusterTensor
from hmgstore.distributed.shard import DistributedTensor

MEMBERS = ("shape", "row_shape", "dtype", "device", "num_rows", "__len__", "gather", "__getitem__", "gather_batch",
           "close")


def test_every_table_kind_answers_the_interface():
    x = random_table(300, (8,), torch.float32, seed=1)
    hybrid = hmgstore.HybridTensor(x, "cpu")
    sharded = hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=8 * 4 * 100)
    for table in (hybrid, sharded):
        assert isinstance(table, hmgstore.FeatureTable), type(table).__name__
        assert table.shape == x.shape and table.row_shape == x.shape[1:] and table.dtype == x.dtype
        assert table.num_rows == len(table) == 300 and table.device == torch.device("cpu")
        idx = torch.tensor([299, 0, 7, 7])
        assert torch.equal(table.gather(idx), x[idx]) and torch.equal(table[idx], x[idx])
    for cls in (DistributedTensor, ClusterTensor):  # built by process groups: their members, checked on the class
        assert not [m for m in MEMBERS if not hasattr(cls, m)], cls.__name__
    assert not isinstance(x, hmgstore.FeatureTable)  # a plain tensor is data to wrap, not a table


def test_each_kind_gathers_a_batch_of_its_tables_with_its_own_hook():
    x = random_table(300, (8,), torch.float32, seed=1)
    y = random_table(300, (2,), torch.int64, seed=2)
    for kind in (lambda t: hmgstore.HybridTensor(t, "cpu"), lambda t: hmgstore.ShardedTensor(t, ["cpu"], gpu_budget=0)):
        tables = [kind(x), kind(y)]
        idx = [torch.tensor([5, 299, 5]), torch.tensor([0, 1])]
        out = torch.full((2, 2), -1, dtype=torch.int64)
        rows = tables[0].gather_batch(list(zip(tables, idx)), outs=[None, out])
        assert torch.equal(rows[0], x[idx[0]]) and torch.equal(rows[1], y[idx[1]])
        assert rows[1] is out or torch.equal(out, y[idx[1]])  # written into the buffer given


def test_dgl_reads_a_sharded_table_through_the_interface():
    hdgl = pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")
    import dgl

    x = random_table(500, (8,), torch.float32, seed=2)
    sharded = hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=8 * 4 * 100)
    src, dst = torch.randint(0, 500, (2, 3000), generator=torch.Generator().manual_seed(3))
    g = dgl.graph((src, dst), num_nodes=500)
    hdgl.attach(g, {"feat": sharded})
    sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"])
    loader = dgl.dataloading.DataLoader(g, torch.arange(64), sampler, batch_size=32)
    for input_nodes, _, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"], x[input_nodes])
    assert torch.equal(g.ndata["feat"], x)  # the whole table, read through the interface
    with pytest.raises(TypeError, match="FeatureTable"):
        hdgl.storage.HybridFeatureStorage(object())
