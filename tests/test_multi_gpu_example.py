"""examples/multi_gpu_pyg.py under torchrun: two CPU processes (gloo) here, every GPU where there are several."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_distributed import no_leaks  # noqa: F401  (fixture: no shared-memory segment left behind)

pytest.importorskip("torch_sparse")  # PyG's CPU sampler, without pyg-lib

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_gpu_pyg.py"
SMALL = ["--num-nodes", "3000", "--feat-dim", "16", "--hidden", "32", "--fanout", "5,5", "--batch-size", "128",
         "--epochs", "2", "--max-steps", "4", "--lr", "0.01", "--no-progress"]
# Sharing, NCCL's NVLink multicast off: a program using it can take a shared host's GPUs out of service.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def torchrun(nproc: int, args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the example as ``python -m torch.distributed.run --standalone``; kill every rank on a hang."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **NO_MULTICAST, **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(EXAMPLE), *args]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: torchrun and the ranks it starts
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s (a hang?)\n{out}\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def check_result(result: dict, world: int) -> None:
    """What every run must show: each rank present, finite losses, disjoint training slices."""
    assert result["world_size"] == world
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    num_train = int(0.6 * result["dataset"]["num_nodes"])  # datasets.synthetic: 60% train
    assert sum(r["train_ids"] for r in ranks) <= num_train
    assert len({r["train_ids"] for r in ranks}) == 1, "every rank needs as many steps as the others (DDP)"
    for r in ranks:
        assert len(r["epochs"]) == 2
        for epoch in r["epochs"]:
            assert math.isfinite(epoch["loss"])
            assert epoch["seeds_on_several_ranks"] == 0, "two ranks trained on the same ids in one epoch"
            assert 0 < epoch["seeds"] <= r["train_ids"]
            assert all(epoch[k] >= 0 for k in ("sampling_s", "gather_s", "train_s"))
            assert epoch["sampling_s"] + epoch["gather_s"] + epoch["train_s"] <= epoch["seconds"]
    total = result["aggregate"]
    assert [e["batches"] for e in total["epochs"]] == [sum(r["epochs"][k]["batches"] for r in ranks)
                                                         for k in range(2)]
    assert total["steady_batches_per_s"] > 0 and total["steady_gather_ms_per_batch"] >= 0
    assert result["test_acc"] > 0.2  # 16 classes: chance is 0.06


def test_two_cpu_processes(tmp_path, no_leaks):  # noqa: F811
    out = tmp_path / "result.json"
    done = torchrun(2, [*SMALL, "--json", str(out)], timeout=120, env={"CUDA_VISIBLE_DEVICES": ""})  # gloo
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["backend"] == "gloo"
    check_result(result, world=2)
    assert all(e["batches"] == 4 for r in result["ranks"] for e in r["epochs"])  # --max-steps
    assert "2 ranks (gloo)" in done.stdout and "rank 1 (cpu)" in done.stdout


def test_says_how_to_start_it_without_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, str(EXAMPLE), *SMALL], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "torchrun --standalone --nproc-per-node" in done.stderr


@pytest.mark.gpu
@pytest.mark.multigpu
def test_every_gpu_of_the_node(tmp_path, no_leaks):  # noqa: F811
    """Every GPU: a 100 MB table, 20 MB per GPU (5 MB of it replicated), so each tier serves rows."""
    world = torch.cuda.device_count()
    out = tmp_path / "result.json"
    args = ["--num-nodes", "200000", "--feat-dim", "128", "--gpu-budget", "20MB", "--replicate", "5MB",
            "--fanout", "10,5", "--batch-size", "512", "--epochs", "2", "--max-steps", "20", "--lr", "0.01",
            "--no-progress", "--json", str(out)]
    done = torchrun(world, args, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["backend"] == "nccl"
    check_result(result, world=world)
    assert len({r["device"] for r in result["ranks"]}) == world, "one GPU per rank"
    rows = result["placement_rows"]
    assert list(rows) == ["replica", *(f"shard{s}" for s in range(world)), "host"]
    assert all(n > 0 for n in rows.values()), rows
