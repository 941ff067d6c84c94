"""Probe: a batch's missed rows read by the CPU and copied by the copy engine, against the zero-copy kernel,
while a GPU-bound training step runs.

Usage: python benchmarks/probes/probe_dma_misses.py [--rows 111000000] [--row-bytes 128] [--misses 98000]
           [--pages 2500] [--threads 4 8 16] [--step-ms 7] [--steps 50] > probe_dma_misses.json
       python benchmarks/probes/probe_dma_misses.py --quick     (smoke check, tiny sizes; exits 0 without CUDA)

Context. On an H100 (PCIe Gen5, cloud VM) a papers100M-shaped batch with a 20% int8 GPU cache misses ~98k rows
of 128 B, spread over ~2,500 distinct 2 MiB pages of a 111M x 128 B pinned host table. hmgstore's zero-copy
kernel reads them in ~2.7 ms of GPU time (~4.8 GB/s), and on a side stream it takes SMs from the training step:
the epoch is GPU-bound at step (~7 ms) + loader kernels (~4.8 ms).

Hypothesis. Reading the missed rows on the CPU (torch.index_select into pinned staging, torch's intra-op
threads, GIL released) and moving them with one cudaMemcpyAsync on the copy engine (no SMs) costs the step much
less GPU time than the zero-copy kernel, so step + fetch overlap better: (step+fetch rate) / (step alone rate)
is closer to 1 for "cpu_dma" than for "zero_copy".

Method. A pinned uint8 table (torch.empty(pin_memory=True), filled with random bytes in 256 MB chunks); 20
batches of --misses distinct ids drawn uniformly from its first --pages * 2 MiB, in random and in sorted order.
Variants fetch one batch into a GPU buffer [M, W]:
  zero_copy  hmgstore.HybridTensor(table, device="cuda") (no GPU rows, pinned in place: see "table.in_place",
             "table.rss_growth_gb"), table.gather(ids_gpu, out=..., stream=side);
  cpu_dma    ids_gpu.cpu() (timed), torch.index_select(table, 0, ids, out=pinned staging[k % 2]), then
             out.copy_(staging, non_blocking=True) on the side stream; at each of --threads intra-op threads.
  (torch_uva, torch's own zero-copy read, is skipped: torch has no public API for it.)
Each alone: median over batches of the wall time (perf_counter, to the stream's completion) and of the GPU time
(CUDA events around the GPU part: the kernel, or the copy), GB/s of missed rows and its ratio to the pinned H2D
limit of this run (256 MB copy, best of 5); every variant's first batch is checked bit-exact against
table[ids] (output poisoned first). The step: TF32 GEMMs [--gemm-rows, 256] x [256, 256], as many as take
--step-ms alone. Overlap, as a training loop: batch n+1's fetch issued on a side stream while step n runs,
(a) "thread": a background Python thread fetching into a queue of depth 2 (prefetch pipeline), (b) "inline": the
main thread issuing fetch n+1 before step n's kernels; each step waits (GPU-side) for its batch and reads it.
Steps/s over --steps steps, and the ratio to the step alone in the same harness (vs_step_alone: the number
that matters); wait_ms_per_step is the main thread's time getting each batch (thread: blocked on the queue;
inline: issuing fetch n+1, the CPU read included for cpu_dma). Prints one JSON object to stdout (keys: probe,
date, device, torch, hmgstore, cpu_threads_default, args, table, h2d_limit_gbps, batch, step, alone, overlap,
skipped), a markdown table to stderr; exits 1 if a variant's rows are not bit-exact.
"""
from __future__ import annotations

import argparse
import datetime
import json
import queue
import statistics
import sys
import threading
import time

import torch

import hmgstore

PAGE = 2 << 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1e6


def make_table(rows: int, width: int, dtype: torch.dtype, chunk: int = 256 << 20):
    t = time.perf_counter()
    host = torch.empty((rows, width), dtype=dtype, pin_memory=True)
    alloc_s = time.perf_counter() - t
    flat, lo, hi = host.view(-1), (0 if dtype == torch.uint8 else -128), (256 if dtype == torch.uint8 else 128)
    t, step = time.perf_counter(), max(1, flat.numel() // chunk // 8) * chunk
    for a in range(0, flat.numel(), chunk):  # random bytes made on the GPU, copied into the pinned table
        b = min(a + chunk, flat.numel())
        flat[a:b].copy_(torch.randint(lo, hi, (b - a,), dtype=dtype, device="cuda"))
        if a % step == 0:
            log(f"  fill {b / 1e9:.1f} / {flat.numel() / 1e9:.1f} GB, {time.perf_counter() - t:.1f} s")
    torch.cuda.synchronize()
    return host, {"alloc_s": round(alloc_s, 2), "fill_s": round(time.perf_counter() - t, 2)}


def h2d_limit_gbps(nbytes: int, reps: int = 5) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(reps + 1):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src, non_blocking=True)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e))
    return nbytes / best / 1e6


def make_batches(n: int, misses: int, first: int, seed: int) -> list[torch.Tensor]:
    """``n`` batches of ``misses`` distinct ids in ``[0, first)``, uniformly, in random order."""
    g, out = torch.Generator().manual_seed(seed), []
    while len(out) < n:
        if first < 2 * misses:
            c = torch.randperm(first, generator=g)[:misses]
        else:
            c = torch.unique(torch.randint(0, first, (misses + misses // 8 + 16,), generator=g))
        if len(c) >= misses:
            out.append(c[torch.randperm(len(c), generator=g)[:misses]])
    return out


def timed_event():
    return torch.cuda.Event(enable_timing=True)


class ZeroCopy:
    """hmgstore's gather kernel reading the pinned table over PCIe."""

    def __init__(self, table, ids_gpu):
        self.table, self.ids_gpu, self.times = table, ids_gpu, []

    def __call__(self, b, out, stream, free=None):
        if free is not None:
            stream.wait_event(free)  # the consumer is done with ``out``
        start, ready = timed_event(), timed_event()
        start.record(stream)
        self.table.gather(self.ids_gpu[b], out=out, stream=stream)
        ready.record(stream)
        return start, ready


class CpuDma:
    """The CPU reads the rows into pinned staging (double-buffered); one copy-engine memcpy moves them."""

    def __init__(self, host, ids_gpu, misses: int):
        self.host, self.ids_gpu, self.times, self.k = host, ids_gpu, [], 0
        self.staging = [torch.empty((misses, host.shape[1]), dtype=host.dtype, pin_memory=True) for _ in range(2)]
        self.copied = [None, None]
        self.ids_stream = torch.cuda.Stream()

    def __call__(self, b, out, stream, free=None):
        t0 = time.perf_counter()
        with torch.cuda.stream(self.ids_stream):
            ids = self.ids_gpu[b].cpu()  # as ids made by GPU sampling would be
        t1 = time.perf_counter()
        s, self.k = self.k % 2, self.k + 1
        if self.copied[s] is not None:
            self.copied[s].synchronize()  # staging ``s``'s last copy is done
        t2 = time.perf_counter()
        torch.index_select(self.host, 0, ids, out=self.staging[s])
        t3 = time.perf_counter()
        start, ready = timed_event(), timed_event()
        with torch.cuda.stream(stream):
            if free is not None:
                stream.wait_event(free)
            start.record(stream)
            out.copy_(self.staging[s], non_blocking=True)
            ready.record(stream)
        self.copied[s] = ready
        self.times.append((t1 - t0, t2 - t1, t3 - t2))
        return start, ready


class Step:
    """A GPU-bound training step: ``k`` TF32 GEMMs, after reading the batch (GPU-side wait on its event)."""

    def __init__(self, rows: int, step_ms: float):
        self.a = torch.randn(rows, 256, device="cuda")
        self.w = torch.randn(256, 256, device="cuda") / 16
        self.b, self.acc, self.k = torch.empty_like(self.a), torch.zeros((), device="cuda"), 10
        self.gemm_ms = self.time(reps=5) / self.k
        self.k = max(1, round(step_ms / self.gemm_ms))

    def __call__(self, batch=None):
        if batch is not None:
            self.acc.add_(batch.sum(dtype=torch.float32))
        for _ in range(self.k):
            torch.mm(self.a, self.w, out=self.b)

    def time(self, reps: int = 20) -> float:
        self()
        ms = []
        for _ in range(reps):
            s, e = timed_event(), timed_event()
            s.record()
            self()
            e.record()
            e.synchronize()
            ms.append(s.elapsed_time(e))
        return statistics.median(ms)


def alone(fetch, host, ids_cpu, nb: int, misses: int, h2d: float, poison: int) -> dict:
    out, side = torch.empty((misses, host.shape[1]), dtype=host.dtype, device="cuda"), torch.cuda.Stream()
    out.fill_(poison)
    torch.cuda.synchronize()
    fetch(0, out, side)[1].synchronize()
    exact = torch.equal(out.cpu(), host[ids_cpu[0]])
    for b in range(1, min(3, nb)):  # warm-up
        fetch(b, out, side)[1].synchronize()
    fetch.times.clear()
    wall, gpu = [], []
    for b in range(nb):
        torch.cuda.synchronize()
        t = time.perf_counter()
        start, ready = fetch(b, out, side)
        ready.synchronize()
        wall.append((time.perf_counter() - t) * 1e3)
        gpu.append(start.elapsed_time(ready))
    ms = statistics.median(wall)
    gbps = misses * host.shape[1] / ms / 1e6
    res = {"wall_ms": round(ms, 3), "gpu_ms": round(statistics.median(gpu), 3), "gbps": round(gbps, 2),
           "of_h2d": round(gbps / h2d, 3), "exact": exact}
    if fetch.times:
        for k, name in enumerate(("ids_ms", "staging_wait_ms", "select_ms")):
            res[name] = round(statistics.median(x[k] for x in fetch.times) * 1e3, 3)
    return res


def train_loop(step, fetch, mode, nb, steps, warm, shape, dtype, threads=None, depth=2) -> dict:
    """Steps/s of ``steps`` steps (after ``warm``), each consuming one fetched batch (or none if ``fetch`` is None)."""
    ring = depth + 3  # the producer is at most depth + 1 batches ahead: a buffer is free before it is reused
    outs = [torch.empty(shape, dtype=dtype, device="cuda") for _ in range(ring)] if fetch is not None else []
    freed = [torch.cuda.Event() for _ in range(ring)]
    main, side, total = torch.cuda.current_stream(), torch.cuda.Stream(), warm + steps
    ready, q, errors, waited = {}, queue.Queue(maxsize=depth), [], 0.0

    def produce():
        try:
            if threads:
                torch.set_num_threads(threads)
            for n in range(total):
                q.put((n % ring, fetch(n % nb, outs[n % ring], side, freed[n % ring])[1]))
        except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
            errors.append(e)
            q.put(None)

    if fetch is not None and mode == "thread":
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
    elif fetch is not None:
        ready[0] = fetch(0, outs[0], side, freed[0])[1]
    torch.cuda.synchronize()
    for n in range(total):
        if n == warm:
            torch.cuda.synchronize()
            t0, waited = time.perf_counter(), 0.0
        batch = None
        if fetch is not None:
            t = time.perf_counter()
            if mode == "thread":
                item = q.get()
                if item is None:
                    raise errors[0]
                j, ev = item
            else:
                if n + 1 < total:
                    ready[n + 1] = fetch((n + 1) % nb, outs[(n + 1) % ring], side, freed[(n + 1) % ring])[1]
                j, ev = n % ring, ready.pop(n)
            waited += time.perf_counter() - t
            main.wait_event(ev)
            batch = outs[j]
        step(batch)
        if fetch is not None:
            freed[j].record(main)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if fetch is not None and mode == "thread":
        producer.join()
    return {"steps_per_s": round(steps / dt, 2), "ms_per_step": round(dt / steps * 1e3, 3),
            "wait_ms_per_step": round(waited / steps * 1e3, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=111_000_000)
    p.add_argument("--row-bytes", type=int, default=128)
    p.add_argument("--dtype", choices=["uint8", "int8"], default="uint8")
    p.add_argument("--misses", type=int, default=98_000)
    p.add_argument("--pages", type=int, default=2500, help="ids drawn from the first PAGES * 2 MiB of the table")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--sorted", choices=["both", "yes", "no"], default="both")
    p.add_argument("--threads", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--step-ms", type=float, default=7.0)
    p.add_argument("--gemm-rows", type=int, default=500_000)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke check")
    args = p.parse_args()
    if args.quick:
        args.rows, args.misses, args.pages, args.batches = 200_000, 2_000, 50, 4
        args.threads, args.step_ms, args.gemm_rows, args.steps, args.warm = [2], 1.0, 16_384, 5, 2
    if not torch.cuda.is_available():
        log("probe_dma_misses: no CUDA device here; this probe measures GPU fetches and has nothing to run"
            + (" (--quick: exiting 0)." if args.quick else "."))
        return 0 if args.quick else 2

    torch.backends.cuda.matmul.allow_tf32 = True
    dtype, width = getattr(torch, args.dtype), args.row_bytes
    first = min(args.rows, args.pages * PAGE // width)
    res = {"probe": "probe_dma_misses", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "hmgstore": hmgstore.__version__,
           "cpu_threads_default": torch.get_num_threads(), "args": vars(args)}
    log(f"table {args.rows} x {width} B = {args.rows * width / 1e9:.1f} GB pinned ...")
    host, res["table"] = make_table(args.rows, width, dtype)
    res["table"].update(rows=args.rows, row_bytes=width, gb=round(host.numel() / 1e9, 2), first_rows=first,
                        base_mod_2mib=host.data_ptr() % PAGE)
    res["h2d_limit_gbps"] = h2d = round(h2d_limit_gbps(min(256 << 20, host.numel())), 2)
    log(f"h2d limit {h2d} GB/s; building the HybridTensor (zero-copy, no GPU rows) ...")
    rss, t = rss_gb(), time.perf_counter()
    table = hmgstore.HybridTensor(host, device="cuda", progress=not args.quick)
    res["table"]["hybrid_build_s"] = round(time.perf_counter() - t, 2)
    res["table"]["rss_growth_gb"] = round(rss_gb() - rss, 2)  # ~0 when pinned in place, ~table size if copied
    # In place: the host tier is the caller's tensor (sources under 64 MiB are copied to pinned memory instead).
    try:
        res["table"]["in_place"] = table.dense().data_ptr() == host.data_ptr() and host.numel() >= 64 << 20
    except Exception as e:  # noqa: BLE001 - a diagnostic only; rss_growth_gb answers too
        res["table"]["in_place"] = f"unknown: {e!r}"

    base = torch.zeros((), dtype=torch.int64) + host.data_ptr()
    batches = make_batches(args.batches, args.misses, first, args.seed)
    pages = [torch.cat([(base + i * width) // PAGE, (base + i * width + width - 1) // PAGE]).unique().numel()
             for i in batches]
    res["batch"] = {"misses": args.misses, "bytes": args.misses * width, "pages_2mib_mean": statistics.mean(pages)}
    step = Step(args.gemm_rows, args.step_ms)
    res["step"] = {"gemm_rows": args.gemm_rows, "gemms_per_step": step.k, "gemm_ms": round(step.gemm_ms, 4),
                   "alone_ms": round(step.time(), 3)}
    res["step"]["loop"] = train_loop(step, None, None, 1, args.steps, args.warm, None, dtype)
    log(f"step {res['step']['alone_ms']} ms ({step.k} GEMMs), batch on {res['batch']['pages_2mib_mean']:.0f} pages")
    res["alone"], res["overlap"], res["skipped"] = [], [], {"torch_uva": "no public torch API for zero-copy reads"}
    shape, poison = (args.misses, width), (0xAB if dtype == torch.uint8 else -0x55)
    base_rate = res["step"]["loop"]["steps_per_s"]
    orders = {"both": ["random", "sorted"], "yes": ["sorted"], "no": ["random"]}[args.sorted]
    for order in orders:
        ids_cpu = [i.sort().values if order == "sorted" else i for i in batches]
        ids_gpu = [i.cuda() for i in ids_cpu]
        torch.cuda.synchronize()
        runs = [("zero_copy", None)] + [("cpu_dma", k) for k in args.threads]
        for name, k in runs:
            def make(k=k, ids_gpu=ids_gpu):
                return ZeroCopy(table, ids_gpu) if k is None else CpuDma(host, ids_gpu, args.misses)

            default = torch.get_num_threads()
            if k:
                torch.set_num_threads(k)
            row = {"order": order, "variant": name, "threads": k}
            res["alone"].append({**row, **alone(make(), host, ids_cpu, args.batches, args.misses, h2d, poison)})
            torch.set_num_threads(default)
            log(f"  alone {res['alone'][-1]}")
            for mode in ("thread", "inline"):
                if k and mode == "inline":
                    torch.set_num_threads(k)
                r = train_loop(step, make(), mode, args.batches, args.steps, args.warm, shape, dtype, threads=k)
                torch.set_num_threads(default)
                r["vs_step_alone"] = round(r["steps_per_s"] / base_rate, 3)
                res["overlap"].append({**row, "mode": mode, **r})
                log(f"  overlap {res['overlap'][-1]}")
    res["step"]["loop_end"] = train_loop(step, None, None, 1, args.steps, args.warm, None, dtype)  # drift check
    print(json.dumps(res, indent=1))

    log(f"\n{res['device']}, H2D {h2d} GB/s, step alone {base_rate} steps/s "
        f"({res['step']['loop']['ms_per_step']} ms; end of run {res['step']['loop_end']['ms_per_step']} ms), "
        f"{args.misses} misses x {width} B on {res['batch']['pages_2mib_mean']:.0f} pages, in place: "
        f"{res['table']['in_place']}\n")
    log("| order | variant | threads | wall ms | GPU ms | GB/s | of H2D | exact |\n|---|---|---|---|---|---|---|---|")
    for r in res["alone"]:
        log(f"| {r['order']} | {r['variant']} | {r['threads'] or '-'} | {r['wall_ms']} | {r['gpu_ms']} | {r['gbps']} "
            f"| {r['of_h2d']} | {r['exact']} |")
    log("\n| order | variant | threads | mode | steps/s | ms/step | vs step alone | main waits ms/step |\n"
        "|---|---|---|---|---|---|---|---|")
    for r in res["overlap"]:
        log(f"| {r['order']} | {r['variant']} | {r['threads'] or '-'} | {r['mode']} | {r['steps_per_s']} "
            f"| {r['ms_per_step']} | {r['vs_step_alone']} | {r['wait_ms_per_step']} |")
    return 0 if all(r["exact"] for r in res["alone"]) else 1


if __name__ == "__main__":
    sys.exit(main())
