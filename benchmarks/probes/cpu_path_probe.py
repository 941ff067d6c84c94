"""CPU gathers, hmgstore against torch.index_select, timed in turns (issue 30, item 9).

On a shared machine the load changes from second to second, so a table of
variants timed one after another (``bench gather``) can be off by 2-9x either
way. Here each rep times every variant once, in turn, and the figure is the
median over reps of index_select's time over hmgstore's in the same rep
(above 1: hmgstore is faster). The order rotates from rep to rep: under 32 MB
a result reuses the heap memory the previous variant freed, and a fixed order
gave the first variant 10-20% of page faults the others did not pay.

    python benchmarks/probes/cpu_path_probe.py [--reps 31]

Prints one line per row size: GB/s of each variant (medians) and the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import hmgstore
from hmgstore.bench.gather import hashed_buffer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=31)
    p.add_argument("--batch", type=int, default=50_000)
    args = p.parse_args()
    buf = hashed_buffer(8 * args.batch * 4096)
    buf.view(torch.int32).bitwise_and_(~(1 << 30))  # |x| < 2: the hashed bits would pass bfloat16's range
    for row_bytes, nbytes in ((128, 2**27), (512, 8 * args.batch * 512), (4096, 8 * args.batch * 4096)):
        cols = row_bytes // 4
        probe(buf[: nbytes // row_bytes * cols].view(-1, cols), row_bytes, args)


def probe(x: torch.Tensor, row_bytes: int, args) -> None:
    """Time every variant on ``x`` (float32 [N, row_bytes / 4]) in turns, and print the line."""
    cols = row_bytes // 4
    xb = x.bfloat16()
    ids = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[: args.batch]
    table = hmgstore.HybridTensor(x, "cpu", progress=False)
    half = hmgstore.HybridTensor(x, "cpu", progress=False, host_dtype=torch.bfloat16)
    reused = torch.empty(args.batch, cols)
    variants = {
        "hmg": lambda: table[ids], "index_select": lambda: torch.index_select(x, 0, ids),
        "hmg_out": lambda: table.gather(ids, out=reused),
        "index_select_out": lambda: torch.index_select(x, 0, ids, out=reused),
        "hmg_bf16": lambda: half[ids], "bf16_index_select_float": lambda: torch.index_select(xb, 0, ids).float(),
    }
    times = {k: [] for k in variants}
    names = list(variants)
    for rep in range(args.reps):  # each rep starts one variant later: none always follows another's frees
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            fn = variants[name]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    gbps = {k: args.batch * row_bytes / statistics.median(v) / 1e9 for k, v in times.items()}
    ratios = {f"{a}/{b}": statistics.median(s / t for s, t in zip(times[b], times[a]))
              for a, b in (("hmg", "index_select"), ("hmg_out", "index_select_out"),
                           ("hmg_bf16", "bf16_index_select_float"))}
    print(f"{row_bytes:5d} B  " + "  ".join(f"{k} {v:.2f}" for k, v in gbps.items()) + "  |  "
          + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()), flush=True)
    table.close()
    half.close()


if __name__ == "__main__":
    main()
