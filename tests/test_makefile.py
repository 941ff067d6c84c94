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


# ---- make pyg-sampler: progress while it builds, and pip's exit status ----------------------------------
def _venv_with_fake_python(tmp_path, script: str) -> Path:
    """A set-up venv (its stamp written) whose ``python`` is ``script``: what pip would print, then its status."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    (venv / ".ready-torch--2.13.0-test").touch()  # newer than pyproject.toml: set-up is done
    return venv


def _make_pyg_sampler(venv: Path) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    return subprocess.run(["make", "pyg-sampler", f"VENV={venv}", "TORCH=torch==2.13.0", "EXTRAS=test",
                           "PROGRESS_EVERY=1"], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_pyg_sampler_fails_when_pip_fails(tmp_path):
    """Its pipe into grep used to end make with grep's status: a build that printed 'error' and failed passed."""
    done = _make_pyg_sampler(_venv_with_fake_python(tmp_path, "echo 'error: command gcc failed'; exit 3\n"))
    assert done.returncode != 0, done.stdout
    assert "pip failed (exit status 3)" in done.stdout and "error: command gcc failed" in done.stdout


def test_pyg_sampler_shows_progress_while_it_builds(tmp_path):
    """Each package compiles for 8-9 minutes: a line at least every PROGRESS_EVERY seconds says how far it is."""
    script = ("echo 'Building wheel for torch_scatter (setup.py): started'; sleep 1.5\n"
              "echo 'gcc -pthread -c csrc/scatter.cpp -o build/scatter.o'; sleep 1.5\n"
              "echo 'gcc -pthread -c csrc/cpu/scatter_cpu.cpp -o build/scatter_cpu.o'; sleep 1.5\n"
              "echo 'Successfully installed torch_scatter-2.1.2'\n")
    venv = _venv_with_fake_python(tmp_path, script)
    done = _make_pyg_sampler(venv)
    assert done.returncode == 0, done.stdout + done.stderr
    progress = [line for line in done.stdout.splitlines() if "source files compiled" in line]
    assert len(progress) >= 2, done.stdout
    assert "2 source files compiled" in progress[-1] and "Building wheel for torch_scatter" in progress[0]
    assert "Successfully installed torch_scatter" in done.stdout
    assert "csrc/scatter.cpp" in (venv / "pyg-sampler.log").read_text()  # the whole output kept in the log


def test_the_slow_list_names_tests_that_exist():
    """A renamed test must not drop out of ``make test-slow`` (and so out of CI) unnoticed."""
    from conftest import SLOW

    for name in SLOW:
        file, test = name.split("::")
        assert f"def {test}(" in (ROOT / "tests" / file).read_text(), f"conftest.SLOW: {name} is gone"


def test_make_test_leaves_the_slow_tests_to_make_test_slow_and_ci_runs_both():
    makefile = (ROOT / "Makefile").read_text()
    assert '-m "not slow"' in makefile and "-m slow" in makefile
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make test") < ci.index("make test-slow")
