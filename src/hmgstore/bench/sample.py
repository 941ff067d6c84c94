"""``python -m hmgstore.bench sample``: neighbour sampling, hmgstore against the CPU samplers.

For each graph, batches of ``--batch-size`` seeds drawn uniformly from its nodes
are sampled with fanout ``--fanout`` (PyG's NeighborLoader semantics:
without replacement, relabelled, seeds first). Figures are batches/s and
sampled edges/s, medians over ``--batches`` batches after warm-up, wall
clock with the device synchronised (a batch's output ready on the device).
Without a GPU, the CPU samplers alone run (hmgstore's, PyG's, DGL's).

Variants:

- ``hmg_gpu``: topology all in GPU memory (the ceiling); hops queued with
  their sizes kept on the device, hash relabelling (the GPU default);
- ``hmg_host``: all neighbour ids in pinned host memory, read zero-copy;
- ``hmg_cache``: ``--cache`` of the neighbour-id bytes on the GPU, lists
  chosen by degree, the rest zero-copy;
- ``hmg_gpu_sort``: as ``hmg_gpu`` with sort-based relabelling, each hop's
  sizes read back (the relabelling alternative, measured);
- ``hmg_cpu``: hmgstore's vectorised torch path on the CPU;
- ``pyg_cpu``: PyG's CPU sampler (torch-sparse's ``neighbor_sample``, one
  thread per call, as PyG's loader runs it), when torch-sparse is installed;
- ``dgl_cpu``: DGL's CPU ``NeighborSampler.sample_blocks`` (all cores:
  fused sampling and relabelling), when DGL is installed;
- ``*_weighted``, ``*_temporal``, ``*_labor`` beside ``hmg_gpu``,
  ``hmg_host`` and ``hmg_cpu``: the same topology placement with edge
  weights (uniform in [0.1, 1.1), float32, in the same tiers), with edge
  times (each list's times rising 0..1000 along it, seed times uniform in
  [0, 1000): on average half a list is in a seed's past; temporal sampling
  is disjoint, as PyG's), LABOR-0 sampling, or uniform sampling with one
  tree per seed (``*_disjoint``: temporal sampling's cost without the time
  windows). The report gives each as a ratio to its uniform variant,
  measured in the same run.

Graphs are power-law CSC topologies generated directly (degrees from a Zipf
law over randomly permuted node ids; neighbours uniform over the nodes):
``--graphs`` names them as ``NODES:EDGES`` (e.g. ``2M:20M``; a papers100M-shaped
graph is ``111M:1.6B``). Each variant's first batch is checked: every
sampled edge must be an edge of the graph, else the benchmark stops.
"""
from __future__ import annotations

import argparse
import gc
import logging

import torch

from ..cli import flags
from ..data import synthetic
from ..data.power_law import power_law_csc
from ..graph import CSC, NeighborSampler, Topology, to_csc
from .report import header, no_gpu_line, ratio_text, smoke_test_lines, write_report
from .timing import median_seconds

log = logging.getLogger(__name__)

VARIANTS = ("hmg_gpu", "hmg_host", "hmg_cache", "hmg_gpu_sort", "hmg_cpu", "pyg_cpu", "dgl_cpu",
            "hmg_gpu_weighted", "hmg_host_weighted", "hmg_cpu_weighted", "hmg_gpu_temporal", "hmg_host_temporal",
            "hmg_cpu_temporal", "hmg_gpu_labor", "hmg_host_labor", "hmg_cpu_labor", "hmg_gpu_disjoint",
            "hmg_host_disjoint", "hmg_cpu_disjoint")
MODES = ("weighted", "temporal", "labor", "disjoint")
#: Edge times run 0 .. TIME_SPAN - 1 along each list; seed times are uniform over the same span.
TIME_SPAN = 1000
#: Sizes for a machine without a GPU, and for --quick (see __main__.parse_args).
CPU = ["--graphs", "synthetic:200K"]
QUICK = ["--graphs", "20K:200K", "--batch-size", "256", "--batches", "3", "--slow-batches", "2"]
_GRAPH = flags.graph("synthetic:NODES", "NODES:EDGES")


def _graph_spec(text: str) -> tuple:
    first, second = _GRAPH(text).split(":")
    if first == "synthetic":  # hmgstore.data.synthetic's community graph, 10 edges per node
        return "synthetic", flags.count(second)
    return "power-law", flags.count(first), flags.count(second)


def build_graph(spec: tuple, skew: float, device, seed: int = 0) -> CSC:
    """The CSC topology of a ``--graphs`` entry, generated from ``seed``."""
    if spec[0] == "synthetic":

        g = synthetic(num_nodes=spec[1], avg_degree=10, feat_dim=1, seed=seed)
        return to_csc(g.edge_index, "coo", (spec[1], spec[1]))
    return power_law_csc(spec[1], spec[2], skew, seed=seed, device=device)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graphs", type=_graph_spec, nargs="+", default=[("synthetic", 2_000_000)], metavar="GRAPH",
                   help="graphs to sample: synthetic:NODES (hmgstore.data.synthetic, 10 edges per node) or "
                        "NODES:EDGES (power-law in-degrees) (default: synthetic:2M)")
    flags.add_fanout(p)
    flags.add_batch_size(p, 1024)
    p.add_argument("--batches", type=flags.positive, default=20, help="timed batches per variant (default: 20)")
    p.add_argument("--slow-batches", type=flags.positive, default=5,
                   help="timed batches of the CPU baselines (default: 5)")
    p.add_argument("--cache", type=flags.share, default=0.2, help="hmg_cache: share of the topology's bytes on the GPU")
    p.add_argument("--skew", type=flags.non_negative_real, default=1.0,
                   help="Zipf exponent of the in-degrees (default: 1.0)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                   help="variants to time (default: all; without a GPU only the CPU ones run)")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/sample", help="folder for sample.json, .md and .png")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def _check_edges(csc: CSC, src, dst, eid, name: str) -> None:
    """Raise unless every (src, dst, CSC position) is an edge of ``csc`` (global ids)."""
    src, dst, eid = src.cpu().long(), dst.cpu().long(), eid.cpu().long()
    ok = torch.equal(csc.row[eid].long(), src) and torch.equal(torch.searchsorted(csc.colptr, eid, right=True) - 1,
                                                               dst)
    if not ok:
        raise AssertionError(f"{name} sampled edges that are not in the graph: the benchmark refuses to time it")


def _check(csc: CSC, node, row_local, col_local, eid, name: str) -> None:
    node = node.cpu().long()
    _check_edges(csc, node[row_local.cpu().long()], node[col_local.cpu().long()], eid, name)


def _extras(csc: CSC, mode: str | None, seed: int) -> dict:
    """Topology keywords of a ``*_weighted`` / ``*_temporal`` variant (see the module docstring)."""
    if mode == "weighted":
        return {"weight": torch.rand(csc.num_edges, generator=torch.Generator().manual_seed(seed)) + 0.1}
    if mode == "temporal":  # rising along each list: sorted by time with no sort (CSC order is the given order)
        degree = csc.colptr.diff()
        col = torch.repeat_interleave(torch.arange(csc.size[1]), degree, output_size=csc.num_edges)
        rank = torch.arange(csc.num_edges) - csc.colptr[:-1].index_select(0, col)
        return {"edge_time": rank * TIME_SPAN // degree.index_select(0, col)}
    return {}


def _time_hmg(csc, fanout, seeds, args, device, budget, name, dedup=None, mode=None) -> dict:
    if mode == "temporal":
        csc = CSC(csc.row, csc.colptr, None, csc.size)  # the times are given in CSC order
    topo = Topology(csc, device, gpu_budget=budget, progress=not args.no_progress, **_extras(csc, mode, args.seed))
    sampler = NeighborSampler({None: topo}, {None: csc.size[1]}, fanout, dedup=dedup, labor=mode == "labor",
                              disjoint=mode == "disjoint")
    g = torch.Generator().manual_seed(args.seed)
    seed_times = [{None: torch.randint(0, TIME_SPAN, (len(s),), generator=g)} if mode == "temporal" else None
                  for s in seeds]
    try:
        out = sampler.sample({None: seeds[0].to(device)}, seed_times[0])
        _check(csc, out.node[None], out.row[None], out.col[None], out.edge[None], name)
        edges = []

        def one(i):
            o = sampler.sample({None: seeds[i % len(seeds)].to(device)}, seed_times[i % len(seeds)])
            edges.append(len(o.edge[None]))

        reps = args.batches if device.type == "cuda" else args.slow_batches
        med, times = median_seconds(one, reps=reps, warmup=2, wall=True, device=device)
        return {"seconds": med, "times": times, "edges_per_batch": sum(edges) / len(edges),
                "gpu_edges": topo.gpu_edges, "num_edges": topo.num_edges}
    finally:
        sampler.close()


def _time_pyg(csc, fanout, seeds, args) -> dict | None:
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        log.info("pyg_cpu skipped: torch-sparse is not installed")
        return None
    colptr, row = csc.colptr, csc.row.long()
    edges = []

    def one(i):
        node, r, c, e = torch.ops.torch_sparse.neighbor_sample(colptr, row, seeds[i % len(seeds)], fanout, False, True)
        edges.append(len(e))
        return node, r, c, e

    node, r, c, e = one(0)
    _check(csc, node, r, c, e, "pyg_cpu")
    med, times = median_seconds(one, reps=args.slow_batches, warmup=1, wall=True)
    return {"seconds": med, "times": times, "edges_per_batch": sum(edges) / len(edges)}


def _time_dgl(csc, fanout, seeds, args) -> dict | None:
    try:
        from ..plugins.dgl import _compat
        dgl = _compat.import_dgl()
    except ImportError:
        log.info("dgl_cpu skipped: DGL is not installed")
        return None
    n = csc.size[1]
    graph = dgl.graph(("csc", (csc.colptr, csc.row.long(), torch.arange(csc.num_edges))), num_nodes=n)
    sampler = dgl.dataloading.NeighborSampler(list(reversed(fanout)))  # DGL lists the fanout from the input layer
    edges = []

    def one(i):
        input_nodes, _, blocks = sampler.sample_blocks(graph, seeds[i % len(seeds)])
        edges.append(sum(b.num_edges() for b in blocks))
        return blocks

    blocks = one(0)
    for b in blocks:  # block edges join real nodes of the graph
        src, dst = b.edges()
        _check_edges(csc, b.srcdata[dgl.NID][src.long()], b.dstdata[dgl.NID][dst.long()], b.edata[dgl.EID],
                     "dgl_cpu")
    med, times = median_seconds(one, reps=args.slow_batches, warmup=1, wall=True)
    return {"seconds": med, "times": times, "edges_per_batch": sum(edges) / len(edges),
            "threads": torch.get_num_threads()}


def run(args) -> dict:
    """Time every variant on every graph; write and return the report."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    fanout = args.fanout
    report = {
        **header("sample", device, quick=getattr(args, "quick", False)),
        "cpu_threads": torch.get_num_threads(),
        "fanout": fanout, "batch": args.batch_size, "cache": args.cache, "skew": args.skew, "graphs": [],
    }
    for spec in args.graphs:
        log.info("graph %s: generating", spec)
        csc = build_graph(spec, args.skew, device if cuda else None, seed=args.seed)
        num_nodes, num_edges = csc.size[1], csc.num_edges
        g = torch.Generator().manual_seed(7 + args.seed)  # 7: the seeds of the results recorded before --seed
        seeds = [torch.randint(0, num_nodes, (args.batch_size,), generator=g) for _ in range(8)]
        entry = {"kind": spec[0], "num_nodes": num_nodes, "num_edges": num_edges,
                 "max_degree": int(csc.colptr.diff().max()), "variants": {}}
        ids_bytes = csc.row.element_size() * num_edges
        plan: dict[str, tuple] = {  # name -> (device, GPU budget, dedup, sampling mode)
            "hmg_gpu": (device, 2**62, None, None), "hmg_host": (device, None, None, None),
            "hmg_cache": (device, int(args.cache * ids_bytes), None, None),
            "hmg_gpu_sort": (device, 2**62, "sort", None), "hmg_cpu": (torch.device("cpu"), None, None, None)}
        for base in ("hmg_gpu", "hmg_host", "hmg_cpu"):
            for mode in MODES:
                plan[f"{base}_{mode}"] = (*plan[base][:2], None, mode)
        for name in args.variants:
            if name.startswith("hmg") and not name.startswith("hmg_cpu") and not cuda:
                continue
            result: dict | None
            try:
                if name in plan:
                    where, budget, dedup, mode = plan[name]
                    result = _time_hmg(csc, fanout, seeds, args, where, budget, name, dedup=dedup, mode=mode)
                elif name == "pyg_cpu":
                    result = _time_pyg(csc, fanout, seeds, args)
                else:
                    result = _time_dgl(csc, fanout, seeds, args)
            except torch.cuda.OutOfMemoryError as err:
                log.warning("%s does not fit on the GPU: %s", name, err)
                result = {"error": f"out of GPU memory: {err}"}
            if result is None:
                continue
            if "seconds" in result:
                result["batches_per_s"] = 1 / result["seconds"]
                result["edges_per_s"] = result["edges_per_batch"] / result["seconds"]
                log.info("%s %-9s %9.1f batches/s %7.1f M edges/s", f"{num_nodes}:{num_edges}", name,
                         result["batches_per_s"], result["edges_per_s"] / 1e6)
            entry["variants"][name] = result
            gc.collect()
            torch.cuda.empty_cache() if cuda else None
        report["graphs"].append(entry)
        del csc
        gc.collect()
    write_report(report, args.out, ratios=add_ratios, text_of=table_text, plot_to=plot)
    return report


def _rate(graph: dict, name: str):
    v = graph["variants"].get(name)
    return None if v is None or "batches_per_s" not in v else v["batches_per_s"]


def add_ratios(report: dict) -> None:
    """The ratios the targets are stated in: against DGL's and PyG's CPU samplers, host against GPU topology."""
    for graph in report["graphs"]:
        gpu, host = _rate(graph, "hmg_gpu"), _rate(graph, "hmg_host")
        ratios = {}
        for name in ("hmg_gpu", "hmg_cache", "hmg_host", "hmg_gpu_sort", "hmg_cpu"):
            mine = _rate(graph, name)
            for base in ("dgl_cpu", "pyg_cpu"):
                theirs = _rate(graph, base)
                if mine is not None and theirs is not None:
                    ratios[f"{name}_vs_{base}"] = mine / theirs
        if gpu and host:
            ratios["host_vs_gpu_topology"] = host / gpu
        cache = _rate(graph, "hmg_cache")
        if gpu and cache:
            ratios["cache_vs_gpu_topology"] = cache / gpu
        for base in ("hmg_gpu", "hmg_host", "hmg_cpu"):  # each sampling mode against uniform, same placement
            for mode in MODES:
                mine, uniform = _rate(graph, f"{base}_{mode}"), _rate(graph, base)
                if mine and uniform:
                    ratios[f"{base}_{mode}_vs_uniform"] = mine / uniform
        graph["ratios"] = ratios


def _fmt_ratio(report: dict, mine, theirs) -> str:
    return "-" if not mine or not theirs else ratio_text(report, mine / theirs, ".1f")


def table_text(report: dict) -> str:
    """The sample report as a markdown table: batches/s, and ratios to the CPU samplers that ran."""
    bases = [(b, label) for b, label in (("dgl_cpu", "x DGL CPU"), ("pyg_cpu", "x PyG CPU"))
             if any(_rate(g, b) for g in report["graphs"])]
    lines = [f"device: {report['device']}   fanout {report['fanout']}, batch {report['batch']}"
             + (f", cache {report['cache']:.0%} of the topology" if report.get("gpus", 1) else "")
             + f"   date: {report['date']}",
             *no_gpu_line(report, "hmgstore's CPU sampler against PyG's and DGL's",
                          "the topology on the GPU, zero-copy reads from the host and the GPU cache"),
             *smoke_test_lines(report), "",
             "| " + " | ".join(["graph", "variant", "batches/s", "M sampled edges/s", *(label for _, label in bases)])
             + " |",
             "|---|---|---:|---:|" + "---:|" * len(bases)]
    for graph in report["graphs"]:
        label = f"{graph['kind']}, {graph['num_nodes'] / 1e6:g}M nodes, {graph['num_edges'] / 1e6:g}M edges"
        for name, v in graph["variants"].items():
            if "batches_per_s" not in v:
                lines.append(f"| {label} | {name} | {v.get('error', '-')} | |" + " |" * len(bases))
                continue
            vs = [_fmt_ratio(report, v["batches_per_s"], _rate(graph, base)) for base, _ in bases]
            lines.append(f"| {label} | {name} | {v['batches_per_s']:.1f} | {v['edges_per_s'] / 1e6:.1f} |"
                         + "".join(f" {r} |" for r in vs))
        r = graph.get("ratios", {})
        if "host_vs_gpu_topology" in r:
            lines.append(f"| {label} | zero-copy / all-GPU topology "
                         f"| {ratio_text(report, r['host_vs_gpu_topology'])} | |"
                         + " |" * len(bases))
        for key, value in r.items():
            if key.endswith("_vs_uniform"):
                variant = key[:-len("_vs_uniform")]
                lines.append(f"| {label} | {variant} / uniform | {ratio_text(report, value)} | |" + " |" * len(bases))
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = report["graphs"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [n for n in VARIANTS if any(_rate(g, n) for g in graphs)]
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        ys = [_rate(g, name) or 0 for g in graphs]
        ax.bar([i + k * width for i in range(len(graphs))], ys, width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(graphs))])
    ax.set_xticklabels([f"{g['num_nodes'] / 1e6:g}M / {g['num_edges'] / 1e6:g}M" for g in graphs])
    ax.set_yscale("log")
    ax.set_ylabel("batches/s (log)")
    ax.set_title(f"neighbour sampling, fanout {report['fanout']}, batch {report['batch']}, {report['device']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
