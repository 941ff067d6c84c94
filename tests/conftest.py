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


#: End-to-end runs of 8 s or more each on 2 cores (benchmarks, examples, notebooks, torchrun commands): marked
#: ``slow``, so that ``make test`` (``-m "not slow"``) stays within 5 minutes; ``make test-slow`` runs them, and CI
#: runs both.
SLOW = {
    "test_docs.py::test_the_cpu_torchrun_commands_run_as_written",
    "test_bench.py::test_sample_and_train_benchmarks_run_on_cpu",
    "test_bench.py::test_scale_benchmark_runs_the_example_on_one_and_two_processes",
    "test_bench.py::test_scale_benchmark_says_what_failed",
    "test_bench.py::test_train_runs_the_readme_swap_beside_the_tuned_configurations_repeated",
    "test_research.py::test_remote_benchmark_runs_two_simulated_machines_on_cpu",
    "test_research.py::test_remote_benchmark_trains_alone_when_asked",
    "test_train_step.py::test_cap_modes_run_as_pipelined_cache_variants_on_one_loader",
    "test_train_step.py::test_train_benchmark_reports_the_ceilings",
    "test_train_step.py::test_each_configuration_builds_after_the_last_ones_tables_are_freed",
    "test_train_step.py::test_labels_on_gpu_builds_the_cache_with_its_labels_whole",
    "test_train_step.py::test_variants_apply_where_they_mean_something",
    "test_train_step.py::test_topology_cache_sets_the_samplers_gpu_budget_apart_from_the_features",
    "test_train_step.py::test_split_threads_name_cache_configurations_and_reach_the_table",
    "test_train_step.py::test_sampler_stream_values_build_a_loader_each_and_leave_the_setting_as_it_was",
    "test_train_step.py::test_capped_rows_and_cap_modes_reach_the_gathers_and_a_producer",
    "test_examples.py::test_batches_from_a_producer_process",
    "test_examples.py::test_two_cpu_processes",
    "test_examples.py::test_minimal_example_is_short_marked_and_trains",
    "test_cluster.py::test_distributed_sampling_and_pyg_loader",
    "test_soak.py::test_a_short_soak_reports_every_series_and_checks_a_batch_each_epoch",
    "test_notebook.py::test_quickstart_notebook_runs_from_any_folder",
    "test_notebook.py::test_big_table_notebook_runs_from_any_folder",
    "test_dgl_compat.py::test_fresh_interpreter_imports_plugin_then_uses_dgl_with_spawned_workers",
    "test_multi_node_example.py::test_two_machines_train_as_well_as_one",
    "test_producer.py::test_closing_mid_pass_raises_nothing",
    "test_producer.py::test_batches_that_cannot_be_packed_keep_no_slot",
    "test_loader_contracts.py::test_a_producer_resumes_a_generator_with_the_batches_in_its_ring_and_yields_an_empty_epoch",
}


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if item.nodeid.split("[")[0].rsplit("/", 1)[-1] in SLOW:
            item.add_marker(pytest.mark.slow)
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
