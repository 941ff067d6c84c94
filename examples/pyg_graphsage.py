"""GraphSAGE node classification with PyG's NeighborLoader, features served by hmgstore.

This is the canonical PyG mini-batch script (as in PyG's ogbn-products
example). The changes that put hmgstore under it are the lines marked
``<-- hmgstore``: the loader gets ``(feature_store, graph_store)`` instead of
``data``, and hmgstore's neighbour sampler (on the GPU when there is one,
its topology in GPU and pinned host memory); everything else is stock PyG.

    python examples/pyg_graphsage.py                                   # synthetic graph, GPU if present
    python examples/pyg_graphsage.py --dataset-root ~/ogb --gpu-budget 8GB   # ogbn-products if on disk
    python examples/pyg_graphsage.py --sampler pyg      # hmgstore's stores, PyG's CPU sampler (needs torch-sparse)
    python examples/pyg_graphsage.py --features cpu --sampler pyg   # stock PyG, data.x on the CPU
    python examples/pyg_graphsage.py --features gpu     # data.x and the topology on the GPU: the ceiling
    python examples/pyg_graphsage.py --host-dtype bfloat16   # x's host rows in 16 bits, read back as float32
    python examples/pyg_graphsage.py --no-trim --no-tf32   # every hop's full subgraph at every layer; fp32 matmuls

The model trims each batch to what the next layers need
(``torch_geometric.utils.trim_to_layer`` with the batch's
``num_sampled_nodes``/``num_sampled_edges``) and lets CUDA matmuls use TF32;
after training, a layer-wise inference pass over all nodes (as in PyG's own
GraphSAGE examples: each layer over every node, all neighbours) gives the
full-graph test accuracy (``--no-inference`` skips it).

Each training step is split into sampling (the sampler, plus loader
overhead), gather (features and labels of the sampled nodes on the device,
including the batch's copy to it) and training, CUDA-synchronised at each
boundary (so nothing overlaps while timing). With ``--num-workers > 0`` the
work done inside workers shows up as sampling (waiting for the workers).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import platform
import statistics
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.nn.functional as F
import torch_geometric
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import trim_to_layer
from tqdm import tqdm

import hmgstore
from hmgstore import data as datasets
from hmgstore.cli import flags
from hmgstore.plugins.pyg import HybridNeighborSampler, from_data, pyg_sampler_available

OGB_DATASETS = ("ogbn-products", "ogbn-papers100M")
HOST_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SAGE(torch.nn.Module):
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int,
                 trim: bool = True):
        super().__init__()
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))
        self.trim = trim

    def forward(self, x, edge_index, num_sampled_nodes=None, num_sampled_edges=None):
        """Logits of the batch's nodes; with ``trim`` and the per-hop counts, layer ``i`` skips the nodes and edges
        of the outer hops, which no longer reach the seeds (the seeds' logits are the same)."""
        trim = self.trim and num_sampled_nodes is not None and num_sampled_edges is not None
        for i, conv in enumerate(self.convs):
            if trim:
                x, edge_index, _ = trim_to_layer(i, num_sampled_nodes, num_sampled_edges, x, edge_index)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), p=0.5, training=self.training)
        return x

    @torch.no_grad()
    def inference(self, x_all, loader, device) -> torch.Tensor:
        """Layer-wise logits of every node (PyG's GraphSAGE examples): each layer over all nodes, batch by batch,
        every neighbour (``loader``: one hop, all neighbours, every node once as a seed, in order). Layer 0 reads
        the batch's features as the loader gathered them (``x_all`` None), later layers the previous layer's
        output (CPU)."""
        for i, conv in enumerate(self.convs):
            outs = []
            for batch in loader:
                x = batch.x if x_all is None else x_all[batch.n_id.cpu()]
                x = conv(x.to(device), batch.edge_index.to(device))
                if i < len(self.convs) - 1:
                    x = x.relu()
                outs.append(x[:batch.batch_size].cpu())
            x_all = torch.cat(outs)
        return x_all


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="auto",
                   help="'synthetic', an OGB name (ogbn-products, ogbn-papers100M: must be under --dataset-root), "
                        "or 'auto': the first OGB dataset found under --dataset-root, else synthetic")
    p.add_argument("--dataset-root", default="dataset", help="folder holding OGB datasets (never downloaded)")
    p.add_argument("--num-nodes", type=flags.synthetic_nodes, default=10_000, help="synthetic graph: nodes")
    p.add_argument("--avg-degree", type=flags.positive, default=10, help="synthetic graph: edges per node")
    p.add_argument("--feat-dim", type=flags.positive, default=128, help="synthetic graph: feature width")
    p.add_argument("--features", choices=("hmgstore", "cpu", "gpu"), default="hmgstore",
                   help="hmgstore stores, or stock PyG with data.x on the CPU / on the GPU")
    p.add_argument("--device", type=flags.device, default=None,
                   help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--gpu-budget", type=flags.size("auto", "none"), default="auto",
                   help="hmgstore: GPU memory for hot rows, e.g. 8GB; 'auto' (default): the lesser of the whole "
                        "table and half the GPU's free memory (none on a CPU); 'none': every row in host memory")
    p.add_argument("--host-dtype", choices=tuple(HOST_DTYPES), default="float32",
                   help="hmgstore: keep x's host rows in this width; bfloat16/float16 halve the host bytes and "
                        "every row then reads as x.to(host_dtype).float() (default: float32, as given)")
    p.add_argument("--sampler", choices=("hmgstore", "pyg"), default="hmgstore",
                   help="hmgstore's neighbour sampler (GPU or CPU, no compiled extension), or PyG's own "
                        "(CPU; needs torch-sparse or pyg-lib)")
    p.add_argument("--pipeline", choices=("on", "off", "producer"), default=None,
                   help="hmgstore.Pipeline: sample and gather the next batches on a side stream while the model "
                        "trains (default: on when hmgstore's sampler runs on a GPU); producer: hmgstore.Producer, "
                        "the same in a process of its own (pays under CUDA MPS; see the README)")
    p.add_argument("--topology-budget", type=flags.size("all", "none", "auto"), default=None,
                   help="hmgstore sampler on a GPU: GPU memory for hot adjacency lists, e.g. 2GB; 'all' keeps the "
                        "whole topology on the GPU; 'none' reads it all from pinned host memory (default: all of it "
                        "on the GPU when --features gpu, else 'auto': the lesser of the whole topology and half the "
                        "GPU memory free after the features)")
    p.add_argument("--epochs", type=flags.positive, default=3)
    p.add_argument("--no-trim", action="store_true",
                   help="run every layer over the batch's whole subgraph (default: trim_to_layer drops the outer "
                        "hops each layer no longer needs)")
    p.add_argument("--no-tf32", action="store_true", help="full float32 matmuls on CUDA (default: TF32 allowed)")
    p.add_argument("--no-inference", action="store_true",
                   help="skip the layer-wise inference pass over all nodes after training")
    p.add_argument("--inference-batch-size", type=flags.positive, default=4096,
                   help="seeds per batch of the inference pass (default: 4096)")
    flags.add_batch_size(p, 1024)
    flags.add_fanout(p)
    p.add_argument("--hidden", type=flags.positive, default=256)
    p.add_argument("--lr", type=flags.positive_real, default=0.003)
    p.add_argument("--num-workers", type=flags.natural, default=0)
    flags.add_max_batches(p)
    p.add_argument("--loss-every", type=flags.positive, default=25,
                   help="show the loss every N batches (default: 25); reading it makes the training thread wait "
                        "for the GPU, which then idles while the next step is issued")
    flags.add_seed(p)
    p.add_argument("--json", default=None, help="write the results (timings per epoch, accuracy) here")
    flags.add_no_progress(p)
    return p.parse_args(argv)


def load_graph(args) -> tuple[datasets.NodeGraph, str]:
    """The OGB dataset asked for (or found), else the embedded synthetic graph."""
    from hmgstore.data import ogb

    if args.dataset == "auto" or args.dataset.startswith("ogbn-"):
        for name in OGB_DATASETS if args.dataset == "auto" else (args.dataset,):
            try:
                return ogb.load_node_dataset(args.dataset_root, name), name
            except FileNotFoundError as err:
                if args.dataset != "auto":
                    sys.exit(f"error: {err}")
        print(f"no OGB dataset under {args.dataset_root!r}; using the synthetic graph "
              f"({args.num_nodes:,} nodes, {args.feat_dim} features)", file=sys.stderr)
    elif args.dataset != "synthetic":
        sys.exit(f"error: unknown dataset {args.dataset!r}")
    graph = datasets.synthetic(num_nodes=args.num_nodes, avg_degree=args.avg_degree, feat_dim=args.feat_dim,
                               seed=args.seed)
    return graph, "synthetic"


# ---- timing: not part of the canonical script ---------------------------------------------
class StepTimer:
    """Seconds spent per phase, synchronising CUDA at each boundary so work is charged where it was queued."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds: dict[str, float] = defaultdict(float)
        self.thread = threading.get_ident()

    @contextmanager
    def __call__(self, phase: str):
        # A synchronisation waits for every stream of the GPU: in a pipeline's thread it would hold each batch
        # until the step (and, under DDP, every rank's all-reduce) is done, so the loader never overlaps.
        if threading.get_ident() != self.thread:
            raise RuntimeError("StepTimer times the training loop's own thread; a pipelined loader must not be "
                               "watched (watch_gather only without a pipeline)")
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[phase] += time.perf_counter() - start

    def watch_gather(self, loader: NeighborLoader) -> None:
        """Charge PyG's filter_fn (it joins sampled nodes with their features) to 'filter'."""
        filter_fn = loader.filter_fn

        def timed(out):
            with self("filter"):
                return filter_fn(out)

        loader.filter_fn = timed

    def split(self) -> dict[str, float]:
        """sampling = waiting for the loader minus its gather; gather = that gather plus the copy to the device."""
        s = self.seconds
        return {"sampling_s": s["load"] - s["filter"], "gather_s": s["filter"] + s["to_device"],
                "train_s": s["train"]}


# ---- the script ----------------------------------------------------------------------------
def sampled_counts(batch) -> tuple:
    """The batch's per-hop node and edge counts for trim_to_layer, or (None, None) when its sampler gave none."""
    return getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)


def train_epoch(model, optimizer, loader, device, *, total: int, timer: StepTimer, pipeline=None,
                desc: str = "epoch", progress: bool = True, loss_every: int = 25, after_step=None) -> dict:
    """Train on ``total`` batches; the loop both examples run (the multi-GPU one under DDP).

    ``pipeline``: an ``hmgstore.Pipeline`` or ``Producer`` over ``loader``, whose batches arrive sampled and
    gathered on the device while the previous one trains: then only the training and the loop's waits are
    timed. Without one, each step is split into load, copy to the device and train, synchronised at each
    boundary (nothing overlaps). ``after_step(batch)`` runs after every step. Returns the epoch's seconds,
    batches, batches/s, last loss and per-phase seconds (``sampling_s``, ``gather_s``, ``train_s``, and
    ``wait_s`` with a pipeline).
    """
    model.train()
    before, batches, train_s = dict(timer.split()), 0, 0.0
    bar = tqdm(total=total, desc=desc, disable=not progress)
    start = time.perf_counter()
    batches_in = iter(pipeline if pipeline is not None else loader)
    while batches < total:
        if pipeline is not None:  # phases overlap: only the training is timed (and the loop's waits, below)
            batch = next(batches_in)
            t0 = time.perf_counter()
        else:
            with timer("load"):
                batch = next(batches_in)
            with timer("to_device"):
                batch = batch.to(device, non_blocking=True)
        with timer("train") if pipeline is None else contextlib.nullcontext():
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, *sampled_counts(batch))[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()  # under DDP, the gradients' all-reduce runs here
            optimizer.step()
        if after_step is not None:
            after_step(batch)
        batches += 1
        bar.update()
        if batches % loss_every == 0:  # reading the loss waits for the GPU: not every step
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if pipeline is not None:
            train_s += time.perf_counter() - t0
    if pipeline is not None:
        batches_in.close()
    bar.close()
    seconds = time.perf_counter() - start
    after = timer.split()
    split = {k: after[k] - before[k] for k in after}
    if pipeline is not None:
        split = {"sampling_s": 0.0, "gather_s": 0.0, "train_s": train_s, "wait_s": pipeline.waited}
    return {"seconds": seconds, "batches": batches, "batches_per_s": batches / seconds, "loss": loss.item(),
            **split}


@torch.no_grad()
def evaluate(model, loader, device, max_batches: int | None = None, progress: bool = True) -> tuple[int, int]:
    """``(correct, total)`` predictions of the seed nodes of ``loader``'s batches (at most ``max_batches``)."""
    model.eval()
    correct = total = 0
    for step, batch in enumerate(tqdm(loader, desc="test", disable=not progress)):
        if step == max_batches:
            break
        batch = batch.to(device, non_blocking=True)
        pred = model(batch.x, batch.edge_index, *sampled_counts(batch))[:batch.batch_size].argmax(dim=-1)
        correct += int((pred == batch.y[:batch.batch_size]).sum())
        total += batch.batch_size
    return correct, total


def build_loaders(args, device, graph, host_dtype):
    """``(train loader, test loader, the loaders' keyword arguments)`` as the flags ask; the stores are the
    loaders' ``data``, the sampler their ``neighbor_sampler``."""
    data = Data(x=graph.x, y=graph.y, edge_index=graph.edge_index)
    fanout = args.fanout

    source = data  # stock PyG: the loader gathers features from the Data object
    loader_kwargs = dict(batch_size=args.batch_size, num_workers=args.num_workers,
                         persistent_workers=args.num_workers > 0)
    if args.features == "hmgstore":
        budget = None if str(args.gpu_budget).lower() == "none" else args.gpu_budget
        source = from_data(data, device=device, gpu_budget=budget, host_dtype=host_dtype)  # <-- hmgstore
        loader_kwargs["filter_per_worker"] = False  # workers (if any) sample; the main process gathers on the GPU
    elif args.features == "gpu":
        data = data.to(device)  # baseline: the whole table on the GPU
        source = data
    if args.sampler == "hmgstore":
        budget = args.topology_budget or ("all" if args.features == "gpu" else "auto")
        budget = {"all": 2**62, "none": None}.get(str(budget).lower(), budget)
        on = device if args.features != "cpu" else torch.device("cpu")
        sampler = HybridNeighborSampler(source, fanout, device=on, gpu_budget=budget)  # <-- hmgstore
        loader_kwargs["neighbor_sampler"] = sampler
        if on.type == "cuda" and args.num_workers:
            print("the GPU sampler samples in the main process: --num-workers is set to 0", file=sys.stderr)
            loader_kwargs.update(num_workers=0, persistent_workers=False)

    train_loader = NeighborLoader(source, num_neighbors=fanout, input_nodes=graph.train_idx, shuffle=True,
                                  **loader_kwargs)
    test_loader = NeighborLoader(source, num_neighbors=fanout, input_nodes=graph.test_idx, **loader_kwargs)
    return train_loader, test_loader, loader_kwargs


def graph_gpu_memory(loader, sampler) -> dict:
    """``{"features" / "topology": (bytes on the GPU, bytes in all)}`` of what hmgstore holds, as built."""
    held = {}
    if isinstance(loader.data, tuple):  # hmgstore's (feature_store, graph_store)
        tables = loader.data[0].tables().values()
        held["features"] = (sum(t.num_gpu_rows * t.gpu_row_bytes for t in tables),
                            sum(t.num_rows * t.gpu_row_bytes for t in tables))
    if sampler is not None:
        topologies = sampler.sampler.topologies.values()
        held["topology"] = (sum(t.gpu_edges * t.row.element_size() for t in topologies),
                            sum(t.num_edges * t.row.element_size() for t in topologies))
    return held


def gpu_memory_line(held: dict, args, device) -> str:
    """One line saying how much of the graph the budgets put in GPU memory, and by which rule."""
    if device.type != "cuda":
        whole = " and ".join(f"{name} {size / 1e6:.1f} MB" for name, (_, size) in held.items())
        return f"graph in GPU memory: none (no GPU here: {whole} read from host memory)"
    parts = ", ".join(f"{name} {on / 1e6:.1f} of {whole / 1e6:.1f} MB" for name, (on, whole) in held.items())
    rules = [f"--gpu-budget {args.gpu_budget}" if "features" in held else "",
             f"--topology-budget {args.topology_budget or ('all' if args.features == 'gpu' else 'auto')}"
             if "topology" in held else ""]
    return (f"graph in GPU memory: {parts} ({'; '.join(r for r in rules if r)}; 'auto' is the lesser of the "
            "whole and half the GPU memory free when each is built)")


def inference_loader(args, source, graph, loader_kwargs) -> NeighborLoader:
    """One hop, every neighbour, every node once as a seed, in id order: the layer-wise inference pass's batches."""
    kwargs = dict(loader_kwargs, batch_size=args.inference_batch_size)
    sampler = kwargs.pop("neighbor_sampler", None)
    if sampler is not None:  # the same kind of sampler, on the same device, all neighbours
        kwargs["neighbor_sampler"] = HybridNeighborSampler(source, [-1], device=sampler.device)  # <-- hmgstore
    return NeighborLoader(source, num_neighbors=[-1], input_nodes=torch.arange(graph.num_nodes), **kwargs)


def make_train_loader(args, device):
    """The training loader, built again in hmgstore.Producer's process (--pipeline producer) from the flags."""
    graph, _ = load_graph(args)
    return build_loaders(args, device, graph, HOST_DTYPES[args.host_dtype])[0]


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.features == "gpu" and device.type != "cuda":
        sys.exit("error: --features gpu holds the table on a GPU, and there is none here (torch sees no CUDA "
                 "device); use --features hmgstore or --features cpu")
    host_dtype = HOST_DTYPES[args.host_dtype]
    if host_dtype is not None and args.features != "hmgstore":
        sys.exit(f"error: --host-dtype {args.host_dtype} is a choice of hmgstore's feature store; --features "
                 f"{args.features} is stock PyG, which reads data.x as it is. Use --features hmgstore")
    if args.sampler == "pyg" and not pyg_sampler_available():  # else an ImportError at the first batch
        sys.exit("error: --sampler pyg needs PyG's own sampler (pyg-lib or torch-sparse), which is not installed "
                 "here: run `make pyg-sampler` (about 17 minutes), or use --sampler hmgstore")
    graph, dataset_name = load_graph(args)
    train_loader, test_loader, loader_kwargs = build_loaders(args, device, graph, host_dtype)
    gpu_memory = graph_gpu_memory(train_loader, loader_kwargs.get("neighbor_sampler"))
    if gpu_memory:
        print(gpu_memory_line(gpu_memory, args, device))
    bound = hmgstore.host_bound(train_loader) if args.features == "hmgstore" else None  # <-- hmgstore: on a GPU,
    if bound is not None:  # what the host reads allow, in one line with the fix (None on a machine without a GPU)
        print(bound)

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not args.no_tf32
    model = SAGE(graph.x.shape[1], args.hidden, graph.num_classes, len(args.fanout), trim=not args.no_trim).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    timer = StepTimer(device)

    producer = None
    if args.pipeline == "producer":  # <-- hmgstore: the training batches made in a process of their own
        producer = hmgstore.Producer(functools.partial(make_train_loader, args, device), seed=args.seed).start()
    pipelined = producer is not None or args.pipeline == "on" or (
        args.pipeline is None and args.sampler == "hmgstore" and device.type == "cuda" and args.features != "cpu")
    if not pipelined:  # the phases are timed only in the loop's own thread (StepTimer)
        timer.watch_gather(train_loader)

    def train(epoch: int) -> dict:
        total = min(len(train_loader), args.max_batches or len(train_loader))
        # <-- hmgstore: the next batches are sampled and gathered while this one trains
        pipeline = (producer or hmgstore.Pipeline(train_loader, depth=2)) if pipelined else None
        return {"epoch": epoch, **train_epoch(model, optimizer, train_loader, device, total=total, timer=timer,
                                               pipeline=pipeline, desc=f"epoch {epoch}",
                                               progress=not args.no_progress, loss_every=args.loss_every)}

    def test() -> float:
        correct, total = evaluate(model, test_loader, device, args.max_batches, progress=not args.no_progress)
        return correct / total

    epochs = [train(epoch) for epoch in range(1, args.epochs + 1)]
    if producer is not None:
        producer.close()
    source = test_loader.data
    counted = [obj for obj in (source[0] if isinstance(source, tuple) else None,
                               loader_kwargs.get("neighbor_sampler")) if obj is not None]
    for obj in counted:  # hit ratios of the GPU tiers, counted over the test pass
        obj.reset_stats()
    accuracy = test()
    hits = {name: obj.stats()["hit_ratio"] for name, obj in zip(("features", "topology"), counted)}
    inference = None
    if not args.no_inference:  # layer-wise, over all nodes: the full-graph accuracy
        model.eval()
        start = time.perf_counter()
        logits = model.inference(None, inference_loader(args, test_loader.data, graph, loader_kwargs), device)
        inference = {"seconds": time.perf_counter() - start,
                     "test_acc": float((logits[graph.test_idx].argmax(-1) == graph.y[graph.test_idx]).float().mean())}

    steady = epochs[1:] or epochs  # the first epoch pays for warm-up (kernel compilation, page faults)
    result = {
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]) if argv is None else argv,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "versions": {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
                     "hmgstore": hmgstore.__version__},
        "features": args.features, "host_dtype": args.host_dtype, "gpu_budget": args.gpu_budget,
        "num_workers": loader_kwargs["num_workers"], "pipeline": pipelined, "gpu_hit_ratio": hits,
        "sampler": args.sampler, "topology_budget": args.topology_budget, "graph_gpu_memory": gpu_memory,
        "host_bound": dataclasses.asdict(bound) if bound is not None else None,
        "dataset": {"name": dataset_name, "num_nodes": graph.num_nodes, "num_edges": graph.edge_index.shape[1],
                    "feat_dim": graph.x.shape[1], "x_gb": graph.x.nelement() * graph.x.element_size() / 1e9},
        "epochs": epochs,
        "steady_epoch_s": statistics.median(e["seconds"] for e in steady),
        "steady_batches_per_s": statistics.median(e["batches_per_s"] for e in steady),
        "steady_split_s_per_batch": {k: statistics.median(e[k] / e["batches"] for e in steady)
                                     for k in ("sampling_s", "gather_s", "train_s", "wait_s") if k in steady[0]},
        "test_acc": accuracy,
        "trim": not args.no_trim, "tf32": not args.no_tf32, "inference": inference,
    }
    split = {k: v for k, v in result["steady_split_s_per_batch"].items() if v or k in ("train_s", "wait_s")}
    print(f"{dataset_name}, features={args.features}"
          f"{f' (host rows {args.host_dtype})' if host_dtype is not None else ''}, sampler={args.sampler}"
          f"{', pipelined' if pipelined else ''}: test accuracy {accuracy:.4f}; "
          f"{result['steady_epoch_s']:.2f} s/epoch, {result['steady_batches_per_s']:.2f} batches/s; per batch "
          + ", ".join(f"{k[:-2]} {1e3 * v:.1f} ms" for k, v in split.items())
          + "".join(f"; {name} from GPU memory {ratio:.0%}" for name, ratio in hits.items() if ratio is not None)
          + ("" if device.type == "cuda" or not hits else " (no GPU: every row is read from host memory)")
          + ("" if inference is None else f"; layer-wise inference over all {graph.num_nodes:,} nodes: test "
             f"accuracy {inference['test_acc']:.4f} in {inference['seconds']:.2f} s"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
