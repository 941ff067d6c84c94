"""hmgstore.load's arguments checked alike for .npy and raw files, and bool rows checked byte by byte."""
import numpy as np
import pytest
import torch

import hmgstore


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(60, dtype=np.float32).reshape(10, 6))
    return path


@pytest.mark.parametrize("shape", [10, (10.0, 6), (10, 6.0), (True, 6), "10,6"])
def test_a_shape_that_is_not_integers_is_refused_for_npy_files_as_for_raw_ones(npy, shape):
    raw = npy.with_suffix(".bin")
    raw.write_bytes(np.arange(60, dtype=np.float32).tobytes())
    for path, dtype in ((npy, None), (raw, np.float32)):
        with pytest.raises(TypeError, match=r"shape= \(a tuple\) and offset= take integers"):
            hmgstore.load(path, dtype=dtype, shape=shape)
    assert torch.equal(hmgstore.load(npy, shape=(10, 6))[torch.arange(10)],
                       torch.arange(60, dtype=torch.float32).view(10, 6))


def test_negative_sizes_after_the_first_are_named_as_such(tmp_path):
    raw = tmp_path / "x.bin"
    raw.write_bytes(np.arange(24, dtype=np.float32).tobytes())
    with pytest.raises(ValueError, match="negative size"):
        hmgstore.load(raw, dtype=np.float32, shape=(-1, -2, -3))


@pytest.mark.parametrize("kind", ["raw", "npy"])
def test_bool_rows_hold_only_zeros_and_ones(tmp_path, kind):
    data = np.array([0, 1, 2, 255], dtype=np.uint8)
    if kind == "raw":
        path = tmp_path / "b.raw"
        path.write_bytes(data.tobytes())
        options = {"dtype": np.bool_, "shape": (-1,)}
    else:
        path = tmp_path / "b.npy"
        np.save(path, np.zeros(4, dtype=np.bool_))
        with open(path, "r+b") as f:  # the header stays a bool one; the bytes after it do not
            f.seek(-4, 2)
            f.write(data.tobytes())
        options = {}
    with pytest.raises(ValueError, match="element 2 of its bool rows is the byte 2"):
        hmgstore.load(path, **options)
    path.write_bytes(path.read_bytes()[:-2] + bytes([1, 0]))  # valid now
    assert hmgstore.load(path, **options)[torch.arange(4)].tolist() == [False, True, True, False]


@pytest.mark.parametrize("view", [lambda a: a[::-1], lambda a: a[:, ::-1], lambda a: a[::-2]])
def test_a_backwards_numpy_source_is_refused_with_the_fix(view):
    source = view(np.arange(40, dtype=np.float32).reshape(10, 4))
    with pytest.raises(ValueError, match=r"runs backwards in memory.*np.ascontiguousarray"):
        hmgstore.HybridTensor(source)
    table = hmgstore.HybridTensor(np.ascontiguousarray(source))
    assert torch.equal(table[torch.arange(len(source))], torch.from_numpy(np.ascontiguousarray(source)))
