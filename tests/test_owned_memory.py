"""hmgstore.memory.owned: host memory hmgstore allocates (2 MiB pages or cudaHostAlloc), and what a forked
DataLoader worker gets of a table (a copy of memory pinned in place, a share of owned or shared memory).
"""
from __future__ import annotations

import gc
import os
import re

import numpy as np
import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore import memory
from hmgstore.memory import owned


# ---- owned memory: huge pages hmgstore allocates -------------------------------------------------
def test_owned_hugepage_memory_is_aligned_zeroed_and_writable():
    t = owned.empty((3000, 37), torch.float32, backing="hugepage")
    assert t.shape == (3000, 37) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % owned.HUGE_PAGE == 0
    assert not t.any()
    t[5] = 1.5
    assert float(t[5, 36]) == 1.5 and not t[4].any()
    assert owned.empty((0, 4), torch.int64).shape == (0, 4)
    assert owned.transparent_huge_pages() in ("always", "madvise", "never", "unknown")


def test_owned_memory_checks_its_arguments():
    with pytest.raises(ValueError, match="backing"):
        owned.empty((4,), torch.float32, backing="malloc")
    with pytest.raises(ValueError, match="negative"):
        owned.empty((-1, 4), torch.float32)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a GPU"):
            owned.empty((4,), torch.float32, backing="cuda")


def test_owned_memory_outlives_views_and_copies_convert():
    src = random_table(1000, (6,), torch.float32, seed=41)
    copy = owned.copy_of(src, torch.bfloat16, progress=False)
    view = copy[10:20]
    del copy
    gc.collect()
    assert torch.equal(view, src[10:20].bfloat16())  # the mapping lives as long as a view of it


@pytest.mark.gpu
def test_owned_cuda_memory_is_page_locked_and_freed(cuda_device):
    t = owned.empty((1 << 20, 4), torch.float32, backing="cuda")  # 16 MB
    assert t.is_pinned() and owned.page_locked_here(t.data_ptr(), t.data_ptr() + t.nbytes)
    start = t.data_ptr()
    del t
    gc.collect()
    assert not owned.page_locked_here(start, start + 16)


# ---- fork: what a forked DataLoader worker gets of a pinned table ---------------------------------
def test_auto_backing_is_page_locked_for_gpu_tables_only():
    gpu = "cuda" if torch.cuda.is_available() else "hugepage"  # without a GPU the device check speaks, not this
    assert owned.chosen("auto", "cpu") == "hugepage" and owned.chosen("auto", torch.device("cuda", 0)) == gpu
    assert owned.chosen("auto") == gpu
    assert owned.chosen("hugepage", "cuda") == "hugepage" and owned.chosen("cuda", "cpu") == "cuda"
    with pytest.raises(ValueError, match="backing"):
        owned.chosen("malloc")
    t = hmgstore.HybridTensor(random_table(100, (4,), torch.float32), "cpu", copy=True)
    assert memory.private_anonymous_bytes(t.source.data_ptr(), t.source.data_ptr() + t.source.nbytes) > 0


def test_private_anonymous_bytes_tell_what_a_fork_would_copy(tmp_path):
    import mmap

    heap = torch.empty(32 << 20, dtype=torch.uint8)
    assert memory.private_anonymous_bytes(heap.data_ptr(), heap.data_ptr() + heap.nbytes) == heap.nbytes
    shared_map = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    view = torch.frombuffer(shared_map, dtype=torch.uint8)
    assert memory.private_anonymous_bytes(view.data_ptr(), view.data_ptr() + view.nbytes) == 0
    on_disk = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(1 << 20,))
    address = on_disk.ctypes.data
    assert memory.private_anonymous_bytes(address, address + on_disk.nbytes) == 0  # a file: not copied
    del view, on_disk


def test_a_fork_that_copies_pinned_tables_warns_once(monkeypatch, caplog):
    from hmgstore.memory import pinned

    monkeypatch.setattr(pinned, "_fork_warned", False)
    monkeypatch.setattr(pinned._registry, "copied_at_fork", lambda: 3 << 30)
    with caplog.at_level("WARNING", logger="hmgstore.memory.pinned"):
        pinned._before_fork()
        pinned._before_fork()
    said = [r.getMessage() for r in caplog.records if "fork" in r.getMessage()]
    assert (len(said) == 1 and "3.22 GB" in said[0] and "copy=True" in said[0] and "hugepage" in said[0]
            and "share_memory_" in said[0])
    monkeypatch.setattr(pinned, "_fork_warned", False)
    monkeypatch.setattr(pinned._registry, "copied_at_fork", lambda: pinned.FORK_WARN_BYTES - 1)
    caplog.clear()
    pinned._before_fork()
    assert not caplog.records


def test_the_fork_hook_runs_at_os_fork_and_a_child_copies_nothing_more(monkeypatch, caplog):
    from hmgstore.memory import pinned

    monkeypatch.setattr(pinned, "_fork_warned", False)
    monkeypatch.setitem(pinned._registry._ranges, (1 << 40, (1 << 40) + (1 << 30)), [1, [], 1 << 30])
    r, w = os.pipe()
    with caplog.at_level("WARNING", logger="hmgstore.memory.pinned"):
        pid = os.fork()
        if pid == 0:  # the child: its copy of the pages is not pinned, so its own forks copy nothing
            os.write(w, str(pinned._registry.copied_at_fork()).encode())
            os._exit(0)
        os.close(w)
        child_counts = int(os.read(r, 64).decode())
        os.waitpid(pid, 0)
    assert child_counts == 0 and pinned._registry.copied_at_fork() >= 1 << 30
    assert any("fork copies the 1.07 GB" in rec.getMessage() for rec in caplog.records)


def _forked_child_reads(table, idx) -> dict:
    """Fork; the child reports its resident bytes of the table's source and whether it reads ``idx`` right."""
    import json

    source = table.source
    start, end = source.data_ptr(), source.data_ptr() + source.nbytes
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no CUDA here, only host memory
        try:
            rss = 0
            with open("/proc/self/smaps") as f:
                inside = False
                for line in f:
                    head = line.split()[0]
                    if "-" in head and all(c in "0123456789abcdef-" for c in head):
                        low, high = (int(a, 16) for a in head.split("-"))
                        inside = low < end and start < high
                    elif inside and head == "Rss:":
                        rss += int(line.split()[1]) * 1024
            rows = source[idx].clone()
            os.write(w, json.dumps({"rss": rss, "rows": rows.flatten().tolist()}).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = json.loads(f.read().decode())
    os.waitpid(pid, 0)
    return said


@pytest.mark.gpu
def test_forked_processes_share_owned_gpu_tables_and_are_warned_of_pinned_ones(cuda_device, monkeypatch, caplog):
    from hmgstore.memory import pinned

    x = random_table(600_000, (32,), torch.float32, seed=71)  # 77 MB: registered in place, not copied
    idx = torch.tensor([0, 5, 599_999])
    owned_table = hmgstore.HybridTensor(x, cuda_device, copy=True)  # "auto": cudaHostAlloc
    assert owned.page_locked_here(owned_table.source.data_ptr(), owned_table.source.data_ptr() + 16)
    monkeypatch.setattr(pinned, "_fork_warned", False)
    # what earlier tests left registered stays under the bar; x pinned in place goes over it
    monkeypatch.setattr(pinned, "FORK_WARN_BYTES", pinned._registry.copied_at_fork() + x.nbytes // 2)
    with caplog.at_level("WARNING", logger="hmgstore.memory.pinned"):
        child = _forked_child_reads(owned_table, idx)
    assert not caplog.records  # nothing is copied: nothing to warn of
    assert child["rss"] < x.nbytes // 10  # the child mapped only the pages it read
    assert torch.equal(torch.tensor(child["rows"]).view(3, 32), x[idx])
    in_place = hmgstore.HybridTensor(x, cuda_device)  # the caller's private pages, pinned where they are
    assert pinned._registry.copied_at_fork() >= x.nbytes
    with caplog.at_level("WARNING", logger="hmgstore.memory.pinned"):
        child = _forked_child_reads(in_place, idx)
    assert torch.equal(torch.tensor(child["rows"]).view(3, 32), x[idx])
    assert any(re.search(r"fork copies the \d+\.\d\d GB", r.getMessage()) for r in caplog.records)
    assert_same(in_place[idx.to(cuda_device)].cpu(), x[idx])  # the parent's table is unharmed
    assert_same(owned_table[idx.to(cuda_device)].cpu(), x[idx])
