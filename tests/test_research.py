"""``python benchmarks/research``: the research benchmarks (hotness, reach, remote) outside the wheel.

Their command line is ``python -m hmgstore.bench``'s (:class:`hmgstore.bench.__main__.Suite`): help texts,
the shared flags, ``--quick`` and the CPU sizes; each runs on the CPU here, as a child process started the
way its users start it. The commands recorded in ``benchmarks/`` of both suites still parse.
"""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hmgstore.bench.__main__ import build_parser, main, parse_args
from hmgstore.cli import flags
from hmgstore.graph import parse_fanout

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "benchmarks" / "research"
sys.path.insert(0, str(RUNNER.parent))
from research import hotness, reach, remote, remote_train  # noqa: E402
from research.__main__ import RESEARCH  # noqa: E402

from helpers import check_no_progress_reaches_every_bar  # noqa: E402

no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU shows")


def _bench(*argv, timeout=300) -> subprocess.CompletedProcess:
    """``python benchmarks/research ARGV`` in a child process; fails the test unless it exits 0."""
    res = subprocess.run([sys.executable, str(RUNNER), *map(str, argv)], capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _assert_cpu_output(stdout: str) -> None:
    """Without a GPU: said once, and every cell a figure, not '-'."""
    rows = [line for line in stdout.splitlines() if line.startswith("|") and not line.startswith("|---")]
    cells = [c.strip() for row in rows[1:] for c in row.strip().strip("|").split("|")
             if not any(row.startswith(h) for h in ("| table", "| graph", "| config", "| row B", "| pages"))]
    assert stdout.count("no GPU:") == 1, stdout
    assert "-" not in cells, stdout


# ---- the command line --------------------------------------------------------------------
def test_help_of_the_runner_and_of_every_research_benchmark(capsys):
    """argparse %-formats help texts: a bare '%' in one ('1-20% of the nodes') crashed the top-level --help."""
    for argv in ([], *[[name] for name in RESEARCH.benchmarks]):
        with pytest.raises(SystemExit) as done:
            parse_args([*argv, "--help"], RESEARCH)
        assert done.value.code == 0
        assert "usage: python benchmarks/research" in capsys.readouterr().out
    res = subprocess.run([sys.executable, str(RUNNER), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "1-20% of the nodes" in res.stdout, res.stderr[-2000:]
    assert set(RESEARCH.benchmarks) == {"hotness", "reach", "remote"}


@pytest.mark.parametrize("name", ["hotness", "reach", "remote"])
def test_every_research_benchmark_speaks_the_shared_flags(name):
    args = parse_args([name, "--batch-size", "77"], RESEARCH)
    assert args.batch_size == 77 and not args.no_progress
    assert parse_args([name, "--no-progress"], RESEARCH).no_progress
    if name != "reach":  # reach draws its pages with the library's own fixed seed (hmgstore.table.host_pages.measure)
        assert parse_args([name], RESEARCH).seed == 0 and parse_args([name, "--seed", "5"], RESEARCH).seed == 5
    if name == "hotness":
        assert parse_args([name], RESEARCH).fanout == parse_fanout(flags.DEFAULT_FANOUT) == [15, 10, 5]


def test_quick_and_cpu_sizes_fill_only_the_options_not_given():
    assert parse_args(["reach", "--quick", "--reps", "4"], RESEARCH).reps == 4
    assert parse_args(["remote", "--quick", "--row-bytes", "256"], RESEARCH).row_bytes == [256]
    if not torch.cuda.is_available():
        assert parse_args(["reach"], RESEARCH).table_gb == 1
        assert parse_args(["reach", "--table-gb", "2"], RESEARCH).table_gb == 2


def test_commands_recorded_in_benchmarks_still_parse():
    """Every ``python -m hmgstore.bench ...`` and ``python benchmarks/research ...`` written in benchmarks/."""
    recorded = {"python -m hmgstore.bench": set(), "python benchmarks/research": set()}
    for path in [*(ROOT / "benchmarks" / "results").glob("*.md"), ROOT / "benchmarks" / "NOTES.md",
                 ROOT / "benchmarks" / "results" / "README.md"]:
        for m in re.finditer(r"`+(python3? -m hmgstore\.bench|python3? benchmarks/research) ([^`]+)`",
                             path.read_text()):
            prog = m.group(1).replace("python3", "python")
            recorded[prog].add(" ".join(m.group(2).split()))
    assert len(recorded["python -m hmgstore.bench"]) > 15 and recorded["python benchmarks/research"]
    for command in recorded["python -m hmgstore.bench"]:
        build_parser().parse_args(shlex.split(command))  # exits (fails the test) on an unknown option
    for command in recorded["python benchmarks/research"]:
        build_parser(suite=RESEARCH).parse_args(shlex.split(command))


@pytest.mark.parametrize("name, module, attr, extra", [
    ("hotness", hotness, "presample", ["--cache", "0.1"]),
    ("reach", reach, "measure", ["--row-bytes", "128", "--pages", "4"]),
])
def test_no_progress_reaches_every_progress_bar(name, module, attr, extra, tmp_path, monkeypatch):
    def run(flags):
        main([name, "--quick", *flags, *extra, "--out", str(tmp_path)], RESEARCH)

    check_no_progress_reaches_every_bar(run, module, attr, monkeypatch)


def test_reports_record_the_research_command(tmp_path):
    main(["reach", "--quick", "--no-progress", "--out", str(tmp_path)], RESEARCH)
    assert json.loads((tmp_path / "reach.json").read_text())["command"].startswith("python benchmarks/research ")


# ---- the benchmarks, on the CPU -------------------------------------------------------------
def test_hotness_benchmark_compares_orders_on_a_second_epoch(tmp_path):
    out = tmp_path / "hotness"
    res = _bench("hotness", "--quick", "--cache", "0.05", "0.5", "--no-progress", "--out", out)
    if not torch.cuda.is_available():
        _assert_cpu_output(res.stdout)
    graph = json.loads((out / "hotness.json").read_text())["graphs"][0]
    assert graph["train_nodes"] == 2000 and graph["batches_per_epoch"] == 8
    small, half = graph["hit_ratio"]["0.05"], graph["hit_ratio"]["0.5"]
    for order in ("presample", "in_degree", "out_degree"):
        for kind in ("features", "topology"):
            assert 0 <= small[order][kind] <= half[order][kind] <= 1  # a larger cache never holds less
    # the seeds of every batch are training nodes: half the nodes, hottest first by pre-sampling, hold them all
    assert half["presample"]["features"] > half["in_degree"]["features"]
    assert (out / "hotness.md").is_file() and (out / "hotness.png").stat().st_size > 0



def test_remote_benchmark_runs_two_simulated_machines_on_cpu(tmp_path):
    """Rows from the other machine, checked bit for bit inside the benchmark, against all_to_all."""
    out = tmp_path / "remote"
    res = _bench("remote", "--quick", "--device", "cpu", "--no-progress", "--out", out, timeout=240)
    if not torch.cuda.is_available():
        _assert_cpu_output(res.stdout)
    report = json.loads((out / "remote.json").read_text())
    assert report["machines"] == 2 and [s["row_bytes"] for s in report["sizes"]] == [128, 1024]
    for size in report["sizes"]:
        assert set(size["variants"]) == {"remote", "mixed", "all_to_all"}
        assert all(v["gbps"] > 0 and v["x_all_to_all"] > 0 for v in size["variants"].values())
    assert "all_to_all GB/s" in res.stdout and "remote rows" in (out / "remote.md").read_text()
    train = report["train"]  # GraphSAGE on the two machines against one holding the whole graph, same run
    assert train["ranks"] == 2 and train["nodes"] == 4000 and train["batches"] == 3 and train["fanout"] == [5, 3]
    assert train["one_machine_batches_per_s"] > 0 and train["per_rank_batches_per_s"] > 0
    assert train["speedup"] == pytest.approx(train["all_ranks_batches_per_s"] / train["one_machine_batches_per_s"])
    assert train["efficiency"] == pytest.approx(train["speedup"] / 2)
    assert "| partitioned, 2 ranks |" in res.stdout and "one machine holding everything" in res.stdout


def test_remote_benchmark_trains_alone_when_asked(tmp_path):
    out = tmp_path / "remote"
    res = _bench("remote", "--quick", "--what", "train", "--device", "cpu", "--no-progress", "--out", out,
                 timeout=240)
    report = json.loads((out / "remote.json").read_text())
    assert report["sizes"] == [] and report["train"]["ranks"] == 2 and "row B" not in res.stdout


def test_remote_benchmark_needs_two_machines(tmp_path):
    res = subprocess.run([sys.executable, str(RUNNER), "remote", "--machines", "1", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "at least 2" in res.stderr


def test_quick_remote_reports_are_smoke_tests_without_ratios():
    from hmgstore.bench.report import SMOKE_TEST_LINE, header

    train = {"graph": "synthetic", "nodes": 4000, "edges": 40000, "feat_dim": 16, "fanout": [5, 3],
             "batch_per_rank": 64, "batches": 3, "threads_per_rank": 1, "one_machine_batches_per_s": 10.0,
             "per_rank_batches_per_s": 30.0, "all_ranks_batches_per_s": 60.0, "speedup": 6.0, "efficiency": 3.0,
             "ranks": 2}
    report = {**header("remote", torch.device("cpu"), quick=True), "machines": 2, "ranks_per_machine": 1, "batch": 64,
              "sizes": [{"row_bytes": 128, "variants": {n: {"gbps": g, "x_all_to_all": g / 0.1} for n, g in
                                                        (("remote", 0.5), ("mixed", 0.7), ("all_to_all", 0.1))}}],
              "train": train}
    text = remote.table_text(report)
    # six cells, and the smoke-test line
    assert "5.00" not in text and "6.00" not in text and "3.00" not in text and text.count("n/a") == 6 + 1
    assert text.count(SMOKE_TEST_LINE) == 1
    assert "6.00" in "\n".join(remote_train.table_lines(train))  # a full run's report keeps its ratios
