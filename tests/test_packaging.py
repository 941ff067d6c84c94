"""Packaging: the kernels and the plugins are part of the package (and of its wheel)."""
import importlib.resources
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
    for expected in ("hmgstore/kernels/gather.cu", "hmgstore/kernels/gather_job.cuh",
                     "hmgstore/plugins/pyg/__init__.py", "hmgstore/plugins/dgl/__init__.py",
                     "hmgstore/cuda/gather.py", "hmgstore/graph/csc.py",
                     "hmgstore/distributed/shard.py", "hmgstore/bench/gather.py"):
        assert expected in names
