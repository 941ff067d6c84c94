"""Probe: where a split gather's time goes (hmgstore.gather.cpu_share), phase by phase, on one GPU.

Usage: python benchmarks/probes/probe_split.py [--gb 2 8] [--row-bytes 512 128] [--cpu-methods] > probe_split.log

For each table (owned memory, copy=True: 2 MiB pages before 2026-11-23, cudaHostAlloc since) and 500k distinct
random CPU ids:
- the CPU gather alone, by method and thread count: numpy.take in k Python threads (does it drop the GIL?),
  torch.index_select in k Python threads on chunks small enough to run inline, torch.index_select in one call
  (torch's own pool);
- the kernel alone and the CPU path alone (shares 0 and 1) and splits at several shares, with the host
  time of each phase (launch, CPU take, copy + scatter) and the kernel's own time from CUDA events;
- the CPU's reads timed alone and while a kernel-only gather of the other rows runs (interference);
- with --variance S: the spread (median, min, max) of split gathers at share S with the CPU's reads done by
  torch (the library's way; all threads or --threads) or by numpy.take in --threads Python threads.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import torch

import hmgstore
from hmgstore.cuda import gather
from hmgstore.gather import cpu_share as split


def wall(fn, reps=5):
    best = float("inf")
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def threaded(fn, n, k):
    bounds = np.linspace(0, n, k + 1).astype(np.int64)
    ts = [threading.Thread(target=fn, args=(int(a), int(b))) for a, b in zip(bounds[:-1], bounds[1:])]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def cpu_methods(x, ids, out):
    rows = x.reshape(len(x), -1).view(torch.uint8).numpy()
    staged = out.view(len(ids), -1).view(torch.uint8).numpy()
    ids_np = ids.numpy()
    res = {}
    for k in (1, 4, 8, 16):
        res[f"numpy_take_{k}"] = wall(lambda: threaded(
            lambda a, b: np.take(rows, ids_np[a:b], 0, staged[a:b], "clip"), len(ids), k), 3)

        def chunks(a, b, c=512):
            for s in range(a, b, c):
                torch.index_select(x, 0, ids[s:min(b, s + c)], out=out[s:min(b, s + c)])
        res[f"torch_chunks_{k}"] = wall(lambda: threaded(chunks, len(ids), k), 3)
    res[f"torch_pool_{torch.get_num_threads()}"] = wall(lambda: torch.index_select(x, 0, ids, out=out), 3)
    return {name: {"seconds": s, "rows_per_s": len(ids) / s} for name, s in res.items()}


def phases(table, ids, share, threads):
    """One split gather with each phase timed on the host, and the kernel by events."""
    times = {}
    orig_run, orig_start, orig_finish = gather.run, split.start, split.finish

    def run(packed, device, stream, *a, **k):
        t = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        orig_run(packed, device, stream, *a, **k)
        end.record(stream)
        times["events"] = (start, end)
        times["launch_host"] = time.perf_counter() - t

    def start(*a, **k):
        t = time.perf_counter()
        orig_start(*a, **k)
        times["start_host"] = time.perf_counter() - t

    def finish(part, *a, **k):
        t = time.perf_counter()
        times["kernel_done_at_finish"] = times["events"][1].query() if "events" in times else None
        for _, future in part.chunks:
            future.result()
        times["reads_left_at_finish"] = time.perf_counter() - t
        orig_finish(part, *a, **k)
        times["finish_host"] = time.perf_counter() - t

    gather.run, split.start, split.finish = run, start, finish
    try:
        table.set_split(share)
        torch.cuda.synchronize()
        t = time.perf_counter()
        table[ids]
        times["call_host"] = time.perf_counter() - t
        torch.cuda.synchronize()
        times["total"] = time.perf_counter() - t
        if "events" in times:
            s, e = times.pop("events")
            times["kernel"] = s.elapsed_time(e) / 1e3
    finally:
        gather.run, split.start, split.finish = orig_run, orig_start, orig_finish
    return times


def interference(table, ids, share, threads):
    """The CPU's reads alone, then while a kernel gathers the other rows."""
    k = int(share * len(ids))
    cpu_ids, rest = ids[:k], ids[k:]
    source = table.host_tier
    staged = torch.empty((k, *source.shape[1:]), dtype=source.dtype)
    def take():
        for _, future in split.read_chunks(source, cpu_ids, staged):
            future.result()

    alone = wall(take, 3)
    rest_dev = rest.cuda()
    table.set_split(None)
    kernel_alone = wall(lambda: table[rest_dev], 3)
    best = float("inf")
    for _ in range(4):
        torch.cuda.synchronize()
        table[rest_dev]  # queued, runs while the CPU takes
        t = time.perf_counter()
        take()
        best = min(best, time.perf_counter() - t)
        torch.cuda.synchronize()
    return {"take_alone": alone, "take_beside_kernel": best, "kernel_alone": kernel_alone}


def variance(table, ids, share, threads, reps=15):
    """Median and min of ``reps`` split gathers, with the CPU's reads done four ways (see --variance)."""
    import concurrent.futures
    import statistics

    torch_reads = split.read_chunks
    pool = concurrent.futures.ThreadPoolExecutor(threads)

    def numpy_reads(per_thread):
        def reads(source, ids, into, chunks=2):
            rows = source.reshape(len(source), -1).view(torch.uint8).numpy()
            staged, ids_np = into.view(len(ids), -1).view(torch.uint8).numpy(), ids.numpy()
            step = -(-len(ids_np) // (threads * per_thread))
            return [((a, min(len(ids_np), a + step)),
                     pool.submit(np.take, rows, ids_np[a:a + step], 0, staged[a:a + step], "clip"))
                    for a in range(0, len(ids_np), step)]
        return reads

    res = {}
    for name, reader, torch_threads in ((f"numpy_{threads}_threads_2_chunks_each", numpy_reads(2), None),
                                        (f"numpy_{threads}_threads_1_chunk_each", numpy_reads(1), None),
                                        ("torch_all_threads", torch_reads, None),
                                        (f"torch_{threads}_threads", torch_reads, threads)):
        before = torch.get_num_threads()
        split.read_chunks = reader
        if torch_threads:
            torch.set_num_threads(torch_threads)
        try:
            table.set_split(share)
            times = []
            for _ in range(reps + 2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                table[ids]
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            times = times[2:]
            res[name] = {"median": statistics.median(times), "min": min(times), "max": max(times)}
        finally:
            split.read_chunks = torch_reads
            torch.set_num_threads(before)
    table.set_split(None)
    for name, fn in (("kernel_alone", lambda: table[ids]),):
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        res[name] = {"median": statistics.median(times), "min": min(times), "max": max(times)}
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, nargs="+", default=[2, 8])
    p.add_argument("--row-bytes", type=int, nargs="+", default=[512, 128])
    p.add_argument("--batch", type=int, default=500_000)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--variance", type=float, default=None,
                   help="only time the spread of split gathers at this share, with the CPU reads done four ways")
    p.add_argument("--cpu-methods", action="store_true", help="also time the CPU gather by method and threads")
    args = p.parse_args()
    report = {"device": torch.cuda.get_device_name(), "torch_threads": torch.get_num_threads(), "runs": []}
    for gb in args.gb:
        for rb in args.row_bytes:
            n = int(gb * 1e9) // rb
            x = torch.empty(n, rb // 4)
            x.view(torch.int32).random_()
            t = hmgstore.HybridTensor(x, "cuda", copy=True, progress=False)
            del x
            ids = torch.randperm(n)[: args.batch]
            out = torch.empty(args.batch, rb // 4, pin_memory=True)
            if args.variance is not None:
                print(json.dumps({"gb": gb, "row_bytes": rb, "share": args.variance,
                                  "variance": variance(t, ids, args.variance, args.threads)}), flush=True)
                t.close()
                continue
            run = {"gb": gb, "row_bytes": rb, "cpu": cpu_methods(t.host_tier, ids, out) if args.cpu_methods else {}}
            run["paths"] = {}
            for share in (0.0, 1.0, 0.15, 0.3, 0.5):
                t.set_split(share)
                w = wall(lambda: t[ids], 4)  # warm first: the phases below are of one steady-state call
                run["paths"][str(share)] = {"wall": w, "phases": phases(t, ids, share, args.threads)}
            run["interference"] = interference(t, ids, 0.3, args.threads)
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
            t.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
