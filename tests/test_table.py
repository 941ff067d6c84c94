"""HybridTensor beyond the gather itself (hmgstore.table.state): lifetime and misuse, per-tier statistics, host memory
hmgstore owns, half-width host rows, and GPU ids checked by the kernel without waiting.

As in test_tensor.py, results are compared byte for byte with ``x[idx]``.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import hmgstore
from helpers import assert_same, no_collection, random_table


def check_context_alive(device) -> None:
    """The CUDA context still works after an error was raised (a bad read would have killed it)."""
    a = torch.arange(10, device=device)
    assert int((a * 2).sum()) == 90
    torch.cuda.synchronize(device)


# ---- lifetime and misuse (a close racing a gather, changed sources, reused buffers, scalars) ----------
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_close_waits_for_a_gather_in_flight(device, monkeypatch):
    import threading
    import time

    import hmgstore.gather.plan as plan_module

    x = random_table(4000, (16,), torch.float32, seed=20)
    table = hmgstore.HybridTensor(x, device, gpu_rows=torch.arange(0, 4000, 2) if device == "cuda" else None)
    idx = torch.randint(0, 4000, (1000,))
    inside, release, results = threading.Event(), threading.Event(), []
    real = {name: getattr(plan_module, name) for name in ("prepare_many", "check_range")}  # GPU path, CPU path

    def holding(name):
        def held(*args, **kwargs):  # the gather stops after its closed-check, before it reads anything
            inside.set()
            assert release.wait(10)
            return real[name](*args, **kwargs)
        return held

    for name in real:
        monkeypatch.setattr(plan_module, name, holding(name))
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
    for name, function in real.items():
        monkeypatch.setattr(plan_module, name, function)
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
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_cpu_ids_do_not_wait_for_the_stream(pinned):
    """CPU ids are staged in pinned memory of the gather's own: a copy from pageable memory would first wait
    for the stream to drain. Many gathers queued behind a busy stream, each with its ids overwritten at once,
    must all come back right (a staging block handed out again before its copy ran would mix them up)."""
    import time

    x = random_table(60_000, (16,), torch.float32, seed=29)
    table = hmgstore.HybridTensor(x, "cuda", gpu_rows=torch.arange(0, 60_000, 2))
    warm = torch.randint(0, 60_000, (1000,))
    table[warm.pin_memory() if pinned else warm]  # compilation, first pinned blocks
    torch.cuda.synchronize()
    generator = torch.Generator().manual_seed(30)
    wanted, results = [], []
    with no_collection():  # an earlier test's garbage freed in here would synchronise the device
        torch.cuda._sleep(2_000_000_000)  # ~1 s of work on the stream the gathers queue on
        start = time.perf_counter()
        for _ in range(20):
            ids = torch.randint(0, 60_000, (5000,), generator=generator)
            ids = ids.pin_memory() if pinned else ids
            wanted.append(x[ids])
            results.append(table.gather(ids))
            ids.fill_(7)  # the caller reuses its buffer at once
        spent = time.perf_counter() - start
    assert spent < 0.5, f"20 gathers with CPU ids waited {spent:.2f} s for the busy stream"
    torch.cuda.synchronize()
    for k, (rows, want) in enumerate(zip(results, wanted)):
        assert torch.equal(rows.cpu(), want), f"gather {k} returned the wrong rows"


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
    with no_collection():
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
    for dtype in (torch.uint16, torch.uint32, torch.uint64):
        assert torch.equal(table[torch.tensor([3, 250], dtype=dtype)].cpu(), x[[3, 250]]), dtype
    for dtype in (np.uint8, np.uint32):
        assert torch.equal(table[np.array([3, 9], dtype=dtype)].cpu(), x[[3, 9]])
    with pytest.raises(TypeError, match="ambiguous"):  # torch reads a uint8 tensor as a mask
        table[torch.tensor([3, 250], dtype=torch.uint8)]
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
    with pytest.raises(ValueError, match="outs 0 and 1 share memory"):
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
    table.reset_stats(counting=False)  # stopped: gathers go on, uncounted
    assert table.counter is None
    assert_same(table[torch.arange(0, 10)].cpu(), x[:10])
    with pytest.raises(RuntimeError, match="not counting"):
        table.stats()


def test_merged_statistics():
    from hmgstore.rows import stats

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
    x[1, :2] = torch.tensor([60000.0, -0.0])  # near float16's largest; negative zero
    want = x.to(host_dtype).to(torch.float32)
    past = x.clone()
    past[2, 3] = 70000.0 if host_dtype == torch.float16 else 3.4e38  # would read back as infinity: refused
    with pytest.raises(ValueError, match="row 2 holds .* past"):
        hmgstore.HybridTensor(past, device, host_dtype=host_dtype)
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
    with pytest.raises(ValueError, match="unknown stored row format"):
        hmgstore.HybridTensor(random_table(5, (2,), torch.float32), "cpu", host_dtype=torch.int16)


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
    assert (torch.isnan(rows[2]).all()
            and torch.equal(rows[2].view(torch.int32), torch.full((16,), -1, dtype=torch.int32)))
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
