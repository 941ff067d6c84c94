"""The CUDA layer's pure parts, testable without a GPU: job layout, vectors, kernel source."""
import importlib.util
import re
import shutil
import subprocess

import pytest
import torch

from hmgstore import _cuda


def test_vector_width_divides_everything():
    assert _cuda.vector_bytes(512, 4096, 1024) == 16
    assert _cuda.vector_bytes(28, 4096) == 4
    assert _cuda.vector_bytes(512, 4104) == 8
    assert _cuda.vector_bytes(3, 4096) == 1


def test_job_words_layout():
    out = torch.empty(10, 40, dtype=torch.uint8)
    ids = torch.arange(10, dtype=torch.int32)
    job = _cuda.Job(ids, None, out, None, 100, 40, [(0, 7, 1 << 20, 40), (7, 107, 1 << 30, 64)])
    words, tiles = _cuda.job_words(job, tile_start=5)
    assert len(words) == _cuda.J_WORDS
    assert words[_cuda.J_N] == 10 and words[_cuda.J_TILE_START] == 5 and words[_cuda.J_NTIERS] == 2
    assert words[_cuda.J_BOUNDS:_cuda.J_BOUNDS + 3] == [0, 7, 107]
    assert words[_cuda.J_BASE:_cuda.J_BASE + 2] == [1 << 20, 1 << 30]
    vec_log2, tpr_log2 = (words[_cuda.J_FLAGS] >> 8) & 0xFF, (words[_cuda.J_FLAGS] >> 16) & 0xFF
    assert 1 << vec_log2 == 8  # 40-byte rows: 8-byte vectors
    assert 1 << tpr_log2 == 8  # 5 vectors -> a team of 8 threads
    assert tiles == -(-10 // ((_cuda.BLOCK >> tpr_log2) * _cuda.ROWS))
    assert words[_cuda.J_FLAGS] & 1 == 0  # int32 ids


def test_too_many_tiers_refused():
    job = _cuda.Job(torch.arange(2), None, torch.empty(2, 4), None, 2, 16, [(0, 2, 0, 16)] * (_cuda.MAX_TIERS + 1))
    with pytest.raises(ValueError, match="tiers"):
        _cuda.job_words(job, 0)


def test_job_layout_matches_the_kernel_source():
    import importlib.resources
    text = importlib.resources.files("hmgstore.kernels").joinpath("gather.cu").read_text()
    defines = dict(re.findall(r"#define (J_[A-Z_]+) (\d+)", text))
    for name, value in defines.items():
        assert getattr(_cuda, name) == int(value), name
    assert f"#define MAX_TIERS {_cuda.MAX_TIERS}" in text


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="checks the message given without CuPy")
def test_missing_cupy_says_what_to_install():
    with pytest.raises(ImportError, match="pip install cupy-cuda"):
        _cuda.cupy()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile (no GPU needed)")
def test_kernel_compiles_without_spills(tmp_path):
    import importlib.resources
    src = importlib.resources.files("hmgstore.kernels").joinpath("gather.cu")
    res = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", f"-DROWS={_cuda.ROWS}", "-Xptxas", "-v", "-c",
                          str(src), "-o", str(tmp_path / "g.o")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores" in res.stderr
