"""hmgstore.distributed: one process per device on a node, several nodes.

Each test starts real ranks (tests/distributed_worker.py) the way torchrun
would (RANK, WORLD_SIZE, MASTER_ADDR/PORT) and reads what each saw: on the
CPU (gloo), what CI checks; the tests marked ``gpu`` and ``multigpu`` start
one rank per GPU (NCCL). Shared segments themselves are tested in
test_memory.py; the ``no_leaks`` fixture is in conftest.py.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import cuda_devices, warm

WORKER = Path(__file__).with_name("distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario: str, world: int, tmp_path: Path, *, device: str = "cpu", node_of=None, env=None,
           timeout: float = 120, pyg: bool = False) -> tuple[list[int], dict[int, dict], list[str]]:
    """Run ``world`` ranks of ``scenario``; returns exit codes, reports and stderr by rank. CPU ranks are forked
    from a warm interpreter (helpers.warm: torch and hmgstore imported once, not once per rank; PyG too for a
    scenario that uses it, ``pyg``); CUDA ranks are fresh interpreters."""
    port = _free_port()
    envs = []
    for rank in range(world):
        e = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "HMGSTORE_TEST_DEVICE": device,
             "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1",
             # one OpenMP thread per rank unless told otherwise, as torchrun sets it: ranks sharing the cores,
             # each with a thread per core, spend their time spinning in each other's way
             "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **(env or {})}
        if node_of is not None:
            e["HMGSTORE_NODE_ID"] = f"node{node_of(rank)}"
            e["LOCAL_RANK"] = str(rank // 2)
        envs.append(e)
    if device == "cpu":
        try:
            codes, _, errs = warm(pyg).run([([WORKER, scenario, tmp_path], e) for e in envs], timeout)
        except TimeoutError as err:
            raise AssertionError(f"{scenario}: ranks still running after {timeout} s (a hang): {err}") from None
    else:
        procs = [subprocess.Popen([sys.executable, str(WORKER), scenario, str(tmp_path)], env=e,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in envs]
        deadline = time.monotonic() + timeout
        errs = []
        for p in procs:
            try:
                _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise AssertionError(f"{scenario}: ranks still running after {timeout} s (a hang)") from None
            errs.append(err)
        codes = [p.returncode for p in procs]
    reports = {}
    for rank in range(world):
        f = tmp_path / f"rank{rank}.json"
        if f.exists():
            reports[rank] = json.loads(f.read_text())
    return codes, reports, errs


def test_shard_on_three_ranks(tmp_path, no_leaks):
    codes, reports, errs = launch("shard", 3, tmp_path)
    assert codes == [0, 0, 0], errs
    for rank, r in reports.items():
        assert r["shared_equal"], f"rank {rank} saw a different shared table"
        assert r["segments_after_setup"] == [], "the segment's name must be gone once every rank mapped it"
        assert r["tiers"] == ["replica", "shard0", "shard1", "shard2", "host"]
        assert all(ok for _, ok in r["tiers_exact"].values()), r["tiers_exact"]
        assert "out of range" in r["bad_index"] or str(5000) in r["bad_index"]
        assert r["node_ranks"] == [0, 1, 2] and r["closed"]
    assert len({json.dumps(r["bounds"]) for r in reports.values()}) == 1


def test_shard_as_int8_rows_reads_back_as_decoded(tmp_path, no_leaks):
    codes, reports, errs = launch("shard_int8", 2, tmp_path)
    assert codes == [0, 0], errs
    for r in reports.values():
        assert r["shared_equal"] and r["tiers"] == ["replica", "shard0", "shard1", "host"]
        assert all(ok for _, ok in r["tiers_exact"].values()), r["tiers_exact"]


def test_each_node_shards_over_its_own_ranks(tmp_path, no_leaks):
    codes, reports, errs = launch("shard", 4, tmp_path, node_of=lambda rank: rank % 2)
    assert codes == [0] * 4, errs
    assert reports[0]["node_ranks"] == reports[2]["node_ranks"] == [0, 2]
    assert reports[1]["node_ranks"] == reports[3]["node_ranks"] == [1, 3]
    for r in reports.values():
        assert r["tiers"] == ["replica", "shard0", "shard1", "host"] and r["shared_equal"]
        assert all(ok for _, ok in r["tiers_exact"].values())


def test_ranks_that_disagree_are_told_which(tmp_path, no_leaks):
    codes, reports, errs = launch("mismatch", 2, tmp_path)
    assert codes == [0, 0], errs
    for r in reports.values():
        assert "rank 1 builds a different table than rank 0" in r["error"] or \
               "rank 0 builds a different table than rank 1" in r["error"]


def test_ranks_with_different_data_are_told_which(tmp_path, no_leaks):
    codes, reports, errs = launch("different_data", 2, tmp_path)
    assert codes == [0, 0], errs
    for r in reports.values():
        assert "builds a different table than rank" in r["error"] and "data" in r["error"]


def test_a_peer_dying_while_sharing_leaves_no_segment(tmp_path, no_leaks):
    codes, reports, errs = launch("peer_dies_while_sharing", 2, tmp_path, timeout=90)
    assert codes[1] == 3  # the peer died where it would map the segment
    assert codes[0] == 0, errs[0]
    assert "error" in reports[0] and reports[0]["own_segments_left"] == [], reports[0]


def test_ranks_looking_in_different_folders_leave_no_segment(tmp_path, no_leaks):
    other = tmp_path / "other-shm"
    other.mkdir()
    codes, reports, errs = launch("different_shm_dirs", 2, tmp_path, env={"OTHER_SHM_DIR": str(other)})
    assert codes == [0, 0], errs
    assert "is gone from" in reports[1]["error"] and str(other) in reports[1]["error"]
    assert reports[0]["own_segments_left"] == [] and reports[1]["own_segments_left"] == []


def test_a_new_process_group_gets_a_fresh_node_state(tmp_path, no_leaks):
    codes, reports, errs = launch("new_process_group", 2, tmp_path)
    assert codes == [0, 0], errs
    for r in reports.values():
        assert r["first_equal"] and r["fresh_node"] and r["second_equal"], r


def test_a_failing_leader_fails_every_rank(tmp_path, no_leaks):
    codes, reports, errs = launch("leader_fails", 3, tmp_path)
    assert codes == [0, 0, 0], errs
    assert "feature file missing" in reports[0]["error"]
    for rank in (1, 2):
        assert "could not build the shared table" in reports[rank]["error"]
        assert "feature file missing" in reports[rank]["error"]


def test_killed_rank_makes_the_others_raise(tmp_path, no_leaks):
    start = time.monotonic()
    codes, reports, errs = launch("kill", 3, tmp_path)
    assert codes[2] == -9
    for rank in (0, 1):
        assert codes[rank] == 0, errs[rank]
        assert "rank 2" in reports[rank]["error"] and "exited without closing" in reports[rank]["error"]
        assert reports[rank]["seconds"] < 10
    assert time.monotonic() - start < 60


def test_killed_rank_ends_survivors_stuck_in_a_collective(tmp_path, no_leaks):
    codes, reports, errs = launch("kill_blocked", 3, tmp_path, env={"PEER_EXIT_TIMEOUT": "3"}, timeout=90)
    assert codes[2] == -9
    for rank in (0, 1):
        assert codes[rank] != 0, "a survivor finished as if nothing happened"
        assert "barrier_returned" not in reports.get(rank, {})
        # gloo may notice the closed connection first; either way the process ends, with hmgstore's reason
        assert "rank 2" in errs[rank] or "Connection" in errs[rank] or "closed" in errs[rank], errs[rank][-2000:]


def test_clean_exits_are_not_crashes(tmp_path, no_leaks):
    codes, reports, errs = launch("clean_exit", 3, tmp_path)
    assert codes == [0, 0, 0], errs
    assert all(r["survived"] for r in reports.values())
    assert "exited without closing" not in errs[0]


def test_a_normal_exit_with_cpu_tables_open_is_not_a_crash(tmp_path, no_leaks):
    """Leaving without close() is fine where no peer depends on this process's memory (CPU tables): the peers
    are not ended after peer_exit_timeout. A killed rank still is (test_killed_rank_makes_the_others_raise)."""
    if os.environ.get("HMGSTORE_TEST_DEVICE") == "cuda":
        pytest.skip("CPU shards only: a GPU shard left open at exit is lost to its peers")
    codes, reports, errs = launch("exit_unclosed", 2, tmp_path)
    assert codes == [0, 0], errs
    assert reports[0]["survived"] and reports[0]["lost"] is None, reports[0]
    assert "exited without closing" not in errs[0]


def test_dgl_loader_per_rank_over_sharded_features(tmp_path, no_leaks):
    pytest.importorskip("hmgstore.plugins.dgl")  # makes dgl importable on this torch
    codes, reports, errs = launch("dgl", 2, tmp_path)
    assert codes == [0, 0], errs
    assert all(r["dgl_exact"] and r["dgl_batches"] == 3 for r in reports.values())


def test_shard_needs_an_initialised_process_group():
    import hmgstore.distributed as hd

    with pytest.raises(RuntimeError, match="init_process_group"):
        hd.share_on_node(torch.zeros(3))


# ---- one process per GPU (NCCL) -------------------------------------------------------------
def launch_on_every_gpu(scenario: str, tmp_path, env=None) -> dict:
    """The scenario on one rank per GPU; each rank's report, after checking every rank ended well and read every
    tier (each shard, the replica, the host) exactly."""
    k = torch.cuda.device_count()
    codes, reports, errs = launch(scenario, k, tmp_path, device="cuda", timeout=300, env=env)
    assert codes == [0] * k, errs
    for rank, r in reports.items():
        assert r["tiers"] == ["replica", *(f"shard{s}" for s in range(k)), "host"]
        assert all(ok for _, ok in r["tiers_exact"].values()), (rank, r["tiers_exact"])
    return reports


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("mapping", ["vmm", "ipc"])
def test_distributed_every_tier_on_every_rank(tmp_path, no_leaks, mapping):
    """Peers' shards mapped by cuMemCreate (the default) and by legacy CUDA IPC (HMGSTORE_PEER_MEMORY=ipc)."""
    env = {"HMGSTORE_PEER_MEMORY": "ipc"} if mapping == "ipc" else None
    for rank, r in launch_on_every_gpu("shard", tmp_path, env).items():
        assert r["peer_mappings"] == [mapping], rank
        assert r["shared_equal"] and r["segments_after_setup"] == []
        assert r["bad_index"]
        assert r["registered_ranges"] == 0 and r["ipc_mappings_open"] == 0
        assert r["gpu_free_lost"] < 16 << 20, f"rank {rank}: {r['gpu_free_lost']} B of GPU memory not given back"


@pytest.mark.gpu
@pytest.mark.multigpu
def test_distributed_int8_rows_on_every_rank(tmp_path, no_leaks):
    for r in launch_on_every_gpu("shard_int8", tmp_path).values():
        assert r["stored_pitch"] == 32  # 24 int8 values and a float32 scale, padded to 16 bytes


@pytest.mark.gpu
def test_sharded_topology_on_one_gpu(tmp_path, no_leaks):
    """One rank: chunks in the replica, its own shard and the host tier, read by the sampling kernel."""
    codes, reports, errs = launch("topology", 1, tmp_path, device="cuda", timeout=240)
    assert codes == [0], errs
    r = reports[0]
    assert r["sharded"] and r["tiers"] == ["replica", "shard0", "host"], r
    assert r["same_as_cpu"] == [True, True] and 0 < r["hit_ratio"] < 1


@pytest.mark.gpu
@pytest.mark.multigpu
def test_sharded_topology_on_every_gpu(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    codes, reports, errs = launch("topology", k, tmp_path, device="cuda", timeout=300)
    assert codes == [0] * k, errs
    for rank, r in reports.items():
        assert r["sharded"] and r["tiers"] == ["replica", *(f"shard{s}" for s in range(k)), "host"], (rank, r)
        assert r["same_as_cpu"] == [True, True], rank


@pytest.mark.gpu
def test_sharded_topology_with_weights_and_times_on_one_gpu(tmp_path, no_leaks):
    codes, reports, errs = launch("topology_options", 1, tmp_path, device="cuda", timeout=240)
    assert codes == [0], errs
    r = reports[0]
    assert r["weights_chunked"] and r["weighted_agree"] > 0.999 and r["temporal_same_as_cpu"] == [True, True], r


def test_topology_options_on_cpu_ranks(tmp_path, no_leaks):
    codes, reports, errs = launch("topology_options", 1, tmp_path)
    assert codes == [0], errs
    assert reports[0]["weighted_agree"] == 1.0 and reports[0]["temporal_same_as_cpu"] == [True, True]


def test_sharded_topology_on_cpu_ranks_samples_as_one_process(tmp_path, no_leaks):
    """On the CPU a topology is never sharded (sampling reads host memory); the option is accepted."""
    codes, reports, errs = launch("topology", 2, tmp_path)
    assert codes == [0, 0], errs
    assert all(not r["sharded"] and r["same_as_cpu"] == [True, True] for r in reports.values())


def _gpus_free():
    torch.cuda.synchronize()
    return [torch.cuda.mem_get_info(d)[0] for d in cuda_devices()]


def _assert_gpus_given_back(free_before):
    deadline = time.monotonic() + 10  # the driver tears down a dead process's context asynchronously
    while True:
        lost = [b - a for a, b in zip(_gpus_free(), free_before)]
        if all(x < 16 << 20 for x in lost) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert all(x < 16 << 20 for x in lost), f"GPU memory not given back after the ranks ended: {lost}"


@pytest.mark.gpu
@pytest.mark.multigpu
def test_distributed_killed_rank(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    free = _gpus_free()
    codes, reports, errs = launch("kill", k, tmp_path, device="cuda", timeout=300)
    _assert_gpus_given_back(free)
    assert codes[-1] == -9
    for rank in range(k - 1):
        assert codes[rank] == 0, errs[rank]
        assert f"rank {k - 1}" in reports[rank]["error"] and reports[rank]["seconds"] < 10


@pytest.mark.gpu
@pytest.mark.multigpu
def test_distributed_killed_rank_unblocks_nccl(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    codes, reports, errs = launch("kill_blocked", k, tmp_path, device="cuda", env={"PEER_EXIT_TIMEOUT": "5"},
                                  timeout=120)
    assert codes[-1] == -9
    for rank in range(k - 1):
        assert codes[rank] != 0 and f"rank {k - 1}" in errs[rank], errs[rank][-3000:]


@pytest.mark.gpu
@pytest.mark.multigpu
def test_distributed_clean_exit(tmp_path, no_leaks):
    k = torch.cuda.device_count()
    free = _gpus_free()
    codes, reports, errs = launch("clean_exit", k, tmp_path, device="cuda", timeout=300)
    _assert_gpus_given_back(free)
    assert codes == [0] * k, errs


@pytest.mark.gpu
@pytest.mark.multigpu
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


def test_distributed_tables_index_rows_only_as_a_hybrid_tensor_does():
    """``t[3, 1]`` is the element x[3, 1] in torch: refused with how to index, as HybridTensor refuses it."""
    import hmgstore
    from hmgstore.distributed import ClusterTensor, DistributedTensor

    x = torch.arange(40, dtype=torch.float32).view(10, 4)
    view = hmgstore.HybridTensor(x, "cpu")
    table = DistributedTensor(None, x, view.placement, view)  # a one-rank table's parts, no process group
    cluster = object.__new__(ClusterTensor)  # refused before any exchange: no job needed to see it
    for t in (table, cluster):
        with pytest.raises(TypeError, match=r"rows only.*t\[\[3, 1\]\]"):
            t[3, 1]
    assert torch.equal(table[[3, 1]], x[[3, 1]]) and torch.equal(table[3][1], x[3, 1])
    assert torch.equal(table.gather((3, 1)), x[[3, 1]])  # gather() takes a tuple as ids, as HybridTensor's does
