"""HybridTensor and gather_many (hmgstore.table.tensor): bit-identical to ``x[idx]`` on the CPU and on a GPU.

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
    with pytest.raises(ValueError, match="hot_order is only used with gpu_budget"):
        hmgstore.HybridTensor(torch.zeros(4, 2), "cpu", hot_order=[0])
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
    with pytest.raises(TypeError, match=r"\(table, ids\) pairs.*Tensor, not a HybridTensor: wrap a plain tensor"):
        hmgstore.gather_many([(x, idx)])


def test_gpu_budget_without_an_order_and_hotness_on_the_cpu():
    """A budget alone keeps rows in id order (checked on the CPU as on a GPU); scores go in hotness=."""
    x = random_table(50, (4,), torch.float32)
    t = hmgstore.HybridTensor(x, "cpu", gpu_budget="1KB")
    assert t.num_gpu_rows == 0 and same(t[[0, 49]], x[[0, 49]])
    t = hmgstore.HybridTensor(x, "cpu", gpu_budget=160, hotness=torch.rand(50))
    assert same(t[[3, 1]], x[[3, 1]])
    with pytest.raises(ValueError, match="hotness has 49 entries for 50 rows"):
        hmgstore.HybridTensor(x, "cpu", gpu_budget=160, hotness=torch.rand(49))
    with pytest.raises(ValueError, match="lists row .* more than once.*hotness=score"):
        hmgstore.HybridTensor(x, "cpu", gpu_budget=160, hot_order=torch.randint(0, 5, (50,)))
    with pytest.raises(TypeError, match="hot_order is row ids"):
        hmgstore.HybridTensor(x, "cpu", gpu_budget=160, hot_order=torch.tensor([0.5, 1.7]))
    with pytest.raises(IndexError, match="hot_order"):
        hmgstore.HybridTensor(x, "cpu", gpu_budget=32, hot_order=[0, 1, 10**6])
    e = hmgstore.HybridTensor.empty((50, 4), device="cpu", gpu_budget=160, hotness=torch.arange(50))
    assert e.shape == (50, 4)


def test_odd_index_objects():
    x = random_table(50, (4,), torch.float32)
    t = hmgstore.HybridTensor(x, "cpu")
    assert same(t[range(3, 9, 2)], x[range(3, 9, 2)]) and same(t[range(5, 2)], x[range(5, 2)])  # as torch does
    with pytest.raises(TypeError, match="sparse tensor is not an index.*to_dense"):
        t[torch.tensor([1, 2]).to_sparse()]
    with pytest.raises(TypeError, match="'meta' device hold no values"):
        t[torch.empty(3, dtype=torch.int64, device="meta")]


def test_writes_of_the_wrong_shape_say_so():
    t = hmgstore.HybridTensor(random_table(50, (4,), torch.float32), "cpu", copy=True)
    with pytest.raises(ValueError, match=r"value of shape \(3, 4\) does not broadcast to the 2 rows written, "
                                         r"\(2, 4\)"):
        t[[1, 2]] = torch.ones(3, 4)
    t[[1, 2]] = torch.arange(4.0)  # broadcast, as in torch
    assert same(t[[1, 2]], torch.arange(4.0).expand(2, 4))


def test_a_closed_table_refuses_every_read():
    t = hmgstore.HybridTensor(random_table(50, (4,), torch.float32), "cpu")
    t.close()
    for read in (lambda: t[1], lambda: t.dense(), lambda: hmgstore.gather_many([(t, [1])])):
        with pytest.raises(RuntimeError, match="this table was closed"):
            read()
    with pytest.raises(RuntimeError, match="this table was closed"):
        t[[1]] = 0
    t.close()  # idempotent
    assert "closed" in repr(t) and len(t) == 50


def test_two_indices_are_refused_and_say_how_to_index():
    """``t[3, 1]`` is the element x[3, 1] in torch and numpy; a table indexes rows only, so it refuses."""
    x = random_table(50, (4,), torch.float32)
    t = hmgstore.HybridTensor(x, "cpu")
    for bad in ((3, 1), (slice(None), 1), (torch.tensor([3]), torch.tensor([1])), (Ellipsis, 0)):
        with pytest.raises(TypeError, match=r"rows only.*t\[\[3, 1\]\].*t\[ids\]\[:, cols\]"):
            t[bad]
        with pytest.raises(TypeError, match="rows only"):
            t[bad] = 0
    assert same(t[[3, 1]], x[[3, 1]]) and same(t[3][1], x[3, 1])  # the ways the message names
    assert same(t.gather((3, 1)), x[[3, 1]])  # gather() takes a tuple as a sequence of ids, as documented


@pytest.mark.parametrize("key", [slice(10, 3), slice(-1, -5), slice(5, 5), slice(60, 70), slice(40, 10, 2),
                                 slice(3, 10, -1)])
def test_empty_slices_give_empty_results_as_in_torch(key):
    x = random_table(50, (4,), torch.float32)
    want = x[key] if (key.step or 1) > 0 else x[:0]  # torch refuses negative steps; numpy's answer is empty
    assert same(hmgstore.HybridTensor(x, "cpu")[key], want) and want.shape == (0, 4)


def test_slices_with_steps_match_numpy():
    x = random_table(50, (2,), torch.int64)
    t = hmgstore.HybridTensor(x, "cpu")
    for key in (slice(None, None, 3), slice(-10, None), slice(None, None, -1), slice(40, 5, -7), slice(-3, -60, -1)):
        assert same(t[key], torch.from_numpy(x.numpy()[key].copy())), key


def test_gather_many_says_requests_are_pairs():
    t = hmgstore.HybridTensor(random_table(20, (2,), torch.float32), "cpu")
    for bad in ([t], t, [(t,)], [(t, [1], [2])], [[1, 2]]):
        with pytest.raises(TypeError, match=r"\(table, ids\) pairs.*gather_many\(\[\(t, ids\)\]\)"):
            hmgstore.gather_many(bad)
    assert same(hmgstore.gather_many([[t, [1]]])[0], t[[1]])  # a pair given as a list is a pair


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_ids_of_every_integer_dtype_and_layout(dtype):
    x = random_table(120, (3,), torch.float32)
    t = hmgstore.HybridTensor(x, "cpu")
    if dtype == torch.bool:
        mask = torch.rand(120, generator=torch.Generator().manual_seed(0)) < 0.3
        assert same(t[mask], x[mask]) and same(t[mask.numpy()], x[mask])
        return
    ids = torch.randint(0, 120 if dtype != torch.int8 else 127, (6, 8), generator=torch.Generator().manual_seed(1))
    ids = ids.clamp(max=119).to(dtype)
    for view in (ids, ids.t(), ids[:, ::3], ids[::2], ids.flip(0)):  # contiguous, then strided views
        assert same(t[view.numpy()], x[view.long()])
        if dtype == torch.uint8:  # torch reads a uint8 tensor as a mask and numpy a uint8 array as ids: refused
            with pytest.raises(TypeError, match="ambiguous"):
                t[view]
            continue
        assert same(t[view], x[view.long()])


@pytest.mark.parametrize("bad", [torch.tensor([-1], dtype=torch.int8), torch.tensor([120], dtype=torch.uint8),
                                 torch.tensor([[0, 1], [2, 200]], dtype=torch.int16).t(),
                                 torch.tensor([1.0]), torch.tensor([1], dtype=torch.float16), np.array([1.5])])
def test_bad_ids_of_every_dtype_raise_before_reading(bad):
    t = hmgstore.HybridTensor(random_table(120, (3,), torch.float32), "cpu")
    with pytest.raises((IndexError, TypeError)) as err:
        t[bad]
    assert ("out of range" in str(err.value)) if err.type is IndexError else ("integer" in str(err.value))


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
    from hmgstore.cuda import gather  # hmgstore.table.tensor launches through this module

    x = random_table(5000, (100,), torch.float32, seed=10)
    y = torch.randint(0, 50, (5000,))
    z = random_table(700, (3,), torch.float16, seed=11)
    tx = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 5000, 4))
    ty = hmgstore.HybridTensor(y, cuda_device)
    tz = hmgstore.HybridTensor(z, cuda_device, gpu_rows=torch.randperm(700))
    launches = []  # jobs per kernel launch
    real = gather.run
    monkeypatch.setattr(gather, "run",
                        lambda packed, *a, **k: (launches.append(packed.num_jobs), real(packed, *a, **k)))
    i1, i2 = torch.randint(0, 5000, (3000,)).to(cuda_device), torch.randint(0, 700, (123,))
    gx, gy, gz = hmgstore.gather_many([(tx, i1), (ty, i1), (tz, i2)])
    assert launches == [3]
    assert_same(gx, x[i1.cpu()])
    assert_same(gy, y[i1.cpu()])
    assert_same(gz, z[i2])


@pytest.mark.gpu
@pytest.mark.parametrize("exclusive", [True, False], ids=["whole-sms", "spread"])
def test_stream_and_max_sms(cuda_device, monkeypatch, exclusive):
    """A capped gather: with whole SMs (one block of EXCLUSIVE_BLOCK threads to an SM, more than half its
    shared memory asked for) or spread thread slots; exact either way, float32 and int8 rows."""
    import cupy

    from hmgstore.cuda import gather

    monkeypatch.setattr(gather, "EXCLUSIVE", exclusive)
    launches = []
    real = gather.run
    monkeypatch.setattr(gather, "run", lambda packed, *a, **k: launches.append(packed) or real(packed, *a, **k))
    x = random_table(20_000, (128,), torch.float32, seed=12)
    side = torch.cuda.Stream(cuda_device)
    idx = torch.randint(0, 20_000, (50_000,), device=cuda_device)
    for compress in (None, "int8"):
        t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 20_000, 3), max_sms=2, compress=compress)
        want = x if compress is None else hmgstore.rows.formats.get("int8").decode(
            hmgstore.rows.formats.get("int8").encode(x), (128,))
        out = torch.full((50_000, 128), float("nan"), device=cuda_device)
        side.wait_stream(torch.cuda.current_stream(cuda_device))
        t.gather(idx, out=out, stream=side)
        side.synchronize()
        assert_same(out, want[idx.cpu()])
        packed = launches[-1]
        assert packed.max_sms == 2
        smem = gather.exclusive_smem(cuda_device.index, compress is not None)
        per_sm = cupy.cuda.Device(cuda_device.index).attributes["MaxSharedMemoryPerMultiprocessor"]
        assert smem is None or smem > per_sm // 2
        if torch.cuda.get_device_capability(cuda_device) >= (8, 0):
            assert smem is not None  # the whole-SM build fits a 1024-thread block on an A100, H100 or H200
        if smem:  # the whole-SM build: registers for a 1024-thread block, all shared memory preferred
            whole = gather._kernel(cuda_device.index, compress is not None, whole=True)
            assert whole.num_regs * gather.EXCLUSIVE_BLOCK <= 65536
            assert whole.preferred_shared_memory_carveout == gather.CARVEOUT
        if exclusive and smem:
            assert packed.smem == smem and packed.block == gather.EXCLUSIVE_BLOCK
        else:
            assert packed.smem == 0 and packed.block == gather.BLOCK


@pytest.mark.gpu
@pytest.mark.parametrize("index_on", ["cpu", "cuda"])
def test_capped_gather_in_two_passes_is_exact_and_reports_bad_ids(cuda_device, monkeypatch, index_on):
    """CAPPED_ROWS="remote": the GPU tier's rows in an uncapped launch, then the host rows capped; every row
    written once, exact in float32 and int8, into a poisoned output; a GPU id out of range filled with 0xFF bytes
    and reported once (by the remote pass); a table with no remote rows, one uncapped launch."""
    from hmgstore.cuda import gather

    monkeypatch.setattr(gather, "CAPPED_ROWS", "remote")
    launches = []
    real = gather.run
    monkeypatch.setattr(gather, "run", lambda packed, *a, **k: launches.append(packed) or real(packed, *a, **k))
    x = random_table(30_000, (128,), torch.float32, seed=21)
    idx = torch.randint(0, 30_000, (70_000,))
    fmt = hmgstore.rows.formats.get("int8")
    for compress in (None, "int8"):
        t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.randperm(30_000)[:9_000], max_sms=2,
                                  compress=compress)
        want = x if compress is None else fmt.decode(fmt.encode(x), (128,))
        out = torch.full((70_000, 128), float("nan"), device=cuda_device)
        t.gather(idx.to(cuda_device) if index_on == "cuda" else idx, out=out)
        assert_same(out, want[idx])
        assert launches[-1].passes == ((gather.LAYOUT["PASS_LOCAL"], False), (gather.LAYOUT["PASS_REMOTE"], True))
        bad = idx[:100].clone()
        bad[57] = 30_000
        if index_on == "cuda":  # checked by the kernel: the remote pass fills the row and records the id, once
            rows = t[bad.to(cuda_device)].cpu()
            assert torch.equal(rows[57].view(torch.int32), torch.full((128,), -1, dtype=torch.int32))
            keep = torch.arange(100) != 57
            assert_same(rows[keep], want[bad[keep]])
            with pytest.raises(IndexError, match=r"index 30000 at position 57 "):
                hmgstore.raise_deferred(cuda_device)
            hmgstore.raise_deferred(cuda_device)  # reported once: nothing left
        else:  # checked on the host before any launch
            with pytest.raises(IndexError, match="30000"):
                t.gather(bad, check="sync")
        check_context_alive(cuda_device)
        whole = hmgstore.HybridTensor(x[:500], cuda_device, gpu_rows=torch.arange(500), max_sms=2, compress=compress)
        assert_same(whole[torch.tensor([499, 3])], want[[499, 3]])
        assert launches[-1].passes == ((gather.LAYOUT["PASS_ALL"], False),)  # nothing remote: one launch, uncapped


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
    t = hmgstore.HybridTensor(x, cuda_device,
                              gpu_rows=torch.arange(4000) if layout == "gpu" else torch.arange(0, 4000, 2))
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
