"""Probe: how many host rows cooperative minibatches would save, counted on real sampled batches.

Usage: python benchmarks/probes/probe_cooperative.py [--nodes 11100000] [--edges 160000000] [--gpus 1 2 4 8]
           [--steps 12] [--cache 0 0.2 0.8] > probe_cooperative.json
       python benchmarks/probes/probe_cooperative.py --quick     (smoke check, tiny sizes)

Context. With one process per GPU, each GPU samples its own batch and gathers its rows: a row that the
batches of several GPUs of a node need in the same step is read once per GPU. Cooperative minibatching
(GraphBolt, arXiv 2310.12403) has each row read once per node, by the GPU that owns it, and sent over NVLink
to the others; the paper reports up to 4x less feature traffic. With a hot-row cache on each GPU (the node's
setting b: 20% of the float32 bytes as int8 rows, 80% of the rows, hottest first), only the misses cross PCIe.

Hypothesis. Hot rows are shared by many batches and cold rows by few, so the cache takes the shared rows
first: the saving in host rows falls from the uncached figure to little once 80% of the rows are cached.

Method (CPU only; counts, no timing). A papers-shaped topology at a tenth of the scale (Zipf 0.6 in-degrees,
`hmgstore.data.power_law_csc`), neighbours drawn uniformly (`uniform`) or Zipf 0.6 over the same ranking
(`skewed`: hubs cite and are cited); 1.1% of the nodes train. The hot order: one pre-sampled epoch
(`hmgstore.graph.presample`, features counts), as `bench train` ranks its cache. Then, in a fresh shuffle, each
step takes G batches of 1024 seeds (fanout 15,10,5, hmgstore's CPU sampler), one per GPU; per cache share
(of the rows, hottest first), per step: the missed rows each GPU reads alone (sum over GPUs of its batch's
uncached unique nodes) against the node's union (each row once). `saving` is their ratio (1.0: nothing
saved); `nvlink_rows` the rows that would cross NVLink cooperatively (each GPU's missed rows owned by another,
owner = id mod G). Prints one JSON object (keys: probe, date, hmgstore, args, graphs) to stdout and a
markdown table to stderr.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch

import hmgstore
from hmgstore.data import power_law_csc
from hmgstore.graph import NeighborSampler, Topology
from hmgstore.graph.presample import presample
from hmgstore.rows.hotness import order_by_score


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=11_100_000)
    p.add_argument("--edges", type=int, default=160_000_000)
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--steps", type=int, default=12, help="steps counted for each GPU count")
    p.add_argument("--cache", type=float, nargs="+", default=[0.0, 0.2, 0.8], help="shares of the rows cached")
    p.add_argument("--sources", nargs="+", default=["uniform", "skewed"], choices=["uniform", "skewed"])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the probe runs")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.edges, args.steps, args.gpus, args.batch = 20_000, 200_000, 2, [1, 2, 4], 32
    if max(args.gpus) * args.batch > args.nodes * 11 // 1000:
        p.error(f"a step of {max(args.gpus)} batches of {args.batch} needs more training nodes than the "
                f"{args.nodes * 11 // 1000:,} of {args.nodes:,} nodes: more --nodes or a smaller --batch")
    return args


def count(sampler, train, ranks, args) -> dict:
    """Per GPU count and cache share: rows read alone (summed over GPUs), once per node, and over NVLink."""
    out: dict = {}
    order = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(7))]
    cursor = 0
    for g in args.gpus:
        sums = {c: {"alone": 0, "node": 0, "nvlink": 0} for c in args.cache}
        for _ in range(args.steps):
            if cursor + g * args.batch > len(order):
                cursor = 0
            nodes = []
            for r in range(g):
                seeds = order[cursor:cursor + args.batch]
                cursor += args.batch
                nodes.append((r, sampler.sample({None: seeds}).node[None]))
            for c in args.cache:
                cached_rows = int(c * len(ranks))
                missed = [(r, n[ranks[n] >= cached_rows]) for r, n in nodes]
                s = sums[c]
                s["alone"] += sum(len(m) for _, m in missed)
                s["node"] += len(torch.unique(torch.cat([m for _, m in missed])))
                s["nvlink"] += sum(int((m % g != r).sum()) for r, m in missed)
        out[g] = {c: {"rows_alone_per_step": s["alone"] / args.steps, "rows_node_per_step": s["node"] / args.steps,
                      "nvlink_rows_per_step": s["nvlink"] / args.steps,
                      "saving": s["alone"] / max(1, s["node"])} for c, s in sums.items()}
    return out


def main(argv=None) -> int:
    args = parse(argv)
    torch.manual_seed(0)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report = {"probe": "cooperative", "date": now,
              "hmgstore": hmgstore.__version__, "args": vars(args), "graphs": {}}
    fanout = [15, 10, 5]
    for source in args.sources:
        start = time.perf_counter()
        csc = power_law_csc(args.nodes, args.edges, 0.6, source_skew=0.6 if source == "skewed" else None)
        sampler = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: args.nodes}, fanout)
        train = torch.randperm(args.nodes, generator=torch.Generator().manual_seed(1))[:max(1, args.nodes * 11 // 1000)]
        hot = presample(sampler, train, batch_size=args.batch, progress=False,
                        generator=torch.Generator().manual_seed(3))
        ranks = torch.empty(args.nodes, dtype=torch.int64)
        ranks[order_by_score(hot.features[None])] = torch.arange(args.nodes)
        report["graphs"][source] = {"counts": count(sampler, train, ranks, args),
                                    "seconds": time.perf_counter() - start}
        print(f"{source}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    json.dump(report, sys.stdout, indent=1)
    print(file=sys.stdout)
    print("| neighbours | GPUs | rows cached | missed rows a step, each GPU alone | once per node | saving | "
          "over NVLink |\n|---|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
    for source, g in report["graphs"].items():
        for gpus, by_cache in g["counts"].items():
            for c, v in by_cache.items():
                print(f"| {source} | {gpus} | {c:.0%} | {v['rows_alone_per_step']:,.0f} | "
                      f"{v['rows_node_per_step']:,.0f} | {v['saving']:.2f}x | {v['nvlink_rows_per_step']:,.0f} |",
                      file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
