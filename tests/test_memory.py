"""hmgstore.memory: host tables as tensors (pinned.py) and segments shared by a node's processes (shared.py).

On the CPU: what a source becomes (``as_host_tensor``), its row layout and
extent, and the shared segments' life (create, attach, unlink, sweep). On a
GPU (``gpu``): how tables pin their host tier, share registrations and give
them back.
"""
from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore import memory
from hmgstore.memory import owned


def registered(address: int) -> bool:
    """Whether hmgstore itself has page-locked the byte at ``address``."""
    return any(start <= address < end for start, end in memory.registered_ranges())


# ---- as_host_tensor ----------------------------------------------------------------------
def test_host_tensor_of_a_torch_tensor_is_a_detached_view():
    x = random_table(20, (3, 4), torch.float32).requires_grad_()
    t, read_only = memory.as_host_tensor(x)
    assert t is not x and not read_only and not t.requires_grad
    assert t.data_ptr() == x.data_ptr() and t.shape == x.shape and t.stride() == x.stride()
    assert t.dtype == torch.float32 and t.device == torch.device("cpu")
    x.data = torch.zeros(2, 2)  # what the caller does to its own tensor later does not reach the view
    assert t.shape == (20, 3, 4)


def test_host_tensor_of_numpy_arrays_shares_their_memory():
    arr = np.arange(60, dtype=np.int16).reshape(10, 6)
    t, read_only = memory.as_host_tensor(arr)
    assert not read_only and t.dtype == torch.int16 and t.shape == (10, 6)
    assert t.data_ptr() == arr.ctypes.data
    arr[3, 2] = -7
    assert int(t[3, 2]) == -7  # no copy

    cols = arr[:, 1:4]  # a column slice: rows contiguous, pitch larger than a row
    t, _ = memory.as_host_tensor(cols)
    assert t.shape == (10, 3) and t.stride() == (6, 1) and t.data_ptr() == cols.ctypes.data


def test_read_only_arrays_and_memmaps_are_wrapped_without_a_copy_and_flagged(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(4, 3)
    arr.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning about non-writable arrays stays inside
        t, read_only = memory.as_host_tensor(arr)
    assert read_only and t.data_ptr() == arr.ctypes.data and torch.equal(t, torch.arange(12.0).view(4, 3))

    path = tmp_path / "x.npy"
    np.save(path, np.ones((5, 2), dtype=np.float64))
    ro = np.load(path, mmap_mode="r")
    t, read_only = memory.as_host_tensor(ro)
    assert read_only and t.shape == (5, 2) and t.dtype == torch.float64 and t.data_ptr() == ro.ctypes.data
    t, read_only = memory.as_host_tensor(np.load(path, mmap_mode="r+"))
    assert not read_only


def test_host_tensor_refuses_device_tensors_other_types_and_scalars():
    with pytest.raises(TypeError, match="host memory, got a tensor on meta"):
        memory.as_host_tensor(torch.empty(3, 2, device="meta"))
    with pytest.raises(TypeError, match="cannot build a table from list"):
        memory.as_host_tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="at least one dimension"):
        memory.as_host_tensor(torch.tensor(3.0))
    with pytest.raises(ValueError, match="at least one dimension"):
        memory.as_host_tensor(np.array(3.0))


@pytest.mark.gpu
def test_host_tensor_refuses_a_cuda_tensor(cuda_device):
    with pytest.raises(TypeError, match=f"host memory, got a tensor on {cuda_device}"):
        memory.as_host_tensor(torch.zeros(4, 2, device=cuda_device))


# ---- row_layout and extent ---------------------------------------------------------------
def test_row_layout_of_dense_and_sliced_tables():
    assert memory.row_layout(torch.empty(10, 3, 4)) == (48, 48)
    assert memory.row_layout(torch.empty(7, dtype=torch.int64)) == (8, 8)  # one value per row
    base = torch.empty(40, 10)
    assert memory.row_layout(base[:, 2:7]) == (20, 40)  # pitch larger than a row
    assert memory.row_layout(base[:1, 2:7]) == (20, 20)  # one row: no step between rows
    assert memory.row_layout(base[::2]) == (40, 80)  # every other row
    # a dimension of size 1 may have any stride: it is not a step inside the row
    assert memory.row_layout(torch.empty(20).as_strided((5, 1, 4), (4, 999, 1))) == (16, 16)


def test_a_source_of_no_rows_is_laid_out_whatever_its_strides():
    """numpy gives an empty array strides of 0, contiguous or not: a table of no rows has nothing to lay out."""
    empty = torch.from_numpy(np.zeros((0, 3, 2), np.float32))
    assert memory.row_layout(empty) == (24, 24)
    for source in (np.zeros((0, 3), np.float32), np.ascontiguousarray(np.zeros((0, 3), np.float32))):
        table = hmgstore.HybridTensor(source, "cpu")
        assert table.shape == (0, 3) and table[torch.empty(0, dtype=torch.int64)].shape == (0, 3)


def test_row_layout_refuses_rows_that_are_not_contiguous_or_overlap():
    with pytest.raises(ValueError, match=r"contiguous.*source\.contiguous\(\)"):
        memory.row_layout(torch.empty(10, 4, 4).transpose(1, 2))
    with pytest.raises(ValueError, match="contiguous"):
        memory.row_layout(torch.empty(10, 8)[:, ::2])
    with pytest.raises(ValueError, match="overlap"):
        memory.row_layout(torch.empty(10).as_strided((4, 4), (2, 1)))
    with pytest.raises(ValueError, match="overlap"):
        memory.row_layout(torch.zeros(1, 4).expand(5, 4))


def test_extent_spans_first_to_last_row():
    x = torch.empty(30, 6, dtype=torch.float16)
    assert memory.extent(x) == (x.data_ptr(), 30 * 12)
    base = torch.empty(40, 10)
    cols = base[:, 2:7]
    assert memory.extent(cols) == (base.data_ptr() + 8, 39 * 40 + 20)  # the last row ends before the pitch does
    assert memory.extent(base[5:6, 2:7]) == (base.data_ptr() + 5 * 40 + 8, 20)
    assert memory.extent(torch.empty(0, 4))[1] == 0


# ---- shared segments ---------------------------------------------------------------------
@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """Segments of this test go to a folder of its own."""
    monkeypatch.setenv("HMGSTORE_SHM_DIR", str(tmp_path))
    return tmp_path


def test_segment_dir_follows_the_environment(shm_dir, monkeypatch):
    assert memory.segment_dir() == str(shm_dir)
    monkeypatch.delenv("HMGSTORE_SHM_DIR")
    assert memory.segment_dir() == ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())


def test_segment_created_attached_and_unlinked(shm_dir):
    name, a = memory.create_segment((100, 3), torch.float32)
    assert name.startswith(f"{memory.SEGMENT_PREFIX}{os.getpid()}-") and (shm_dir / name).is_file()
    assert a.shape == (100, 3) and a.dtype == torch.float32 and a.is_contiguous()
    assert (shm_dir / name).stat().st_size == 100 * 3 * 4  # reserved up front
    a.copy_(torch.arange(300.0).view(100, 3))
    b = memory.attach_segment(name, (100, 3), torch.float32)
    assert b.data_ptr() != a.data_ptr()  # a second mapping of the same memory
    assert torch.equal(b, torch.arange(300.0).view(100, 3))  # written in one mapping, seen in the other
    b[7] = -1.0
    assert torch.equal(a[7], torch.full((3,), -1.0))
    as_bytes = memory.attach_segment(name, (1200,), torch.uint8)  # any shape and dtype over the same bytes
    assert torch.equal(as_bytes.view(torch.float32).view(100, 3), a)

    memory.unlink_segment(name)
    assert not (shm_dir / name).exists()
    assert float(b[7, 0]) == -1.0 and float(a[99, 2]) == 299.0  # mappings outlive the name
    memory.unlink_segment(name)  # idempotent
    with pytest.raises(FileNotFoundError, match=name):
        memory.attach_segment(name, (100, 3), torch.float32)


def test_attaching_a_missing_segment_names_it(shm_dir):
    missing = f"{memory.SEGMENT_PREFIX}{os.getpid()}-nothing"
    with pytest.raises(FileNotFoundError, match=f"shared segment {missing} is gone from {shm_dir}"):
        memory.attach_segment(missing, (4, 4), torch.int64)


def test_empty_segment(shm_dir):
    name, t = memory.create_segment((0, 5), torch.int64)
    assert t.shape == (0, 5) and t.dtype == torch.int64
    assert memory.attach_segment(name, (0, 5), torch.int64).shape == (0, 5)
    memory.unlink_segment(name)
    assert list(shm_dir.iterdir()) == []


def test_another_process_sees_and_writes_the_segment(shm_dir):
    name, a = memory.create_segment((4, 8), torch.int32)
    a.copy_(torch.arange(32, dtype=torch.int32).view(4, 8))
    child = textwrap.dedent(f"""
        import torch
        from hmgstore import memory
        t = memory.attach_segment({name!r}, (4, 8), torch.int32)
        assert t.sum().item() == sum(range(32)), t
        t[2] = 1000
    """)
    try:
        done = subprocess.run([sys.executable, "-c", child], env={**os.environ, "HMGSTORE_SHM_DIR": str(shm_dir)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert torch.equal(a[2], torch.full((8,), 1000, dtype=torch.int32))
        assert torch.equal(a[3], torch.arange(24, 32, dtype=torch.int32))
    finally:
        memory.unlink_segment(name)


def test_segments_of_dead_processes_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"{memory.SEGMENT_PREFIX}{dead.pid}-test"
    Path(memory.segment_dir(), name).write_bytes(b"x")
    live = f"{memory.SEGMENT_PREFIX}{os.getpid()}-test"
    Path(memory.segment_dir(), live).write_bytes(b"x")
    try:
        assert name in memory.sweep_stale_segments()
        assert not Path(memory.segment_dir(), name).exists() and Path(memory.segment_dir(), live).exists()
    finally:
        memory.unlink_segment(live)
        memory.unlink_segment(name)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_a_zombie_process_counts_as_gone():
    assert memory.process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.05)
        assert not memory.process_alive(child.pid)  # exited, not yet reaped
    finally:
        child.wait()
    assert not memory.process_alive(child.pid)


def test_segment_too_large_for_shm_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("HMGSTORE_SHM_DIR", str(tmp_path))
    with pytest.raises(MemoryError, match="HMGSTORE_SHM_DIR"):
        memory.create_segment((1 << 50,), torch.uint8)
    assert list(tmp_path.iterdir()) == []


# ---- owned.copy_in --------------------------------------------------------------------------
class _Slices:
    """A source that records which row blocks were read from it."""

    def __init__(self, tensor):
        self.tensor, self.blocks, self.shape = tensor, [], tensor.shape

    def __getitem__(self, rows: slice):
        self.blocks.append((rows.start, rows.stop))
        return self.tensor[rows]


def test_cuda_host_memory_is_freed_with_its_last_tensor_without_a_collection(monkeypatch):
    """backing="cuda": the cudaHostAlloc block goes back the moment its last tensor goes, garbage collection
    off (no reference cycle holds it). cudaHostAlloc/cudaFreeHost stand in as plain memory, so this runs on a
    CPU."""
    held, freed = {}, []

    class Runtime:
        hostAllocPortable = 1
        CUDARuntimeError = RuntimeError

        @staticmethod
        def hostAlloc(nbytes, flags):
            buffer = (ctypes.c_uint8 * nbytes)()
            held[ctypes.addressof(buffer)] = buffer
            return ctypes.addressof(buffer)

        @staticmethod
        def freeHost(ptr):
            freed.append(ptr)
            held.pop(ptr)

    class Cupy:
        cuda = type("cuda", (), {"runtime": Runtime})

    monkeypatch.setattr(owned, "cupy", lambda: Cupy)
    monkeypatch.setattr(owned.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(owned, "synchronize", lambda devices: None)
    gc.disable()
    try:
        t = owned.empty((1000, 8), torch.float32, backing="cuda")
        view = t[10:20]
        assert t.data_ptr() in held and not freed and owned.page_locked_here(t.data_ptr(), t.data_ptr() + 32_000)
        del t
        assert not freed  # a view still holds it
        del view
        assert len(freed) == 1 and not held and not owned.page_locked_here(freed[0], freed[0] + 1)
    finally:
        gc.enable()


@pytest.mark.parametrize("chunk_bytes, blocks", [
    (50, [(0, 2), (2, 4), (4, 6), (6, 7)]),  # 20-byte rows: 2 rows a block, the last one short
    (7, [(k, k + 1) for k in range(7)]),  # smaller than a row: one row at a time
    (1 << 20, [(0, 7)]),  # the whole table at once
])
def test_copy_in_copies_exactly_block_by_block(monkeypatch, chunk_bytes, blocks):
    monkeypatch.setattr(owned, "COPY_CHUNK_BYTES", chunk_bytes)
    src = random_table(7, (5,), torch.float32, seed=3)
    dst = torch.full_like(src, float("nan"))
    recorder = _Slices(src)
    owned.copy_in(dst, recorder, progress=True, desc="test")
    assert recorder.blocks == blocks
    assert_same(dst, src)


def test_copy_in_of_sliced_and_empty_tables(monkeypatch):
    monkeypatch.setattr(owned, "COPY_CHUNK_BYTES", 64)
    base = random_table(1000, (12,), torch.int64, seed=4)
    src = base[:, 3:9]  # rows of 48 bytes, a pitch of 96
    dst = torch.zeros(1000, 6, dtype=torch.int64)
    owned.copy_in(dst, src, progress=False, desc="test")
    assert_same(dst, src)
    out = torch.zeros(2000, 12, dtype=torch.int64)[::2, 2:8]  # a strided destination too
    owned.copy_in(out, src, progress=False, desc="test")
    assert torch.equal(out, src)
    empty = torch.empty(0, 6, dtype=torch.int64)
    owned.copy_in(empty, src[:0], progress=False, desc="test")
    assert empty.shape == (0, 6)


# ---- pinning on a GPU --------------------------------------------------------------------------
@pytest.mark.gpu
def test_already_pinned_source_used_as_is(cuda_device):
    x = random_table(2000, (16,), torch.float32, seed=7).pin_memory()
    t = hmgstore.HybridTensor(x, cuda_device)
    assert t.pinned.tensor.data_ptr() == x.data_ptr()
    idx = torch.randint(0, 2000, (3000,))
    assert_same(t[idx], x[idx])


@pytest.mark.gpu
def test_two_tables_share_one_registration(cuda_device):
    x = random_table((80 << 20) // 256, (64,), torch.float32, seed=8)  # over SMALL_COPY_BYTES: registered
    a = hmgstore.HybridTensor(x, cuda_device)
    b = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(1000))
    assert registered(x.data_ptr())
    a.close()
    idx = torch.randint(0, len(x), (5000,))
    assert_same(b[idx], x[idx])  # still registered for b
    b.close()
    assert not registered(x.data_ptr())


@pytest.mark.gpu
def test_unregistered_on_garbage_collection(cuda_device):
    x = random_table((80 << 20) // 256, (64,), torch.float32, seed=9)
    t = hmgstore.HybridTensor(x, cuda_device)
    assert registered(x.data_ptr())
    del t
    gc.collect()
    assert not registered(x.data_ptr())


# ---- memory pinned by someone else, and tables sent to other processes --------------------------------
CHILD = textwrap.dedent("""
    import sys, torch, hmgstore
    from hmgstore import cuda
    from hmgstore.memory.pinned import PAGE
    rt = cuda.cupy().cuda.runtime
    x = torch.randn(40_000_000 // 64, 16)  # 160 MB: pinned in place, not copied
    start = x.data_ptr() - x.data_ptr() % PAGE
    rt.hostRegister(start, 16 * PAGE, 0)  # another component pinned only the first pages
    table = hmgstore.HybridTensor(x, "cuda")
    idx = torch.randint(0, len(x), (100_000,))
    idx[:2] = torch.tensor([0, len(x) - 1])
    assert torch.equal(table[idx.cuda()].cpu(), x[idx]), "wrong rows"
    table.close()
    assert cuda.host.is_pinned(start), "the other component's pages were unpinned"
    rt.hostUnregister(start)
    torch.cuda.synchronize()
    print("OK")
""")


@pytest.mark.gpu
def test_a_source_pinned_in_part_by_someone_else():
    # A kernel reading a page nobody pinned kills the CUDA context: run it in a child process.
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


@pytest.mark.gpu
def test_an_owner_pinned_source_sent_to_another_process_is_left_in_place():
    from multiprocessing.reduction import ForkingPickler

    x = random_table(200_000, (32,), torch.float32, seed=40).pin_memory()  # pinned by its owner (cudaHostAlloc)
    want = x.clone()
    table = hmgstore.HybridTensor(x, "cuda")
    ForkingPickler.dumps(table)  # as torch's multiprocessing sends it to a DataLoader worker
    assert x.is_pinned() and not x.is_shared()  # the source stayed where the table reads it
    garbage = torch.full_like(x, 7.0).pin_memory()  # would reuse a freed pinned block
    idx = torch.randint(0, len(x), (50_000,))
    assert torch.equal(table[idx.cuda()].cpu(), want[idx])
    del garbage
