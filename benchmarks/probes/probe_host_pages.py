"""Why are small host rows slower than DESIGN.md's figure? Test the page-size hypothesis (GPU only).

    python benchmarks/probes/probe_host_pages.py --out DIR

Hypothesis: rows of a registered malloc'd table sit on 4 KiB pages, and the
GPU's translation of sysmem addresses pays per page; cudaHostAlloc memory
(or THP-backed memory) uses 2 MiB pages. Prediction: for 128 B rows, sorted
ids, the plain registered table runs at ~28 GB/s, the cudaHostAlloc copy and
the huge-page table at ~50 GB/s; 4 KiB rows are unaffected.

Also times the fixed costs of a 500k-id gather, to choose the cheapest
validation: aminmax + read-back, and clamp + narrow + sort + read the ends.
"""
from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import torch

import hmgstore
from hmgstore.bench.gather import hashed_buffer
from hmgstore.bench.timing import median_seconds

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


def madvise(t: torch.Tensor, advice: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    page = 4096
    start = t.data_ptr() // page * page
    end = t.data_ptr() + t.numel() * t.element_size()
    rc = libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)
    return 0 if rc == 0 else ctypes.get_errno()


def gbps(table, ids):
    med, _ = median_seconds(lambda i: table[ids[i % len(ids)]], reps=15, warmup=3, device=ids[0].device)
    return len(ids[0]) * table.row_bytes / med / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench-out/probe")
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    res = {"thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
           if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists() else "n/a"}
    print("THP:", res["thp"])
    nbytes = 2 << 30
    variants = {}
    plain = hashed_buffer(nbytes)
    variants["registered_plain"] = plain
    variants["cudaHostAlloc_copy"] = plain.pin_memory()
    thp = torch.empty_like(plain)
    res["madv_hugepage_errno"] = madvise(thp, MADV_HUGEPAGE)
    thp.copy_(plain)  # first touch after the advice: faults in huge pages where THP allows
    res["madv_collapse_errno"] = madvise(thp, MADV_COLLAPSE)
    variants["registered_thp"] = thp
    collapsed = hashed_buffer(nbytes)
    res["collapse_after_errno"] = madvise(collapsed, MADV_COLLAPSE)
    variants["registered_collapsed_after_fill"] = collapsed
    res["rows"] = []
    for rb in (64, 128, 512, 4096):
        cols = rb // 4
        row = {"row_bytes": rb}
        n = nbytes // rb
        g = torch.Generator().manual_seed(3)
        batch = min(500_000, n // 8)
        ids = [torch.randperm(n, generator=g)[:batch].to(dev) for _ in range(3)]
        for name, buf in variants.items():
            t = hmgstore.HybridTensor(buf.view(-1, cols), dev, progress=False)
            row[name] = gbps(t, ids)
            t.close()
        row["batch"] = batch
        res["rows"].append(row)
        print(row)

    ids = torch.randint(0, 1 << 24, (500_000,), device=dev)
    costs = {}
    costs["aminmax_stack_tolist"] = lambda i: torch.stack(list(torch.aminmax(ids))).tolist()
    costs["aminmax_only"] = lambda i: torch.aminmax(ids)
    costs["clamp_narrow"] = lambda i: ids.clamp(-1, 1 << 24).to(torch.int32)
    ids32 = ids.int()
    costs["sort_int32"] = lambda i: torch.sort(ids32)
    costs["sort_int64"] = lambda i: torch.sort(ids)
    costs["argsort_int32"] = lambda i: torch.argsort(ids32)
    s = torch.sort(ids32).values
    ends = torch.tensor([0, len(s) - 1], device=dev)
    costs["read_ends_tolist"] = lambda i: s[ends].tolist()
    costs["sync_only"] = lambda i: torch.cuda.current_stream().synchronize()
    res["costs_us"] = {k: median_seconds(f, reps=50, warmup=5, device=dev)[0] * 1e6 for k, f in costs.items()}
    print(res["costs_us"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
