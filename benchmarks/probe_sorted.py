"""Probe: where the host tier's 128 B rate goes against a plain kernel's (issue 11, item 1), on one GPU.

Usage: python benchmarks/probe_sorted.py [--gb 2] [--row-bytes 128 512] > probe_sorted.json

One owned table (copy=True, 2 MiB pages) per row size, 500k distinct random ids on the GPU. Timed with CUDA
events (median of 20), each as a share of the pinned H2D memcpy limit measured in the same run:
- ``random``: ``table[ids]`` as users call it: sort, kernel with scatter through the sort's permutation;
- ``presorted``: the same ids sorted beforehand, hmgstore's own sort turned off: no sort, rows written in
  order (what the issue's plain-kernel probe measured);
- ``presorted_scatter``: sorted ids, hmgstore's sort off, but the output written through a random
  permutation: the scatter's cost alone;
- ``sort_only``: ``torch.sort`` of the random ids: the sort's cost alone.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json

import torch

import hmgstore
from hmgstore.bench.timing import h2d_limit_gbps, median_seconds
from hmgstore.cuda import gather


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=2)
    p.add_argument("--row-bytes", type=int, nargs="+", default=[128, 512])
    p.add_argument("--batch", type=int, default=500_000)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    limit = h2d_limit_gbps(device)
    report = {"device": torch.cuda.get_device_name(device), "h2d_limit_gbps": limit, "batch": args.batch, "runs": []}
    for rb in args.row_bytes:
        n = int(args.gb * 1e9) // rb
        x = torch.empty(n, rb // 4)
        x.view(torch.int32).random_()
        t = hmgstore.HybridTensor(x, device, copy=True, progress=False)
        ids = torch.randperm(n, device=device)[: args.batch]
        ids32 = ids.to(torch.int32)
        s_ids = torch.sort(ids32).values
        perm = torch.randperm(args.batch, device=device)
        out = torch.empty(args.batch, rb // 4, device=device)

        def direct(i, scatter):
            job = gather.Job(s_ids, perm if scatter else None, out, t._map, t.num_rows, t.row_bytes, t._tiers)
            gather.launch_gather([job], device, torch.cuda.current_stream(device))

        variants = {
            "random": lambda i: t.gather(ids, out=out),
            "presorted": lambda i: direct(i, False),
            "presorted_scatter": lambda i: direct(i, True),
            "sort_only": lambda i: torch.sort(ids32),
        }
        out.fill_(float("nan"))
        direct(0, False)
        assert torch.equal(out.cpu().view(torch.int32), x[s_ids.long().cpu()].view(torch.int32))
        run = {"row_bytes": rb, "table_gb": args.gb}
        useful = args.batch * rb
        for name, fn in variants.items():
            med, _ = median_seconds(fn, reps=20, warmup=3, device=device)
            run[name] = {"seconds": med, "gbps": useful / med / 1e9, "x_limit": useful / med / 1e9 / limit}
        report["runs"].append(run)
        t.close()
        del x
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
