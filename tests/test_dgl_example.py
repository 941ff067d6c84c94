"""examples/dgl_graphsage.py runs end to end on a small synthetic graph (CPU)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "examples" / "dgl_graphsage.py"
SMALL = ["--num-nodes", "3000", "--epochs", "2", "--fanouts", "5", "5", "5", "--hidden", "32", "--batch-size", "512",
         "--no-progress"]


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *SMALL, *args], capture_output=True, text=True, timeout=300)


def test_example_trains_from_hmgstore():
    done = _run("--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert "features from hmgstore" in done.stdout
    accuracy = float(done.stdout.split("test accuracy")[1].split()[0])
    assert accuracy > 1 / 16  # better than chance over 16 classes
    assert "seed nodes/s" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, the answer depends on the DGL build")
def test_example_refuses_cuda_without_a_cuda_build_of_dgl():
    done = _run("--device", "cuda")
    assert done.returncode == 2 and "CUDA build of DGL" in done.stderr
