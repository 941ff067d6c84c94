"""The remote benchmark's training half: GraphSAGE batches/s on several machines against one holding everything.

Every rank builds the same synthetic graph (``--graph``, ``--feat-dim``,
seeded), then, in the same run:

- **one machine**: rank 0 alone (the others wait at a barrier) trains on the
  whole graph through hmgstore's single-machine PyG path (``from_data``
  stores, ``HybridNeighborSampler``), ``--train-batch`` seeds a batch;
- **the machines**: every rank holds its machine's part
  (:func:`hmgstore.distributed.part_of`, a hash book) and trains with DDP
  over ``ClusterFeatureStore``, ``ClusterNeighborSampler`` (owners sample
  their part on the rank's GPU when it has one) and ``cluster_loader``,
  ``--train-batch`` seeds a batch on each rank.

Each times ``--train-batches`` steps (sample, gather, forward, backward,
optimiser step) after two of warm-up, from a barrier to the slowest rank's
end. Reported: one machine's batches/s; the machines' per rank and in all;
the speed-up (all ranks' batches/s over one machine's) and the efficiency
(the speed-up over the number of ranks). Simulated machines on one host
share its cores: each rank, and the one-machine run, gets
``cores // ranks`` torch threads, as one of those machines would.
"""
from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hmgstore.bench.report import ratio_text
from hmgstore.bench.train_setup import SAGE
from hmgstore.cli import flags
from hmgstore.data import synthetic

#: --quick's training sizes (added to remote.QUICK).
QUICK = ["--graph", "synthetic:4000", "--feat-dim", "16", "--fanout", "5,3", "--train-batch", "64",
         "--train-batches", "3"]
WARM = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="synthetic:200K", metavar="synthetic:NODES",
                   help="the training graph: a synthetic community graph of NODES nodes, 10 in-edges each")
    p.add_argument("--feat-dim", type=flags.positive, default=128, help="features per node (float32)")
    flags.add_fanout(p)
    p.add_argument("--train-batch", type=flags.positive, default=1024, help="seed nodes per batch on each rank")
    p.add_argument("--train-batches", type=flags.positive, default=20, help="timed training steps")
    p.add_argument("--hidden", type=flags.positive, default=128, help="GraphSAGE hidden width")


def graph_of(spec: str, feat_dim: int, seed: int):
    """The ``--graph`` spec's graph (every rank makes the same one)."""
    kind, _, nodes = spec.partition(":")
    if kind != "synthetic" or not nodes:
        raise SystemExit(f"--graph {spec!r}: benchmarks/research remote trains on synthetic:NODES graphs")
    return synthetic(num_nodes=flags.count(nodes), avg_degree=10, feat_dim=feat_dim, seed=seed)


def run(args, device: torch.device, cluster) -> dict:
    """Both runs (collective); every rank returns the same report."""
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = torch.get_num_threads()
    if "HMGSTORE_NODE_ID" in os.environ:  # simulated machines share this host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        g = graph_of(args.graph, args.feat_dim, args.seed)
        one = _one_machine(args, g, device) if rank == 0 else None
        dist.barrier(group=cluster.control)
        per_rank = _machines(args, g, device, cluster)  # the slowest rank's rate, the same on every rank
        shared: list[Any] = [one]
        dist.broadcast_object_list(shared, src=0, group=cluster.control)  # rank 0's one-machine rate
        one = shared[0]
    finally:
        used = torch.get_num_threads()
        torch.set_num_threads(threads)
    return {"graph": args.graph, "nodes": g.num_nodes, "edges": int(g.edge_index.shape[1]),
            "feat_dim": args.feat_dim, "fanout": args.fanout, "batch_per_rank": args.train_batch,
            "batches": args.train_batches, "ranks": world, "threads_per_rank": used,
            "one_machine_batches_per_s": one, "per_rank_batches_per_s": per_rank,
            "all_ranks_batches_per_s": per_rank * world, "speedup": per_rank * world / one,
            "efficiency": per_rank / one}


def _model(args, g, device):
    dims = [args.feat_dim] + [args.hidden] * (len(args.fanout) - 1) + [g.num_classes]
    return SAGE(dims).to(device)


def _one_machine(args, g, device) -> float:
    """Batches/s of one process holding the whole graph (hmgstore's single-machine path)."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device=device, progress=False)
    sampler = HybridNeighborSampler(stores, args.fanout, device=device, progress=False)
    loader = NeighborLoader(stores, args.fanout, neighbor_sampler=sampler, input_nodes=g.train_idx,
                            batch_size=args.train_batch, shuffle=True, drop_last=True)
    model = _model(args, g, device)
    try:
        return _timed(model, loader, args.train_batches, device, None)
    finally:
        sampler.close()
        for table in stores[0].tables().values():
            table.close()


def _machines(args, g, device, cluster) -> float:
    """Batches/s of each rank of the partitioned run (collective)."""
    from torch.nn.parallel import DistributedDataParallel

    import hmgstore.distributed as hd
    from hmgstore.plugins.pyg import ClusterFeatureStore, ClusterNeighborSampler, cluster_loader

    rank, world = dist.get_rank(), dist.get_world_size()
    book = hd.PartitionBook.hash(g.num_nodes, cluster.num_machines)
    part = hd.part_of({"x": g.x, "y": g.y}, g.edge_index, book, cluster.machine, device, progress=False)
    tables = {name: hd.ClusterTensor(t, book) for name, t in part.features.items()}
    sampler = ClusterNeighborSampler(part, args.fanout, generator=torch.Generator().manual_seed(args.seed + rank),
                                     device=device if device.type == "cuda" else None)
    loader = cluster_loader(ClusterFeatureStore(tables), sampler, g.train_idx.tensor_split(world)[rank],
                            args.train_batch, shuffle=True, seed=args.seed + rank)
    model = DistributedDataParallel(_model(args, g, device), device_ids=[device.index] if device.type == "cuda"
                                    else None)
    try:
        return _timed(model, loader, args.train_batches, device, cluster.control)
    finally:
        sampler.close()
        for table in tables.values():
            table.close()
        part.close()


def _timed(model, loader, batches: int, device, control) -> float:
    """Batches/s of ``batches`` training steps after :data:`WARM`, from a barrier to the slowest rank's end
    (``control``: the group of every rank; None: this process alone)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def epochs():
        for epoch in itertools.count():
            if hasattr(loader.batch_sampler, "set_epoch"):
                loader.batch_sampler.set_epoch(epoch)
            yield from loader

    steps = epochs()
    start = None
    for i in range(WARM + batches):
        if i == WARM:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if control is not None:
                dist.barrier(group=control)
            start = time.perf_counter()
        batch = next(steps).to(device)
        optimizer.zero_grad()
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        # An empty (padding) batch still runs backward: DDP all-reduces on every rank.
        loss = F.cross_entropy(out, batch.y[:batch.batch_size]) if batch.batch_size else out.sum() * 0
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    assert start is not None  # set when the warm-up ended: batches >= 1
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    if control is not None:
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=control)
    return batches / float(seconds)


def table_lines(train: dict, report: dict | None = None) -> list[str]:
    """The training half of ``report``, as markdown lines (its ratios n/a in a ``--quick`` report)."""
    report = report or {}
    fanout = ",".join(map(str, train["fanout"]))
    return [f"GraphSAGE on {train['graph']} ({train['nodes']:,} nodes, {train['edges']:,} edges, "
            f"{train['feat_dim']}-d), fanout {fanout}, {train['batch_per_rank']} seeds a batch per rank, "
            f"{train['batches']} timed steps, {train['threads_per_rank']} torch threads per rank:", "",
            "| run | batches/s per rank | batches/s in all | speed-up (x one machine) | efficiency |",
            "|---|---:|---:|---:|---:|",
            f"| one machine holding everything (1 rank) | {train['one_machine_batches_per_s']:.1f} | "
            f"{train['one_machine_batches_per_s']:.1f} | {ratio_text(report, 1.0)} | {ratio_text(report, 1.0)} |",
            f"| partitioned, {train['ranks']} ranks | {train['per_rank_batches_per_s']:.1f} | "
            f"{train['all_ranks_batches_per_s']:.1f} | {ratio_text(report, train['speedup'])} | "
            f"{ratio_text(report, train['efficiency'])} |"]
