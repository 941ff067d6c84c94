"""ShardedTensor (hmgstore.table.sharded): one table over several GPUs of one process.

The CPU tests check the API (the same calls as on several GPUs); the tests
marked ``gpu`` and ``multigpu`` read every tier from every GPU.
"""
import pytest
import torch

import hmgstore
from helpers import cuda_devices, random_table


def test_cpu_sharded_table_gathers_like_indexing():
    x = random_table(1000, (8,), torch.float32)
    with hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=320, hot_order=torch.randperm(1000), replicate=64) as t:
        idx = torch.randint(0, 1000, (300,))
        assert torch.equal(t[idx], x[idx]) and torch.equal(t.on("cpu")[idx], x[idx])
        assert t.placement.names == ("replica", "shard0", "host") and len(t) == 1000
        assert "ShardedTensor" in repr(t)
        with pytest.raises(IndexError):
            t[torch.tensor([1000])]
        with pytest.raises(TypeError, match=r"rows only.*t\[\[3, 1\]\]"):  # torch's element x[3, 1]: refused
            t[3, 1]
        assert torch.equal(t[10:3], x[10:3])  # an empty slice is empty, as in torch


def test_sharded_table_takes_gpu_budget_alone_or_hotness_as_a_hybrid_tensor_does():
    """gpu_budget alone fills the GPUs in id order; hotness= is a score per row (higher is hotter)."""
    from hmgstore.rows import placement

    x = random_table(100, (4,), torch.float32)  # 16-byte rows
    alone = hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=160).placement
    assert torch.equal(alone.rows_of("shard0"), torch.arange(10))
    in_id_order = placement.sharded(100, torch.arange(100), 16, 1, 160)
    assert (alone.names, alone.bounds) == (in_id_order.names, in_id_order.bounds)
    score = torch.rand(100)
    scored = hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=160, hotness=score).placement
    assert torch.equal(scored.rows_of("shard0"), torch.argsort(score, descending=True, stable=True)[:10])
    with pytest.raises(ValueError, match="not both"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=160, hot_order=torch.arange(100), hotness=score)
    with pytest.raises(ValueError, match="one score per row"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=160, hotness=torch.rand(7))
    with pytest.raises(ValueError, match="gpu_budget"):
        hmgstore.ShardedTensor(x, ["cpu"], hotness=score)


@pytest.mark.parametrize("kwargs, message", [
    ({"hot_order": torch.arange(10)}, "gpu_budget"),
    ({"gpu_budget": 10, "hot_order": torch.arange(10), "replicate": 20}, "must fit"),
])
def test_sharded_table_explains_missing_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hmgstore.ShardedTensor(torch.ones(10, 2), ["cpu"], **kwargs)


def test_sharded_table_refuses_odd_device_lists():
    x = torch.ones(10, 2)
    with pytest.raises(ValueError, match="empty"):
        hmgstore.ShardedTensor(x, [], gpu_budget=8, hot_order=torch.arange(10))
    with pytest.raises(ValueError, match="once"):
        hmgstore.ShardedTensor(x, ["cpu", "cpu"], gpu_budget=8, hot_order=torch.arange(10))


def test_sharded_table_does_not_pickle():
    import pickle

    t = hmgstore.ShardedTensor(torch.ones(10, 2), ["cpu"], gpu_budget=8, hot_order=torch.arange(10))
    with pytest.raises(TypeError, match="cannot be sent"):
        pickle.dumps(t)


# ---- on several GPUs ------------------------------------------------------------------
def _rows_by_tier(p):
    rows = {name: p.rows_of(name) for name in p.names if name != "host"}
    on_host = torch.ones(p.num_rows, dtype=torch.bool)
    for r in p.resident:
        on_host[r] = False
    rows["host"] = on_host.nonzero().view(-1)
    return rows


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("dtype, row_shape", [(torch.float32, (33,)), (torch.bfloat16, (64,)), (torch.int8, (3,)),
                                              (torch.float64, (2, 8))])
def test_every_tier_from_every_gpu_is_exact(dtype, row_shape):
    n = 20_000
    x = random_table(n, row_shape, dtype)
    row_bytes = x[0].nbytes
    with hmgstore.ShardedTensor(x, cuda_devices(), gpu_budget=3000 * row_bytes, replicate=500 * row_bytes,
                                hot_order=torch.randperm(n)) as t:
        assert t.placement.names[0] == "replica" and t.placement.has_host_tier
        for d in t.devices:
            for tier, rows in _rows_by_tier(t.placement).items():
                idx = rows[torch.randperm(len(rows))][:999]
                for ids in (idx, idx.to(d), idx.to(torch.int32)):
                    out = torch.empty((len(idx), *row_shape), dtype=dtype, device=d)
                    out.view(torch.uint8).fill_(0xFF)  # poison
                    t.on(d).gather(ids, out=out)
                    assert torch.equal(out.cpu(), x[idx]), f"{tier} rows read on {d}"
            idx = torch.randint(0, n, (5000, 2))
            assert torch.equal(t.on(d)[idx].cpu(), x[idx])


@pytest.mark.gpu
@pytest.mark.multigpu
def test_sharded_view_fuses_with_other_tables():
    x = random_table(10_000, (16,), torch.float32)
    y = random_table(10_000, (1,), torch.int64)
    d0 = cuda_devices()[0]
    with hmgstore.ShardedTensor(x, cuda_devices(), gpu_budget=16 * 4 * 4000, hot_order=torch.randperm(10_000)) as t:
        labels = hmgstore.HybridTensor(y, d0)
        idx = torch.randint(0, 10_000, (4000,))
        xs, ys = hmgstore.gather_many([(t.on(d0), idx), (labels, idx)])
        assert torch.equal(xs.cpu(), x[idx]) and torch.equal(ys.cpu(), y[idx])
        with pytest.raises(IndexError):
            t.on(d0).gather(torch.tensor([0, 10_000], device=d0), check="sync")
        t.on(d0)[torch.tensor([0, 10_000], device=d0)]  # checked by the kernel: raised by the next gather
        with pytest.raises(IndexError, match="10000 at position 1"):
            hmgstore.raise_deferred(d0)
        assert torch.equal(t.on(d0)[idx].cpu(), x[idx])  # the context survived the rejected index


@pytest.mark.gpu
@pytest.mark.multigpu
def test_all_rows_on_gpus_needs_no_host_reads():
    x = random_table(8_000, (32,), torch.float16)
    k = len(cuda_devices())
    with hmgstore.ShardedTensor(x, cuda_devices(), gpu_budget=x.nbytes // k + 4096, hot_order=torch.arange(8000)) as t:
        assert not t.placement.has_host_tier and t.pinned is None
        for d in t.devices:
            idx = torch.randint(0, 8000, (3000,), device=d)
            assert torch.equal(t.on(d)[idx].cpu(), x[idx.cpu()])


@pytest.mark.gpu
@pytest.mark.multigpu
def test_without_peer_access_rows_come_from_the_host(monkeypatch):
    from hmgstore.cuda import peer

    monkeypatch.setattr(peer, "can_access_peer", lambda a, b: a == b)
    x = random_table(10_000, (16,), torch.float32)
    with pytest.warns(RuntimeWarning, match="no peer access"):
        t = hmgstore.ShardedTensor(x, cuda_devices(), gpu_budget=16 * 4 * 2000, hot_order=torch.randperm(10_000))
    with t:
        for d in t.devices:
            idx = torch.randint(0, 10_000, (4000,))
            assert torch.equal(t.on(d)[idx].cpu(), x[idx])


@pytest.mark.gpu
@pytest.mark.multigpu
def test_close_gives_the_memory_back():
    x = random_table(200_000, (64,), torch.float32)  # 51 MB
    torch.cuda.synchronize()
    free = [torch.cuda.mem_get_info(d)[0] for d in cuda_devices()]
    t = hmgstore.ShardedTensor(x, cuda_devices(), gpu_budget="40MB", replicate="8MB", hot_order=torch.arange(200_000))
    t.close()
    torch.cuda.empty_cache()
    assert all(torch.cuda.mem_get_info(d)[0] >= f - (4 << 20) for d, f in zip(cuda_devices(), free))
    with pytest.raises(RuntimeError, match="closed"):
        t.on(cuda_devices()[0])[torch.arange(3)]


@pytest.mark.gpu
@pytest.mark.multigpu
def test_adapters_serve_a_sharded_view(small_graph):
    """PyG's store and DGL's storage take a sharded view like any table: rows of a sampled batch."""
    from hmgstore.plugins import dgl as hdgl
    from hmgstore.plugins.pyg.feature_store import HybridFeatureStore

    # isort: split
    import dgl  # noqa: E402  (after the plugin)

    x, n = small_graph.x, small_graph.num_nodes
    d0 = cuda_devices()[0]
    with hmgstore.ShardedTensor(x, cuda_devices(), gpu_budget=x[0].nbytes * n // 4, replicate=x[0].nbytes * 50,
                                hot_order=torch.randperm(n)) as t:
        store = HybridFeatureStore(d0)
        store.put_tensor(t.on(d0), group_name=None, attr_name="x", index=None)
        idx = torch.randint(0, n, (700,))
        (attr,) = store.get_all_tensor_attrs()
        attr.index = idx
        assert torch.equal(store.multi_get_tensor([attr])[0].cpu(), x[idx])

        g = hdgl.attach(dgl.graph(tuple(small_graph.edge_index), num_nodes=n), {"feat": t.on(d0)})
        sampler = dgl.dataloading.NeighborSampler([5, 5])
        loader = dgl.dataloading.DataLoader(g, small_graph.train_idx, sampler, batch_size=256)
        input_nodes, _, _ = next(iter(loader))
        rows = g.get_node_storage("feat", "_N").fetch(input_nodes, d0, None).wait()
        assert torch.equal(rows.cpu(), x[input_nodes])
        g.ndata["feat"][:3] += 1.0  # host rows the GPUs hold copies of: the edit cannot reach those
        with pytest.raises(RuntimeError, match="changed in place"):
            g.get_node_storage("feat", "_N")


@pytest.mark.gpu
@pytest.mark.multigpu
def test_a_views_first_gather_on_another_stream_sees_its_map():
    """The view's id map is written at build; a first gather on another stream (DGL's prefetch thread)
    must read it written."""
    d0, d1 = cuda_devices()[:2]
    x = random_table(200_000, (16,), torch.float32, seed=50)
    for _ in range(3):
        torch.cuda._sleep(100_000_000)  # the building stream is busy: a map written late would show
        t = hmgstore.ShardedTensor(x, [d0, d1], gpu_budget=16 * 4 * 60_000, hot_order=torch.randperm(200_000))
        side = torch.cuda.Stream(d1)
        idx = torch.randint(0, 200_000, (50_000,))
        with torch.cuda.stream(side):
            rows = t.on(d1)[idx.to(d1)]
        side.synchronize()
        assert torch.equal(rows.cpu(), x[idx])
        t.close()


@pytest.mark.gpu
@pytest.mark.multigpu
def test_dropping_a_sharded_table_while_another_gpu_reads_is_safe():
    import gc

    d0, d1 = cuda_devices()[:2]
    x = random_table(400_000, (32,), torch.float32, seed=51)
    t = hmgstore.ShardedTensor(x, [d0, d1], gpu_budget=32 * 4 * 100_000, hot_order=torch.randperm(400_000))
    idx = torch.randint(0, 400_000, (300_000,), device=d1)
    view = t.on(d1)
    outs = [view[idx] for _ in range(5)]  # queued on GPU 1, reading GPU 0's shard and pinned host rows
    del t, view
    gc.collect()  # dropped without close(): every GPU must be waited for before shards and pins go
    filler = [torch.full((64 << 20,), 7.0, device=d) for d in (d0, d1)]  # would reuse freed memory
    for out in outs:
        assert torch.equal(out.cpu(), x[idx.cpu()])
    del filler
