"""benchmarks/soak.py: a few epochs of a tiny graph through its main(), on the CPU (the report's fields, the
exactness check); the soak itself (30 + 10 epochs) is run as a benchmark, its figures in benchmarks/results/."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import soak  # noqa: E402 - the script, importable by name so that the producer process finds its loader

pytest.importorskip("torch_geometric")

SERIES = {"rss_bytes", "rss_untrimmed_bytes", "heap_in_use_bytes", "producer_rss_bytes", "fds", "producer_fds",
          "shm_files", "shm_bytes", "shm_dir_files", "shm_dir_bytes", "gpu_allocated", "gpu_reserved", "gpu_used"}


def test_a_short_soak_reports_every_series_and_checks_a_batch_each_epoch(tmp_path, monkeypatch):
    checked = []

    def spy(batch, graph):
        checked.append(len(batch.n_id))
        return real(batch, graph)

    real = soak.exact
    monkeypatch.setattr(soak, "exact", spy)
    out = tmp_path / "soak"
    report = soak.main(["--device", "cpu", "--epochs", "3", "--producer-epochs", "2", "--num-nodes", "2000",
                        "--feat-dim", "16", "--batch-size", "256", "--fanout", "5,5", "--max-batches", "2",
                        "--out", str(out)])
    assert len(checked) == 5 and all(checked)  # one batch per epoch, both phases
    assert report["exact"] and report["exact_checks"] == {"passed": 5, "of": 5}
    assert [(r["phase"], r["epoch"]) for r in report["epochs"]] == [
        ("start", 0), *(("pipeline", e) for e in (1, 2, 3)), *(("producer", e) for e in (1, 2))]
    for row in report["epochs"]:
        assert SERIES <= set(row) and row["rss_bytes"] > 0 and row["fds"] > 0
        assert row["gpu_allocated"] is None or torch.cuda.is_available()
    producer_rows = [r for r in report["epochs"] if r["phase"] == "producer"]
    assert all(r["producer_rss_bytes"] > 0 and r["producer_fds"] > 0 for r in producer_rows)
    assert all(r["batches"] == 2 for r in report["epochs"][1:])
    for phase in ("pipeline", "producer"):
        series = report["phases"][phase]["series"]
        assert {"rss_bytes", "fds", "shm_files", "shm_bytes"} <= set(series)
        assert all({"after_epoch_1", "min", "max", "max_drift", "flat"} <= set(s) for s in series.values())
    assert "producer_rss_bytes" in report["phases"]["producer"]["series"]
    assert report["passed"] == (report["flat"] and report["exact"])
    assert json.loads(out.with_suffix(".json").read_text())["command"] == report["command"]
    table = out.with_suffix(".md").read_text()
    assert report["device"] in table and report["date"] in table and "benchmarks/soak.py --device cpu" in table
    assert "| pipeline (3 epochs) | host RSS, trainer |" in table


def test_the_check_is_bit_exact():
    graph = SimpleNamespace(x=torch.randn(50, 8), y=torch.randint(0, 4, (50,)))
    n_id = torch.tensor([7, 3, 3, 49])
    batch = SimpleNamespace(n_id=n_id, x=graph.x[n_id].clone(), y=graph.y[n_id].clone())
    assert soak.exact(batch, graph)
    batch.x.view(torch.int32)[2, 5] ^= 1  # one bit of one value: a float 1 ulp away
    assert not soak.exact(batch, graph)
    batch.x = graph.x[n_id].double()  # the same values, another dtype
    assert not soak.exact(batch, graph)


def test_series_must_stay_flat_after_the_first_epoch():
    assert soak.drift([1000, 1005, 995, 1010], 0.01)["flat"]
    grown = soak.drift([1000, 1005, 1020], 0.01)
    assert not grown["flat"] and grown["max_drift"] == pytest.approx(0.02)
    assert not soak.drift([6, 6, 7], 0.01)["flat"]  # a count below 100 must not change at all
    assert soak.drift([0, 0, 0], 0.01)["flat"] and not soak.drift([0, 0, 4096], 0.01)["flat"]
    assert soak.drift([None, None], 0.01) is None
    settled = soak.drift([5834, 6706, 7366, 7366, 7366, 7366], 0.01, settle=3)  # a cache filling, then flat
    assert settled["flat"] and settled["judged_from_epoch"] == 3 and settled["after_epoch_1"] == 5834
    assert not soak.drift([5834, 6706, 7366, 8366, 9366], 0.01, settle=3)["flat"]  # still growing: a leak
    slow = [5834, 6706] + [7366 + 2 * k for k in range(28)]  # within 1% of the reference, but rising to the end
    assert not soak.drift(slow, 0.01, settle=10)["flat"]
