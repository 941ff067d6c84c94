"""examples/multi_node_pyg.py: two simulated machines train GraphSAGE as well as one machine does.

The ranks are started as torchrun would start them (RANK, WORLD_SIZE,
MASTER_*; HMGSTORE_NODE_ID per simulated machine), over gloo on the CPU.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from test_distributed import _free_port

from helpers import warm
from hmgstore.cli.partition import main as partition_command

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "multi_node_pyg.py"
GRAPH = ["--synthetic", "6000", "--feat-dim", "16", "--avg-degree", "8", "--no-progress"]
OPTIONS = ["--epochs", "3", "--batch-size", "256", "--fanout", "8,4", "--hidden", "64"]


def run_example(parts: Path, machines: int, out: Path, timeout: float = 120) -> dict:
    """One rank per simulated machine, forked from a warm interpreter that has imported torch, hmgstore and PyG
    (helpers.warm: not once per rank); rank 0's JSON."""
    port, procs = _free_port(), []
    for rank in range(machines):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(machines), "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "HMGSTORE_NODE_ID": f"node{rank}", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        procs.append(([EXAMPLE, parts, *OPTIONS, "--json", out], env))
    codes, _, errs = warm(pyg=True).run(procs, timeout)
    for code, err in zip(codes, errs):
        assert code == 0, err[-3000:]
    return json.loads(out.read_text())


def test_two_machines_train_as_well_as_one(tmp_path):
    for machines in (1, 2):
        partition_command([str(tmp_path / f"parts{machines}"), "--parts", str(machines), "--by", "hash", *GRAPH])
    one = run_example(tmp_path / "parts1", 1, tmp_path / "one.json")
    two = run_example(tmp_path / "parts2", 2, tmp_path / "two.json")
    assert (one["machines"], two["machines"]) == (1, 2)
    assert one["test_nodes"] == two["test_nodes"] == 1200  # every test node, once, over the ranks
    assert one["test_acc"] > 0.6, one  # it learned (16 classes: chance is 0.06)
    assert abs(one["test_acc"] - two["test_acc"]) <= 0.03, (one["test_acc"], two["test_acc"])
    assert one["batches_per_s_per_rank"] > 0 and two["batches_per_s_per_rank"] > 0, (one, two)
