"""Probe: a batch sampled over two simulated machines (gloo, CPU), time per batch, for the code on PYTHONPATH.

Run from any checkout to compare the sampling exchange of two versions on the same graph:

    python benchmarks/probes/probe_sampling_exchange.py [--nodes 200000] [--batches 20] [--fanout 15,10,5]

The parent writes the parts of a synthetic graph (hash book, two machines) and starts two ranks on this host
(HMGSTORE_NODE_ID apart). Each rank samples ``--batches`` batches of 1024 random seeds of its own with
``hmgstore.distributed.DistributedNeighborSampler`` (owners on the CPU), after 3 of warm-up; a batch is timed
from a barrier to the slower rank's end. Prints one JSON line: the median and the spread of ms per batch, the
``all_to_all_single`` rounds per batch and the sampled nodes per batch.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--fanout", default="15,10,5")
    p.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)  # parts folder, set for the ranks
    return p.parse_args(argv)


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    import hmgstore.distributed as hd

    dist.init_process_group("gloo")
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    cluster = hd.this_cluster()
    part = hd.load_partition(args.rank_of, cluster.machine, "cpu", progress=False)
    fanout = [int(k) for k in args.fanout.split(",")]
    sampler = hd.DistributedNeighborSampler(part, fanout, generator=torch.Generator().manual_seed(dist.get_rank()))
    ids = torch.Generator().manual_seed(100 + dist.get_rank())
    rounds, all_to_all = [0], dist.all_to_all_single

    def counted(*a, **k):
        rounds[0] += 1
        return all_to_all(*a, **k)

    dist.all_to_all_single = counted
    times, nodes = [], []
    for i in range(3 + args.batches):
        seeds = torch.randint(0, args.nodes, (1024,), generator=ids)
        dist.barrier()
        start = time.perf_counter()
        out = sampler.sample(seeds)
        t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if i >= 3:
            times.append(float(t) * 1e3)
            nodes.append(len(out.node[None]))
    per_batch = rounds[0] / (3 + args.batches)
    if dist.get_rank() == 0:
        print(json.dumps({"nodes": args.nodes, "fanout": fanout, "batches": args.batches,
                          "ms_per_batch_median": statistics.median(times), "ms_min": min(times), "ms_max": max(times),
                          "rounds_per_batch": per_batch, "sampled_nodes_per_batch": statistics.mean(nodes),
                          "torch_threads_per_rank": torch.get_num_threads()}))
    dist.destroy_process_group()


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.rank_of:
        return rank_main(args)
    import hmgstore.distributed as hd
    from hmgstore.data import synthetic

    with tempfile.TemporaryDirectory() as tmp:
        g = synthetic(num_nodes=args.nodes, avg_degree=10, feat_dim=4, seed=0)
        hd.partition({"y": g.y}, g.edge_index, hd.PartitionBook.hash(args.nodes, 2), tmp, progress=False)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--nodes", str(args.nodes),
                                   "--batches", str(args.batches), "--fanout", args.fanout, "--rank-of", tmp],
                                  env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                       "MASTER_PORT": str(port), "LOCAL_RANK": "0", "HMGSTORE_NODE_ID": f"m{r}"})
                 for r in range(2)]
        codes = [p.wait() for p in procs]
        if any(codes):
            sys.exit(f"a rank failed: exit codes {codes}")


if __name__ == "__main__":
    main()
