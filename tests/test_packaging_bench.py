"""Packaging (kernels and plugins inside the package) and the benchmark command (CPU run)."""
import importlib.resources
import json
import subprocess
import sys
import zipfile

import pytest


def test_kernels_and_plugins_are_part_of_the_package():
    assert importlib.resources.files("hmgstore.kernels").joinpath("gather.cu").is_file()
    import hmgstore.plugins  # noqa: F401


@pytest.mark.slow
def test_wheel_ships_kernels_and_plugins(tmp_path):
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(repo)], check=True)
    wheel = next(tmp_path.glob("hmgstore-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for expected in ("hmgstore/kernels/gather.cu", "hmgstore/kernels/gather_job.cuh", "hmgstore/plugins/pyg/__init__.py",
                     "hmgstore/plugins/dgl/__init__.py", "hmgstore/cuda/gather.py", "hmgstore/graph/csc.py",
                     "hmgstore/distributed/shard.py", "hmgstore/bench/gather.py"):
        assert expected in names


def test_gather_benchmark_runs_on_cpu(tmp_path):
    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "gather", "--quick", "--row-bytes", "64", "512",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "| row B |" in res.stdout
    report = json.loads((out / "gather.json").read_text())
    assert [s["row_bytes"] for s in report["sizes"]] == [64, 512]
    assert report["sizes"][0]["variants"]["hmg_host"]["gbps"] > 0
    assert (out / "gather.png").stat().st_size > 0 and (out / "gather.md").is_file()
