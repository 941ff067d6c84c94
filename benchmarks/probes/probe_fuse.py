"""Probe: fused gathers (hmgstore.gather.fusion) on a big table: batches gathered one launch each, or k at a time.

Usage: python benchmarks/probes/probe_fuse.py [--gb 40] [--row-bytes 512 128] [--rows 290000] [--fuse 1 2 4 8]
       > probe_fuse.json

A float32 table in owned cudaHostAlloc memory (a random 1 GB block tiled over it) and its int8 copy
(``compress="int8"``); batches of ``--rows`` distinct random ids on the GPU (a GraphSAGE batch of 1024 seeds,
fanout 15,10,5 on a 20M-node graph reads about 290k rows), gathered one by one (``fuse=1``) or ``k`` at a time
inside ``hmgstore.gather.fusion.fused``. Rates count the float32 bytes asked for, over the median time of a group of
``k`` batches (CUDA events), as a ratio to the pinned H2D limit of this run. Every group's first run is checked
against ``x[idx]`` (the format's decoding of it for int8).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import torch

import hmgstore
from hmgstore.gather.fusion import fused
from hmgstore.memory import owned
from hmgstore.rows import formats
from hmgstore.util.timing import h2d_limit_gbps


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=40)
    p.add_argument("--row-bytes", type=int, nargs="+", default=[512, 128])
    p.add_argument("--rows", type=int, default=290_000)
    p.add_argument("--fuse", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--formats", nargs="+", default=["none", "int8"])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    limit = h2d_limit_gbps(device)
    out = {"device": torch.cuda.get_device_name(device), "h2d_limit_gbps": limit, "date": time.strftime("%F %T"),
           "command": " ".join(sys.argv), "runs": []}
    g = torch.Generator().manual_seed(0)
    for rb in args.row_bytes:
        rows = int(args.gb * 1e9) // rb
        x = owned.empty((rows, rb // 4), torch.float32, "cuda", zero=False)
        block = torch.randn(min(rows, (1 << 30) // rb), rb // 4, generator=g)
        for a in range(0, rows, len(block)):
            x[a:a + len(block)] = block[:rows - a]
        batches = []
        for _ in range(max(args.fuse) * 2):
            ids = torch.unique(torch.randint(0, rows, (int(args.rows * 1.05),), generator=g))[:args.rows]
            batches.append(ids[torch.randperm(len(ids), generator=g)].to(device))
        for name in args.formats:
            t = hmgstore.HybridTensor.over_host_tier(x, device, torch.float32, progress=False) if name == "none" else \
                hmgstore.HybridTensor(x, device, compress=name, progress=False)
            fmt = formats.get(name) if name != "none" else None
            for k in args.fuse:
                groups = [batches[i:i + k] for i in range(0, len(batches) - k + 1, k)][:2]
                times, exact = [], True
                for rep in range(args.reps + 1):
                    group = groups[rep % len(groups)]
                    torch.cuda.synchronize(device)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    if k == 1:
                        results = [t[group[0]]]
                    else:
                        with fused(device, k):
                            results = [t[ids] for ids in group]
                    end.record()
                    end.synchronize()
                    if rep == 0:  # the first run: checked, not timed
                        for ids, r in zip(group, results):
                            want = x[ids.cpu()]
                            want = want if fmt is None else fmt.decode(fmt.encode(want), (rb // 4,))
                            exact &= bool(torch.equal(r.cpu().view(torch.int32), want.view(torch.int32)))
                        continue
                    times.append(start.elapsed_time(end) / 1e3)
                secs = statistics.median(times)
                rate = k * args.rows * rb / secs / 1e9 / limit
                entry = {"gb": args.gb, "row_bytes": rb, "format": name, "fuse": k, "rows_per_batch": args.rows,
                         "group_s": secs, "x_limit": rate, "exact": exact}
                out["runs"].append(entry)
                log(f"{rb} B {name:5s} fuse {k}: {rate:.2f}x the limit ({secs * 1e3 / k:.1f} ms a batch)  "
                    f"exact {exact}")
            if name != "none":
                t.close()
            del t
        del x, batches
        gc.collect()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
