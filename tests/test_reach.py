"""hmgstore.table.host_pages and ``python benchmarks/research reach``: rates against pages per batch, the knee, the cost
per page.

The curve arithmetic is checked on made-up times; the measurement itself runs on the CPU here (the CPU path
alone) and, with the gpu marker, with the kernel, whose every probe gather is checked against ``x[idx]``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hmgstore.table import host_pages as reach


def test_knee_and_cost_per_page_from_a_made_up_curve():
    # 1 MB batches: 1 ms up to 256 pages (1 GB/s), then 1 us more for every page
    pages = [16, 64, 256, 1024, 4096]
    seconds = [1e-3, 1e-3, 1.05e-3, 1e-3 + 1024e-6, 1e-3 + 4096e-6]
    curve = reach.Curve(500, pages, [2000] * 5, seconds)
    assert curve.gbps()[0] == pytest.approx(1.0)
    assert curve.knee() == 256  # 0.95 GB/s is within 0.8x of the best; 0.49 GB/s is not
    assert curve.us_per_page() == pytest.approx(1.0, rel=0.05)
    assert curve.knee("cpu") == 0 and curve.us_per_page("cpu") == 0.0  # no CPU times: nothing to say
    back = reach.Reach.from_dict(reach.Reach("dev", 50.0, 1 << 30, {500: curve}).to_dict())
    assert back.curves[500] == curve and back.knee(400) == 256


def test_ids_stay_inside_the_chosen_pages():
    g = torch.Generator().manual_seed(0)
    ids = reach.confined_ids(1 << 20, 128, 5, 10_000, g)  # 16384 rows of 128 B a page
    assert len(torch.unique(ids // 16384)) == 5 and bool((ids < 1 << 20).all())
    assert len(torch.unique(ids)) == len(ids) == 10_000
    few = reach.confined_ids(1 << 20, 128, 1, 50_000, g)  # one page holds 16384 rows: all of them, shuffled
    assert len(few) == 16384 and len(torch.unique(few // 16384)) == 1 and not torch.equal(few, few.sort().values)


def test_the_cpu_path_is_measured_without_a_gpu():
    r = reach.measure("cpu", table_bytes=64 << 20, row_bytes=(256,), pages=(2, 8, 64), batch=5000, reps=2,
                      progress=False)  # 64 pages would not fit a 64 MB table: left out
    curve = r.curves[256]
    assert r.limit_gbps is None and curve.pages == [2, 8] and not curve.kernel_seconds
    assert len(curve.cpu_seconds) == 2 and all(g > 0 for g in curve.gbps("cpu"))


def test_calibration_needs_a_gpu_and_reads_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HMGSTORE_CACHE_DIR", str(tmp_path))
    assert reach.cache_path() == tmp_path / "reach.json"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="calibrated on a GPU"):
            reach.calibrated("cpu")


@pytest.mark.gpu
def test_calibration_measures_once_and_caches(tmp_path, monkeypatch, cuda_device):
    monkeypatch.setenv("HMGSTORE_CACHE_DIR", str(tmp_path))
    calls = []
    real = reach.measure
    monkeypatch.setattr(reach, "measure", lambda *a, **k: calls.append(1) or real(*a, **{**k, "pages": (4, 64)}))
    first = reach.calibrated(cuda_device)
    assert first.limit_gbps > 0 and first.curves[128].kernel_seconds and first.knee(128) in (4, 64)
    entry = json.loads((tmp_path / "reach.json").read_text())
    assert len(entry) == 1
    again = reach.calibrated(cuda_device)
    assert len(calls) == 1 and again.curves[512].pages == first.curves[512].pages


def test_bench_reach_runs_on_this_machine(tmp_path, capsys):
    from hmgstore.bench.__main__ import main

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from research.__main__ import RESEARCH

    main(["reach", "--quick", "--no-progress", "--out", str(tmp_path)], RESEARCH)
    text = capsys.readouterr().out
    report = json.loads((tmp_path / "reach.json").read_text())
    assert "knee at" in text and report["summary"]["128"]
    assert (tmp_path / "reach.md").exists()
    if not torch.cuda.is_available():
        assert "no GPU" in text and "kernel" not in report["summary"]["128"]


def test_batches_to_fuse_follow_the_host_pages_over_the_knee():
    from types import SimpleNamespace

    curve = reach.Curve(512, [64, 1024, 4096], [1000] * 3, [1e-3, 1e-3, 4e-3])  # knee at 1024 pages
    measured = reach.Reach("dev", 50.0, 1 << 30, {512: curve})
    gpu = torch.device("cuda", 0)

    def table(gb, row=512, device=gpu, host=True):  # a table's shape without its memory (meta tensors)
        source = torch.empty((int(gb * 1e9) // row, row), dtype=torch.uint8, device="meta")
        return SimpleNamespace(device=device, placement=SimpleNamespace(has_host_tier=host), source=source)

    assert reach.batches_to_fuse([table(1)], gpu, measured) == 1  # 477 pages: within the knee
    assert reach.batches_to_fuse([table(4)], gpu, measured) == 2  # 1908 pages
    assert reach.batches_to_fuse([table(1), table(40)], gpu, measured) == reach.MAX_FUSE  # 19k pages: capped
    assert reach.batches_to_fuse([table(40, host=False)], gpu, measured) == 1  # all on the GPU
    assert reach.batches_to_fuse([table(40)], "cpu", measured) == 1
