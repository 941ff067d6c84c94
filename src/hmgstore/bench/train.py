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
  (:func:`hmgstore.graph.presample`); ``api+pipe``: the README's swap, the
  cache's budget with every other default;

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
topologies' per-tier counters (:mod:`hmgstore.rows.stats`). Without a GPU, the
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
import dataclasses
import functools
import gc
import logging
import math
import os
import resource
import time

import torch

import hmgstore

from ..cli import flags
from ..graph import presample, sampling_stream
from . import train_timed
from .report import header, write_report
from .train_alone import _rate, _step_alone, ceilings, counted_stats
from .train_configs import (
    Kept,
    _cap_modes,
    _capped_rows,
    _hollow,
    _mode,
    _repeated,
    _resident_gb,
    _whole_sm_launch,
    _with_caps,
    _with_variants,
    base_of,
    cap_mode_as,
    capped_rows_as,
    sampler_stream_as,
    variant,
)
from .train_report import add_ratios, plot, table_text  # noqa: F401 - re-exported
from .train_setup import (
    _graph_source,
    _topology_share,
    build_graph,
    build_loader,
    produced_loader,
)

log = logging.getLogger(__name__)

CONFIGS = ("stock", "all_gpu", "all_gpu+pipe", "host", "host+pipe", "cache", "cache+pipe", "api+pipe")
#: Also offered: each configuration but stock with its batches made in a producer process (hmgstore.Producer).
PROC = ("all_gpu+proc", "host+proc", "cache+proc")
#: Sizes for a machine without a GPU, and for --quick (see __main__.parse_args).
CPU = ["--graph", "synthetic:20K", "--configs", "stock", "host", "host+pipe"]
QUICK = ["--graph", "synthetic:5K", "--feat-dim", "32", "--batch-size", "256", "--batches", "3", "--stock-batches", "2"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", type=flags.graph("synthetic:NODES", "products", "papers:NODES:EDGES"),
                   default="synthetic:2M", help="synthetic:NODES, products, or papers:NODES:EDGES")
    p.add_argument("--feat-dim", type=flags.positive, default=1024,
                   help="synthetic graph: features per node (default: 1024)")
    p.add_argument("--batches", type=flags.positive, default=30, help="timed batches per configuration (default: 30)")
    p.add_argument("--stock-batches", type=flags.positive, default=6,
                   help="timed batches of the stock configuration (default: 6)")
    p.add_argument("--cache", type=flags.share, default=0.15, help="cache: share of features and topology on the GPU")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS + PROC,
                   help="configurations to train (default: all; without a GPU the all_gpu ones are left out)")
    flags.add_batch_size(p, 1024)
    flags.add_fanout(p)
    p.add_argument("--depth", type=flags.positive, default=2, help="pipeline depth (default: 2)")
    p.add_argument("--max-sms", type=flags.sm_cap, nargs="+", default=[None],
                   help="pipeline and producer: cap the gather at this many SMs, leaving the rest to training; 'auto' "
                        "(hmgstore.prefetch.pipeline.auto_sms where a table reads host memory: hmgstore.Pipeline's and "
                        "Producer's default) or 'none' (the default here); several values run each pipelined "
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
    p.add_argument("--timeline", type=flags.natural, default=0, metavar="N",
                   help="GPU: after each pipelined configuration's timed batches, profile N more (and N steps alone) "
                        "and report a batch's GPU milliseconds: the step's kernels beside the loader and alone, the "
                        "loader's, the time both ran at once and the GPU's idle time (hmgstore.bench.timeline)")
    p.add_argument("--sm-percent", type=flags.whole(1, 100), default=None,
                   help="+proc: the producer's share of the SMs under CUDA MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)")
    p.add_argument("--mps-priority", type=flags.whole(0, 1), default=None,
                   help="+proc: the producer's MPS client priority (CUDA_MPS_CLIENT_PRIORITY: 0 normal, 1 below "
                        "normal; default: the trainer's). The trainer's own is its environment's")
    p.add_argument("--fuse", type=flags.positive, default=1,
                   help="pipeline: gather this many batches' rows in one launch (hmgstore.gather.fusion; default: 1)")
    p.add_argument("--sampler-graphs", choices=("on", "off"), default="on",
                   help="hmgstore's GPU sampler replays each batch's kernels as a CUDA graph (on, the default: "
                        "captured in the pipeline's warm-up) or launches them one by one from Python (off)")
    p.add_argument("--compress", default=None, choices=("bfloat16", "float16", "float8", "int8"),
                   help="host and cache configurations: keep the features in this stored format "
                        "(hmgstore.rows.formats; the cache's GPU budget then holds that many more rows)")
    p.add_argument("--topology-cache", type=flags.share, nargs="+", default=[None],
                   help="cache configurations: the share of the topology's bytes on the GPU, when it should differ "
                        "from --cache (1.0: the whole topology; the features stay at --cache). Several values: each "
                        "cache configuration once per value, as name/topoT. Default: --cache")
    _add_variant_options(p)
    p.add_argument("--labor", action="store_true",
                   help="every configuration (and the cache's pre-sampling) samples LABOR-0 instead of uniform "
                        "(HybridNeighborSampler labor=True); the report's nodes_per_batch shows the rows it saves")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/train", help="folder for train.json, .md and .png")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def _add_variant_options(p: argparse.ArgumentParser) -> None:
    """Options that run a configuration once per value given (``name/keyV``), and its repeats."""
    p.add_argument("--overlap-reads", choices=("auto", "on", "off"), nargs="+", default=["off"],
                   help="pipeline and producer: hmgstore.Pipeline's overlap_reads (a split gather's CPU reads "
                        "finished by the reader thread while the next batch is sampled); several values: each cache "
                        "configuration once per value, as name/overlapV")
    p.add_argument("--sampler-stream", choices=("on", "off"), nargs="+", default=[None],
                   help="pipelined cache configurations: the GPU sampler's batches on a stream of their own (on) or "
                        "on the loader's (off) (hmgstore.graph.sampling_stream; a producer gets it through "
                        "HMGSTORE_SAMPLER_STREAM); several values: each once per value, as name/streamV, the others "
                        "under the first. Default: as the environment's HMGSTORE_SAMPLER_STREAM says")
    p.add_argument("--capped-rows", choices=("all", "remote"), nargs="+", default=[None],
                   help="pipelined cache configurations: the rows their gathers' SM cap holds, all of them or only "
                        "those read over a link, the GPU tier's then read uncapped (hmgstore.cuda.gather.CAPPED_ROWS, "
                        "HMGSTORE_CAPPED_ROWS); several values: each once per value, as name/rowsV, the others under "
                        "the first. Default: the library's")
    p.add_argument("--repeat", type=flags.positive, default=1,
                   help="run the whole list of configurations this many times, interleaved (name/runK for K >= 2): "
                        "the spread between runs of one configuration is the run's noise")
    p.add_argument("--split", type=flags.share, nargs="+", default=[None],
                   help="cache configurations: the CPU's share of each batch's host-tier feature rows, read into "
                        "pinned staging and moved by the copy engine instead of by the zero-copy kernel "
                        "(HybridTensor split=; 1.0: all of them; several values: each cache configuration once "
                        "per value, as name/splitS). Default: none, the kernel reads them")
    p.add_argument("--labels-on-gpu", action="store_true",
                   help="cache: the labels whole in GPU memory, out of the --cache budget (from_data's gpu_whole="
                        "('y',)); by default they follow the features' rows, and a batch's misses read them from host")
    p.add_argument("--cap-mode", choices=("whole", "spread"), nargs="+", default=[None],
                   help="pipelines' capped gathers hold that many SMs' worth of blocks spread over the GPU ('spread') "
                        "or whole SMs ('whole': hmgstore.cuda.gather.EXCLUSIVE; the report's whole_sm_launch says "
                        "whether this GPU can; a producer's through HMGSTORE_WHOLE_SMS); several values: each "
                        "pipelined cache configuration once per value, as name/capV. Default: the library's")
    p.add_argument("--split-threads", type=flags.positive, nargs="+", default=[None],
                   help="cache configurations with --split: torch's intra-op threads for the CPU's reads (HybridTensor."
                        "set_split's threads; several values: each cache configuration once per value, as name/thrN). "
                        "Default: torch's count")


def run_config(config: str, data, csc, train, classes, device, args, hot, kept: Kept | None = None) -> dict:
    """Train ``config`` for ``args.batches`` timed batches; its rate, epoch time, phases and hit ratios, and
    beside them the step's rate on batches made beforehand and the loader's rate with no training. ``kept``:
    the loader of the previous configuration, used again where only the cap or the split differ."""
    own = kept is None
    kept = Kept() if kept is None else kept
    torch.manual_seed(args.seed)  # every configuration: the same model, shuffles and neighbours
    cached = base_of(config) == "cache"
    split = variant(config, "split", args.split[0] if cached else None)  # the features' host rows by the CPU
    topology_cache = variant(config, "topo", _topology_share(args) if cached else None)
    threads = variant(config, "thr", args.split_threads[0] if cached else None, int)  # the CPU reads' threads
    overlap = variant(config, "overlap", args.overlap_reads[0], str)
    overlap_reads = {"on": True, "off": False}.get(overlap, overlap)
    try:
        with sampler_stream_as(variant(config, "stream", getattr(args, "sampler_stream", [None])[0], str)), \
                capped_rows_as(variant(config, "rows", getattr(args, "capped_rows", [None])[0], str)), \
                cap_mode_as(variant(config, "cap", getattr(args, "cap_mode", [None])[0], str)):
            result = _run_config(config, data, csc, train, classes, device, args, hot, kept, cached, split,
                                 topology_cache, threads, overlap, overlap_reads)
            # whether its samplers ran on a stream of their own: GPU samplers only (stock's is PyG's, on the CPU)
            on_stream = sampling_stream.OWN_STREAM and device.type == "cuda" and base_of(config) != "stock"
            return {**result, "sampler_stream": on_stream}
    finally:
        if own:
            kept.close()


def _make(config, base, mode, pipe, max_sms, data, csc, train, device, args, hot, kept, key, cached, split,
          topology_cache, threads, overlap_reads) -> tuple:
    """``(loader, data, stores, sampler, build seconds or None, what the timed run iterates)``: a Producer (its
    loader built again in its process), else the loader, kept or built, through a Pipeline when ``pipe``."""
    build_start = time.perf_counter()
    if mode == "proc":
        make = functools.partial(produced_loader, base, args, hot, device, topology_cache=topology_cache, split=split,
                                 split_threads=threads)
        producer = hmgstore.Producer(make, depth=args.depth, device=device, seed=args.seed, max_sms=max_sms,
                                     fuse=args.fuse, sm_percent=args.sm_percent, overlap_reads=overlap_reads,
                                     mps_priority=getattr(args, "mps_priority", None)).start()
        return None, data, None, None, time.perf_counter() - build_start, producer
    # kept apart by mode too: without the pipeline the phase timer times the loader (below), and puts it back
    built, built_by = kept.get(key, config, functools.partial(
        build_loader, base, data, csc, train, device, args, hot, topology_cache=topology_cache))
    loader, data, stores, sampler, build = built
    if built_by != config:
        build = None
        log.info("%s: the loader of %s, used again", config, built_by)
    if cached:  # the features' table only: labels are 8 B rows, not worth a read-back
        stores[0].table(None, "x").set_split(split, threads)
    options = {} if base == "api" else dict(  # api: the README's Pipeline(loader), with its defaults
        depth=args.depth, max_sms=max_sms, fuse=args.fuse if pipe and device.type == "cuda" else 1,
        overlap_reads=overlap_reads)
    return loader, data, stores, sampler, build, hmgstore.Pipeline(loader, device=device, **options) if pipe else loader


def _run_config(config, data, csc, train, classes, device, args, hot, kept, cached, split, topology_cache, threads,
                overlap, overlap_reads) -> dict:
    name, _, cap = config.partition("/")[0].partition("@")  # cache+pipe@none: capped as --max-sms none says
    base, mode = name.partition("+")[::2]  # mode: "" (phases timed), "pipe" (Pipeline) or "proc" (Producer)
    max_sms = flags.sm_cap(cap) if cap else args.max_sms[0]
    pipe = mode != ""
    reps = args.stock_batches if base == "stock" else args.batches
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    key = None if mode == "proc" else (base, topology_cache, pipe, sampling_stream.OWN_STREAM)
    kept.keep_only(key)  # a loader not used again is closed first: not counted in what earlier ones left
    host_gb = _resident_gb()  # what earlier configurations and the graph left in this process
    loader, data, stores, sampler, build, iterable = _make(
        config, base, mode, pipe, max_sms, data, csc, train, device, args, hot, kept, key, cached, split,
        topology_cache, threads, overlap_reads)
    # A full collection walks every tracked object (~350k after the imports: 0.15 s on a 2-core CPU) holding the
    # GIL; one due since the build could land inside the timed window (60 batches: ~0.4 s on a GPU). Collected
    # here, the window sees only what training itself leaves (the report's "gc" counts it).
    gc.collect()
    alone, trimmed, step_issue, calls, step_work = {}, None, None, None, None
    if loader is not None:  # the ceilings: the loader with no training, and the step with no loader
        alone, trimmed, step_issue, calls, step_work = ceilings(loader, iterable, pipe, data, classes, device, args,
                                                                reps, sync, config)
    timed = train_timed.timed(iterable, loader, pipe, data, classes, device, args, reps, sync, trimmed, step_work)
    if mode == "proc":
        alone["producer"] = _rate(iterable, reps, sync, warmup=1)
        # The step's ceiling in this process, on the producer's batches: its rate comes from the same run
        # (and the same MPS daemon, where one runs) as the epoch it is the ceiling of.
        alone["step"], _, step_issue, _, _ = _step_alone(iterable, data, classes, device, args, reps, sync, copy=True)
        iterable.close()
    seconds, per_epoch = timed["seconds"], math.ceil(len(train) / args.batch_size)
    result = {"config": config, "seconds_per_batch": seconds, "batches_per_s": 1 / seconds,
              "batches_per_epoch": per_epoch, "epoch_s": seconds * per_epoch, "loss": timed["loss"],
              "trimmed": timed["trimmed"], "max_sms": max_sms if pipe else None, "split": split,
              "overlap_reads": overlap if pipe else None, "topology_cache": topology_cache, "split_threads": threads,
              "step_issue_s": step_issue, "torch_calls": calls, "gpu_time": timed["gpu_time"],
              "alone_batches_per_s": alone, "split_s": timed["split_s"], "gc": timed["gc"]}
    if build is not None:
        result["build_s"] = build
    elif loader is not None:
        result["loader_of"] = kept.config  # built by an earlier configuration, used again
    if mode == "proc":
        result["producer_batches_per_s"] = alone["producer"]
    result["peak_host_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB, so far
    result["host_gb_at_start"] = host_gb
    if stores is not None or sampler is not None:  # hit ratios, counted over a few more batches (not timed)
        result.update(counted_stats(stores, sampler, loader))
    if loader is not None and device.type == "cuda" and base in ("host", "cache", "api"):
        bound = hmgstore.host_bound(loader)  # the estimate, beside the loader's measured ceiling
        result["host_bound"] = dataclasses.asdict(bound) if bound is not None else None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    gc.collect()
    return result


def _configs(args, cuda: bool) -> list[str]:
    """The configurations to run, in order: those asked for that this machine can run, each once per value of
    every option given several (``name/keyV``), the whole list ``--repeat`` times."""
    configs = [c for c in args.configs if cuda or not c.startswith("all_gpu")]
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        configs = [c for c in configs if c != "stock"]
        log.info("stock skipped: PyG's CPU sampler needs torch-sparse")
    configs = _with_variants(_with_variants(_with_caps(configs, args.max_sms), "topo", args.topology_cache),
                             "split", args.split)
    if any(args.split_threads) and not any(args.split):
        raise ValueError("--split-threads sets the threads of the CPU's reads of a split gather: give --split too")
    configs = _with_variants(configs, "thr", args.split_threads)
    configs = [v for c in configs for v in (_with_variants([c], "cap", args.cap_mode) if _mode(c) else [c])]
    configs = [v for c in configs for v in (_with_variants([c], "overlap", args.overlap_reads)
                                            if _mode(c) and base_of(c) != "api" else [c])]
    configs = [v for c in configs for v in (_with_variants(_with_variants([c], "stream", args.sampler_stream), "rows",
                                                           args.capped_rows) if _mode(c) else [c])]
    if len(args.sampler_stream) > 1:  # one loader build per stream value, producers last (the graph then freed)
        configs.sort(key=lambda c: (_mode(c) == "proc", args.sampler_stream.index(
            variant(c, "stream", args.sampler_stream[0], str))))
    configs = _repeated(configs, args.repeat)
    return configs


def run(args) -> dict:
    """Train every configuration in turn; write and return the report."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    configs = _configs(args, cuda)
    data, csc, train, classes, name = build_graph(args.graph, args.feat_dim)
    fanout = ",".join(map(str, args.fanout))
    report = {
        **header("train", device, quick=bool(getattr(args, "quick", False))),
        "graph": {"name": name, "num_nodes": data.num_nodes, "train": len(train), "feat_dim": data.x.shape[1],
                  "x_gb": data.x.numel() * data.x.element_size() / 1e9},
        "model": f"GraphSAGE {len(args.fanout)} layers, hidden 256, fanout {fanout}", "batch": args.batch_size,
        "cache": args.cache, "seed": args.seed, "compress": args.compress,
        "pipeline": {"depth": args.depth, "max_sms": args.max_sms, "fuse": args.fuse},
        "mps": {"sm_percent": args.sm_percent, "producer_priority": args.mps_priority,
                "trainer_priority": os.environ.get("CUDA_MPS_CLIENT_PRIORITY")},
        "sampler_graphs": args.sampler_graphs,
        "sampler_stream": args.sampler_stream if any(args.sampler_stream) else sampling_stream.OWN_STREAM,
        "capped_rows": args.capped_rows if any(args.capped_rows) else _capped_rows(),
        "trim": args.trim, "tf32": args.tf32 and cuda,
        "host_layout": args.host_layout, "split": args.split, "split_threads": args.split_threads,
        "labels_on_gpu": args.labels_on_gpu, "labor": args.labor, "cap_mode": _cap_modes(args.cap_mode),
        "whole_sm_launch": _whole_sm_launch(device) if "whole" in _cap_modes(args.cap_mode) else None,
        "profiled": bool(args.profile),
        "overlap_reads": args.overlap_reads, "repeat": args.repeat,
        "topology_cache": [_topology_share(args, t) for t in args.topology_cache], "configs": {},
    }
    hot = None
    if any(c.startswith("cache") for c in configs):
        from ..plugins.pyg import HybridNeighborSampler

        log.info("pre-sampling one epoch for the cache")
        torch.manual_seed(args.seed)
        sampler = HybridNeighborSampler(_graph_source(data, csc), args.fanout, device=device,
                                        progress=not args.no_progress, labor=args.labor)
        start = time.perf_counter()
        hot = presample(sampler, train, batch_size=args.batch_size, progress=not args.no_progress)
        report["presample_s"] = time.perf_counter() - start
        sampler.close()
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")  # "high": TF32 matrix products
    kept = Kept()
    try:
        for k, config in enumerate(configs):
            if all(_mode(c) == "proc" for c in configs[k:]) and data.x.numel():
                data, csc = _hollow(data), None  # the producers build the graph again: not two copies at once
            reps = args.stock_batches if base_of(config) == "stock" else args.batches
            log.info("%s: training %s batches", config, reps)
            report["configs"][config] = run_config(config, data, csc, train, classes, device, args, hot, kept)
            gc.collect()
            _write_so_far(report, args.out, configs[k + 1:])
            r = report["configs"][config]
            alone = ", ".join(f"{k} {v:.1f}" for k, v in r["alone_batches_per_s"].items())
            log.info("%-13s %7.2f batches/s  epoch %7.2f s  alone: %s; host GB at start %s, peak %.1f", config,
                     r["batches_per_s"], r["epoch_s"], alone,
                     "?" if r["host_gb_at_start"] is None else f"{r['host_gb_at_start']:.1f}", r["peak_host_gb"])
    finally:
        kept.close()
        torch.set_float32_matmul_precision(precision)
    report.pop("_table_text", None)
    write_report(report, args.out, ratios=add_ratios, text_of=table_text, plot_to=plot)
    return report


def _write_so_far(report: dict, out, left: list) -> None:
    """Write the report of the configurations run so far (no plot), naming those ``left``: a run stopped by a
    time limit keeps every configuration it finished."""
    report["configs_left"] = left
    report.pop("_table_text", None)  # the last write's table, not part of the results
    write_report(report, out, ratios=add_ratios, text_of=table_text, plot_to=lambda *_: None)
