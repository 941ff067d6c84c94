"""``python benchmarks/research hotness``: cache hit ratios of pre-sampled hotness against degree order.

For each graph, one epoch over the training seeds is pre-sampled
(:func:`hmgstore.graph.presample`) and gives a hotness order; a second epoch,
shuffled differently, is then sampled and counted, and each order's hit ratio
on that second epoch is reported for caches holding 1, 5, 10 and 20% of the
nodes (``--cache``):

- ``features``: share of the gathered feature rows that a cache of that
  share of the nodes holds;
- ``topology``: share of the neighbour ids read (each adjacency-list read
  weighted by min(degree, largest fanout)) that a cache of that share of the
  topology's bytes holds (lists taken in order while they fit, passing
  over any list larger than the whole cache).

Orders compared: ``presample`` (touch counts of the first epoch; for the
topology, neighbour ids read per id held), ``in_degree``
(the default without pre-sampling) and ``out_degree`` (how often a node can
be drawn as a neighbour). Graphs (``--graphs``) are ``NODES:EDGES:TRAIN``:
power-law in-degrees (as ``bench sample``) and neighbours drawn by the same
ranking (``--source-skew``: hubs cite and are cited, as in an undirected
graph), with a random ``TRAIN`` share of the nodes as training seeds. The papers100M-shaped graph is
``111M:1.6B:0.011`` (1.2M training nodes). With a GPU the GPU sampler runs
with the topology in GPU memory; without one, the CPU sampler (a smaller
default graph). Hit ratios are counted, not timed: a CPU run's are what a
GPU would see on the same graph and seeds.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

import torch

from hmgstore.bench.report import header, no_gpu_line, smoke_test_lines, write_report
from hmgstore.cli import flags
from hmgstore.cli.flags import count as _count
from hmgstore.data import power_law_csc
from hmgstore.graph import Hotness, NeighborSampler, Topology, presample
from hmgstore.graph.presample import hit_ratio
from hmgstore.rows.placement import order_by_score

from . import PROG

log = logging.getLogger(__name__)

ORDERS = ("presample", "in_degree", "out_degree")
#: Sizes for a machine without a GPU, and for --quick (see hmgstore.bench.__main__.parse_args).
CPU = ["--graphs", "200K:2M:0.1"]
QUICK = ["--graphs", "20K:200K:0.1", "--batch-size", "256"]


def _graph_spec(text: str) -> tuple[int, int, float]:
    try:
        nodes, edges, train = text.split(":")
        return _count(nodes), _count(edges), float(train)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a graph is NODES:EDGES:TRAIN_SHARE (e.g. 2M:20M:0.1); "
                                         f"got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graphs", type=_graph_spec, nargs="+", metavar="GRAPH",
                   default=[(2_000_000, 20_000_000, 0.1), (111_000_000, 1_600_000_000, 0.011)],
                   help="NODES:EDGES:TRAIN_SHARE graphs with power-law in-degrees (default: 2M:20M:0.1 and the "
                        "papers100M-shaped 111M:1.6B:0.011)")
    p.add_argument("--cache", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2],
                   help="cache sizes, as shares of the nodes")
    flags.add_fanout(p)
    flags.add_batch_size(p, 1024)
    p.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of the in-degrees")
    p.add_argument("--source-skew", type=float, default=1.0,
                   help="Zipf exponent of how often a node is drawn as a neighbour (out-degrees)")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/hotness", help="folder for hotness.json, .md and .png")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def _touches(sampler: NeighborSampler, seeds: torch.Tensor, batch: int, seed: int,
             progress: bool) -> Hotness:
    """Touch counts of one epoch over ``seeds`` in batches of ``batch``, shuffled by ``seed``."""
    return presample(sampler, seeds, epochs=1, batch_size=batch, generator=torch.Generator().manual_seed(seed),
                     progress=progress)


def measure(num_nodes: int, num_edges: int, train_share: float, args, device) -> dict:
    """Hit ratios of every order at every cache size on one graph."""
    csc = power_law_csc(num_nodes, num_edges, args.skew, seed=args.seed,
                        device=device if device.type == "cuda" else None, source_skew=args.source_skew)
    # 3, 1, 2: the draws of the results recorded before --seed (seed 0)
    g = torch.Generator().manual_seed(3 + args.seed)
    seeds = torch.randperm(num_nodes, generator=g)[:max(1, int(train_share * num_nodes))]
    progress = not args.no_progress
    topo = Topology(csc, device, gpu_budget=None if device.type == "cpu" else 2**62, progress=progress)
    sampler = NeighborSampler({None: topo}, {None: num_nodes}, args.fanout)
    first = _touches(sampler, seeds, args.batch_size, seed=1 + args.seed, progress=progress)
    second = _touches(sampler, seeds, args.batch_size, seed=2 + args.seed, progress=progress)
    in_degree = csc.colptr.diff()
    out_degree = torch.bincount(csc.row.long(), minlength=num_nodes)
    fanout = max(args.fanout)
    read = in_degree.clamp(max=fanout) if fanout > 0 else in_degree  # neighbour ids read per visit of a list
    # topology: ids read per byte held, so that one hub read 15 ids at a time does not take the whole cache
    orders = {"presample": {"features": order_by_score(first.features[None]),
                            "topology": order_by_score(first.topology[None] * read / in_degree.clamp(min=1))},
              "in_degree": {"features": order_by_score(in_degree), "topology": order_by_score(in_degree)},
              "out_degree": {"features": order_by_score(out_degree), "topology": order_by_score(out_degree)}}
    reads = second.topology[None] * read
    entry: dict[str, Any] = {"num_nodes": num_nodes, "num_edges": num_edges, "train_nodes": len(seeds),
             "batches_per_epoch": second.batches, "touched_share": float((second.features[None] > 0).float().mean()),
             "hit_ratio": {}}
    for share in args.cache:
        k = int(share * num_nodes)
        entry["hit_ratio"][str(share)] = {
            name: {"features": hit_ratio(second.features[None], order["features"][:k]),
                   "topology": hit_ratio(reads, _fitting(order["topology"], in_degree, share * num_edges))}
            for name, order in orders.items()}
        log.info("%s cache %4.0f%%: %s", f"{num_nodes}:{num_edges}", share * 100,
                 "  ".join(f"{n} {v['features']:.3f}/{v['topology']:.3f}"
                           for n, v in entry["hit_ratio"][str(share)].items()))
    sampler.close()
    return entry


def _fitting(order: torch.Tensor, degree: torch.Tensor, edges: float) -> torch.Tensor:
    """The lists of ``order`` taken while they fit in ``edges`` neighbour ids, passing over those larger than
    the whole budget (a hub that could never fit does not keep the rest out)."""
    order = order[degree[order] <= edges]
    return order[:int((degree[order].cumsum(0) <= edges).sum())]


def run(args) -> dict:
    """Hit ratios of every order on every graph; write and return the report."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    report = {
        **header("hotness", device, quick=getattr(args, "quick", False), prog=PROG),
        "fanout": ",".join(map(str, args.fanout)), "batch": args.batch_size, "skew": args.skew,
        "source_skew": args.source_skew,
        "cache": args.cache, "graphs": [],
    }
    for nodes, edges, train in args.graphs:
        log.info("graph %d nodes, %d edges, %.1f%% training nodes", nodes, edges, train * 100)
        report["graphs"].append(measure(nodes, edges, train, args, device))
        write_report(report, args.out, ratios=lambda r: None, text_of=table_text, plot_to=plot)
        if cuda:
            torch.cuda.empty_cache()
    write_report(report, args.out, ratios=lambda r: None, text_of=table_text, plot_to=plot)
    return report


def table_text(report: dict) -> str:
    """The hotness report as a markdown table: hit ratios by order and cache size."""
    lines = [f"device: {report['device']}   fanout {report['fanout']}, batch {report['batch']}   "
             f"hit ratios on a second epoch (features: cache of that share of the nodes / topology: of that share "
             f"of the edges)   date: {report['date']}",
             *no_gpu_line(report, "hit ratios are counted, not timed: a GPU would count the same on this graph; "
                                  "the CPU sampler ran, on a smaller default graph",
                          "the default graphs (2M and 111M nodes)"), *smoke_test_lines(report), "",
             "| graph | train nodes | cache | " + " | ".join(ORDERS) + " | presample x in_degree (features) |",
             "|---|---:|---:|" + "---:|" * (len(ORDERS) + 1)]
    for g in report["graphs"]:
        label = f"{g['num_nodes'] / 1e6:g}M nodes / {g['num_edges'] / 1e6:g}M edges"
        for share, ratios in g["hit_ratio"].items():
            cells = [f"{ratios[n]['features']:.3f} / {ratios[n]['topology']:.3f}" for n in ORDERS]
            gain = ratios["presample"]["features"] / max(ratios["in_degree"]["features"], 1e-9)
            lines.append(f"| {label} | {g['train_nodes']:,} | {float(share) * 100:g}% | " + " | ".join(cells)
                         + f" | {gain:.2f} |")
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = report["graphs"]
    fig, axes = plt.subplots(1, len(graphs), figsize=(6 * len(graphs), 4.5), squeeze=False)
    for ax, g in zip(axes[0], graphs):
        shares = [float(s) for s in g["hit_ratio"]]
        for name, style in zip(ORDERS, ("-", "--", ":")):
            for kind, marker in (("features", "o"), ("topology", "s")):
                ax.plot([s * 100 for s in shares], [g["hit_ratio"][str(s)][name][kind] for s in shares],
                        ls=style, marker=marker, label=f"{name}, {kind}")
        ax.set_xlabel("cache size (% of nodes)")
        ax.set_ylabel("hit ratio on a second epoch")
        ax.set_title(f"{g['num_nodes'] / 1e6:g}M nodes, {g['train_nodes']:,} training nodes")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
