"""HybridTensor on the CPU: the same API as on CUDA, bit-identical to ``x[idx]``."""
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from helpers import random_table

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool]


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_indexing_for_every_dtype(dtype):
    x = random_table(500, (3, 5), dtype, seed=2)
    t = hmgstore.HybridTensor(x, "cpu", gpu_rows=torch.arange(10))  # accepted, ignored on the CPU
    idx = torch.randint(0, 500, (1000,), dtype=torch.int32)
    assert t.device == torch.device("cpu") and t.num_gpu_rows == 0
    assert same(t[idx], x[idx.long()])
    assert same(t[7], x[7]) and same(t[3:9], x[3:9])


def test_out_buffer_and_its_checks():
    x = random_table(100, (4,), torch.float32)
    out = torch.full((3, 4), float("nan"))
    assert t_gather(x, torch.tensor([5, 6, 5]), out).data_ptr() == out.data_ptr()
    assert same(out, x[[5, 6, 5]])
    for bad in (torch.empty(2, 4), torch.empty(3, 4, dtype=torch.float64), torch.empty(4, 3).t()):
        with pytest.raises(ValueError, match="out must be"):
            t_gather(x, torch.tensor([5, 6, 5]), bad)


def t_gather(x, idx, out):
    return hmgstore.HybridTensor(x, "cpu").gather(idx, out=out)


def test_empty_duplicates_and_2d_index():
    x = random_table(50, (6,), torch.int64)
    t = hmgstore.HybridTensor(x, "cpu")
    assert t[torch.empty(0, dtype=torch.int64)].shape == (0, 6)
    assert same(t[[3, 3, 3]], x[[3, 3, 3]])
    two_d = torch.randint(0, 50, (4, 5))
    assert same(t[two_d], x[two_d])


def test_bad_indices_raise_clear_errors():
    t = hmgstore.HybridTensor(random_table(50, (2,), torch.float32), "cpu")
    with pytest.raises(IndexError, match="index 50 at position 1"):
        t[torch.tensor([0, 50])]
    with pytest.raises(IndexError, match="index -3"):
        t[[-3]]
    with pytest.raises(TypeError, match="integer"):
        t[torch.tensor([0.0])]
    with pytest.raises(TypeError):
        t["rows"]


def test_sources_numpy_memmap_and_column_slices(tmp_path):
    arr = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float16, shape=(300, 8))
    arr[:] = np.random.default_rng(1).standard_normal(arr.shape)
    arr.flush()
    ro = np.load(tmp_path / "x.npy", mmap_mode="r")
    t = hmgstore.HybridTensor(ro, "cpu")
    idx = np.array([299, 0, 17])
    assert same(t[idx], torch.from_numpy(np.asarray(ro[idx])))
    base = random_table(40, (10,), torch.float32)
    cols = base[:, 2:7]
    assert same(hmgstore.HybridTensor(cols, "cpu")[[1, 39]], cols[[1, 39]])


def test_unusable_sources_and_arguments():
    with pytest.raises(ValueError, match="contiguous"):
        hmgstore.HybridTensor(random_table(10, (4, 4), torch.float32).transpose(1, 2), "cpu")
    with pytest.raises(TypeError, match="torch CPU tensor"):
        hmgstore.HybridTensor([[1, 2]], "cpu")
    with pytest.raises(ValueError, match="hot_order"):
        hmgstore.HybridTensor(torch.zeros(4, 2), "cpu", gpu_budget="1MB")
    with pytest.raises(ValueError, match="not both"):
        hmgstore.HybridTensor(torch.zeros(4, 2), "cpu", gpu_rows=[1], gpu_budget="1MB", hot_order=[0])
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        hmgstore.HybridTensor(torch.zeros(4, 2), "meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_cuda_without_a_gpu_says_what_to_do():
    with pytest.raises(RuntimeError, match="no CUDA GPU.*device='cpu'"):
        hmgstore.HybridTensor(torch.zeros(4, 2), "cuda")


def test_closed_table_and_pickling():
    x = random_table(30, (3,), torch.float32)
    t = hmgstore.HybridTensor(x, "cpu")
    clone = pickle.loads(pickle.dumps(t))
    assert same(clone[[1, 2]], x[[1, 2]]) and clone.device == t.device
    with t:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        t[[1]]


def test_gather_many_matches_each_gather():
    x, y = random_table(80, (5,), torch.float32), torch.randint(0, 7, (80,))
    tx, ty = hmgstore.HybridTensor(x, "cpu"), hmgstore.HybridTensor(y, "cpu")
    idx = torch.randint(0, 80, (33,))
    gx, gy = hmgstore.gather_many([(tx, idx), (ty, idx)])
    assert same(gx, x[idx]) and same(gy, y[idx])
    assert hmgstore.gather_many([]) == []
    with pytest.raises(IndexError):  # a bad index anywhere stops the whole batch
        hmgstore.gather_many([(tx, idx), (ty, torch.tensor([80]))])
    with pytest.raises(TypeError, match="HybridTensor, index"):
        hmgstore.gather_many([(x, idx)])


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 200), shape=st.lists(st.integers(1, 5), max_size=2), dtype=st.sampled_from(DTYPES),
       batch=st.integers(0, 300), seed=st.integers(0, 1000))
def test_property_same_as_torch(rows, shape, dtype, batch, seed):
    x = random_table(rows, tuple(shape), dtype, seed=seed)
    idx = torch.randint(0, rows, (batch,), generator=torch.Generator().manual_seed(seed))
    assert same(hmgstore.HybridTensor(x, "cpu")[idx], x[idx])
