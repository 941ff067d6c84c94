"""HybridTensor and gather_many (hmgstore.tensor): bit-identical to ``x[idx]`` on the CPU and on a GPU.

The CPU tests run everywhere: the same API as on CUDA. The tests marked
``gpu`` compare bytes (``torch.equal`` on the raw bytes, so NaNs and -0.0
count too) with the CPU reference ``x[idx]``; outputs passed through
``out=`` are filled with a poison pattern first, so an unwritten row fails.
How the host tier is pinned and registered is tested in test_memory.py; a
table over 4 GiB read across the registration seams is tested here.
"""
from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hmgstore
from helpers import assert_same, random_table

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool]
GPU_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
              torch.int16, torch.uint8, torch.int8, torch.bool]


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

# ---- on a CUDA GPU -----------------------------------------------------------------------
def poisoned(shape, dtype, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    out.view(torch.uint8).fill_(0xA5)
    return out


def check_context_alive(device) -> None:
    a = torch.arange(10, device=device)
    assert int((a * 2).sum()) == 90
    torch.cuda.synchronize(device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("layout", ["host", "gpu", "mixed"])
def test_dtypes_and_tiers(dtype, layout, cuda_device):
    x = random_table(3000, (7,), dtype, seed=1)  # 7 elements: odd row sizes for every width
    gpu_rows = {"host": None, "gpu": torch.arange(3000), "mixed": torch.randperm(3000)[:1000]}[layout]
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows)
    idx = torch.randint(0, 3000, (5000,))
    out = poisoned((5000, 7), dtype, cuda_device)
    got = t.gather(idx, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert_same(got, x[idx])


@pytest.mark.gpu
@pytest.mark.parametrize("row_elems", [1, 2, 3, 4, 8, 16, 31, 32, 33, 64, 100, 128, 256, 1000, 1024])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("index_on", ["cpu", "cuda"])
def test_row_sizes_index_kinds(row_elems, index_dtype, index_on, cuda_device):
    x = random_table(4096, (row_elems,), torch.float32, seed=row_elems)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 4096, 3))
    idx = torch.randint(0, 4096, (3001,), dtype=index_dtype)
    got = t[idx.to(cuda_device) if index_on == "cuda" else idx]
    assert got.device == cuda_device
    assert_same(got, x[idx.long()])


@pytest.mark.gpu
def test_large_source_pinned_in_place_with_seams(cuda_device):
    """A table over 4 GiB: 64-bit offsets, chunked registration, rows straddling the 1 GiB seams."""
    from hmgstore import memory
    from hmgstore.memory.pinned import CHUNK_BYTES

    row = 1000  # bytes: not a divisor of 1 GiB, so some rows straddle registration seams
    n = (4 << 30) // row + 12345
    x = torch.empty((n, row), dtype=torch.uint8)
    x.view(torch.int64).view(-1)[:] = torch.arange(x.numel() // 8, dtype=torch.int64) * 0x9E3779B97F4A7C15
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, n, 7))
    start, size = memory.extent(x)
    assert size > CHUNK_BYTES * 4
    covered = sum(max(0, min(e, start + size) - max(s, start)) for s, e in memory.registered_ranges())
    assert covered == size  # pinned in place: x's own pages are registered, no copy
    seam_rows = torch.tensor([k * CHUNK_BYTES // row for k in range(1, 5)])
    idx = torch.cat([seam_rows, seam_rows + 1, torch.tensor([0, n - 1]), torch.randint(0, n, (200_000,))])
    assert_same(t[idx.to(cuda_device)], x[idx])
    t.close()
    del t, x
    gc.collect()


@pytest.mark.gpu
def test_all_host_all_gpu_and_mixed_batches(cuda_device):
    x = random_table(10_000, (64,), torch.float16, seed=3)
    hot = torch.randperm(10_000)[:2500]
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=hot)
    cold = torch.ones(10_000, dtype=torch.bool)
    cold[hot] = False
    cold_ids = cold.nonzero().flatten()
    for idx in (hot[torch.randint(0, 2500, (4000,))], cold_ids[torch.randint(0, len(cold_ids), (4000,))],
                torch.randint(0, 10_000, (4000,))):
        assert_same(t[idx], x[idx])


@pytest.mark.gpu
def test_gpu_budget_and_hot_order(cuda_device):
    x = random_table(5000, (32,), torch.float32, seed=4)
    order = torch.randperm(5000)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_budget=1000 * 32 * 4, hot_order=order)
    assert t.num_gpu_rows == 1000
    assert torch.equal(t.placement.gpu_rows, order[:1000])
    idx = torch.randint(0, 5000, (7000,))
    assert_same(t[idx], x[idx])


@pytest.mark.gpu
def test_duplicates_empty_scalar_slice_mask_numpy(cuda_device):
    x = random_table(1000, (5,), torch.int64, seed=5)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(100))
    assert_same(t[torch.tensor([7, 7, 7, 500, 7])], x[[7, 7, 7, 500, 7]])
    empty = t[torch.empty(0, dtype=torch.int64)]
    assert empty.shape == (0, 5) and empty.device == cuda_device
    assert_same(t[3], x[3])
    assert_same(t[10:20], x[10:20])
    mask = torch.rand(1000) < 0.3
    assert_same(t[mask], x[mask])
    assert_same(t[np.array([1, 999])], x[[1, 999]])
    two_d = torch.randint(0, 1000, (4, 6))
    assert_same(t[two_d], x[two_d])


@pytest.mark.gpu
def test_numpy_memmap_source(tmp_path, cuda_device):
    path = tmp_path / "feat.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(20_000, 48))
    arr[:] = np.random.default_rng(0).standard_normal(arr.shape, dtype=np.float32)
    arr.flush()
    ro = np.load(path, mmap_mode="r")
    t = hmgstore.HybridTensor(ro, cuda_device, gpu_rows=torch.arange(0, 20_000, 5))
    idx = torch.randint(0, 20_000, (9000,))
    assert_same(t[idx], torch.from_numpy(np.asarray(ro[idx.numpy()])))


@pytest.mark.gpu
def test_column_slice_source(cuda_device):
    base = random_table(3000, (40,), torch.float32, seed=6)
    x = base[:, 3:35]  # rows contiguous, pitch larger than a row
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 3000, 2))
    idx = torch.randint(0, 3000, (4000,))
    assert_same(t[idx], x[idx])


@pytest.mark.gpu
def test_gather_many_one_launch(cuda_device, monkeypatch):
    from hmgstore.cuda import gather  # hmgstore.tensor launches through this module

    x = random_table(5000, (100,), torch.float32, seed=10)
    y = torch.randint(0, 50, (5000,))
    z = random_table(700, (3,), torch.float16, seed=11)
    tx = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 5000, 4))
    ty = hmgstore.HybridTensor(y, cuda_device)
    tz = hmgstore.HybridTensor(z, cuda_device, gpu_rows=torch.randperm(700))
    launches = []  # jobs per kernel launch
    real = gather.run
    monkeypatch.setattr(gather, "run", lambda packed, *a, **k: (launches.append(packed.num_jobs), real(packed, *a, **k)))
    i1, i2 = torch.randint(0, 5000, (3000,)).to(cuda_device), torch.randint(0, 700, (123,))
    gx, gy, gz = hmgstore.gather_many([(tx, i1), (ty, i1), (tz, i2)])
    assert launches == [3]
    assert_same(gx, x[i1.cpu()])
    assert_same(gy, y[i1.cpu()])
    assert_same(gz, z[i2])


@pytest.mark.gpu
def test_stream_and_max_sms(cuda_device):
    x = random_table(20_000, (128,), torch.float32, seed=12)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 20_000, 3), max_sms=2)
    side = torch.cuda.Stream(cuda_device)
    idx = torch.randint(0, 20_000, (50_000,), device=cuda_device)
    side.wait_stream(torch.cuda.current_stream(cuda_device))
    out = t.gather(idx, stream=side)
    side.synchronize()
    assert_same(out, x[idx.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [-1, 1000, 2**31, 2**40, -(2**40)])
@pytest.mark.parametrize("index_on", ["cpu", "cuda"])
def test_bad_index_raises_and_context_survives(bad, index_on, cuda_device):
    x = random_table(1000, (16,), torch.float32, seed=13)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(10))
    idx = torch.tensor([1, 2, bad, 4])
    with pytest.raises(IndexError, match=str(bad)):
        t.gather(idx.to(cuda_device) if index_on == "cuda" else idx, check="sync")
    check_context_alive(cuda_device)
    assert_same(t[torch.tensor([999, 0])], x[[999, 0]])


@pytest.mark.gpu
def test_float_index_and_bad_out(cuda_device):
    t = hmgstore.HybridTensor(random_table(100, (4,), torch.float32), cuda_device)
    with pytest.raises(TypeError):
        t[torch.tensor([1.0, 2.0], device=cuda_device)]
    with pytest.raises(ValueError, match="out must be"):
        t.gather(torch.tensor([1, 2]), out=torch.empty(3, 4, device=cuda_device))
    check_context_alive(cuda_device)


@pytest.mark.gpu
def test_closed_table_refuses(cuda_device):
    t = hmgstore.HybridTensor(random_table(100, (4,), torch.float32), cuda_device)
    t.close()
    with pytest.raises(RuntimeError, match="closed"):
        t[torch.tensor([1])]


@pytest.mark.gpu
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    num_rows=st.integers(1, 3000),
    row=st.lists(st.integers(1, 9), min_size=0, max_size=2),
    dtype=st.sampled_from(GPU_DTYPES),
    gpu_share=st.floats(0, 1),
    batch=st.integers(0, 4000),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_torch(num_rows, row, dtype, gpu_share, batch, index_dtype, seed, cuda_device):
    g = torch.Generator().manual_seed(seed)
    x = random_table(num_rows, tuple(row), dtype, seed=seed)
    gpu_rows = torch.randperm(num_rows, generator=g)[: int(gpu_share * num_rows)]
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows, progress=False)
    idx = torch.randint(0, num_rows, (batch,), generator=g, dtype=index_dtype)
    out = poisoned((batch, *row), dtype, cuda_device)
    assert_same(t.gather(idx, out=out), x[idx.long()])
    t.close()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["gpu", "mixed"])
def test_strided_and_expanded_cuda_indices(layout, cuda_device):
    x = random_table(4000, (24,), torch.float32, seed=14)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(4000) if layout == "gpu" else torch.arange(0, 4000, 2))
    base = torch.randint(0, 4000, (6000,), device=cuda_device)
    for idx in (base[::3], base[:1].expand(500), base.view(2, 3000)[:, 7]):
        assert_same(t[idx], x[idx.cpu()])


@pytest.mark.gpu
def test_read_only_memmap_fully_resident(tmp_path, cuda_device):
    """A read-only mapping over SMALL_COPY_BYTES is registered in place (read-only) to fill the GPU tier."""
    from hmgstore.memory.pinned import SMALL_COPY_BYTES

    rows = SMALL_COPY_BYTES // 256 + 1000
    arr = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(rows, 64))
    arr[:] = np.arange(arr.size, dtype=np.float32).reshape(arr.shape) * 0.5 + 1
    arr.flush()
    ro = np.load(tmp_path / "big.npy", mmap_mode="r")
    t = hmgstore.HybridTensor(ro, cuda_device, gpu_rows=torch.arange(rows))
    idx = torch.randint(0, rows, (20_000,))
    assert_same(t[idx], torch.from_numpy(np.asarray(ro[idx.numpy()])))


# ---- lifetime and misuse (a close racing a gather, changed sources, reused buffers, scalars) ----------
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_close_waits_for_a_gather_in_flight(device, monkeypatch):
    import threading
    import time

    import hmgstore.plan as plan_module

    x = random_table(4000, (16,), torch.float32, seed=20)
    table = hmgstore.HybridTensor(x, device, gpu_rows=torch.arange(0, 4000, 2) if device == "cuda" else None)
    idx = torch.randint(0, 4000, (1000,))
    inside, release, results = threading.Event(), threading.Event(), []
    real = plan_module.prepare_many

    def held(*args, **kwargs):  # the gather stops after its closed-check, before it reads anything
        inside.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "prepare_many", held)
    gather = threading.Thread(target=lambda: results.append(table[idx].cpu()))
    gather.start()
    assert inside.wait(10)
    closer = threading.Thread(target=table.close)
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive(), "close() returned while a gather was in flight"
    release.set()
    gather.join(10)
    closer.join(10)
    assert not closer.is_alive() and table.closed
    assert torch.equal(results[0], x[idx])  # the gather in flight finished on live memory
    monkeypatch.setattr(plan_module, "prepare_many", real)
    with pytest.raises(RuntimeError, match="closed"):
        table[idx]
    if device == "cuda":
        check_context_alive(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.parametrize("device", DEVICES)
def test_close_from_another_thread_while_gathering_in_a_loop(device):
    import threading

    x = random_table(20_000, (32,), torch.float32, seed=21)
    table = hmgstore.HybridTensor(x, device)
    idx = torch.randint(0, 20_000, (5000,), device=device)
    errors, rows = [], []

    def loop():
        try:
            while True:
                rows.append(table[idx])
        except RuntimeError as err:
            errors.append(str(err))

    worker = threading.Thread(target=loop)
    worker.start()
    while not rows:
        pass
    table.close()
    worker.join(10)
    assert errors and "closed" in errors[0]
    assert all(torch.equal(r.cpu(), x[idx.cpu()]) for r in rows[:3])
    if device == "cuda":
        check_context_alive(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.parametrize("device", DEVICES)
def test_source_changed_after_build(device):
    x = random_table(1000, (8,), torch.float32, seed=22)
    kept = x.clone()
    table = hmgstore.HybridTensor(x, device)
    x.set_(torch.zeros(5, 8))  # the caller's tensor now means something else
    assert torch.equal(table[torch.arange(1000)].cpu(), kept) and table.num_rows == 1000
    y = random_table(1000, (8,), torch.float32, seed=23)
    kept_y = y.clone()
    other = hmgstore.HybridTensor(y, device)
    y.data = torch.ones(2000, 8)
    assert torch.equal(other[torch.arange(1000)].cpu(), kept_y)
    with pytest.raises(IndexError, match="out of range"):
        other[torch.tensor([1500])]  # ids at or beyond the built row count


def test_source_grown_in_place_keeps_the_built_row_count():
    x = random_table(1000, (8,), torch.float32, seed=24)
    table = hmgstore.HybridTensor(x, "cpu")
    x.resize_(3000, 8)  # reallocates the storage the table's view shares
    with pytest.raises(IndexError, match="out of range"):
        table[torch.tensor([2500])]
    assert torch.equal(table[torch.arange(1000)], x[:1000])


@pytest.mark.gpu
def test_source_moved_under_a_pinned_table_is_refused():
    from hmgstore.memory.pinned import SMALL_COPY_BYTES

    rows = SMALL_COPY_BYTES // 256 + 1000  # large enough to be pinned in place, not copied
    x = random_table(rows, (64,), torch.float32, seed=25)
    table = hmgstore.HybridTensor(x, "cuda")
    x.share_memory_()  # moves the storage's memory into a shared segment
    with pytest.raises(RuntimeError, match="moved"):
        table[torch.tensor([0, 1])]
    check_context_alive(torch.device("cuda", torch.cuda.current_device()))


@pytest.mark.parametrize("device", DEVICES)
def test_requires_grad_source_is_detached(device):
    x = random_table(100, (4,), torch.float32, seed=26).requires_grad_()
    table = hmgstore.HybridTensor(x, device)
    rows = table[torch.tensor([3, 7])]
    assert not rows.requires_grad and torch.equal(rows.cpu(), x.detach()[[3, 7]])


@pytest.mark.gpu
def test_pinned_ids_reused_right_after_gather():
    x = random_table(50_000, (8,), torch.float32, seed=27)
    table = hmgstore.HybridTensor(x, "cuda", gpu_rows=torch.arange(0, 50_000, 3))
    ids = torch.randint(0, 50_000, (20_000,)).pin_memory()
    want = x[ids]
    torch.cuda._sleep(200_000_000)  # the stream is busy: a copy from `ids` would run late
    rows = table.gather(ids)
    ids.fill_(2**32 + 3)  # the caller reuses its buffer at once
    assert torch.equal(rows.cpu(), want)


@pytest.mark.gpu
def test_gather_on_a_side_stream_does_not_wait_for_the_default_stream():
    import time

    x = random_table(100_000, (32,), torch.float32, seed=28)
    table = hmgstore.HybridTensor(x, "cuda", gpu_rows=torch.arange(0, 100_000, 2))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        idx = torch.randint(0, 100_000, (10_000,), device="cuda")
        table[idx]  # warm-up: compilation, pinned buffers
    side.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of work on the default stream
    start = time.perf_counter()
    with torch.cuda.stream(side):
        rows = table[idx]  # CUDA ids: checked with a read-back on the side stream only
    spent = time.perf_counter() - start
    side.synchronize()
    assert spent < 0.5, f"the gather waited {spent:.2f} s for the default stream"
    assert torch.equal(rows.cpu(), x[idx.cpu()])
    torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ids_on_a_one_dimensional_table(device):
    labels = torch.arange(100) * 3
    table = hmgstore.HybridTensor(labels, device)
    for index in (5, torch.tensor(5), np.int64(5)):
        row = table[index]
        assert row.shape == () and int(row) == 15
    assert table[torch.tensor([5])].shape == (1,)


@pytest.mark.parametrize("device", DEVICES)
def test_unsigned_and_huge_ids(device):
    x = random_table(300, (4,), torch.float32, seed=29)
    table = hmgstore.HybridTensor(x, device)
    for dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        assert torch.equal(table[torch.tensor([3, 250], dtype=dtype)].cpu(), x[[3, 250]]), dtype
    assert torch.equal(table[np.array([3, 9], dtype=np.uint32)].cpu(), x[[3, 9]])
    for bad in (2**63, 2**64 + 1, -(2**63) - 1):
        with pytest.raises(IndexError):
            table[bad]
        with pytest.raises(IndexError):
            table[[1, bad]]
    with pytest.raises(IndexError, match="out of range"):
        table[torch.tensor([2**63 + 5], dtype=torch.uint64)]


def test_the_same_out_twice_is_refused():
    x = random_table(50, (4,), torch.float32, seed=30)
    table = hmgstore.HybridTensor(x, "cpu")
    out = torch.empty(3, 4)
    with pytest.raises(ValueError, match="same out"):
        hmgstore.gather_many([(table, [1, 2, 3]), (table, [4, 5, 6])], outs=[out, out])


def test_a_closed_table_pickles_closed():
    table = hmgstore.HybridTensor(random_table(50, (4,), torch.float32, seed=31), "cpu")
    table.close()
    copy = pickle.loads(pickle.dumps(table))
    assert copy.closed
    with pytest.raises(RuntimeError, match="closed"):
        copy[[1]]


def test_read_only_source_is_handed_back_read_only(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(40, dtype=np.float32).reshape(10, 4))
    ro = np.load(path, mmap_mode="r")
    table = hmgstore.HybridTensor(ro, "cpu")
    assert table.read_only and isinstance(table.source, np.ndarray)
    with pytest.raises(ValueError, match="read-only"):
        table.source[0, 0] = 1.0  # raises instead of crashing the process
    assert float(np.load(path)[0, 0]) == 0.0


def test_a_memmap_table_crosses_processes_by_file_name(tmp_path):
    from multiprocessing.reduction import ForkingPickler

    path = tmp_path / "x.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(1000, 8))
    arr[:] = np.random.default_rng(2).standard_normal(arr.shape)
    arr.flush()
    view = np.load(path, mmap_mode="r")[100:]  # a view with an offset into the file
    table = hmgstore.HybridTensor(view, "cpu")
    sent = bytes(ForkingPickler.dumps(table))
    assert len(sent) < 10_000  # the file's name, not its 32 KB of rows
    copy = pickle.loads(sent)
    assert torch.equal(copy[torch.arange(900)], torch.from_numpy(np.asarray(view)))


def test_placement_ids_are_checked_on_the_cpu_too():
    x = random_table(1000, (4,), torch.float32, seed=32)
    with pytest.raises(IndexError, match="out of range"):
        hmgstore.HybridTensor(x, "cpu", gpu_rows=[5000])
    with pytest.raises(ValueError, match="more than once"):
        hmgstore.HybridTensor(x, "cpu", gpu_rows=[1, 1])


# ---- per-tier statistics -------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_statistics_count_rows_per_tier(device):
    x = random_table(1000, (16,), torch.float32, seed=33)
    table = hmgstore.HybridTensor(x, device, gpu_rows=torch.arange(0, 1000, 2))  # even rows on the GPU
    with pytest.raises(RuntimeError, match="reset_stats"):
        table.stats()
    table.reset_stats()
    table[torch.arange(0, 100)]  # 50 even, 50 odd
    hmgstore.gather_many([(table, torch.tensor([2, 4, 6]))])
    s = table.stats()
    assert s["gathers"] == 2 and s["rows"] == 103 and s["bytes"] == 103 * 64 and s["seconds"] > 0
    if device == "cuda":
        assert s["tiers"]["gpu"]["rows"] == 53 and s["tiers"]["host"]["rows"] == 50
        assert s["hit_ratio"] == pytest.approx(53 / 103)
    else:
        assert s["tiers"] == {"host": {"rows": 103, "bytes": 103 * 64}} and s["hit_ratio"] == 0.0
    table.reset_stats()
    assert table.stats()["rows"] == 0


def test_merged_statistics():
    from hmgstore import stats

    a = hmgstore.HybridTensor(random_table(100, (4,), torch.float32), "cpu", stats=True)
    b = hmgstore.HybridTensor(random_table(100, (2,), torch.float32), "cpu", stats=True)
    hmgstore.gather_many([(a, [1, 2, 3]), (b, [4, 5])])
    merged = stats.merge([a.stats(), b.stats()])
    assert merged["rows"] == 5 and merged["bytes"] == 3 * 16 + 2 * 8 and merged["gathers"] == 1


# ---- host memory hmgstore owns: copy=True, empty() and writes -------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backing", ["hugepage", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_copy_puts_the_host_tier_in_owned_memory(device, backing):
    if backing == "cuda" and device == "cpu":
        pytest.skip("cudaHostAlloc memory is for GPU tables")
    x = random_table(100_000, (32,), torch.float32, seed=61)  # 12.8 MB
    kept = x.clone()
    t = hmgstore.HybridTensor(x, device, copy=True, backing=backing, gpu_rows=torch.arange(0, 100_000, 3))
    assert t.source.data_ptr() != x.data_ptr()
    if backing == "hugepage":
        assert t.source.data_ptr() % (2 << 20) == 0
    x.zero_()  # the caller's tensor is no longer read
    idx = torch.randint(0, 100_000, (20_000,))
    assert_same(t[idx].cpu(), kept[idx])
    t.close()


def test_copy_of_a_read_only_memmap_is_writable(tmp_path):
    x = random_table(500, (4,), torch.float32, seed=62)
    np.save(tmp_path / "x.npy", x.numpy())
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    with pytest.raises(TypeError, match="copy=True"):
        hmgstore.HybridTensor(mm, "cpu")[3] = 0.0
    t = hmgstore.HybridTensor(mm, "cpu", copy=True)
    t[3] = 0.0
    assert not t[3].any() and torch.equal(t[4], x[4]) and not t.read_only


@pytest.mark.parametrize("device", DEVICES)
def test_empty_tables_are_filled_by_writes_in_every_tier(device):
    x = random_table(4000, (16,), torch.float32, seed=63)
    t = hmgstore.HybridTensor.empty((4000, 16), device=device, gpu_budget=1000 * 64, hot_order=torch.randperm(4000))
    assert t.num_gpu_rows == (1000 if device != "cpu" else 0) and not t[torch.arange(4000)].any()
    for start in range(0, 4000, 1500):  # filled piece by piece, as a loader would
        t[start:start + 1500] = x[start:start + 1500]
    idx = torch.randint(0, 4000, (3000,))
    assert_same(t[idx].cpu(), x[idx])
    t[torch.tensor([7, 9])] = -1.0  # broadcast, reaching the GPU tier's copies too
    want = x.clone()
    want[[7, 9]] = -1.0
    assert_same(t[torch.arange(4000)].cpu(), want)
    with pytest.raises(IndexError, match="out of range"):
        t[torch.tensor([4000])] = 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("host_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [64, 7])  # 16-byte loads of 8 values; one value at a time
def test_half_width_host_rows_read_as_rounded_float32(device, host_dtype, width):
    x = random_table(20_000, (width,), torch.float32, seed=64)
    x[0, :3] = torch.tensor([float("inf"), -float("inf"), 3e-7])  # infinities; a float16 subnormal
    x[1, :2] = torch.tensor([70000.0, -0.0])  # beyond float16: inf; negative zero
    want = x.to(host_dtype).to(torch.float32)
    t = hmgstore.HybridTensor(x, device, host_dtype=host_dtype, gpu_rows=torch.arange(0, 20_000, 5))
    assert t.dtype == torch.float32 and t.host_dtype == host_dtype and t.source.dtype == host_dtype
    assert "host_dtype" in repr(t)
    idx = torch.randint(0, 20_000, (10_000,))
    idx[:2] = torch.tensor([0, 1])
    assert_same(t[idx].cpu(), want[idx])
    ids_on = idx.to(device)
    assert_same(t[ids_on].cpu(), want[idx])
    copy = pickle.loads(pickle.dumps(t))
    assert copy.dtype == torch.float32 and copy.host_dtype == host_dtype
    assert_same(copy[idx].cpu(), want[idx])
    t[torch.tensor([2])] = 1.0 / 3.0
    assert_same(t[torch.tensor([2])].cpu(), torch.full((1, width), 1.0 / 3.0).to(host_dtype).float())


def test_half_width_host_rows_are_for_float32_tables():
    with pytest.raises(ValueError, match="float32 table"):
        hmgstore.HybridTensor(torch.arange(10).reshape(5, 2), "cpu", host_dtype=torch.float16)
    with pytest.raises(ValueError, match="float32 table"):
        hmgstore.HybridTensor(random_table(5, (2,), torch.float32), "cpu", host_dtype=torch.int8)


# ---- GPU ids checked by the kernel, without waiting ------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("bad", [-1, 1000, 2**31, 2**40])
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_deferred_check_reports_the_bad_id_at_the_next_gather(bad, ids_dtype, cuda_device):
    if ids_dtype == torch.int32 and not -2**31 <= bad < 2**31:
        pytest.skip("not an int32")
    x = random_table(1000, (16,), torch.float32, seed=65)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 1000, 2))
    other = hmgstore.HybridTensor(torch.arange(1000), cuda_device)
    idx = torch.tensor([1, 2, bad, 4, 999], dtype=ids_dtype)
    got = t[idx.to(cuda_device)]  # returns without waiting
    torch.cuda.synchronize(cuda_device)
    rows = got.cpu()
    assert torch.isnan(rows[2]).all() and torch.equal(rows[2].view(torch.int32), torch.full((16,), -1, dtype=torch.int32))
    keep = torch.tensor([0, 1, 3, 4])
    assert_same(rows[keep], x[idx[keep].long()])
    with pytest.raises(IndexError, match=rf"index {bad} at position 2 .*shape \(1000, 16\).*check='sync'"):
        other[torch.tensor([5])]  # the next gather on this GPU reports it
    check_context_alive(cuda_device)
    assert_same(t[torch.tensor([999, 0], device=cuda_device)].cpu(), x[[999, 0]])
    hmgstore.raise_deferred(cuda_device)  # reported once: nothing left


@pytest.mark.gpu
def test_deferred_errors_are_raised_by_raise_deferred_and_sync_raises_at_once(cuda_device):
    x = random_table(500, (8,), torch.float32, seed=66)
    t = hmgstore.HybridTensor(x, cuda_device)
    labels = hmgstore.HybridTensor(torch.arange(300), cuda_device)
    a, b = torch.tensor([1, 2], device=cuda_device), torch.tensor([0, 299, 300], device=cuda_device)
    hmgstore.gather_many([(t, a), (labels, b)])
    with pytest.raises(IndexError, match=r"index 300 at position 2 .*shape \(300,\)"):
        hmgstore.raise_deferred(cuda_device)
    with pytest.raises(IndexError, match="index 300 at position 2"):
        hmgstore.gather_many([(t, a), (labels, b)], check="sync")
    with pytest.raises(ValueError, match="check must be"):
        t.gather(a, check="later")
    check_context_alive(cuda_device)


@pytest.mark.gpu
def test_gathers_of_gpu_ids_never_synchronise(cuda_device):
    x = random_table(50_000, (32,), torch.float32, seed=67)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 50_000, 3), stats=False)
    idx = torch.randint(0, 50_000, (20_000,), device=cuda_device)
    t[idx]  # compile and warm outside the check
    torch.cuda.synchronize(cuda_device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        outs = [t[idx] for _ in range(5)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_same(outs[-1].cpu(), x[idx.cpu()])
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            t.gather(idx, check="sync")  # the check that makes it fail is real
    finally:
        torch.cuda.set_sync_debug_mode("default")
