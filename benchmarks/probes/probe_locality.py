"""Probe: pages touched per batch and gather rates for each host layout and batch order, on one GPU.

Usage: python benchmarks/probes/probe_locality.py [--nodes 20000000] [--communities 100000] [--row-bytes 512]
       > probe_locality.json

A community graph (``hmgstore.data.synthetic`` with fine communities: most edges stay inside one of
``--communities``), GraphSAGE-style batches (fanout 15,10,5, 1024 seeds, hmgstore's GPU sampler, topology on the
GPU). Layouts of a host table of ``--row-bytes`` rows: id order (none), label-propagation communities (computed
on the GPU), co-access (first touch in an epoch of locality-aware batches), hotness (pre-sampled counts, hottest
first). Batch orders: random, and :class:`LocalityBatchSampler` (window of 8 parts of 4096 nodes). For each pair:
distinct 2 MiB pages a batch's rows touch (mean over the batches), and the median gather rate of those batches
from the host tier laid out that way (x the pinned H2D limit of this run); each first gather checked against x[idx].
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import torch

import hmgstore
from hmgstore.data import synthetic
from hmgstore.graph import NeighborSampler, Topology, presample, to_csc
from hmgstore.graph import locality as L
from hmgstore.memory import owned
from hmgstore.rows.placement import order_by_score
from hmgstore.util.timing import h2d_limit_gbps


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=20_000_000)
    p.add_argument("--degree", type=int, default=15)
    p.add_argument("--communities", type=int, default=100_000)
    p.add_argument("--row-bytes", type=int, default=512)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--part-rows", type=int, default=4096)
    p.add_argument("--window", type=int, default=8)
    args = p.parse_args()
    device = torch.device("cuda", 0)
    limit = h2d_limit_gbps(device)
    out = {"device": torch.cuda.get_device_name(device), "h2d_limit_gbps": limit, "date": time.strftime("%F %T"),
           "command": " ".join(sys.argv), "args": vars(args), "runs": []}
    t0 = time.perf_counter()
    g = synthetic(args.nodes, args.degree, 1, 16, communities=args.communities, seed=1)
    n = g.num_nodes
    csc = to_csc(g.edge_index, "coo", (n, n))
    train = g.train_idx
    del g
    gc.collect()
    log(f"graph {n} nodes, {csc.num_edges} edges in {time.perf_counter() - t0:.0f} s")
    topo = Topology(csc, device, gpu_budget=2**62, progress=False)
    sampler = NeighborSampler({None: topo}, {None: n}, [15, 10, 5])
    gen = lambda s: torch.Generator().manual_seed(s)  # noqa: E731

    t0 = time.perf_counter()
    community = L.community_order(csc, generator=gen(0), progress=False, device=device)
    out["community_s"] = time.perf_counter() - t0
    log(f"community order in {out['community_s']:.0f} s")
    t0 = time.perf_counter()
    hot = presample(sampler, train[torch.randperm(len(train), generator=gen(9))[:200 * 1024]], batch_size=1024,
                    progress=False)
    hotness = order_by_score(hot.features[None])
    out["hotness_s"] = time.perf_counter() - t0
    part = L.parts_of(community, args.part_rows)
    t0 = time.perf_counter()
    warm = L.LocalityBatchSampler(train, part, 1024, args.window, generator=gen(8))
    coaccess = L.coaccess_order(sampler, train, batches=[torch.tensor(b) for b in warm], progress=False)
    out["coaccess_s"] = time.perf_counter() - t0
    log(f"hotness {out['hotness_s']:.0f} s, co-access {out['coaccess_s']:.0f} s")
    layouts = {"none": None, "community": community, "coaccess": coaccess, "hotness": hotness}

    x = owned.empty((n, args.row_bytes // 4), torch.float32, "cuda", zero=False)
    block = torch.randn(min(n, 1 << 20), args.row_bytes // 4, generator=gen(1))
    for a in range(0, n, len(block)):
        x[a:a + len(block)] = block[:n - a]
    for lname, layout in layouts.items():
        t0 = time.perf_counter()
        table = hmgstore.HybridTensor.over_host_tier(x, device, torch.float32, progress=False) if layout is None else \
            hmgstore.HybridTensor(x, device, layout=layout, progress=False)
        build = time.perf_counter() - t0
        for bname in ("random", "locality"):
            lay = layout if layout is not None else torch.arange(n)
            if bname == "random":
                perm = torch.randperm(len(train), generator=gen(5))
                batches = [perm[a:a + 1024] for a in range(0, args.batches * 1024, 1024)]
            else:
                sampler_b = L.LocalityBatchSampler(train, L.parts_of(lay, args.part_rows), 1024, args.window,
                                                   generator=gen(5))
                batches = [torch.tensor(b) for _, b in zip(range(args.batches), sampler_b)]
            torch.manual_seed(0)
            nodes = [sampler.sample({None: train[b].to(device)}).node[None] for b in batches]
            pages = [L.pages_touched(v.cpu(), args.row_bytes, layout) for v in nodes]
            rows = [len(v) for v in nodes]
            dst = torch.empty((max(rows), args.row_bytes // 4), device=device)
            ok = torch.equal(table.gather(nodes[0], out=dst[:rows[0]]).cpu(), x[nodes[0].cpu()])
            times = []
            for v in nodes * 2:  # each batch twice: the second pass is timed
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                table.gather(v, out=dst[:len(v)])
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            times = times[len(nodes):]
            rate = statistics.median(r * args.row_bytes / t / 1e9 for r, t in zip(rows, times))
            entry = {"layout": lname, "batches": bname, "pages": statistics.mean(pages), "rows": statistics.mean(rows),
                     "x_limit": rate / limit, "exact": ok, "build_s": build}
            out["runs"].append(entry)
            log(f"{lname:10s} {bname:9s} rows {entry['rows']:9.0f} pages {entry['pages']:7.0f} of "
                f"{n * args.row_bytes // (2 << 20)}  gather {entry['x_limit']:.2f}x  exact {ok}")
        if layout is not None:
            table.close()
        del table
        gc.collect()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
