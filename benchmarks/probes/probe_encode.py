"""Probe: how fast the CPU encodes float32 rows into each stored format (hmgstore.rows.formats).

Usage: python benchmarks/probes/probe_encode.py [--rows 4000000] [--width 128] [--repeat 5] > encode.json

Why. Building a compressed table (``compress=``/``host_dtype=``) encodes every row on the CPU first: on a
papers-sized table that is minutes, and docs/big-tables.md quotes the rate. Method: random normal rows (every
row finite, so the NaN/infinity check passes), each format's ``encode`` over all of them, ``--repeat`` times;
the fastest and the slowest run, in seconds per million rows, with torch's thread count. Prints one JSON
object (probe, date, hmgstore, threads, args, formats) to stdout.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

import hmgstore
from hmgstore.rows import formats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--width", type=int, default=128, help="values a row")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--formats", nargs="+", default=["int8", "float8", "bfloat16", "float16"])
    args = p.parse_args()
    torch.manual_seed(0)
    rows = torch.randn(args.rows, args.width)
    result = {"probe": "encode", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "hmgstore": hmgstore.__version__, "threads": torch.get_num_threads(), "args": vars(args), "formats": {}}
    for name in args.formats:
        fmt = formats.get(name)
        runs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fmt.encode(rows)
            runs.append((time.perf_counter() - start) / args.rows * 1e6)
        result["formats"][name] = {"s_per_million_rows": {"min": min(runs), "max": max(runs)}, "runs": runs}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
