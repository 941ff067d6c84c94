"""Probe: what ``fork`` (DataLoader workers) does to a pinned host table, by how the table's memory was made.

Usage: python benchmarks/probes/probe_fork.py [--gb 4] > probe_fork.json

Linux copies a private anonymous page at fork time when it may be pinned for DMA (since 5.11), so a
registered table could be copied whole into every forked worker. For each kind of host memory, the probe
fills ``--gb`` of it, forks one child and reports: how long ``fork`` took, how much memory the system lost
while the child lived, whether the child sees the table (and reads it right), and how many of the
parent's bytes are in huge pages. Then the zero-copy rate at 128 B rows of a table over each memory
(500k random ids), since the backing decides that rate too. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time

import torch

import hmgstore
from hmgstore.cuda.host import host_register
from hmgstore.memory import owned


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def vma_stats(pid: str, start: int, end: int) -> dict:
    """Rss and huge-page bytes of the mappings of ``pid`` that meet ``[start, end)``; ``present`` if any."""
    found = {"present": False, "rss": 0, "huge": 0, "flags": ""}
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a < end and start < b
                found["present"] |= inside
            elif inside and head in ("Rss:",):
                found["rss"] += int(line.split()[1]) * 1024
            elif inside and head in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:"):
                found["huge"] += int(line.split()[1]) * 1024
            elif inside and head == "VmFlags:":
                found["flags"] = " ".join(line.split()[1:])
    return found


def fork_once(t: torch.Tensor) -> dict:
    start, end = t.data_ptr(), t.data_ptr() + t.numel()
    before = mem_available()
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    began = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: does it see the table, and read it right?
        os.close(r)
        seen = vma_stats("self", start, end)
        if seen["present"]:
            import ctypes
            seen["first_last"] = [ctypes.string_at(start, 1)[0], ctypes.string_at(end - 1, 1)[0]]
        os.write(w, json.dumps(seen).encode())
        os.close(w)
        os.read(go_r, 1)  # live until the parent has measured
        os._exit(0)
    forked = time.perf_counter() - began
    os.close(w)
    child = json.loads(os.read(r, 1 << 16).decode())
    lost = before - mem_available()
    os.write(go_w, b"x")
    os.waitpid(pid, 0)
    return {"fork_s": round(forked, 3), "memory_lost_gb": round(lost / 1e9, 2), "child": child}


def gather_rate(t: torch.Tensor, device) -> float:
    """Share of nothing: GB/s of a 128 B-row zero-copy gather of 500k random ids over ``t`` (pinned in place)."""
    rows = t.view(torch.float32).view(-1, 32)
    table = hmgstore.HybridTensor(rows, device, progress=False)
    ids = torch.randint(0, rows.shape[0], (500_000,))
    times = []
    for _ in range(12):
        torch.cuda.synchronize()
        a = time.perf_counter()
        table[ids]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - a)
    table.close()
    return round(ids.numel() * 128 / sorted(times[2:])[len(times[2:]) // 2] / 1e9, 1)


def kinds(nbytes: int):
    def anon(shared: bool, dontfork: bool = False):
        flags = (mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE) | mmap.MAP_ANONYMOUS
        m = mmap.mmap(-1, nbytes + owned.HUGE_PAGE, flags=flags)
        whole = torch.frombuffer(m, dtype=torch.uint8)
        offset = (-whole.data_ptr()) % owned.HUGE_PAGE
        m.madvise(mmap.MADV_HUGEPAGE, offset, nbytes)
        if dontfork:
            m.madvise(mmap.MADV_DONTFORK, offset, nbytes)
        return whole[offset:offset + nbytes]

    yield "malloc, registered (pin in place)", lambda: torch.empty(nbytes, dtype=torch.uint8), True
    yield "owned hugepage (private mmap), registered", lambda: owned.empty((nbytes,), torch.uint8, "hugepage"), True
    yield "owned cuda (cudaHostAlloc)", lambda: owned.empty((nbytes,), torch.uint8, "cuda"), False
    yield "torch pin_memory", lambda: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), False
    yield "shared mmap + MADV_HUGEPAGE, registered", lambda: anon(True), True
    yield "private mmap + MADV_DONTFORK, registered", lambda: anon(False, True), True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    nbytes = int(args.gb * 1e9) // owned.HUGE_PAGE * owned.HUGE_PAGE
    sysfs = {}
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
                sysfs[name] = f.read().strip()
        except OSError:
            sysfs[name] = None
    report = {"device": torch.cuda.get_device_name(device), "kernel": os.uname().release, "thp": sysfs,
              "gb": args.gb, "kinds": {}}
    torch.zeros(1, device=device)
    for name, make, register in kinds(nbytes):
        t = make()
        t.fill_(7)
        if register:
            host_register(t.data_ptr(), t.numel(), False)
        row = {"parent": vma_stats("self", t.data_ptr(), t.data_ptr() + t.numel())}
        row.update(fork_once(t))
        if register:
            from hmgstore.cuda.host import host_unregister
            host_unregister(t.data_ptr())
        try:
            row["gather_128B_GBps"] = gather_rate(t, device)
        except Exception as err:  # the rate is a side figure; the fork facts are the point
            row["gather_error"] = repr(err)
        report["kinds"][name] = row
        print(name, json.dumps(row), file=sys.stderr, flush=True)
        del t
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
