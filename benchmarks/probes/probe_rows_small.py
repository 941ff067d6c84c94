"""Probe: rows each gather thread keeps in flight (the kernel's ROWS) for small rows in GPU memory, on one GPU.

Usage: python benchmarks/probes/probe_rows_small.py [--rows 4 8 16] [--row-bytes 64 128 256 512] > probe.json

A stand-in for peer reads of small rows (benchmarks/probes/probe_peer_rows.py needs 2 GPUs): a 4 GiB table wholly
in GPU memory (``HybridTensor(x, "cuda", gpu_rows=all)``), 1M distinct random ids already on the GPU,
gathered with the kernel built for each ROWS value (``hmgstore.cuda.gather.ROWS``), against ``index_select``
of the same rows. Every variant's output is poisoned, then checked bit for bit against ``x[ids]``, before it
is timed (median of 20 runs, CUDA events). GB/s count the rows' bytes delivered.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import hmgstore
from hmgstore.cuda import gather


def timed(fn, reps: int = 20) -> float:
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--row-bytes", type=int, nargs="+", default=[64, 128, 256, 512])
    p.add_argument("--table-gib", type=float, default=4)
    p.add_argument("--ids", type=int, default=1_000_000)
    a = p.parse_args()
    found = {"device": torch.cuda.get_device_name(), "ids": a.ids}
    for row_bytes in a.row_bytes:
        n = int(a.table_gib * 2**30) // row_bytes
        x = torch.arange(n * row_bytes // 4, dtype=torch.int32).view(n, row_bytes // 4).view(torch.float32)
        table = hmgstore.HybridTensor(x, "cuda", gpu_rows=torch.arange(n), progress=False)
        on_gpu = x.cuda()
        ids = torch.randperm(n, device="cuda")[:a.ids]
        want = on_gpu[ids]
        out = torch.empty_like(want)
        line = {"index_select_gbps": round(want.nbytes / timed(lambda: torch.index_select(on_gpu, 0, ids, out=out))
                                           / 1e9, 1)}
        for rows in a.rows:
            gather.ROWS = rows
            out.view(torch.int32).fill_(-1)
            table.gather(ids, out=out)
            if not torch.equal(out.view(torch.int32), want.view(torch.int32)):
                raise AssertionError(f"ROWS={rows}, {row_bytes} B: wrong rows")
            gbps = want.nbytes / timed(lambda: table.gather(ids, out=out)) / 1e9
            line[f"rows{rows}_gbps"] = round(gbps, 1)
            line[f"rows{rows}_x_index_select"] = round(gbps / line["index_select_gbps"], 3)
        found[str(row_bytes)] = line
        print(row_bytes, line, file=sys.stderr, flush=True)
        gather.ROWS = 4
        table.close()
        del on_gpu, want, out, ids, x
        torch.cuda.empty_cache()
    json.dump(found, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
