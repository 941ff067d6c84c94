"""Shared fixtures: tables and graphs, the shared-memory leak check, and the GPU skip rule.

Tests marked ``gpu`` run only where torch sees a CUDA GPU and CuPy imports;
``multigpu`` also needs two GPUs. Everything else runs in CI on the CPU.
Helpers that tests import (tables, PyG graphs and model, a fake OGB dataset)
are in helpers.py.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from hmgstore import data as datasets
from hmgstore import memory

# Property tests (hypothesis): "ci" (the default, what make test runs) keeps each property to a few dozen
# cases so the suite stays within its 5 minutes on 2 cores; "long" (HYPOTHESIS_PROFILE=long) runs 20x more
# cases of each, with fresh random cases every run, for a deeper run before a release. A failure prints the
# case and a blob to replay it (@reproduce_failure).
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=30, deadline=None, suppress_health_check=_QUIET, derandomize=True,
                          print_blob=True)
settings.register_profile("long", max_examples=600, deadline=None, suppress_health_check=_QUIET, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _has_cuda() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("cupy") is not None


HAS_CUDA = _has_cuda()


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs ``-n auto``), each worker's torch and the processes its tests start
    take their share of the cores: OpenMP threads beyond it only spin against the other workers'."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if item.get_closest_marker("gpu") and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("multigpu") and (not HAS_CUDA or torch.cuda.device_count() < 2):
            item.add_marker(skip_multi)


@pytest.fixture(scope="session")
def small_graph() -> datasets.NodeGraph:
    """2,000 nodes, 16 features, 4 classes: fast enough for every adapter test."""
    return datasets.synthetic(num_nodes=2_000, avg_degree=8, feat_dim=16, num_classes=4, seed=1)


@pytest.fixture(scope="session")
def cuda_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _leftover_segments() -> set[str]:
    return {n for n in os.listdir(memory.segment_dir()) if n.startswith(memory.SEGMENT_PREFIX)}


@pytest.fixture
def no_leaks():
    """Fails the test when it leaves node-shared memory segments behind (segments that other programs on the
    machine, such as another test run, make and remove meanwhile are theirs, not the test's)."""
    from helpers import shm_left_behind

    before = _leftover_segments()
    yield
    left = shm_left_behind(before, memory.segment_dir(), memory.SEGMENT_PREFIX, pid_in_name=True)
    assert not left, f"shared-memory segments were left behind: {sorted(left)}"


# ---- PyG graphs over small_graph (the builders are in helpers.py) ----------------------
@pytest.fixture(scope="module")
def data(small_graph):
    """small_graph as a PyG Data."""
    from helpers import as_data

    return as_data(small_graph)


@pytest.fixture(scope="module")
def hetero(small_graph):
    """small_graph as the papers of a PyG HeteroData, with authors who write them."""
    from helpers import as_hetero

    return as_hetero(small_graph)


def pytest_terminal_summary(terminalreporter):
    """One line on why tests were skipped (a row of 's' says nothing), by reason."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]))
    terminalreporter.write_line(f"skipped: {parts}")
