"""Probe: the cost of reading a topology through chunks (a sharded topology's path) on one GPU.

Usage: python benchmarks/probes/probe_topology_chunks.py [--nodes 10M] [--edges 200M] [--share 0.3] > probe.json

One process, a one-rank gloo group (so that ``hmgstore.distributed.sharded_topology`` runs: its only shard is this
GPU's).
GraphSAGE-shaped batches (1024 seeds, fanout 15,10,5) sampled on a power-law graph (int32 ids), by
variant: every list on the GPU; ``--share`` of the ids' bytes on the GPU as hot lists (the one-GPU
two-tier layout, lists packed, the rest zero-copy from the host); the same share as hot chunks of 32 ids
(the sharded layout: a map lookup per id read, then the tier); none on the GPU. Each variant's first
batch is checked against the CPU sampler (the draws are the same on every device); batches/s is the median
of 5 rounds of 20 batches.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from hmgstore.cli import flags
from hmgstore.data import power_law_csc
from hmgstore.distributed import sharded_topology
from hmgstore.graph import NeighborSampler, Topology


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def rate(sampler, seeds) -> float:
    times = []
    for r in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in range(20):
            sampler.sample({None: seeds[(r * 20 + b) % len(seeds)]})
        torch.cuda.synchronize()
        if r:  # the first round warms up
            times.append(time.perf_counter() - t0)
    return 20 / statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=flags.count, default="10M")
    p.add_argument("--edges", type=flags.count, default="200M")
    p.add_argument("--share", type=float, default=0.3)
    a = p.parse_args()
    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    csc = power_law_csc(a.nodes, a.edges, 0.6, device="cuda")
    ids_bytes = csc.num_edges * csc.row.element_size()
    g = torch.Generator().manual_seed(0)
    seeds = [torch.randint(0, a.nodes, (1024,), generator=g).cuda() for _ in range(40)]
    cpu = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: a.nodes}, [15, 10, 5])
    torch.manual_seed(1)
    want = cpu.sample({None: seeds[0].cpu()})
    budget = int(a.share * ids_bytes)
    variants = {"all_gpu": dict(gpu_budget=ids_bytes), "lists": dict(gpu_budget=budget),
                "chunks": dict(gpu_budget=budget, shard=True), "host": dict(gpu_budget=None)}
    found = {"device": torch.cuda.get_device_name(), "nodes": a.nodes, "edges": csc.num_edges, "share": a.share}
    for name, kwargs in variants.items():
        chunked = kwargs.pop("shard", False)
        topo = (sharded_topology(csc, "cuda", progress=False, **kwargs) if chunked else
                Topology(csc, "cuda", progress=False, **kwargs))
        sampler = NeighborSampler({None: topo}, {None: a.nodes}, [15, 10, 5])
        torch.manual_seed(1)
        got = sampler.sample({None: seeds[0]})
        same = all(torch.equal(getattr(want, f)[None], getattr(got, f)[None].cpu()) for f in ("node", "row", "edge"))
        if not same:
            raise AssertionError(f"{name}: the GPU sample differs from the CPU sampler's")
        topo.reset_stats()
        sampler.sample({None: seeds[1]})
        hits = topo.stats()["hit_ratio"]
        sampler.topologies[None]._counter = None
        found[name] = {"batches_per_s": round(rate(sampler, seeds), 1), "hit_ratio": round(hits, 3),
                       "sharded": topo.chunked}
        log(name, found[name])
        topo.close()
        torch.cuda.empty_cache()
    json.dump(found, sys.stdout, indent=1)
    dist.destroy_process_group()
    os.unlink(store.name)


if __name__ == "__main__":
    main()
