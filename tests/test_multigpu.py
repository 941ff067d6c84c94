"""Tables sharded over several GPUs: one process (ShardedTensor) and one process per GPU
(hmgstore.distributed, through tests/distributed_worker.py). Needs 2+ GPUs."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import hmgstore
from helpers import random_table
from test_distributed import launch, no_leaks  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def _devices():
    return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]


def _rows_by_tier(p):
    rows = {name: p.rows_of(name) for name in p.names if name != "host"}
    on_host = torch.ones(p.num_rows, dtype=torch.bool)
    for r in p.resident:
        on_host[r] = False
    rows["host"] = on_host.nonzero().view(-1)
    return rows


@pytest.mark.parametrize("dtype, row_shape", [(torch.float32, (33,)), (torch.bfloat16, (64,)), (torch.int8, (3,)),
                                              (torch.float64, (2, 8))])
def test_every_tier_from_every_gpu_is_exact(dtype, row_shape):
    n = 20_000
    x = random_table(n, row_shape, dtype)
    row_bytes = x[0].nbytes
    with hmgstore.ShardedTensor(x, _devices(), gpu_budget=3000 * row_bytes, replicate=500 * row_bytes,
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


def test_sharded_view_fuses_with_other_tables():
    x = random_table(10_000, (16,), torch.float32)
    y = random_table(10_000, (1,), torch.int64)
    d0 = _devices()[0]
    with hmgstore.ShardedTensor(x, _devices(), gpu_budget=16 * 4 * 4000, hot_order=torch.randperm(10_000)) as t:
        labels = hmgstore.HybridTensor(y, d0)
        idx = torch.randint(0, 10_000, (4000,))
        xs, ys = hmgstore.gather_many([(t.on(d0), idx), (labels, idx)])
        assert torch.equal(xs.cpu(), x[idx]) and torch.equal(ys.cpu(), y[idx])
        with pytest.raises(IndexError):
            t.on(d0)[torch.tensor([0, 10_000], device=d0)]
        assert torch.equal(t.on(d0)[idx].cpu(), x[idx])  # the context survived the rejected index


def test_all_rows_on_gpus_needs_no_host_reads():
    x = random_table(8_000, (32,), torch.float16)
    k = len(_devices())
    with hmgstore.ShardedTensor(x, _devices(), gpu_budget=x.nbytes // k + 4096, hot_order=torch.arange(8000)) as t:
        assert not t.placement.has_host_tier and t._pinned is None
        for d in t.devices:
            idx = torch.randint(0, 8000, (3000,), device=d)
            assert torch.equal(t.on(d)[idx].cpu(), x[idx.cpu()])


def test_without_peer_access_rows_come_from_the_host(monkeypatch):
    from hmgstore.cuda import peer as _cuda

    monkeypatch.setattr(_cuda, "can_access_peer", lambda a, b: a == b)
    x = random_table(10_000, (16,), torch.float32)
    with pytest.warns(RuntimeWarning, match="no peer access"):
        t = hmgstore.ShardedTensor(x, _devices(), gpu_budget=16 * 4 * 2000, hot_order=torch.randperm(10_000))
    with t:
        for d in t.devices:
            idx = torch.randint(0, 10_000, (4000,))
            assert torch.equal(t.on(d)[idx].cpu(), x[idx])


def test_close_gives_the_memory_back():
    x = random_table(200_000, (64,), torch.float32)  # 51 MB
    torch.cuda.synchronize()
    free = [torch.cuda.mem_get_info(d)[0] for d in _devices()]
    t = hmgstore.ShardedTensor(x, _devices(), gpu_budget="40MB", replicate="8MB", hot_order=torch.arange(200_000))
    t.close()
    torch.cuda.empty_cache()
    assert all(torch.cuda.mem_get_info(d)[0] >= f - (4 << 20) for d, f in zip(_devices(), free))
    with pytest.raises(RuntimeError, match="closed"):
        t.on(_devices()[0])[torch.arange(3)]


# ---- one process per GPU --------------------------------------------------------
def test_distributed_every_tier_on_every_rank(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    codes, reports, errs = launch("shard", k, tmp_path, device="cuda", timeout=300)
    assert codes == [0] * k, errs
    for rank, r in reports.items():
        assert r["shared_equal"] and r["segments_after_setup"] == []
        assert r["tiers"] == ["replica", *(f"shard{s}" for s in range(k)), "host"]
        assert all(ok for _, ok in r["tiers_exact"].values()), (rank, r["tiers_exact"])
        assert r["bad_index"]
        assert r["registered_ranges"] == 0 and r["ipc_mappings_open"] == 0
        assert r["gpu_free_lost"] < 16 << 20, f"rank {rank}: {r['gpu_free_lost']} B of GPU memory not given back"


def _gpus_free():
    torch.cuda.synchronize()
    return [torch.cuda.mem_get_info(d)[0] for d in _devices()]


def _assert_gpus_given_back(free_before):
    import time

    deadline = time.monotonic() + 10  # the driver tears down a dead process's context asynchronously
    while True:
        lost = [b - a for a, b in zip(_gpus_free(), free_before)]
        if all(x < 16 << 20 for x in lost) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert all(x < 16 << 20 for x in lost), f"GPU memory not given back after the ranks ended: {lost}"


def test_distributed_killed_rank(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    free = _gpus_free()
    codes, reports, errs = launch("kill", k, tmp_path, device="cuda", timeout=300)
    _assert_gpus_given_back(free)
    assert codes[-1] == -9
    for rank in range(k - 1):
        assert codes[rank] == 0, errs[rank]
        assert f"rank {k - 1}" in reports[rank]["error"] and reports[rank]["seconds"] < 10


def test_distributed_killed_rank_unblocks_nccl(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    codes, reports, errs = launch("kill_blocked", k, tmp_path, device="cuda", env={"PEER_EXIT_TIMEOUT": "5"},
                                  timeout=120)
    assert codes[-1] == -9
    for rank in range(k - 1):
        assert codes[rank] != 0 and f"rank {k - 1}" in errs[rank], errs[rank][-3000:]


def test_distributed_clean_exit(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    free = _gpus_free()
    codes, reports, errs = launch("clean_exit", k, tmp_path, device="cuda", timeout=300)
    _assert_gpus_given_back(free)
    assert codes == [0] * k, errs


def test_distributed_host_memory_is_held_once(tmp_path, no_leaks, request):
    k = torch.cuda.device_count()
    codes, reports, errs = launch("rss", k, tmp_path, device="cuda", env={"RSS_TABLE_GB": "2"}, timeout=400)
    assert codes == [0] * k, errs
    table = reports[0]["table_bytes"]
    for r in reports.values():
        assert r["exact"]
        private = r["held"]["RssAnon"] - r["before"]["RssAnon"]
        assert private < table / 4, f"rank {r['rank']} holds {private / 1e9:.2f} GB of private memory"
    print(json.dumps({"rss": reports}, indent=1))


def test_adapters_serve_a_sharded_view(small_graph):
    """PyG's store and DGL's storage take a sharded view like any table: rows of a sampled batch."""
    from hmgstore.plugins import dgl as hdgl
    from hmgstore.plugins.pyg.feature_store import HybridFeatureStore

    import dgl  # noqa: E402  (after the plugin)

    x, n = small_graph.x, small_graph.num_nodes
    d0 = _devices()[0]
    with hmgstore.ShardedTensor(x, _devices(), gpu_budget=x[0].nbytes * n // 4, replicate=x[0].nbytes * 50,
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
