"""Probe: rows each gather thread keeps in flight (the kernel's ROWS) for peer reads of small rows.

Usage: python benchmarks/probes/probe_peer_rows.py [--rows 4 8 16] [--row-bytes 128 256 512] [--reps 10] --out DIR
       > probe_peer_rows.json

For each ROWS value, runs ``python -m hmgstore.bench peer`` (all GPUs at once, every variant checked bit
for bit against ``x[ids]`` before it is timed) with the gather kernel built for that value
(``hmgstore.cuda.gather.ROWS``, which also sizes the tiles). Prints, per row size, the remote gather with host
ids and with ids already on the GPU, as GB/s and as a ratio to the peer memcpy of the same run. What the
kernel keeps in flight per thread is ROWS loads of 16 bytes: at 128 B rows a team of 8 threads covers a row,
so one thread's share of a tile is ROWS rows' 16 B each; the id and map reads before them are two dependent
HBM round trips a tile, which a larger ROWS spreads over more bytes.
"""
from __future__ import annotations

import argparse
import json
import sys

from hmgstore.bench import __main__ as bench
from hmgstore.cuda import gather


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--row-bytes", nargs="+", default=["128", "256", "512"])
    p.add_argument("--reps", default="10")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    found = {}
    for rows in a.rows:
        gather.ROWS = rows
        args = bench.parse_args(["peer", "--row-bytes", *a.row_bytes, "--reps", a.reps, "--no-progress",
                                 "--out", f"{a.out}/rows{rows}"])
        report = bench.BENCHMARKS["peer"].run(args)
        report.pop("_table_text", None)
        memcpy = report["peer_memcpy"]["start"]["gbps_mean"]
        for size in report["sizes"]:
            v = size["variants"]
            line = {name: round(v[name]["gbps_mean"], 1) for name in ("hmg_remote", "hmg_remote_gpu_ids", "hmg_alone",
                                                                      "index_select_copy")}
            line.update({f"{name}_x_memcpy": round(v[name]["gbps_mean"] / memcpy, 3)
                         for name in ("hmg_remote", "hmg_remote_gpu_ids")})
            line["peer_memcpy"] = round(memcpy, 1)
            found[f"rows{rows}/{size['row_bytes']}"] = line
            print(f"ROWS={rows:2d} {size['row_bytes']:4d} B: {line}", file=sys.stderr, flush=True)
    json.dump(found, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
