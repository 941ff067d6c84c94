"""Choose the gather kernel's launch geometry by measurement (GPU only).

    python benchmarks/probes/tune_gather.py --out DIR

Sweeps, on the gather benchmark's tables (>= 2 GiB and >= 8 batches of rows)
and batches of 500k distinct random ids:
  1. ids sorted (address order) vs unsorted, host tier, per row size;
  2. threads per block x rows per team (ROWS: loads in flight per thread), host and GPU tier;
  3. SM cap (max_sms): how few SMs saturate PCIe;
  4. the fixed costs of a gather: validation (aminmax + sync) and the sort.
Writes tune.json and tune.md; the constants in hmgstore/cuda/gather.py cite it.
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

import hmgstore
from hmgstore import cuda
from hmgstore.bench.gather import distinct_ids, hashed_buffer, table_bytes
from hmgstore.bench.timing import h2d_limit_gbps, median_seconds
from hmgstore.cuda import gather as kernel
from hmgstore.rows.ids import check_range


def gbps_of(table, ids, reps=10):
    med, _ = median_seconds(lambda i: table[ids[i % len(ids)]], reps=reps, warmup=3, device=ids[0].device)
    return len(ids[0]) * table.row_bytes / med / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench-out/tune")
    p.add_argument("--batch", type=int, default=500_000)
    p.add_argument("--table-gib", type=float, default=2.0)
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    buf = hashed_buffer(table_bytes(4096, args.table_gib, args.batch))
    res = {"device": torch.cuda.get_device_name(dev), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "h2d_limit_gbps": h2d_limit_gbps(dev), "batch": args.batch}
    lines = [f"# gather tuning, {res['device']}, {res['date']}", "",
             f"H2D memcpy limit {res['h2d_limit_gbps']:.1f} GB/s; {args.batch} distinct random ids; "
             "tables of max(2 GiB, 8 batches of rows)", ""]

    def table_at(row_bytes, gpu=False):
        cols = row_bytes // 4
        x = buf[: table_bytes(row_bytes, args.table_gib, args.batch) // 4].view(-1, cols)
        t = hmgstore.HybridTensor(x, dev, gpu_rows=torch.arange(len(x)) if gpu else None, progress=False)
        return t, distinct_ids(len(x), args.batch, 4, dev)

    # 1. sorted vs unsorted
    lines += ["## 1. address order (host tier)", "", "| row B | unsorted GB/s | sorted GB/s |", "|---:|---:|---:|"]
    res["sort"] = []
    for rb in (64, 128, 256, 512, 1024, 2048, 4096):
        t, ids = table_at(rb)
        t.sort_ids = False
        uns = gbps_of(t, ids)
        t.sort_ids = True
        srt = gbps_of(t, ids)
        t.close()
        res["sort"].append({"row_bytes": rb, "unsorted": uns, "sorted": srt})
        lines.append(f"| {rb} | {uns:.1f} | {srt:.1f} |")

    # 2. block x unroll
    configs = [  # (threads per block, ROWS, launch bounds or None)
        (256, 4, None), (256, 4, "256,4"), (256, 2, None), (256, 2, "256,6"),
        (256, 8, None), (128, 8, None), (128, 4, "128,8"), (512, 2, "512,2")]
    names = [f"{b}x{r}" + (f" lb{lb}" if lb else "") for b, r, lb in configs]
    lines += ["", "## 2. launch geometry: threads x ROWS [launch bounds] (GB/s)", "",
              "| tier | row B | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(configs)]
    res["geometry"] = []
    defaults = kernel.BLOCK, kernel.ROWS, kernel.KERNEL_OPTIONS
    for tier, sizes in (("host", (128, 512, 4096)), ("gpu", (128, 512, 1024, 4096))):
        for rb in sizes:
            kernel.BLOCK, kernel.ROWS, kernel.KERNEL_OPTIONS = defaults
            t, ids = table_at(rb, gpu=tier == "gpu")
            row = []
            for (block, rows, lb), name in zip(configs, names):
                kernel.BLOCK, kernel.ROWS = block, rows
                kernel.KERNEL_OPTIONS = (
                    (f"-DLB_THREADS={lb.split(',')[0]}", f"-DLB_MIN_BLOCKS={lb.split(',')[1]}") if lb else ())
                try:
                    g = gbps_of(t, ids)
                except cuda.cupy().cuda.driver.CUDADriverError:  # too many registers for this block size
                    g = float("nan")
                row.append(g)
                res["geometry"].append({"tier": tier, "row_bytes": rb, "config": name, "gbps": g})
            lines.append(f"| {tier} | {rb} | " + " | ".join(f"{g:.1f}" for g in row) + " |")
            t.close()
            torch.cuda.empty_cache()
    kernel.BLOCK, kernel.ROWS, kernel.KERNEL_OPTIONS = defaults

    # 3. SM cap
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    caps = [c for c in (1, 2, 4, 8, 16, 32, 64) if c < sms] + [sms]
    lines += ["", "## 3. SM cap (max_sms), 512 B rows (GB/s)", "",
              "| tier | " + " | ".join(str(c) for c in caps) + " |", "|---|" + "---:|" * len(caps)]
    res["max_sms"] = []
    for tier in ("host", "gpu"):
        t, ids = table_at(512, gpu=tier == "gpu")
        row = []
        for cap in caps:
            t.max_sms = cap
            g = gbps_of(t, ids)
            row.append(g)
            res["max_sms"].append({"tier": tier, "max_sms": cap, "gbps": g})
        lines.append(f"| {tier} | " + " | ".join(f"{g:.1f}" for g in row) + " |")
        t.close()
        torch.cuda.empty_cache()

    # 4. fixed costs
    ids = torch.randint(0, 2**22, (args.batch,), device=dev)
    ids32 = ids.int()
    check_us = median_seconds(lambda i: check_range(ids, 2**22), reps=30, device=dev)[0] * 1e6
    sort_us = median_seconds(lambda i: torch.sort(ids32), reps=30, device=dev)[0] * 1e6
    sort64_us = median_seconds(lambda i: torch.sort(ids), reps=30, device=dev)[0] * 1e6
    res["fixed_costs_us"] = {"check_range": check_us, "sort_int32": sort_us, "sort_int64": sort64_us}
    lines += ["", "## 4. fixed costs per 500k-id batch (us)", "",
              f"check_range (aminmax + sync): {check_us:.1f}; sort int32: {sort_us:.1f}; sort int64: {sort64_us:.1f}"]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps(res, indent=1))
    (out / "tune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
