"""Probe: does the training step slow down beside a capped zero-copy gather by the host pages the gather
reads, or by its rows, its SMs and the PCIe traffic alone?

Usage: python benchmarks/probes/probe_step_pages.py [--pages 128 512 1024 2500 5000] [--misses 200000]
           [--row-bytes 132] [--max-sms 8 0] [--cap-mode spread whole] [--steps 30] > probe_step_pages.json
       python benchmarks/probes/probe_step_pages.py --quick   (tiny sizes; on a machine without CUDA it runs the
           step once on the CPU and exits 0)

Context (issue 29; benchmarks/results/strong-step-h100.md, seventh session). On an H100 in a cloud VM, beside
the strong GraphSAGE step, a papers-shaped batch's zero-copy reads of ~100k missed int8 feature rows from 2,489
distinct 2 MiB host pages (and of their ~100k 8 B labels, from another table) slowed the step's own kernels
from 6.8 ms to 8.2 ms with the gathers capped at 8 SMs (6% of the SMs: about 0.4 ms expected); on the 2M graph,
whose misses lie in 217 pages, 16 SMs cost the step about their share. The gather kernel's rate falls past
~1,024 pages a batch (reach-h100.md: the GPU's reach into host memory).

Hypothesis. The slowdown beyond the SMs' share grows with the pages a batch reads (translation misses that
the step's own memory accesses then share), not with its rows: at a fixed 200k rows (the batch's rows read
from host memory, features and labels together), reading them from 128
pages costs the step about the cap's share, from 2,500 or 5,000 pages much more. If it does not grow, the
cause is the PCIe reads themselves, and reading the misses by the CPU (no zero-copy) is the remedy.

Method. A pinned uint8 table of max(--pages) 2 MiB pages of --row-bytes rows (random bytes), read zero-copy
by hmgstore.HybridTensor (no GPU rows), and the same rows copied to GPU memory ("hbm": the same gather with
no PCIe, the control). For each page count P, batches of --misses distinct rows drawn uniformly from the
first P pages. The step: bench train's GraphSAGE (3 layers, hidden 256, 128-d inputs, 172 classes), trimmed
per hop and in TF32, on one synthetic batch shaped as a papers-shaped batch (1,024 seeds, fanout 15,10,5).
For each (source, P, cap): a thread gathers batch after batch on a side stream (capped_gathers(cap); cap 0:
none), while the main thread runs --steps steps; each step's GPU time is taken with CUDA events on its stream,
the step queued whole behind a GPU sleep first (so the events time the GPU's work, not the main thread's issue).
Reported: the step alone (ms), the step beside the gather (ms, and / alone), the gather alone (ms a batch, and
GB/s), the batches the gather made during the steps. The first gather of each (source, P) is checked
bit-exact against table[ids] (output poisoned first). One JSON object on stdout, a markdown table on stderr;
exits 1 if a gather is not exact.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import threading
import time

import torch

import hmgstore
from hmgstore.bench.train_setup import SAGE, train_step
from hmgstore.cuda import gather as gather_kernel
from hmgstore.cuda.gather import capped_gathers

PAGE = 2 << 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def papers_batch(device, seeds: int = 1024, fanout=(15, 10, 5), feat: int = 128, classes: int = 172, seed: int = 0):
    """A batch shaped as hmgstore's sampler gives one (nodes and edges hop by hop, per-hop counts), with random
    ids: what the step's kernels cost depends on its sizes, not on which nodes they are. 95% of each hop's
    draws are new nodes, as in a 111M-node graph (a papers-shaped batch has about 1M nodes)."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(seed)
    nodes, edges, srcs, dsts, start = [seeds], [], [], [], 0
    for f in fanout:
        frontier = nodes[-1]
        new = frontier * f * 19 // 20
        first = sum(nodes)
        dst = start + torch.randint(0, frontier, (frontier * f,), generator=g)
        src = torch.where(torch.rand(frontier * f, generator=g) < 0.95,
                          first + torch.randint(0, new, (frontier * f,), generator=g),
                          torch.randint(0, first, (frontier * f,), generator=g))
        srcs.append(src)
        dsts.append(dst)
        edges.append(frontier * f)
        start = first
        nodes.append(new)
    n = sum(nodes)
    x, y = torch.randn(n, feat, generator=g), torch.randint(0, classes, (n,), generator=g)
    edge_index = torch.stack([torch.cat(srcs), torch.cat(dsts)])
    return Data(x=x.to(device), y=y.to(device), edge_index=edge_index.to(device), batch_size=seeds,
                num_sampled_nodes=nodes, num_sampled_edges=edges)


#: GPU cycles a step's stream sleeps before the step (about 12 ms at 1.7 GHz): the whole step is queued before
#: the GPU reaches it, so its events time the GPU's work, not the main thread's issue (~5 ms, and slower while
#: the gathering thread takes the GIL).
HOLD_CYCLES = 20_000_000


def step_ms(model, optimizer, batch, steps: int, timings: list | None = None) -> float:
    """Median GPU time of ``steps`` steps (CUDA events on the current stream, each step queued whole behind a
    sleep first); each step's time appended to ``timings``."""
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOLD_CYCLES)
        start.record()
        train_step(model, optimizer, batch, trim=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    if timings is not None:
        timings.extend(times)
    return statistics.median(times)


def gather_loop(table, batches, out, cap, stop: threading.Event, made: list, errors: list) -> None:
    """Gather batch after batch on a side stream until ``stop`` (the pipeline thread's part)."""
    try:
        side = torch.cuda.Stream()
        with capped_gathers(cap or None):
            k = 0
            while not stop.is_set():
                table.gather(batches[k % len(batches)], out=out, stream=side)
                side.synchronize()
                k += 1
        made.append(k)
    except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
        errors.append(e)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, nargs="+", default=[128, 512, 1024, 2500, 5000])
    p.add_argument("--misses", type=int, default=200_000)
    p.add_argument("--row-bytes", type=int, default=132)
    p.add_argument("--max-sms", type=int, nargs="+", default=[8, 0], help="0: uncapped")
    p.add_argument("--cap-mode", nargs="+", choices=["spread", "whole"], default=["spread"],
                   help="how a capped gather holds its SMs: spread thread slots, or whole SMs "
                        "(hmgstore.cuda.gather.EXCLUSIVE); each capped run is made in each mode")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke check")
    args = p.parse_args()
    if args.quick:
        args.pages, args.misses, args.batches, args.steps, args.max_sms = [4, 8], 2_000, 2, 3, [8]
    if not torch.cuda.is_available():
        batch = papers_batch("cpu", seeds=16, fanout=(3, 2, 2))
        model = SAGE([128, 256, 256, 172])
        loss = train_step(model, torch.optim.Adam(model.parameters()), batch, trim=True)
        log(f"probe_step_pages: no CUDA device; the step ran once on the CPU (loss {loss.item():.3f})"
            + (" (--quick: exiting 0)." if args.quick else "."))
        return 0 if args.quick else 2

    torch.backends.cuda.matmul.allow_tf32 = True
    width, device = args.row_bytes, torch.device("cuda", torch.cuda.current_device())
    if args.misses > min(args.pages) * PAGE // width:
        p.error(f"--misses {args.misses} is more than the {min(args.pages) * PAGE // width} rows of "
                f"{min(args.pages)} pages of {width} B rows: give fewer misses or more pages")
    rows = max(args.pages) * PAGE // width
    res = {"probe": "probe_step_pages", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "hmgstore": hmgstore.__version__,
           "command": "python benchmarks/probes/probe_step_pages.py " + " ".join(sys.argv[1:]), "args": vars(args),
           "table": {"rows": rows, "row_bytes": width, "gb": round(rows * width / 1e9, 2)}, "runs": []}
    log(f"table {rows} x {width} B = {res['table']['gb']} GB pinned, and a copy in GPU memory ...")
    host = torch.empty((rows, width), dtype=torch.uint8, pin_memory=True)
    for a in range(0, rows, 1 << 22):
        host[a:a + (1 << 22)].copy_(torch.randint(0, 256, (min(1 << 22, rows - a), width), dtype=torch.uint8,
                                                  device=device))
    torch.cuda.synchronize()
    sources = {"host": hmgstore.HybridTensor(host, device=device, progress=False),
               "hbm": hmgstore.HybridTensor(host, device=device, gpu_rows=torch.arange(rows), progress=False)}
    batch = papers_batch(device)
    model = SAGE([128, 256, 256, 172]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    step_ms(model, optimizer, batch, 3)  # warm-up
    alone = step_ms(model, optimizer, batch, args.steps)
    res["step_alone_ms"] = round(alone, 3)
    log(f"step alone {alone:.2f} ms on a batch of {batch.num_nodes} nodes, {batch.edge_index.shape[1]} edges")
    g, exact = torch.Generator().manual_seed(args.seed), True
    out = torch.empty((args.misses, width), dtype=torch.uint8, device=device)
    for pages in args.pages:
        first = pages * PAGE // width
        ids_cpu = [torch.randperm(first, generator=g)[:args.misses] for _ in range(args.batches)]
        ids = [i.to(device) for i in ids_cpu]
        for name, table in sources.items():
            out.fill_(0xAB)
            table.gather(ids[0], out=out)
            torch.cuda.synchronize()
            exact &= torch.equal(out.cpu(), host[ids_cpu[0]])
            for cap, mode in [(c, m) for c in args.max_sms for m in (args.cap_mode if c else ["spread"])]:
                gather_kernel.EXCLUSIVE = mode == "whole"
                with capped_gathers(cap or None):
                    table.gather(ids[0], out=out)
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    for i in ids:
                        table.gather(i, out=out)
                    torch.cuda.synchronize()
                gather_ms = (time.perf_counter() - t) / len(ids) * 1e3
                stop, made, errors = threading.Event(), [], []
                worker = threading.Thread(target=gather_loop, args=(table, ids, out, cap, stop, made, errors))
                worker.start()
                time.sleep(0.05)  # the gathers under way
                beside = step_ms(model, optimizer, batch, args.steps)
                stop.set()
                worker.join()
                if errors:
                    raise errors[0]
                whole = bool(cap) and mode == "whole" and gather_kernel.exclusive_smem(device.index) is not None
                run = {"source": name, "pages": pages, "max_sms": cap or None, "whole_sms": whole,
                       "step_ms": round(beside, 3),
                       "step_vs_alone": round(beside / alone, 3), "gather_alone_ms": round(gather_ms, 3),
                       "gather_gbps": round(args.misses * width / gather_ms / 1e6, 2), "gathers_beside": made[0]}
                res["runs"].append(run)
                log(json.dumps(run))
    res["exact"] = bool(exact)
    print(json.dumps(res, indent=1))
    log(f"\n| source | pages | cap | step ms (alone {alone:.2f}) | x alone | gather alone ms | GB/s |")
    log("|---|---:|---:|---:|---:|---:|---:|")
    for r in res["runs"]:
        cap = f"{r['max_sms']}{' whole SMs' if r['whole_sms'] else ''}" if r["max_sms"] else "none"
        log(f"| {r['source']} | {r['pages']} | {cap} | {r['step_ms']} | {r['step_vs_alone']} | "
            f"{r['gather_alone_ms']} | {r['gather_gbps']} |")
    if not exact:
        log("a gather was not bit-exact")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
