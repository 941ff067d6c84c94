"""Probe: where the host tier's 128 B rate goes against a plain kernel's (issue 11, item 1), on one GPU.

Usage: python benchmarks/probes/probe_sorted.py [--gb 2] [--row-bytes 128 512] > probe_sorted.json

One owned table (copy=True) per row size and ``--backing`` (2 MiB pages, cudaHostAlloc), 500k distinct random ids
on the GPU. Timed with CUDA events (median of 20), each as a share of the pinned H2D memcpy limit measured in the
same run:
- ``random``: ``table[ids]`` as users call it: ids grouped by page (``hmgstore.cuda.order``; a full
  ``torch.sort`` before 2026-11-23), kernel with scatter through the grouping's permutation;
- ``group_only``: that grouping alone;
- ``presorted``: the same ids sorted beforehand, hmgstore's own sort turned off: no sort, rows written in
  order (what the issue's plain-kernel probe measured);
- ``presorted_scatter``: sorted ids, hmgstore's sort off, but the output written through a random
  permutation: the scatter's cost alone;
- ``sort_only``: ``torch.sort`` of the random ids: the sort's cost alone; ``sort_only_int32``: of int32 ids;
- ``random_int32``: ``table[ids]`` with int32 ids (a 32-bit sort);
- ``page_sorted_scatter``: ids ordered by their 2 MiB page only (a sort of page numbers, ids random
  within a page), hmgstore's sort off, rows written through the order: does the kernel need a full sort?
  ``sort_page_only``: that ordering's own cost (the sort of page numbers and the id gather);
- ``back_to_back``: 10 ``table[ids]`` calls queued in one timed window, per call: the rate when the host's
  per-call work overlaps earlier gathers (a loader queueing ahead);
- ``host_us``: the host's own time per ``table[ids]`` call (no synchronisation), median of 50.
With ``--profile FILE``, cProfile's top functions over 300 calls go to FILE.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import statistics
import time

import torch

import hmgstore
from hmgstore.bench.timing import h2d_limit_gbps, median_seconds
from hmgstore.cuda import gather, order


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=2)
    p.add_argument("--row-bytes", type=int, nargs="+", default=[128, 512])
    p.add_argument("--batch", type=int, default=500_000)
    p.add_argument("--profile", default=None)
    p.add_argument("--backing", nargs="+", default=["hugepage", "cuda"],
                   help="owned memory kinds to compare in the same run (2 MiB pages; cudaHostAlloc)")
    args = p.parse_args()
    device = torch.device("cuda", 0)
    limit = h2d_limit_gbps(device)
    report = {"device": torch.cuda.get_device_name(device), "h2d_limit_gbps": limit, "batch": args.batch, "runs": []}
    for rb, backing in itertools.product(args.row_bytes, args.backing):
        n = int(args.gb * 1e9) // rb
        x = torch.empty(n, rb // 4)
        x.view(torch.int32).random_()
        t = hmgstore.HybridTensor(x, device, copy=True, backing=backing, progress=False)
        ids = torch.randperm(n, device=device)[: args.batch]
        ids32 = ids.to(torch.int32)
        s_ids = torch.sort(ids32).values
        perm = torch.randperm(args.batch, device=device)
        out = torch.empty(args.batch, rb // 4, device=device)

        rows_per_page = max(1, (2 << 20) // rb)
        page_order = torch.sort((ids32 // rows_per_page), stable=False).indices
        p_ids = ids32[page_order]

        def direct(i, scatter, sorted_ids=s_ids, positions=perm):
            job = gather.Job(sorted_ids, positions if scatter else None, out, t.row_map, t.num_rows, t.row_bytes,
                             t.tiers)
            gather.launch_gather([job], device, torch.cuda.current_stream(device))

        def page_sort(i):
            order = torch.sort((ids32 // rows_per_page), stable=False).indices
            return ids32[order]

        def back_to_back(i):
            for _ in range(10):
                t.gather(ids, out=out)

        variants = {
            "random": lambda i: t.gather(ids, out=out),
            "presorted": lambda i: direct(i, False),
            "presorted_scatter": lambda i: direct(i, True),
            "sort_only": lambda i: torch.sort(ids),
            "sort_only_int32": lambda i: torch.sort(ids32),
            "group_only": lambda i: order.group_by_page(ids, t.num_rows, order.bucket_shift(rb)),
            "random_int32": lambda i: t.gather(ids32, out=out),
            "page_sorted_scatter": lambda i: direct(i, True, p_ids, page_order),
            "sort_page_only": page_sort,
            "back_to_back": back_to_back,
        }
        out.fill_(float("nan"))
        direct(0, False)
        assert torch.equal(out.cpu().view(torch.int32), x[s_ids.long().cpu()].view(torch.int32))
        run = {"row_bytes": rb, "table_gb": args.gb, "backing": backing}
        useful = args.batch * rb
        out.fill_(float("nan"))
        direct(0, True, p_ids, page_order)
        assert torch.equal(out.cpu().view(torch.int32)[page_order.cpu()], x[p_ids.long().cpu()].view(torch.int32))
        for name, fn in variants.items():
            med, _ = median_seconds(fn, reps=20, warmup=3, device=device)
            if name == "back_to_back":
                med /= 10
            run[name] = {"seconds": med, "gbps": useful / med / 1e9, "x_limit": useful / med / 1e9 / limit}
        host = []
        for _ in range(50):
            torch.cuda.synchronize(device)
            a = time.perf_counter()
            t.gather(ids, out=out)
            host.append(time.perf_counter() - a)
        run["host_us"] = statistics.median(host) * 1e6
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for i in range(300):
                t.gather(ids, out=out)
                if i % 10 == 9:
                    torch.cuda.synchronize(device)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
            with open(f"{args.profile}.{rb}.{backing}", "w") as f:
                f.write(text.getvalue())
        report["runs"].append(run)
        t.close()
        del x
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
