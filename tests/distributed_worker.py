"""One rank of a multi-process test (run by tests/test_distributed*.py through `launch`).

Usage: python distributed_worker.py SCENARIO OUT_DIR, with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT (and LOCAL_RANK) in the environment, as torchrun
sets them. Each rank writes OUT_DIR/rank{R}.json with what it saw; the test
reads them. HMGSTORE_TEST_DEVICE=cuda runs the CUDA variant (one GPU per
rank, by local rank).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import hmgstore
import hmgstore.distributed as hd

N, D = 5_000, 24


def table() -> torch.Tensor:
    """The test table: distinct, non-zero values in every row."""
    g = torch.Generator().manual_seed(7)
    return torch.randn(N, D, generator=g) + torch.arange(N, dtype=torch.float32)[:, None]


def hot_order() -> torch.Tensor:
    return torch.randperm(N, generator=torch.Generator().manual_seed(3))


def device() -> torch.device:
    if os.environ.get("HMGSTORE_TEST_DEVICE") == "cuda":
        local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_on_leader_only():
    def make():
        return table()  # only the node's first rank may build it
    if dist.get_rank() != hd.this_node().leader:
        def make():
            raise AssertionError("make() ran on a rank that is not the node's first")
    return make


def build(report, budget=40 * N, replicate=10 * N, **kwargs):
    x = hd.share_on_node(make_on_leader_only(), progress=False)
    t = hd.shard(x, gpu_budget=budget, hot_order=hot_order(), replicate=replicate, device=device(), **kwargs)
    # hmgstore's own segments; "hmgstore-test-*" files are test_producer.py's stand-ins, made while this runs
    report["segments_after_setup"] = sorted(n for n in os.listdir("/dev/shm")
                                            if n.startswith("hmgstore-") and not n.startswith("hmgstore-test-"))
    report["tiers"] = list(t.placement.names)
    report["bounds"] = list(t.placement.bounds)
    report["node_ranks"] = hd.this_node().ranks
    return x, t


def check_every_tier(report, x, t, expected=None):
    """Bit-exact gathers of rows from every tier (and mixed), on poisoned outputs; ``expected``: the rows as
    they read back (default: the table itself)."""
    report["shared_equal"] = bool(torch.equal(x, table()))
    expected = table() if expected is None else expected
    p = t.placement
    results = {}
    for name in p.names:
        if name == "host":
            on_host = torch.ones(N, dtype=torch.bool)
            for rows in p.resident:
                on_host[rows] = False
            rows = on_host.nonzero().view(-1)
        else:
            rows = p.rows_of(name)
        idx = rows[torch.randperm(len(rows))][:700]
        out = torch.full((len(idx), D), float("nan"), device=t.device)
        t.table.gather(idx, out=out)
        results[name] = [len(idx), bool(torch.equal(out.cpu(), expected[idx]))]
    idx = torch.randint(0, N, (3000,))
    for ids in (idx, idx.to(t.device), idx.to(torch.int32)):
        if not torch.equal(t.table[ids].cpu(), expected[idx]):
            results["mixed"] = [len(idx), False]
            break
    else:
        results["mixed"] = [len(idx), True]
    report["tiers_exact"] = results


def scenario_dgl(report):
    """DGL's DataLoader on each rank, its features fetched from this rank's sharded view."""
    from hmgstore.plugins import dgl as hdgl

    # isort: split
    import dgl

    x, t = build(report)
    g = torch.Generator().manual_seed(5)
    src, dst = torch.randint(0, N, (8 * N,), generator=g), torch.randint(0, N, (8 * N,), generator=g)
    graph = hdgl.attach(dgl.graph((src, dst), num_nodes=N), {"feat": t.table})
    seeds = torch.arange(N)[dist.get_rank()::dist.get_world_size()]  # one loader per rank, its own seeds
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"])
    loader = dgl.dataloading.DataLoader(graph, seeds, sampler, batch_size=256, device=t.device)
    exact, batches = True, 0
    for input_nodes, _, blocks in loader:
        exact &= bool(torch.equal(blocks[0].srcdata["feat"].cpu(), table()[input_nodes.cpu()]))
        batches += 1
        if batches == 3:
            break
    report["dgl_exact"], report["dgl_batches"] = exact, batches
    t.close()


def _gpu_free() -> int:
    if device().type != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def scenario_shard(report):
    if device().type == "cuda":
        torch.zeros(1, device=device())
    free = _gpu_free()
    x, t = build(report)
    check_every_tier(report, x, t)
    report["peer_mappings"] = sorted({m.kind for m in t._opened})
    try:
        t.table[torch.tensor([0, N])]
    except IndexError as err:
        report["bad_index"] = str(err)
    t.close()
    report["closed"] = True
    dist.barrier(group=hd.this_node().group)  # every rank has closed (gloo: an NCCL barrier would allocate GPU memory)
    report["gpu_free_lost"] = free - _gpu_free()
    report["registered_ranges"] = len(hmgstore.memory.registered_ranges())
    report["ipc_mappings_open"] = len(t._opened)


def scenario_shard_int8(report):
    """A table sharded as int8 rows: every tier reads back exactly as the format decodes the encoded rows."""
    from hmgstore.rows import formats

    int8 = formats.get("int8")
    x, t = build(report, compress="int8")
    report["stored_pitch"] = t.table.gpu_row_bytes
    check_every_tier(report, x, t, expected=int8.decode(int8.encode(table()), (D,)))
    t.close()


def scenario_topology(report):
    """A topology sharded over the node's GPUs (hot chunks replicated, each GPU's shard read by the others, the
    rest zero-copy from the host) draws the CPU sampler's samples bit for bit, with and without replacement."""
    from hmgstore.graph import NeighborSampler, Topology, to_csc

    g = torch.Generator().manual_seed(11)
    n, e = 4000, 60_000
    dst = (torch.rand(e, generator=g) ** 3 * n).long()  # heavy-tailed in-degrees
    csc = to_csc(torch.stack([torch.randint(0, n, (e,), generator=g), dst]), "coo", (n, n))
    budget = csc.num_edges * 4 // (2 * dist.get_world_size())  # with a quarter replicated, half the ids stay on
    # the host whatever the GPU count: chunks on every tier
    where = device()
    topo = hd.sharded_topology(csc, where, gpu_budget=budget, replicate=budget // 4, progress=False)
    report["sharded"] = topo.chunked
    report["tiers"] = list(topo._placed.placement.names) if topo.chunked else []
    fanout = [10, 5, -1]
    seeds = torch.randperm(n, generator=g)[:400]
    same = []
    for replace in (False, True):
        cpu = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: n}, fanout, replace=replace)
        mine = NeighborSampler({None: topo}, {None: n}, fanout, replace=replace)
        torch.manual_seed(5 + dist.get_rank())
        want = cpu.sample({None: seeds})
        torch.manual_seed(5 + dist.get_rank())
        got = mine.sample({None: seeds.to(where)})
        same.append(all(torch.equal(getattr(want, f)[None], getattr(got, f)[None].cpu())
                        for f in ("node", "row", "col", "edge")))
    report["same_as_cpu"] = same
    topo.reset_stats()
    NeighborSampler({None: topo}, {None: n}, fanout).sample({None: seeds.to(where)})
    report["hit_ratio"] = topo.stats()["hit_ratio"] if where.type == "cuda" else None
    topo.close()  # collective: every rank closes


def scenario_topology_options(report):
    """A sharded topology with edge weights (their chunks placed like the ids') and one with edge times draw as
    the CPU does: temporal bit for bit (uniform draws in each time window), weighted the same edges but where two
    keys differ in their last bits (log rounds differently on the two devices)."""
    from hmgstore.graph import NeighborSampler, Topology, to_csc
    from hmgstore.graph.temporal import sort_by_time

    g = torch.Generator().manual_seed(12)
    n, e = 4000, 60_000
    dst = (torch.rand(e, generator=g) ** 3 * n).long()
    csc = to_csc(torch.stack([torch.randint(0, n, (e,), generator=g), dst]), "coo", (n, n))
    weight, etime = torch.rand(e, generator=g) * (torch.rand(e, generator=g) > 0.3), torch.randint(0, 50, (e,))
    budget = csc.num_edges * 8 // (2 * dist.get_world_size())
    where = device()
    seeds = torch.randperm(n, generator=g)[:400]
    topo = hd.sharded_topology(csc, where, gpu_budget=budget, replicate=budget // 4, progress=False, weight=weight)
    report["weights_chunked"] = topo.weight_tiers is not None
    cpu = NeighborSampler({None: Topology(csc, "cpu", progress=False, weight=weight)}, {None: n}, [10])
    mine = NeighborSampler({None: topo}, {None: n}, [10])
    torch.manual_seed(7)
    want = cpu.sample({None: seeds}).edge[None]
    torch.manual_seed(7)
    got = mine.sample({None: seeds.to(where)}).edge[None].cpu()
    report["weighted_agree"] = float((want == got).double().mean()) if len(want) == len(got) else 0.0
    topo.close()
    timed = sort_by_time(csc, edge_time=etime)
    topo = hd.sharded_topology(timed, where, gpu_budget=budget, replicate=budget // 4, progress=False,
                               edge_time=etime)
    seed_time = {None: torch.randint(10, 50, (len(seeds),), generator=g)}
    same = []
    for strategy in ("uniform", "last"):
        cpu = NeighborSampler({None: Topology(timed, "cpu", progress=False, edge_time=etime)}, {None: n}, [10, 5],
                              temporal_strategy=strategy)
        mine = NeighborSampler({None: topo}, {None: n}, [10, 5], temporal_strategy=strategy)
        torch.manual_seed(9)
        want = cpu.sample({None: seeds}, seed_time)
        torch.manual_seed(9)
        got = mine.sample({None: seeds.to(where)}, seed_time)
        same.append(all(torch.equal(getattr(want, f)[None], getattr(got, f)[None].cpu())
                        for f in ("node", "row", "col", "edge", "batch")))
    report["temporal_same_as_cpu"] = same
    topo.close()


def scenario_mismatch(report):
    x = hd.share_on_node(make_on_leader_only(), progress=False)
    order = hot_order() if dist.get_rank() != 1 else torch.arange(N)
    try:
        hd.shard(x, gpu_budget=40 * N, hot_order=order, replicate=10 * N, device=device())
    except ValueError as err:
        report["error"] = str(err)


def scenario_different_data(report):
    """Each rank passes its own table of the same shape and dtype: the data differ."""
    x = table() + dist.get_rank()  # not node-shared: every rank builds its own
    try:
        hd.shard(x, gpu_budget=40 * N, hot_order=hot_order(), replicate=10 * N, device=device())
    except ValueError as err:
        report["error"] = str(err)


def _own_segments() -> list[str]:
    return sorted(n for n in os.listdir(hmgstore.memory.segment_dir()) if n.startswith(f"hmgstore-{os.getpid()}-"))


def scenario_peer_dies_while_sharing(report):
    """Rank 1 dies after the leader made the segment, before the barrier: nothing may be left behind."""
    import hmgstore.memory.shared as shared

    if dist.get_rank() == 1:
        shared.attach_segment = lambda *a, **k: os._exit(3)  # dies where it would map the segment
    try:
        hd.share_on_node(table(), progress=False)
        report["shared"] = True
    except Exception as err:  # the leader's barrier fails: the peer is gone
        report["error"] = f"{type(err).__name__}: {err}"
    report["own_segments_left"] = _own_segments()  # while this (leader) process still lives


def scenario_different_shm_dirs(report):
    """Rank 1 looks for segments in another folder: it fails, and the leader's segment is still removed."""
    hd.this_node()  # the node's own control state is shared first, from the same folder
    if dist.get_rank() == 1:
        os.environ["HMGSTORE_SHM_DIR"] = os.environ["OTHER_SHM_DIR"]
    try:
        hd.share_on_node(table(), progress=False)
        report["shared"] = True
    except FileNotFoundError as err:
        report["error"] = str(err)
    os.environ.pop("HMGSTORE_SHM_DIR", None)
    report["own_segments_left"] = _own_segments()


def scenario_new_process_group(report):
    """destroy_process_group() and a new init_process_group(): hmgstore's node state starts afresh."""
    first = hd.this_node()
    x = hd.share_on_node(table(), progress=False)
    report["first_equal"] = bool(torch.equal(x, table()))
    dist.destroy_process_group()
    dist.init_process_group("gloo",
                            init_method=f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    second = hd.this_node()
    report["fresh_node"] = second is not first and second.group is not first.group
    y = hd.share_on_node(table(), progress=False)  # the new group carries hmgstore's messages
    t = hd.shard(y, gpu_budget=40 * N, hot_order=hot_order(), device=device())
    report["second_equal"] = bool(torch.equal(t.table[torch.arange(N)].cpu(), table()))
    t.close()


def scenario_leader_fails(report):
    def make():
        raise OSError("feature file missing")
    try:
        hd.share_on_node(make, progress=False)
    except (RuntimeError, OSError) as err:
        report["error"] = f"{type(err).__name__}: {err}"


def _build_then_kill_last_rank(report, peer_exit_timeout: str):
    """Build the table on every rank; the last rank then kills itself (a crash, no clean-up)."""
    x, t = build(report, peer_exit_timeout=float(os.environ.get("PEER_EXIT_TIMEOUT", peer_exit_timeout)))
    if dist.get_rank() == dist.get_world_size() - 1:
        _write(report)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    return x, t


def scenario_kill(report):
    """The last rank kills itself; the others keep gathering and must get PeerLostError."""
    x, t = _build_then_kill_last_rank(report, "30")
    start = time.monotonic()
    idx = torch.randint(0, N, (1000,))
    try:
        while time.monotonic() - start < 60:
            t.table[idx]
            time.sleep(0.01)
        report["error"] = None
    except hd.PeerLostError as err:
        report["error"] = str(err)
        report["seconds"] = time.monotonic() - start
    t.close()


def scenario_kill_blocked(report):
    """As kill, but the survivors wait in a collective: they must not hang."""
    x, t = _build_then_kill_last_rank(report, "3")
    _write(report)
    dist.barrier()  # waits for the dead rank: only hmgstore's watch ends it
    report["barrier_returned"] = True


def scenario_clean_exit(report):
    """Ranks close and leave at different times: nobody may take that for a crash."""
    x, t = build(report)
    t.table[torch.arange(10)]
    t.close()
    if dist.get_rank() == 0:
        time.sleep(3)  # the others have exited by now; the watch must stay quiet
    report["survived"] = True


def scenario_exit_unclosed(report):
    """Ranks but the first leave normally without closing their CPU shards: a normal exit, not a crash. The first
    keeps working past its peers' exit timeout (1 s here) and must not be ended for it."""
    x, t = build(report, peer_exit_timeout=1.0)
    t.table[torch.arange(10)]
    if dist.get_rank() == 0:
        time.sleep(4)  # the others have exited by now, their tables open
        report["lost"] = hd.this_node().lost
        t.close()
    report["survived"] = True


def scenario_rss(report):
    """Host memory of a node-shared, pinned table held by every rank (RSS_TABLE_GB, default 2)."""
    rows = int(float(os.environ.get("RSS_TABLE_GB", "2")) * 1e9) // (4 * 256)

    def make():
        return torch.arange(rows * 256, dtype=torch.float32).view(rows, 256)

    if device().type == "cuda":  # the CUDA context's own host memory is not the table's
        torch.zeros(1, device=device())
        hmgstore.HybridTensor(torch.ones(4, 4), device())[torch.arange(2)]
    before = _memory()
    x = hd.share_on_node(make, progress=False)
    t = hd.shard(x, gpu_budget=64 * 1024 * 1024, hot_order=torch.arange(rows), device=device())
    idx = torch.randint(0, rows, (100_000,))
    report["exact"] = bool(torch.equal(t.table[idx].cpu(), x[idx]))
    dist.barrier(group=hd.this_node().group)
    report["table_bytes"] = x.nbytes
    report["before"] = before
    report["held"] = _memory()
    with open("/proc/meminfo") as f:
        report["meminfo_shmem"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("Shmem:"))
    dist.barrier(group=hd.this_node().group)
    t.close()


def _write(report):
    with open(os.path.join(sys.argv[2], f"rank{report['rank']}.json"), "w") as f:
        json.dump(report, f)


def main():
    backend = "nccl" if os.environ.get("HMGSTORE_TEST_DEVICE") == "cuda" else "gloo"
    if backend == "nccl":
        device()
    dist.init_process_group(backend)
    report = {"rank": dist.get_rank(), "pid": os.getpid()}
    globals()[f"scenario_{sys.argv[1]}"](report)
    report["rss"] = _memory()
    _write(report)
    if _node_lost():
        os._exit(0)  # the process group was aborted by hmgstore: nothing left to tear down
    dist.destroy_process_group()


def _node_lost() -> bool:
    from hmgstore.distributed import node as node_module

    state = node_module._node
    return state is not None and state.lost is not None


def _memory() -> dict:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                    key, value = line.split(":")
                    out[key] = int(value.split()[0]) * 1024
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


if __name__ == "__main__":
    main()
