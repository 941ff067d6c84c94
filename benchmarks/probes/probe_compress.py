"""Probe: compressed host rows on big tables, beside the plain kernel and the CPU path, same tables and ids.

Usage: python benchmarks/probes/probe_compress.py [--gb 2 8 40] [--row-bytes 128 512] [--formats bfloat16 float8 int8]
       > probe_compress.json

For each table size and row size: a float32 table in owned cudaHostAlloc memory (a 1 GB random block
tiled over it), then each stored format built from it (``compress=``, both tiers; no GPU tier here), and for
each: 500k distinct random ids (on the GPU) gathered by the kernel, and the CPU path (index_select of the stored
rows into pinned staging, one copy, decoded on the GPU). Every first gather is compared bit for bit with the
format's own decoding of ``x[idx]``. Rates count the float32 bytes asked for (the *effective* rate) and, apart,
the stored bytes that crossed PCIe; pages are the distinct 2 MiB pages of the stored table a batch touches.
Ratios are to the pinned H2D limit measured at the start of the run.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import torch

import hmgstore
from hmgstore.graph.locality import pages_touched
from hmgstore.memory import owned
from hmgstore.rows import formats
from hmgstore.util.timing import h2d_limit_gbps, median_seconds


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def random_table(nbytes: int, row_bytes: int) -> torch.Tensor:
    rows = nbytes // row_bytes
    x = owned.empty((rows, row_bytes // 4), torch.float32, "cuda", zero=False)
    block = torch.randn(min(rows, (1 << 30) // row_bytes), row_bytes // 4, generator=torch.Generator().manual_seed(0))
    block *= torch.logspace(-2, 2, len(block))[:, None]  # rows of many magnitudes
    for a in range(0, rows, len(block)):
        x[a:a + len(block)] = block[:rows - a]
    return x


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, nargs="+", default=[2, 8, 40])
    p.add_argument("--row-bytes", type=int, nargs="+", default=[128, 512])
    p.add_argument("--formats", nargs="+", default=["bfloat16", "float8", "int8"])
    p.add_argument("--batch", type=int, default=500_000)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--split", action="store_true", help="also the split CPU+GPU gather (CPU ids), share measured")
    p.add_argument("--rows-sweep", type=int, nargs="*", default=[],
                   help="also the kernel alone for batches of these many distinct random ids (does a batch's rate "
                        "grow with its rows on a table whose every page it touches?)")
    args = p.parse_args()
    device = torch.device("cuda", 0)
    limit = h2d_limit_gbps(device)
    log(f"H2D limit {limit:.1f} GB/s")
    results = {"device": torch.cuda.get_device_name(device), "h2d_limit_gbps": limit, "date": time.strftime("%F %T"),
               "command": " ".join(sys.argv), "runs": []}
    for gb in args.gb:
        for rb in args.row_bytes:
            start = time.perf_counter()
            x = random_table(int(gb * 1e9), rb)
            n = len(x)
            log(f"{gb} GB, {rb} B: table of {n} rows in {time.perf_counter() - start:.1f} s")
            g = torch.Generator().manual_seed(1)
            sets = [torch.unique(torch.randint(0, n, (args.batch,), generator=g))[:int(args.batch * 0.9)]
                    for _ in range(3)]
            k = min(len(s) for s in sets)
            sets = [s[torch.randperm(len(s), generator=g)][:k] for s in sets]  # random order, as a sampler gives
            on_gpu = [s.to(device) for s in sets]
            out = torch.empty((k, rb // 4), dtype=torch.float32, device=device)
            for name in ["none", *args.formats]:
                entry = {"gb": gb, "row_bytes": rb, "format": name, "ids": k}
                start = time.perf_counter()
                if name == "none":
                    t = hmgstore.HybridTensor.over_host_tier(x, device, torch.float32, progress=False)
                    want = x[sets[0]]
                else:
                    t = hmgstore.HybridTensor(x, device, compress=name, progress=False)
                    fmt = formats.get(name)
                    want = fmt.decode(fmt.encode(x[sets[0]]), (rb // 4,))
                entry["build_s"] = time.perf_counter() - start
                stored_row = t.source[:1].numel() * t.source.element_size()
                entry["stored_row_bytes"] = stored_row
                entry["pages_per_batch"] = pages_touched(sets[0], stored_row)
                out.fill_(float("nan"))
                entry["exact"] = bool(torch.equal(t.gather(on_gpu[0], out=out).cpu().view(torch.int32),
                                                  want.view(torch.int32)))
                secs, _ = median_seconds(lambda i: t.gather(on_gpu[i % 3], out=out), reps=args.reps, device=device)
                entry["kernel_s"] = secs
                entry["kernel_x_limit"] = k * rb / secs / 1e9 / limit
                entry["kernel_stored_x_limit"] = k * stored_row / secs / 1e9 / limit
                entry["rows_sweep"] = {}
                for m in args.rows_sweep:
                    ids = [torch.unique(torch.randint(0, n, (int(m * 1.1),), generator=g))[:m] for _ in range(2)]
                    ids = [i[torch.randperm(len(i), generator=g)].to(device) for i in ids]
                    dst = torch.empty((m, rb // 4), dtype=torch.float32, device=device)
                    secs_m, _ = median_seconds(lambda i: t.gather(ids[i % 2], out=dst), reps=5, device=device)
                    entry["rows_sweep"][m] = {"x_limit": m * rb / secs_m / 1e9 / limit,
                                              "pages": pages_touched(ids[0].cpu(), stored_row)}
                    log(f"  {name:9s} {m:8d} ids: {entry['rows_sweep'][m]['x_limit']:.2f}x, "
                        f"{entry['rows_sweep'][m]['pages']} pages")
                    del dst, ids
                source = t.source
                staging = torch.empty((k, *source.shape[1:]), dtype=source.dtype, pin_memory=True)
                landed = torch.empty((k, *source.shape[1:]), dtype=source.dtype, device=device)

                def cpu_path(i):
                    torch.index_select(source, 0, sets[i % 3], out=staging)
                    landed.copy_(staging, non_blocking=True)
                    out.copy_(landed if name == "none" else t.host_format.decode(landed, (rb // 4,)))

                secs, _ = median_seconds(cpu_path, reps=max(3, args.reps // 2), wall=True, device=device)
                entry["cpu_s"] = secs
                entry["cpu_x_limit"] = k * rb / secs / 1e9 / limit
                if args.split:
                    t.set_split("auto")
                    start = time.perf_counter()
                    exact = torch.equal(t.gather(sets[0], out=out).cpu().view(torch.int32), want.view(torch.int32))
                    entry["split_model_s"] = time.perf_counter() - start  # the first batch measures the share
                    entry["split_share"] = t.split_setting.shares.get(hmgstore.gather.cpu_share.batch_class(k), 0.0)
                    secs, _ = median_seconds(lambda i: t.gather(sets[i % 3], out=out), reps=max(3, args.reps // 2),
                                             wall=True, device=device)
                    entry["split_x_limit"] = k * rb / secs / 1e9 / limit
                    entry["split_exact"] = exact
                    t.set_split(None)
                    log(f"  {name:9s} split share {entry['split_share']:.2f}: {entry['split_x_limit']:.2f}x "
                        f"exact {exact}")
                log(f"  {name:9s} stored {stored_row:4d} B  pages {entry['pages_per_batch']:6d}  "
                    f"exact {entry['exact']}  kernel {entry['kernel_x_limit']:.2f}x "
                    f"(stored {entry['kernel_stored_x_limit']:.2f}x)  "
                    f"cpu {entry['cpu_x_limit']:.2f}x  build {entry['build_s']:.1f} s")
                results["runs"].append(entry)
                if name != "none":
                    t.close()
                del t, staging, landed
                gc.collect()
            del x
            gc.collect()
    results["h2d_limit_gbps_end"] = h2d_limit_gbps(device)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
