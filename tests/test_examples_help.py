"""Every script in examples/ answers ``--help``: its usage on stdout, exit code 0, and none of its work done.

The scripts start together (each spends its seconds importing torch and its framework), so the whole check
takes about as long as the slowest of them.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
NEEDS = {"minimal_dgl.py": "hmgstore.plugins.dgl", "dgl_graphsage.py": "hmgstore.plugins.dgl"}  # else PyG's
TIMEOUT = 120  # import time only: far above the few seconds an answer takes


def test_examples_are_found():
    assert {"minimal_pyg.py", "minimal_dgl.py", "pyg_graphsage.py"} <= {p.name for p in EXAMPLES}


def test_every_example_answers_help():
    for module in sorted(set(NEEDS.values()) | {"torch_geometric"}):
        pytest.importorskip(module)
    # No GPU and few threads: nothing an example might start before its parser could touch the device.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    started = {path.name: subprocess.Popen([sys.executable, str(path), "--help"], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, env=env, cwd=path.parent)
               for path in EXAMPLES}
    failed = []
    for name, proc in started.items():
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            failed.append(f"{name}: still running after {TIMEOUT} s (it did its work instead of answering)")
            continue
        if proc.returncode != 0 or "usage:" not in out:
            failed.append(f"{name}: exit code {proc.returncode}, stdout {out[-300:]!r}, stderr {err[-600:]!r}")
        elif not out.startswith("usage:"):  # argparse prints the usage first: anything before it is work done
            failed.append(f"{name}: printed {out.split('usage:')[0][-300:]!r} before its usage")
    assert not failed, "\n".join(failed)
