"""``python -m hmgstore.bench train``: what an epoch costs, end to end, and where it goes.

GraphSAGE (one layer per hop of ``--fanout``, 15,10,5 by default; hidden 256;
``--batch-size`` 1024 seeds; Adam) is trained for ``--batches`` batches in each
configuration, after warm-up, on one graph, every configuration from the same
``--seed``:

- ``stock``: PyG as it comes: ``Data`` on the CPU, PyG's CPU sampler
  (torch-sparse), the batch copied to the GPU;
- ``all_gpu``: features and topology whole in GPU memory, hmgstore's sampler
  (the ceiling);
- ``host``: hmgstore with features and topology in pinned host memory,
  read zero-copy;
- ``cache``: hmgstore with ``--cache`` of the features' and of the topology's
  bytes on the GPU, the hot rows chosen by pre-sampling one epoch
  (:func:`hmgstore.graph.presample`);

and each of the last three with ``hmgstore.Pipeline`` (``+pipe``): the next
batches sampled and gathered on a side stream while the model trains; or,
when named, with ``hmgstore.Producer`` (``+proc``): the same in a producer
process outside the training thread's GIL (``--sm-percent`` caps its SMs
under CUDA MPS). A ``+proc`` row also reports the producer's own batches/s,
its batches taken with no training beside it.
The step is the one a speed-minded user writes: each layer trimmed to the
nodes and edges that still reach the seeds (``trim_to_layer`` with the
batch's per-hop counts; ``--no-trim`` runs every layer over every node) and
float32 matrix products in TF32 (``--no-tf32``: full float32). Beside each
configuration, measured in the same run:

- ``step alone``: the step's own rate on batches made beforehand (its
  ceiling: no loader at all);
- ``loader alone``: the same loader with no training, in the main thread and,
  for the pipelined configurations, through the pipeline (its own ceiling).

Several ``--max-sms`` values run each pipelined configuration once per
cap (``cache+pipe@none``, ``cache+pipe@auto``, ...). ``--profile`` writes a
cProfile of the main-thread loader per configuration (``profile-*.txt``).
Without the pipeline a step is timed in phases, the GPU synchronised at each
boundary: sampling (the sampler and the loader's own work), gather (features
and labels onto the GPU), train. With it, the step's wall time and the time
the training loop waited for batches. Epoch time is the steady time per batch
times the batches of an epoch. The hit ratios come from the tables' and
topologies' per-tier counters (:mod:`hmgstore.stats`). Without a GPU, the
configurations a CPU can show run (``stock``, ``host``, ``host+pipe``; the
cache has no GPU to live in, so ``cache`` runs only when named), on a
smaller default graph, and the table leaves out the hit ratios (every row
comes from host memory).

Graphs (``--graph``): ``synthetic:NODES`` (hmgstore.data.synthetic: 10 edges
per node, learnable labels; ``--feat-dim`` features), ``products`` (an
ogbn-products-shaped community graph: 2.45M nodes, 50 edges each, 100
features) or ``papers:NODES:EDGES`` (a papers100M-shaped power-law graph of
128 features, 1.1% of nodes in the training split; features are a cheap
pattern, not learnable, as only time is measured).
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import itertools
import logging
import pstats
import math
import resource
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

import hmgstore

from .. import flags
from ..graph import presample
from ..graph.locality import pages_touched
from .report import header, no_gpu_line, write_report
from .train_setup import SAGE, _graph_source, build_graph, build_loader, produced_loader, train_step, trimmable

log = logging.getLogger(__name__)

CONFIGS = ("stock", "all_gpu", "all_gpu+pipe", "host", "host+pipe", "cache", "cache+pipe")
#: Also offered: each configuration but stock with its batches made in a producer process (hmgstore.Producer).
PROC = ("all_gpu+proc", "host+proc", "cache+proc")
#: Sizes for a machine without a GPU, and for --quick (see __main__.parse_args).
CPU = ["--graph", "synthetic:20K", "--configs", "stock", "host", "host+pipe"]
QUICK = ["--graph", "synthetic:5K", "--feat-dim", "32", "--batch-size", "256", "--batches", "3", "--stock-batches", "2"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="synthetic:2M", help="synthetic:NODES, products, or papers:NODES:EDGES")
    p.add_argument("--feat-dim", type=int, default=1024, help="synthetic graph: features per node (default: 1024)")
    p.add_argument("--batches", type=int, default=30, help="timed batches per configuration (default: 30)")
    p.add_argument("--stock-batches", type=int, default=6, help="timed batches of the stock configuration (default: 6)")
    p.add_argument("--cache", type=float, default=0.15, help="cache: share of features and topology on the GPU")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS + PROC,
                   help="configurations to train (default: all; without a GPU the all_gpu ones are left out)")
    flags.add_batch_size(p, 1024)
    flags.add_fanout(p)
    p.add_argument("--depth", type=int, default=2, help="pipeline depth (default: 2)")
    p.add_argument("--max-sms", type=_sms, nargs="+", default=["auto"],
                   help="pipeline and producer: cap the gather at this many SMs, leaving the rest to training; 'auto' "
                        "(the default: hmgstore.pipeline.auto_sms) or 'none'; several values run each pipelined "
                        "configuration once per cap")
    p.add_argument("--no-trim", dest="trim", action="store_false",
                   help="run every layer over every sampled node (default: layers trimmed per hop, trim_to_layer)")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="float32 matrix products in full float32 (default: TF32 on the GPU)")
    p.add_argument("--host-layout", choices=("auto", "hotness", "id"), default="auto",
                   help="cache: the order of the features' host tier: hottest first ('hotness'), id order ('id'), "
                        "or 'auto' (hottest first when the host tier is copied anyway, e.g. --compress)")
    p.add_argument("--profile", action="store_true",
                   help="write a cProfile of each configuration's main-thread loader (profile-CONFIG.txt in --out)")
    p.add_argument("--sm-percent", type=int, default=None,
                   help="+proc: the producer's share of the SMs under CUDA MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)")
    p.add_argument("--fuse", type=int, default=1,
                   help="pipeline: gather this many batches' rows in one launch (hmgstore.fusion; default: 1)")
    p.add_argument("--sampler-graphs", choices=("on", "off"), default="on",
                   help="hmgstore's GPU sampler replays each batch's kernels as a CUDA graph (on, the default: "
                        "captured in the pipeline's warm-up) or launches them one by one from Python (off)")
    p.add_argument("--compress", default=None, choices=("bfloat16", "float16", "float8", "int8"),
                   help="host and cache configurations: keep the features in this stored format (hmgstore.formats; "
                        "the cache's GPU budget then holds that many more rows)")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/train", help="folder for train.json, .md and .png")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def _sms(text: str):
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of SMs, 'auto' or 'none'; got {text!r}") from None


class PhaseTimer:
    """Seconds per phase, the device synchronised at each boundary."""

    def __init__(self, device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds = defaultdict(float)

    def wrap(self, obj, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[phase] += time.perf_counter() - start

        setattr(obj, name, timed)


def run_config(config: str, data, csc, train, classes, device, args, hot) -> dict:
    """Train ``config`` for ``args.batches`` timed batches; its rate, epoch time, phases and hit ratios, and
    beside them the step's rate on batches made beforehand and the loader's rate with no training."""
    torch.manual_seed(args.seed)  # every configuration: the same model, shuffles and neighbours
    name, _, cap = config.partition("@")  # cache+pipe@none: the pipeline capped as --max-sms none says
    base, mode = name.partition("+")[::2]  # mode: "" (phases timed), "pipe" (Pipeline) or "proc" (Producer)
    max_sms = _sms(cap) if cap else args.max_sms[0]
    pipe = mode != ""
    reps = args.stock_batches if base == "stock" else args.batches
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    build = time.perf_counter()
    if mode == "proc":  # the loader is built again, and iterated, in the producer process
        loader = stores = sampler = None
        iterable = hmgstore.Producer(functools.partial(produced_loader, base, args, hot, device), depth=args.depth,
                                     device=device, seed=args.seed, max_sms=max_sms, fuse=args.fuse,
                                     sm_percent=args.sm_percent).start()
        build = time.perf_counter() - build
    else:
        loader, data, stores, sampler, build = build_loader(base, data, csc, train, device, args, hot)
        iterable = hmgstore.Pipeline(loader, depth=args.depth, device=device, max_sms=max_sms,
                                     fuse=args.fuse if device.type == "cuda" else 1) if pipe else loader
    alone = {}
    if loader is not None:  # the ceilings: the loader with no training, and the step with no loader
        alone["loader_main"] = _rate(loader, reps, sync, profile=_profile_path(args, config))
        if pipe:
            alone["loader_pipe"] = _rate(iterable, reps, sync)
        alone["step"], trimmed = _step_alone(loader, data, classes, device, args, reps, sync)
    model = SAGE([data.x.shape[1], *[256] * (len(args.fanout) - 1), classes]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    timer = PhaseTimer(device)
    if not pipe:
        timer.wrap(loader, "filter_fn", "gather")
    warmup = 3
    load_s = train_s = 0.0
    it = _forever(iterable)
    for step in range(warmup + reps):
        if step == warmup:
            sync()
            start = time.perf_counter()
            timer.seconds.clear()
            load_s = train_s = 0.0
        t0 = time.perf_counter()
        batch = next(it)
        if not pipe:
            batch = batch.to(device, non_blocking=True)
            sync()
        t1 = time.perf_counter()
        if step == 0:
            trimmed = args.trim and trimmable(batch)
        loss = train_step(model, optimizer, batch, args.trim)
        if not pipe:
            sync()
        load_s += t1 - t0
        train_s += time.perf_counter() - t1
    sync()
    seconds = (time.perf_counter() - start) / reps
    it.close()
    if mode == "proc":
        del batch  # views into the producer's ring: released before it is closed
        alone["producer"] = _producer_alone(iterable, reps, sync)
        iterable.close()
    per_epoch = math.ceil(len(train) / args.batch_size)
    result = {"config": config, "seconds_per_batch": seconds, "batches_per_s": 1 / seconds,
              "batches_per_epoch": per_epoch, "epoch_s": seconds * per_epoch, "loss": loss.detach().item(),
              "trimmed": trimmed, "max_sms": max_sms if pipe else None,
              "alone_batches_per_s": alone}
    if build is not None:
        result["build_s"] = build
    if mode == "proc":
        result["producer_batches_per_s"] = alone["producer"]
    result["peak_host_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB, so far
    if pipe:
        result["split_s"] = {"wait": load_s / reps, "train_issue": train_s / reps}
    else:
        gather = timer.seconds["gather"] / reps
        result["split_s"] = {"sampling": load_s / reps - gather, "gather": gather, "train": train_s / reps}
    if stores is not None or sampler is not None:  # hit ratios, counted over a few more batches (not timed)
        for counted in (stores[0] if stores else None, sampler):
            if counted is not None:
                counted.reset_stats()
        counting, pages = _forever(loader), []
        for _ in range(5):
            batch = next(counting)
            if stores is not None:  # distinct 2 MiB pages of the features' host tier that the batch's rows lie in
                table = stores[0].table(None, "x")
                pages.append(pages_touched(batch.n_id.cpu(), table.source[:1].nbytes, table.layout))
        counting.close()
        if stores is not None:
            result["feature_stats"] = stores[0].stats()
            result["pages_per_batch"] = sum(pages) / len(pages)
        result["topology_stats"] = sampler.stats()
    for obj in (stores[0] if stores else None, sampler):
        if obj is not None:
            obj.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    gc.collect()
    return result


def _forever(iterable):
    """``iterable``'s batches, pass after pass (a small graph's epoch may be shorter than the timed batches)."""
    while True:
        yielded = False
        for item in iterable:
            yielded = True
            yield item
        if not yielded:
            raise RuntimeError("the loader yields no batch: use more training nodes or a smaller --batch-size")


def _rate(iterable, reps: int, sync, profile=None) -> float:
    """Batches/s of ``iterable`` taken as fast as it makes them, after two warm-up batches (kernel
    compilation, the sampler's CUDA-graph capture); ``profile``: a path for a cProfile of the timed part."""
    it = _forever(iterable)
    for _ in range(2):
        next(it)
    sync()
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(reps):
        next(it)  # each batch dropped at once
    sync()
    seconds = time.perf_counter() - start
    if profiler:
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        text.write(f"{reps} batches, {seconds:.3f} s\n")
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        profile.write_text(text.getvalue())
    it.close()
    return reps / seconds


def _profile_path(args, config: str):
    if not getattr(args, "profile", False):
        return None
    from pathlib import Path

    Path(args.out).mkdir(parents=True, exist_ok=True)
    return Path(args.out) / f"profile-{config.replace('+', '-').replace('@', '-')}.txt"


def _step_alone(loader, data, classes, device, args, reps: int, sync) -> tuple[float, bool]:
    """The training step's own batches/s, over up to 8 batches made beforehand (its ceiling), and whether
    its layers were trimmed."""
    batches = [b.to(device) for b in itertools.islice(_forever(loader), min(reps, 8))]
    model = SAGE([data.x.shape[1], *[256] * (len(args.fanout) - 1), classes]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    for batch in batches[:2]:
        train_step(model, optimizer, batch, args.trim)
    sync()
    start = time.perf_counter()
    for i in range(reps):
        train_step(model, optimizer, batches[i % len(batches)], args.trim)
    sync()
    rate = reps / (time.perf_counter() - start)
    trimmed = args.trim and trimmable(batches[0])
    del batches
    return rate, trimmed


def _producer_alone(producer, reps: int, sync) -> float:
    """The producer's own batches/s: its batches taken as fast as it makes them, with no training beside it."""
    it = iter(producer)
    next(it)
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        next(it)  # each batch dropped at once
    sync()
    seconds = time.perf_counter() - start
    it.close()
    return reps / seconds


def run(args) -> dict:
    """Train every configuration in turn; write and return the report."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    configs = [c for c in args.configs if cuda or not c.startswith("all_gpu")]
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        configs = [c for c in configs if c != "stock"]
        log.info("stock skipped: PyG's CPU sampler needs torch-sparse")
    configs = _with_caps(configs, args.max_sms)
    data, csc, train, classes, name = build_graph(args.graph, args.feat_dim)
    fanout = ",".join(map(str, args.fanout))
    report = {
        **header("train", device),
        "graph": {"name": name, "num_nodes": data.num_nodes, "train": len(train), "feat_dim": data.x.shape[1],
                  "x_gb": data.x.numel() * data.x.element_size() / 1e9},
        "model": f"GraphSAGE {len(args.fanout)} layers, hidden 256, fanout {fanout}", "batch": args.batch_size,
        "cache": args.cache, "seed": args.seed, "compress": args.compress,
        "pipeline": {"depth": args.depth, "max_sms": args.max_sms, "fuse": args.fuse},
        "sampler_graphs": args.sampler_graphs, "trim": args.trim, "tf32": args.tf32 and cuda,
        "host_layout": args.host_layout, "quick": bool(getattr(args, "quick", False)), "configs": {},
    }
    hot = None
    if any(c.startswith("cache") for c in configs):
        from ..plugins.pyg import HybridNeighborSampler

        log.info("pre-sampling one epoch for the cache")
        torch.manual_seed(args.seed)
        sampler = HybridNeighborSampler(_graph_source(data, csc), args.fanout, device=device,
                                        progress=not args.no_progress)
        start = time.perf_counter()
        hot = presample(sampler, train, batch_size=args.batch_size, progress=not args.no_progress)
        report["presample_s"] = time.perf_counter() - start
        sampler.close()
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")  # "high": TF32 matrix products
    try:
        for config in configs:
            log.info("%s: training %s batches", config, args.stock_batches if config == "stock" else args.batches)
            report["configs"][config] = run_config(config, data, csc, train, classes, device, args, hot)
            r = report["configs"][config]
            log.info("%-13s %7.2f batches/s  epoch %7.2f s  alone: %s", config, r["batches_per_s"], r["epoch_s"],
                     ", ".join(f"{k} {v:.1f}" for k, v in r["alone_batches_per_s"].items()))
    finally:
        torch.set_float32_matmul_precision(precision)
    write_report(report, args.out, ratios=add_ratios, text_of=table_text, plot_to=plot)
    return report


def _with_caps(configs: list, caps: list) -> list:
    """Each pipelined configuration once per cap (``name@cap``) when several caps are given."""
    if len(caps) < 2:
        return configs
    out = []
    for config in configs:
        if "+" in config:
            out += [f"{config}@{'none' if cap is None else cap}" for cap in caps]
        else:
            out.append(config)
    return out


def _base(config: str) -> str:
    return config.partition("@")[0].partition("+")[0]


def _epoch(report, config):
    c = report["configs"].get(config)
    return None if c is None else c["epoch_s"]


def _best_config(report, base):
    """The fastest configuration of ``base`` (any mode, any cap), or None."""
    named = [(c["epoch_s"], n) for n, c in report["configs"].items() if _base(n) == base]
    return min(named)[1] if named else None


def _best(report, base):
    best = _best_config(report, base)
    return None if best is None else _epoch(report, best)


def _issue(report, config):
    c = report["configs"].get(config)
    return c["split_s"].get("train_issue") if c else None


def _loader_vs_step(report, base):
    """The best pipelined loader alone of ``base`` over its step alone (the step's ceiling)."""
    rates = [(c["alone_batches_per_s"].get("loader_pipe"), c["alone_batches_per_s"].get("step"))
             for n, c in report["configs"].items() if _base(n) == base]
    rates = [(loader, step) for loader, step in rates if loader and step]
    return max(loader / step for loader, step in rates) if rates else None


def add_ratios(report: dict) -> None:
    if report.get("quick"):  # tiny sizes: a smoke test, whose ratios mean nothing
        report["targets"] = {}
        return
    best_cache, best_gpu, stock = _best(report, "cache"), _best(report, "all_gpu"), _epoch(report, "stock")
    issue, issue_gpu = _issue(report, "cache+proc"), _issue(report, "all_gpu+pipe")
    proc = report["configs"].get("cache+proc", {})
    report["targets"] = {
        "cache_vs_all_gpu": best_cache / best_gpu if best_cache and best_gpu else None,  # epoch time, <= 1.11
        "stock_vs_cache": stock / best_cache if stock and best_cache else None,  # target >= 10
        "proc_issue_vs_all_gpu": issue / issue_gpu if issue and issue_gpu else None,  # target <= 1.1
        "producer_vs_trainer": proc["producer_batches_per_s"] / proc["batches_per_s"] if proc else None,  # >= 2
        "loader_vs_step_all_gpu": _loader_vs_step(report, "all_gpu"),  # target >= 2
        "loader_vs_step_cache": _loader_vs_step(report, "cache"),  # target >= 1.5
        "cache_epoch_s": best_cache,
    }


def _hits(stats):
    return "-" if not stats or stats.get("hit_ratio") is None else f"{stats['hit_ratio']:.2f}"


def _alone(c: dict) -> list[str]:
    a = c.get("alone_batches_per_s", {})
    fmt = (lambda v: "-" if v is None else f"{v:.1f}")
    return [fmt(a.get("step")), fmt(a.get("loader_main")), fmt(a.get("loader_pipe") or a.get("producer"))]


def table_text(report: dict) -> str:
    """The train report as a markdown table; without a GPU, with no hit-ratio columns (every row comes from
    host memory there)."""
    g = report["graph"]
    gpu = report.get("gpus", 1) > 0
    step = ("layers trimmed per hop" if report.get("trim", False) else "every layer over every node") + \
        (", TF32" if report.get("tf32") else ", float32")
    lines = [f"device: {report['device']}   graph: {g['name']} ({g['num_nodes']:,} nodes, {g['feat_dim']} features, "
             f"{g['x_gb']:.1f} GB; {g['train']:,} training nodes)   {report['model']}, batch {report['batch']}"
             + (f", cache {report['cache']:.0%}" if gpu else "") + f"   date: {report['date']}",
             *no_gpu_line(report, "stock PyG against hmgstore reading host memory on the CPU, with and without the "
                                  "pipeline", "the all-GPU ceiling, the GPU cache and its hit ratios"), "",
             *(["--quick: a smoke test at tiny sizes; its rates and ratios mean nothing", ""]
               if report.get("quick") else []),
             f"step: {step}; pipeline: depth {report['pipeline']['depth']}, fuse {report['pipeline'].get('fuse', 1)}; "
             f"features stored as {report.get('compress') or 'float32'}, cache host tier in "
             f"{report.get('host_layout', 'auto')} order"
             + ("; sampler's CUDA graphs off" if report.get("sampler_graphs") == "off" else ""), ""]
    stock = _epoch(report, "stock")
    columns = ["config", "batches/s", "epoch s", *(["x stock"] if stock else []), "step alone", "loader alone, main",
               "loader alone, pipe", "per batch (ms)", *(["feature hits", "topology hits"] if gpu else []),
               "host pages a batch", "build s", "peak host GB"]
    lines += ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    for name, c in report["configs"].items():
        split = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in c["split_s"].items())
        if c.get("trimmed") is False and report.get("trim", False):
            split += "; untrimmed (no per-hop counts)"
        speed = [f"{stock / c['epoch_s']:.1f}"] if stock else []
        pages = f"{c['pages_per_batch']:.0f}" if c.get("pages_per_batch") is not None else \
            "as +pipe" if "+proc" in name else "-"  # the producer's stores are not the trainer's to count
        build = f"{c['build_s']:.1f}" if c.get("build_s") is not None else "-"
        hits = [_hits(c.get("feature_stats")), _hits(c.get("topology_stats"))] if gpu else []
        cells = [name, f"{c['batches_per_s']:.1f}", f"{c['epoch_s']:.2f}", *speed, *_alone(c), split, *hits, pages,
                 build, f"{c.get('peak_host_gb', 0):.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    t = report.get("targets", {})
    targets = []
    if t.get("cache_vs_all_gpu"):
        targets.append(f"cache epoch / all-GPU epoch: {t['cache_vs_all_gpu']:.2f} (the cache at "
                       f"{1 / t['cache_vs_all_gpu']:.2f}x the all-GPU speed; target >= 0.9x)")
    if t.get("loader_vs_step_all_gpu"):
        targets.append(f"all-GPU loader alone / step alone: {t['loader_vs_step_all_gpu']:.2f}x (target >= 2)")
    if t.get("loader_vs_step_cache"):
        targets.append(f"cache loader alone / step alone: {t['loader_vs_step_cache']:.2f}x (target >= 1.5)")
    targets += [f"stock / cache: {t['stock_vs_cache']:.1f}x (target >= 10)"] if t.get("stock_vs_cache") else []
    targets += [f"cache+proc issue time / all_gpu+pipe's: {t['proc_issue_vs_all_gpu']:.2f} (target <= 1.1)"] \
        if t.get("proc_issue_vs_all_gpu") else []
    targets += [f"producer alone / cache+proc trainer: {t['producer_vs_trainer']:.1f}x (target >= 2)"] \
        if t.get("producer_vs_trainer") else []
    if targets:
        lines.append("\n" + "; ".join(targets))
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["configs"])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar(names, [report["configs"][n]["epoch_s"] for n in names], color="tab:blue")
    ax.set_yscale("log")
    ax.set_ylabel("epoch time, s (log)")
    ax.set_title(f"GraphSAGE epoch, {report['graph']['name']}, {report['device']}")
    ax.tick_params(axis="x", rotation=30)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
