"""GraphSAGE on every GPU of a node: one process per GPU (torchrun), DDP, features sharded by hmgstore.

The multi-GPU form of examples/pyg_graphsage.py (same model, same timing):
each process trains a DistributedDataParallel copy of the model on its own
slice of the training ids, with PyG's NeighborLoader over hmgstore's stores
and hmgstore's neighbour sampler on its own GPU, overlapped with training by
``hmgstore.Pipeline``. What hmgstore changes is marked ``<-- hmgstore``:

- the node's first process builds the graph once and puts its arrays in
  node-shared memory (:func:`hmgstore.distributed.share_on_node`): one host
  copy per node, however many processes;
- the feature table is sharded over the node's GPUs
  (:func:`hmgstore.distributed.shard`): each GPU holds the hottest rows
  (``--replicate`` bytes of them) and its shard of the next hottest, up to
  ``--gpu-budget`` bytes; a gather reads its own GPU, its peers' over NVLink
  and the rest from host memory, in one kernel launch;
- each process samples on its own GPU (``HybridNeighborSampler``), the
  topology replicated in each GPU's memory (``--topology-budget all``, the
  default; with a byte budget, each GPU holds the hottest adjacency lists
  (``--topology-replicate``) and its shard of the next hottest, reads its
  peers' shards over NVLink and the rest zero-copy from the node-shared host
  copy: :func:`hmgstore.distributed.sharded_topology`), and
  ``hmgstore.Pipeline`` samples and gathers the next batches on a side
  stream while this one trains (``--pipeline off`` to time the phases).

    torchrun --standalone --nproc-per-node 4 examples/multi_gpu_pyg.py --gpu-budget 2GB --replicate 256MB
    torchrun --standalone --nproc-per-node 2 examples/multi_gpu_pyg.py --num-nodes 3000   # CPU only: gloo
    torchrun --standalone --nproc-per-node 2 examples/multi_gpu_pyg.py --graph papers:111M:1.6B --gpu-budget 60GB

(``--graph papers:NODES:EDGES``: a papers100M-shaped power-law graph, for timing; ``python -m hmgstore.bench
scale`` runs this script on 1 and N GPUs and reports the scaling.)

Without a GPU the same script runs on the CPU with gloo (hmgstore's sampler
and gathers on the CPU, no compiled extension needed). PyG's own CPU sampler
took 114 ms of a 133 ms step on two H200s (2M nodes, fanout 15,10,5) when this
example used it. Every rank runs the same number of steps (the sampler drops
the ids that would make slices uneven), as DDP's gradient all-reduce needs.

Timing: with the pipeline, the step's training time and the time the loop
waited for batches; without it (``--pipeline off``, and on the CPU), split
per step as in examples/pyg_graphsage.py: sampling, gather (features and
labels of the sampled nodes, on the device) and train (which includes DDP's
all-reduce, so it waits for the slowest rank). Rank 0 prints each rank's
figures and their aggregate; ``--json`` writes them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch_geometric
from pyg_graphsage import SAGE, StepTimer, evaluate, train_epoch  # the single-GPU example's (this folder)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler
from torch_geometric.loader import NeighborLoader

import hmgstore
import hmgstore.distributed as hd
from hmgstore import HybridTensor
from hmgstore import data as datasets
from hmgstore.cli import flags
from hmgstore.graph import CSC, expected_draws
from hmgstore.plugins.pyg import CSCGraphStore, HybridFeatureStore, HybridNeighborSampler, to_csc
from hmgstore.rows import hotness

TORCHRUN = "torchrun --standalone --nproc-per-node NUM_GPUS examples/multi_gpu_pyg.py [options]"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=f"start it with: {TORCHRUN}")
    p.add_argument("--graph", default="synthetic", type=graph_spec,
                   help="synthetic (hmgstore's community graph: --num-nodes, --avg-degree, --feat-dim) or "
                        "papers:NODES:EDGES, a papers100M-shaped power-law topology (papers:111M:1.6B is "
                        "ogbn-papers100M's size) with --feat-dim features of a constant pattern and random labels: "
                        "for timing, its accuracy means nothing")
    p.add_argument("--num-nodes", type=flags.synthetic_nodes, default=None,
                   help="synthetic graph: nodes (default: 1,000,000 on GPUs, 20,000 on the CPU, where a step of "
                        "the larger graph takes seconds)")
    p.add_argument("--avg-degree", type=flags.positive, default=10, help="synthetic graph: edges per node")
    p.add_argument("--feat-dim", type=flags.positive, default=128, help="synthetic graph: feature width")
    p.add_argument("--gpu-budget", type=flags.size(), default="2GB",
                   help="GPU memory each GPU gives the feature table, e.g. 2GB")
    p.add_argument("--replicate", type=flags.size(), default="256MB",
                   help="part of --gpu-budget holding the hottest rows on every GPU; the rest holds its shard")
    p.add_argument("--compress", default=None, choices=("int8", "float8", "bfloat16", "float16"),
                   help="keep the features' rows in this format in every tier (GPUs and host), encoded once per "
                        "node; --gpu-budget then counts stored bytes (default: float32 as given)")
    p.add_argument("--topology-budget", type=flags.size("all"), default="all",
                   help="GPU memory each GPU gives the topology for its sampler, e.g. 1GB: the adjacency lists that "
                        "do not fit are sharded over the node's GPUs (read over NVLink) and the rest read from the "
                        "host; 'all' replicates the whole topology on every GPU (default)")
    p.add_argument("--topology-replicate", type=flags.size(), default=None,
                   help="part of --topology-budget holding the hottest lists on every GPU (default: a quarter)")
    p.add_argument("--pipeline", choices=("on", "off"), default=None,
                   help="hmgstore.Pipeline (default: on with GPUs, off on the CPU)")
    p.add_argument("--max-sms", type=flags.as_written(flags.sm_cap), default="auto",
                   help="cap the pipeline's gathers at this many SMs ('auto', the default: hmgstore's choice, "
                        "hmgstore.Pipeline's own; 'none': no cap)")
    p.add_argument("--epochs", type=flags.positive, default=3)
    flags.add_batch_size(p, 1024, "seed nodes, per process,")
    flags.add_fanout(p)
    p.add_argument("--hidden", type=flags.positive, default=256)
    p.add_argument("--lr", type=flags.positive_real, default=0.003)
    p.add_argument("--no-trim", action="store_true",
                   help="run every layer over the batch's whole subgraph (default: trim_to_layer drops the outer "
                        "hops each layer no longer needs)")
    p.add_argument("--no-tf32", action="store_true", help="full float32 matmuls on CUDA (default: TF32 allowed)")
    p.add_argument("--loss-every", type=flags.positive, default=25,
                   help="show the loss every N batches (default: 25); reading it makes the training thread wait")
    flags.add_max_batches(p)
    flags.add_seed(p)
    p.add_argument("--json", default=None, help="rank 0 writes the results (aggregate and every rank's) here")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="trace 10 steps of the last epoch (after 25) with torch.profiler on every rank: "
                        "DIR/rank<R>.json (a Chrome trace) and DIR/rank<R>.txt (kernels by GPU time)")
    flags.add_no_progress(p)
    args = p.parse_args(argv)
    problem = flags.replicate_problem(args.replicate, args.gpu_budget)
    if problem is not None:  # said now, not once every rank has built the graph
        p.error(problem)
    if args.num_nodes is None:
        args.num_nodes = 1_000_000 if torch.cuda.is_available() else 20_000
    return args


def step_profiler(folder: str, rank: int, total: int):
    """A torch.profiler over 10 steps from the 26th (earlier in a short epoch; ``.step()`` after each) that
    writes this rank's trace and table."""
    from torch.profiler import ProfilerActivity, profile, schedule

    def save(prof) -> None:
        os.makedirs(folder, exist_ok=True)
        prof.export_chrome_trace(os.path.join(folder, f"rank{rank}.json"))
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by="self_device_time_total", row_limit=40))

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=max(0, min(20, total - 15)), warmup=5, active=10, repeat=1),
                   on_trace_ready=save)


_GRAPH = flags.graph("synthetic", "papers:NODES:EDGES")


def graph_spec(text: str) -> tuple:
    """``("synthetic",)`` or ``("papers", nodes, edges)`` for a ``--graph`` value."""
    kind, *counts = _GRAPH(text).split(":")
    return (kind, *(flags.count(c) for c in counts))


def start_process_group() -> torch.device:
    """Join torchrun's job (NCCL on GPUs, gloo without); returns this process's device."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("error: this script runs one process per GPU and must be started by torchrun "
                 f"(RANK and WORLD_SIZE are not set):\n    {TORCHRUN}\n"
                 "On a machine without GPUs, --nproc-per-node 2 runs two CPU processes.")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        sys.exit(f"error: local rank {local_rank} has no GPU (this node has {torch.cuda.device_count()}); "
                 "start at most one process per GPU")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def shared_graph(args) -> dict[str, torch.Tensor]:
    """The synthetic graph's arrays in node-shared memory, built once per node (collective).

    Only the node's first rank builds the graph; each array is copied into
    shared memory and the private copy dropped before the next one. Every
    rank gets the same CPU tensors: ``x`` [N, D], ``y`` [N], the topology as
    CSC ``row`` [E] and ``colptr`` [N + 1] (what PyG's sampler reads), and
    ``train_idx``/``test_idx``. Every node builds the same graph (same seed).
    """
    built: dict[str, torch.Tensor] = {}

    def build(name: str):
        def make() -> torch.Tensor:  # runs on the node's first rank only
            if not built:
                built.update(papers_shaped(args) if args.graph[0] == "papers" else community(args))
            return built.pop(name)
        return make

    names = ("x", "y", "row", "colptr", "train_idx", "test_idx")
    return {name: hd.share_on_node(build(name), progress=not args.no_progress) for name in names}  # <-- hmgstore


def community(args) -> dict[str, torch.Tensor]:
    graph = datasets.synthetic(num_nodes=args.num_nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim,
                               seed=args.seed)
    csc = to_csc(graph.edge_index, "coo", size=(graph.num_nodes, graph.num_nodes))
    return dict(x=graph.x, y=graph.y, row=csc.row, colptr=csc.colptr, train_idx=graph.train_idx,
                test_idx=graph.test_idx)


def papers_shaped(args) -> dict[str, torch.Tensor]:
    """A papers100M-shaped graph for timing: power-law in-degrees (made on the GPU when there is one), 1.1% of
    the nodes to train on as in ogbn-papers100M, features of a constant pattern (never all zeros)."""
    _, nodes, edges = args.graph
    csc = datasets.power_law_csc(nodes, edges, 0.6, seed=args.seed,
                                 device="cuda" if torch.cuda.is_available() else None)
    x = torch.empty(nodes, args.feat_dim)
    x.view(torch.int32).view(-1)[:] = 0x3F800000  # 1.0f
    order = torch.randperm(nodes, generator=torch.Generator().manual_seed(args.seed))
    train, test = max(1, nodes * 11 // 1000), max(1, nodes // 1000)
    return dict(x=x, y=torch.randint(0, 172, (nodes,)), row=csc.row, colptr=csc.colptr,
                train_idx=order[:train].sort().values, test_idx=order[train:train + test].sort().values)


# ---- reporting: not part of the training script ------------------------------------------
def seeds_on_several_ranks(trained: torch.Tensor) -> int:
    """Training ids that more than one rank trained on this epoch (0 when the slices are disjoint).

    ``trained``: bool [num_train_ids] on this rank's device, True where this
    rank's loader delivered that training id. Collective (one all-reduce).
    """
    count = trained.to(torch.int32)
    dist.all_reduce(count)
    return int((count > 1).sum())


def bytes_per_batch(table_stats: dict, shard: int, batches: int, stored_per_row: float = 1.0) -> dict[str, float]:
    """Feature bytes a batch read from this GPU (its replica and its shard), its peers' shards (NVLink) and
    host memory (PCIe), from the table's per-tier counters over ``batches`` batches; ``stored_per_row``: stored
    bytes a row takes per byte it reads back as (compressed rows: under 1)."""
    where = {"own_gpu": 0.0, "peers": 0.0, "host": 0.0}
    for name, tier in table_stats["tiers"].items():
        kind = ("own_gpu" if name in ("replica", f"shard{shard}") else
                "peers" if name.startswith("shard") else "host")
        where[kind] += tier["bytes"] * stored_per_row
    return {k: v / max(1, batches) for k, v in where.items()}


def steady(epochs: list[dict]) -> list[dict]:
    """Epochs after the first, which pays for warm-up (kernel compilation, page faults); all if only one."""
    return epochs[1:] or epochs


def aggregate(ranks: list[dict]) -> dict:
    """Rank 0's summary of every rank's epochs: throughput over all ranks, mean per-batch split."""
    epochs = []
    for per_rank in zip(*(r["epochs"] for r in ranks)):
        seconds = max(e["seconds"] for e in per_rank)  # DDP keeps ranks in step: the slowest sets the pace
        batches = sum(e["batches"] for e in per_rank)
        epochs.append({"epoch": per_rank[0]["epoch"], "seconds": seconds, "batches": batches,
                       "batches_per_s": batches / seconds,
                       "seeds_on_several_ranks": per_rank[0]["seeds_on_several_ranks"],
                       **{f"{k[:-2]}_ms_per_batch": statistics.mean(1e3 * e[k] / e["batches"] for e in per_rank)
                          for k in ("sampling_s", "gather_s", "train_s", "wait_s") if k in per_rank[0]}})
    keys = ("batches_per_s", *(k for k in ("sampling_ms_per_batch", "gather_ms_per_batch", "train_ms_per_batch",
                                         "wait_ms_per_batch") if k in epochs[0]))
    return {"epochs": epochs, **{f"steady_{k}": statistics.median(e[k] for e in steady(epochs)) for k in keys}}


# ---- the script ----------------------------------------------------------------------------
def main(argv=None) -> dict | None:
    args = parse_args(argv)
    device = start_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    progress = not args.no_progress and rank == 0
    torch.manual_seed(args.seed)
    fanout = args.fanout

    graph = shared_graph(args)
    num_nodes, num_classes = graph["x"].shape[0], int(graph["y"].max()) + 1
    # rows ranked by how often the sampler draws them (from_data's default; in-degree ranks no better than chance
    # on a directed graph: default-hotness-cpu.md); each rank makes the same exact sums on its own GPU. The arrays
    # are this script's own (the sampler's graph store checks them): no second scan of 1.6B ids on the CPU
    csc = CSC.trusted(graph["row"], graph["colptr"], None, (num_nodes, num_nodes))
    draws = expected_draws(csc, progress=progress, device=device)
    x = hd.shard(graph["x"], gpu_budget=args.gpu_budget, hot_order=hotness.order_by_score(draws),  # <-- hmgstore
                 replicate=args.replicate, device=device, compress=args.compress, progress=progress)
    feature_store = HybridFeatureStore(device)
    feature_store.put_tensor(x.table, group_name=None, attr_name="x", index=None)
    # the labels (8 bytes a node) whole in GPU memory: a batch reads one per sampled node, and from host memory
    # their reads would also put the pipeline's gathers under its SM cap for host reads
    labels = HybridTensor(graph["y"], device, gpu_rows=torch.arange(num_nodes) if device.type == "cuda" else None)
    feature_store.put_tensor(labels, group_name=None, attr_name="y", index=None)  # <-- hmgstore
    graph_store = CSCGraphStore()
    graph_store.put_edge_index((graph["row"], graph["colptr"]), edge_type=None, layout="csc",
                               size=(num_nodes, num_nodes))

    # Every epoch the sampler shuffles all training ids with a common seed and gives this rank
    # every world-th one: disjoint, equal slices (the few ids left over are dropped).
    train_sampler = DistributedSampler(range(len(graph["train_idx"])), num_replicas=world, rank=rank,
                                       shuffle=True, seed=args.seed, drop_last=True)
    whole = args.topology_budget == "all"
    budget = None if device.type != "cuda" else 2**62 if whole else hotness.parse_bytes(args.topology_budget)
    replicate = 0 if whole or budget is None else (hotness.parse_bytes(args.topology_replicate)
                                                   if args.topology_replicate else budget // 4)
    neighbor_sampler = HybridNeighborSampler((feature_store, graph_store), fanout, device=device,  # <-- hmgstore
                                             gpu_budget=budget, shard_topology=not whole,
                                             topology_replicate=replicate, progress=progress)
    loader_kwargs = dict(num_neighbors=fanout, batch_size=args.batch_size, neighbor_sampler=neighbor_sampler)
    train_loader = NeighborLoader((feature_store, graph_store), input_nodes=graph["train_idx"],
                                  sampler=train_sampler, **loader_kwargs)
    test_loader = NeighborLoader((feature_store, graph_store),
                                 input_nodes=graph["test_idx"].tensor_split(world)[rank], **loader_kwargs)

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not args.no_tf32
    model = SAGE(args.feat_dim, args.hidden, num_classes, len(fanout), trim=not args.no_trim).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                    gradient_as_bucket_view=True)  # gradients all-reduced in place, not copied
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    timer = StepTimer(device)
    pipelined = args.pipeline == "on" or (args.pipeline is None and device.type == "cuda")
    if not pipelined:  # timing the gathers synchronises the GPU: in the pipeline's thread it would serialise
        timer.watch_gather(train_loader)  # the loader with every rank's step (StepTimer refuses it)

    def train(epoch: int) -> dict:
        train_sampler.set_epoch(epoch)
        marks: dict[torch.device, torch.Tensor] = {}

        def mark_seeds(batch) -> None:  # positions in train_idx of this batch's seeds
            # marked where the ids are: copying them would wait for the GPU at every step
            ids = batch.input_id
            if ids.device not in marks:
                marks[ids.device] = torch.zeros(len(graph["train_idx"]), dtype=torch.bool, device=ids.device)
            marks[ids.device][ids] = True

        max_sms = flags.sm_cap(args.max_sms)
        pipeline = hmgstore.Pipeline(train_loader, depth=2, max_sms=max_sms) if pipelined else None  # <-- hmgstore
        total = min(len(train_loader), args.max_batches or len(train_loader))
        prof = step_profiler(args.profile, rank, total) if args.profile and epoch == args.epochs else None

        def after_step(batch) -> None:
            mark_seeds(batch)
            if prof is not None:
                prof.step()

        with prof if prof is not None else contextlib.nullcontext():
            result = train_epoch(model, optimizer, train_loader, device, total=total, timer=timer,
                                 pipeline=pipeline, desc=f"epoch {epoch}", progress=progress,
                                 loss_every=args.loss_every, after_step=after_step)
        trained = torch.zeros(len(graph["train_idx"]), dtype=torch.bool, device=device)
        for marked in marks.values():
            trained |= marked.to(device)
        return {"epoch": epoch, **result, "seeds": int(trained.sum()),
                "seeds_on_several_ranks": seeds_on_several_ranks(trained)}

    def test() -> float:
        """Accuracy over every rank's slice of the test ids (collective)."""
        counts = torch.tensor(evaluate(model.module, test_loader, device, args.max_batches, progress), device=device)
        dist.all_reduce(counts)
        return int(counts[0]) / max(1, int(counts[1]))

    epochs = [train(epoch) for epoch in range(1, args.epochs + 1)]
    x.table.reset_stats()  # the test pass counts the rows each tier serves (training runs uncounted)
    accuracy = test()
    test_batches = min(len(test_loader), args.max_batches or len(test_loader))

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    tier_bytes = bytes_per_batch(x.table.stats(), local_rank, test_batches, x.table.gpu_row_bytes / x.table.row_bytes)
    mine = {"rank": rank, "local_rank": local_rank, "device": str(device), "bytes_per_batch": tier_bytes,
            "host": platform.node(), "train_ids": train_sampler.num_samples, "epochs": epochs,
            "steady_batches_per_s": statistics.median(e["batches_per_s"] for e in steady(epochs)),
            "steady_split_s_per_batch": {k: statistics.median(e[k] / e["batches"] for e in steady(epochs))
                                         for k in ("sampling_s", "gather_s", "train_s", "wait_s") if k in epochs[0]}}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)

    topology_sharded = any(t.chunked for t in neighbor_sampler.topologies.values())
    neighbor_sampler.close()  # <-- hmgstore: collective when the topology is sharded
    feature_store.close()
    x.close()  # <-- hmgstore: collective; frees this GPU's shard once no peer reads it
    dist.destroy_process_group()
    if rank != 0:
        return None

    p = x.placement
    result = {
        "command": " ".join(["torchrun", f"--nproc-per-node={os.environ.get('LOCAL_WORLD_SIZE', world)}",
                             *sys.argv]) if argv is None else argv,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "versions": {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
                     "hmgstore": hmgstore.__version__},
        "world_size": world, "backend": "nccl" if device.type == "cuda" else "gloo",
        "gpu_budget": args.gpu_budget, "replicate": args.replicate, "compress": args.compress,
        "batch_size": args.batch_size,
        "fanout": fanout, "pipeline": pipelined, "max_sms": args.max_sms, "topology_budget": args.topology_budget,
        "trim": not args.no_trim, "tf32": not args.no_tf32,
        "topology_sharded": topology_sharded,
        "placement_rows": {**{t.name: t.size for t in p.tiers if t.rows is not None},
                           "host": p.num_rows - p.resident_rows},
        "dataset": {"name": "synthetic" if args.graph[0] == "synthetic" else "papers-shaped",
                    "num_nodes": num_nodes, "num_edges": graph["row"].numel(),
                    "feat_dim": args.feat_dim, "x_gb": graph["x"].nbytes / 1e9},
        "aggregate": aggregate(ranks),
        "test_acc": accuracy,
        "ranks": ranks,
    }
    for r in ranks:
        split = r["steady_split_s_per_batch"]
        print(f"rank {r['rank']} ({r['device']}): {r['steady_batches_per_s']:.2f} batches/s, loss "
              f"{r['epochs'][-1]['loss']:.3f}; per batch "
              + ", ".join(f"{k[:-2]} {1e3 * v:.1f} ms" for k, v in split.items())
              + "; feature MB per batch from "
              + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in r["bytes_per_batch"].items()))
    total = result["aggregate"]
    where = (f"waited {total['steady_wait_ms_per_batch']:.1f} ms per batch for the pipeline" if pipelined else
             f"gather {total['steady_gather_ms_per_batch']:.1f} ms per batch")
    print(f"{world} ranks ({result['backend']}): {total['steady_batches_per_s']:.2f} batches/s over all ranks; "
          f"{where}; test accuracy {accuracy:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
