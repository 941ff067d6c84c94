"""The Makefile's set-up (make run, make test), read through ``make -n``: what it runs, in which order."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def setup_commands(tmp_path) -> list[str]:
    """The commands a fresh set-up runs, in order (``make -n``: printed, not run), for a venv in ``tmp_path``."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    done = subprocess.run(["make", "-n", "-B", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_numpy_is_installed_before_the_cuda_probe_imports_torch(tmp_path):
    """torch imported without numpy warns 'Failed to initialize NumPy' in the middle of every fresh set-up."""
    commands = setup_commands(tmp_path)
    probe = next(i for i, c in enumerate(commands) if "import torch" in c)
    assert any("pip install" in c and re.search(r"\bnumpy\b", c) for c in commands[:probe]), commands
