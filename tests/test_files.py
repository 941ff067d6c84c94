"""hmgstore.load: tables read from .npy, .pt and raw files into owned host memory."""
import numpy as np
import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore.memory import owned
from hmgstore.table import files

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def table():
    return random_table(5000, (24,), torch.float32, seed=51)


@pytest.mark.parametrize("device", DEVICES)
def test_npy_is_read_into_owned_memory_piece_by_piece(tmp_path, table, device, monkeypatch):
    monkeypatch.setattr(files, "READ_CHUNK_BYTES", 10_000)  # many pieces, rows across no piece boundary
    path = tmp_path / "x.npy"
    np.save(path, table.numpy())
    t = hmgstore.load(path, device, gpu_rows=torch.arange(0, 5000, 7), progress=False)
    start = t.source.data_ptr()
    if device == "cpu":  # 2 MiB pages
        assert start % owned.HUGE_PAGE == 0
    else:  # cudaHostAlloc ("auto" for a GPU table), which forked DataLoader workers share
        assert owned.page_locked_here(start, start + t.source.nbytes)
    assert t.dtype == torch.float32
    idx = torch.randint(0, 5000, (3000,))
    assert_same(t[idx].cpu(), table[idx])


def test_npy_in_fortran_order_and_other_dtypes(tmp_path, table):
    path = tmp_path / "f.npy"
    np.save(path, np.asfortranarray(table.numpy()))
    assert_same(hmgstore.load(path, "cpu")[:], table)
    ints = random_table(300, (3,), torch.int16, seed=52)
    np.save(tmp_path / "i.npy", ints.numpy())
    assert_same(hmgstore.load(tmp_path / "i.npy", "cpu")[:], ints)


def test_pt_files_with_one_tensor_or_a_dict(tmp_path, table):
    torch.save(table, tmp_path / "a.pt")
    assert_same(hmgstore.load(tmp_path / "a.pt", "cpu")[:], table)
    torch.save({"x": table, "y": table[:, 0]}, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="key= one of"):
        hmgstore.load(tmp_path / "b.pt", "cpu")
    assert_same(hmgstore.load(tmp_path / "b.pt", "cpu", key="y")[:], table[:, 0])
    with pytest.raises(ValueError, match="drop key"):
        hmgstore.load(tmp_path / "a.pt", "cpu", key="x")


def test_raw_files_need_their_layout_and_their_length(tmp_path, table):
    path = tmp_path / "x.bin"
    path.write_bytes(b"HEAD" + table.numpy().tobytes())
    with pytest.raises(ValueError, match="dtype= and shape="):
        hmgstore.load(path, "cpu")
    t = hmgstore.load(path, "cpu", dtype=np.float32, shape=(-1, 24), offset=4)
    assert_same(t[:], table)
    with pytest.raises(ValueError, match="ends 96 bytes early"):
        hmgstore.load(path, "cpu", dtype="float32", shape=(5001, 24), offset=4)
    with pytest.raises(FileNotFoundError):
        hmgstore.load(tmp_path / "missing.npy")


@pytest.mark.parametrize("device", DEVICES)
def test_half_width_rows_from_a_file(tmp_path, table, device, monkeypatch):
    monkeypatch.setattr(files, "READ_CHUNK_BYTES", 9_600)  # converted piece by piece
    path = tmp_path / "x.npy"
    np.save(path, table.numpy())
    t = hmgstore.load(path, device, host_dtype=torch.bfloat16, gpu_rows=torch.arange(100))
    assert t.dtype == torch.float32 and t.host_dtype == torch.bfloat16
    idx = torch.randint(0, 5000, (2000,))
    assert_same(t[idx].cpu(), table.bfloat16().float()[idx])
    np.save(tmp_path / "i.npy", np.arange(10))
    with pytest.raises(ValueError, match="float32 tables"):
        hmgstore.load(tmp_path / "i.npy", "cpu", host_dtype=torch.float16)
