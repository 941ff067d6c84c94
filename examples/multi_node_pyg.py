"""GraphSAGE over several machines: the graph partitioned, DDP, PyG loaders over hmgstore's cluster stores.

Each machine holds one part of the graph (its nodes' features, labels and
in-edges), written beforehand by ``python -m hmgstore.cli.partition``. Every
rank samples neighbours of any node and gathers any node's rows: the owner
machine answers, sampling its part on its GPU (:mod:`hmgstore.distributed.sampling`,
:class:`hmgstore.distributed.ClusterTensor`); on CPUs :class:`hmgstore.Pipeline`
makes the next batches while the model trains. Sampling and gathers are
collective, so every rank draws the same number of batches
(:func:`hmgstore.plugins.pyg.cluster_loader` pads with empty ones; the loop
below still runs forward and backward on them, so that DDP stays in step).

Write the parts (once, on a disk every machine reads, or copy part{m} to machine m)::

    python -m hmgstore.cli.partition bench-out/parts --parts 2 --by hash --synthetic 20000 --feat-dim 32

Two machines, K processes each (one per GPU; on CPUs, any K: gloo)::

    # on machine 0 (address ADDR)                    # on machine 1
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node K --master-addr ADDR --master-port 29500 \\
        examples/multi_node_pyg.py bench-out/parts --json bench-out/multi-node.json
    torchrun --nnodes 2 --node-rank 1 --nproc-per-node K --master-addr ADDR --master-port 29500 \\
        examples/multi_node_pyg.py parts

Two simulated machines on one host: the same two commands in two shells,
with ``--master-addr 127.0.0.1`` and ``HMGSTORE_NODE_ID=node0`` /
``HMGSTORE_NODE_ID=node1`` before each (hmgstore tells machines apart by
hostname, or by that variable). One machine: parts written with
``--parts 1`` and ``torchrun --standalone --nproc-per-node K``.

``--batch-size`` is the global batch (each rank takes its share), so one
and two machines train alike. Rank 0 prints the test accuracy and with
``--json`` writes it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pyg_graphsage import SAGE  # the single-GPU example's model (this script's folder)
from torch.nn.parallel import DistributedDataParallel

import hmgstore
import hmgstore.distributed as hd
from hmgstore.cli import flags
from hmgstore.plugins.pyg import (
    ClusterFeatureStore,
    ClusterNeighborSampler,
    cluster_loader,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", type=Path, help="folder written by python -m hmgstore.cli.partition (part0 ..., split/)")
    p.add_argument("--epochs", type=flags.positive, default=3)
    flags.add_batch_size(p, 512, "seed nodes over all ranks")
    flags.add_fanout(p)
    p.add_argument("--hidden", type=flags.positive, default=128)
    p.add_argument("--lr", type=flags.positive_real, default=0.01)
    flags.add_seed(p)
    p.add_argument("--json", type=Path, default=None, help="rank 0 writes the results here")
    flags.add_no_progress(p)
    args = p.parse_args(argv)
    if not args.parts.is_dir():  # before torchrun's ranks meet: each would fail on its own
        p.error(f"{args.parts} is not a folder; write the parts first with python -m hmgstore.cli.partition (see "
                "this script's docstring)")
    return args


def start_process_group() -> torch.device:
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("error: start this script with torchrun (see its docstring for the commands)")
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu")
    # Simulated machines on one host (HMGSTORE_NODE_ID) each count local ranks from 0: one GPU per global rank.
    index = int(os.environ["RANK"]) if "HMGSTORE_NODE_ID" in os.environ else int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", index % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    device = start_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    fanout = args.fanout
    start = time.perf_counter()

    cluster = hd.this_cluster()  # <-- hmgstore: which machine this rank runs on
    part = hd.load_partition(args.parts, cluster.machine, device, share=True,  # once per machine
                             progress=not args.no_progress and rank == 0)
    tables = {name: hd.ClusterTensor(part.features[name], part.book) for name in ("x", "y")}
    store = ClusterFeatureStore(tables)
    sampler = ClusterNeighborSampler(part, fanout, generator=torch.Generator().manual_seed(args.seed + rank),
                                     device=device)  # <-- hmgstore: owners sample their part on this GPU
    split = {name: torch.from_numpy(np.load(args.parts / "split" / f"{name}.npy")) for name in ("train", "test")}
    per_rank = max(1, args.batch_size // world)
    train_loader = cluster_loader(store, sampler, split["train"].tensor_split(world)[rank], per_rank, shuffle=True,
                                  seed=args.seed + rank)
    test_loader = cluster_loader(store, sampler, split["test"].tensor_split(world)[rank], per_rank)

    num_classes = int(part.features["y"].source.max()) + 1
    count = torch.tensor([num_classes])
    dist.all_reduce(count, dist.ReduceOp.MAX, group=cluster.control)
    model = SAGE(tables["x"].shape[1], args.hidden, int(count), len(fanout)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    losses, rates = [], []
    for epoch in range(args.epochs):
        model.train()
        train_loader.batch_sampler.set_epoch(epoch)
        began, batches_run = time.perf_counter(), 0
        # hmgstore: the next batches sampled and gathered (collectively, in a thread of their own) while this one
        # trains; DDP's all-reduce stays in this thread, on its own group. Over gloo only: with GPU tables the
        # gathers' exchange is an NCCL group, and two NCCL groups used from two threads may be issued in another
        # order on each rank, which NCCL does not allow (it can deadlock), so GPUs iterate the loader itself.
        batches = hmgstore.Pipeline(train_loader) if device.type == "cpu" else train_loader
        for batch in batches:
            batch = batch.to(device)
            optimizer.zero_grad()
            out = model(batch.x.float(), batch.edge_index)[:batch.batch_size]
            # An empty (padding) batch still runs backward: DDP all-reduces on every rank.
            loss = F.cross_entropy(out, batch.y[:batch.batch_size]) if batch.batch_size else out.sum() * 0
            loss.backward()
            optimizer.step()
            batches_run += 1
        losses.append(loss.item())  # waits for this rank's last step, so the epoch's time below is complete
        rates.append(batches_run / (time.perf_counter() - began))

    model.eval()
    counts = torch.zeros(2, dtype=torch.int64)
    with torch.no_grad():
        for batch in test_loader:
            batch = batch.to(device)
            pred = model.module(batch.x.float(), batch.edge_index)[:batch.batch_size].argmax(-1)
            counts += torch.tensor([int((pred == batch.y[:batch.batch_size]).sum()), batch.batch_size])
    dist.all_reduce(counts, group=cluster.control)
    accuracy = int(counts[0]) / max(1, int(counts[1]))

    for table in tables.values():
        table.close()
    sampler.close()
    part.close()
    dist.destroy_process_group()
    if rank != 0:
        return None
    # every rank runs the same number of batches (padded), so the last epoch's rate per rank is rank 0's
    result = {"test_acc": accuracy, "test_nodes": int(counts[1]), "machines": cluster.num_machines,
              "world_size": world, "losses": losses, "seconds": time.perf_counter() - start,
              "batches_per_s_per_rank": rates[-1] if rates else 0.0,
              "fanout": fanout, "batch_size": args.batch_size, "epochs": args.epochs}
    print(f"{cluster.num_machines} machine(s), {world} rank(s): test accuracy {accuracy:.4f}, last epoch "
          f"{result['batches_per_s_per_rank']:.1f} batches/s per rank ({result['seconds']:.1f} s in all)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
