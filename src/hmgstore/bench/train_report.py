"""``bench train``'s report: the targets as ratios of the same run, the markdown table and the plot."""
from __future__ import annotations

import statistics

from .report import no_gpu_line, smoke_test, smoke_test_lines
from .train_configs import _mode, base_of


def _epoch(report, config):
    c = report["configs"].get(config)
    return None if c is None else c["epoch_s"]


#: A configuration's step alone slower than this share of the run's median, or issued in more than this
#: many times its median, is marked disturbed: the machine, not the code (on a cloud VM the same step's rate
#: moved 10-30% between configurations of one run, benchmarks/results/strong-step-h100.md).
DISTURBED_RATE, DISTURBED_ISSUE = 0.95, 1.3


def mark_disturbed(report: dict) -> None:
    """Set ``disturbed`` on each configuration whose step alone (the same step on batches made beforehand,
    whatever the loader) ran off the run's median: its other figures were measured on a disturbed machine."""
    configs = [c for c in report["configs"].values() if c.get("alone_batches_per_s", {}).get("step")]
    if len(configs) < 3:
        return
    rate = sorted(c["alone_batches_per_s"]["step"] for c in configs)[len(configs) // 2]
    issues = sorted(c["step_issue_s"] for c in configs if c.get("step_issue_s"))
    issue = issues[len(issues) // 2] if issues else None
    for c in configs:
        c["disturbed"] = c["alone_batches_per_s"]["step"] < DISTURBED_RATE * rate or bool(
            issue and c.get("step_issue_s") and c["step_issue_s"] > DISTURBED_ISSUE * issue)


def _best_config(report, base, mode=None):
    """The fastest configuration of ``base`` (of ``mode``, or any; any cap and variant) not marked disturbed,
    or None."""
    named = [(c["epoch_s"], n) for n, c in report["configs"].items()
             if base_of(n) == base and (mode is None or _mode(n) == mode) and not c.get("disturbed")]
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
             for n, c in report["configs"].items() if base_of(n) == base and not c.get("disturbed")]
    rates = [(loader, step) for loader, step in rates if loader and step]
    return max(loader / step for loader, step in rates) if rates else None


def add_ratios(report: dict) -> None:
    report["repeats"] = repeats(report)
    if smoke_test(report):  # tiny sizes: a smoke test, whose ratios mean nothing
        report["targets"] = {}
        return
    mark_disturbed(report)
    best_cache, best_gpu, stock = _best(report, "cache"), _best(report, "all_gpu"), _epoch(report, "stock")
    best_proc, best_gpu_pipe = _best_config(report, "cache", "proc"), _best_config(report, "all_gpu", "pipe")
    issue = _issue(report, best_proc) if best_proc else None
    issue_gpu = _issue(report, best_gpu_pipe) if best_gpu_pipe else None
    proc = report["configs"][best_proc] if best_proc else {}
    report["targets"] = {
        "cache_vs_all_gpu": best_cache / best_gpu if best_cache and best_gpu else None,  # epoch time, <= 1.11
        "stock_vs_cache": stock / best_cache if stock and best_cache else None,  # target >= 10
        "proc_issue_vs_all_gpu": issue / issue_gpu if issue and issue_gpu else None,  # target <= 1.1
        "producer_vs_trainer": proc["producer_batches_per_s"] / proc["batches_per_s"] if proc else None,  # >= 2
        "loader_vs_step_all_gpu": _loader_vs_step(report, "all_gpu"),  # target >= 2
        "loader_vs_step_cache": _loader_vs_step(report, "cache"),  # target >= 1.5
        "cache_epoch_s": best_cache,
        # the README's swap (api+pipe, every default) against the fastest tuned cache configuration: >= 0.95
        "api_vs_tuned_cache": _median_ratio(report, "api", "cache"),
    }


def _median_rate(report: dict, base: str) -> float | None:
    """The best median batches/s over ``base``'s configurations (each the median of its runs, ``/runK``; one
    run is its own median), leaving out runs marked disturbed."""
    return max((statistics.median(r) for name, r in _runs(report, disturbed=False).items() if base_of(name) == base),
               default=None)


def _median_ratio(report: dict, base: str, against: str) -> float | None:
    """``base``'s best median rate over ``against``'s: medians, so that one lucky run decides nothing."""
    mine, theirs = _median_rate(report, base), _median_rate(report, against)
    return mine / theirs if mine and theirs else None


def repeats(report: dict) -> dict:
    """Per configuration run more than once (``--repeat``, ``name/runK``): the median batches/s of its runs and
    their spread (min and max), so that a lever of a few percent can be told from the machine's noise."""
    return {name: {"runs": len(r), "median": statistics.median(r), "min": min(r), "max": max(r)}
            for name, r in _runs(report).items() if len(r) > 1}


def _runs(report: dict, disturbed: bool = True) -> dict:
    """Configuration name (``/runK`` left out) -> the batches/s of its runs; ``disturbed=False`` leaves out runs
    marked disturbed."""
    runs: dict = {}
    for name, c in report["configs"].items():
        if disturbed or not c.get("disturbed"):
            runs.setdefault(name.split("/run")[0], []).append(c["batches_per_s"])
    return runs


def _hits(stats):
    return "-" if not stats or stats.get("hit_ratio") is None else f"{stats['hit_ratio']:.2f}"


def _alone(c: dict) -> list[str]:
    """Step alone; loader alone in the main thread; loader alone as the configuration runs it (through its
    pipeline or producer, else the main thread's)."""
    a = c.get("alone_batches_per_s", {})
    missing = "(in producer)" if "producer" in a else "-"  # its loader is the producer's, not the trainer's
    fmt = (lambda v: missing if v is None else f"{v:.1f}")
    return [fmt(a.get("step")), fmt(a.get("loader_main")),
            fmt(a.get("loader_pipe") or a.get("producer") or a.get("loader_main"))]


def table_text(report: dict) -> str:
    """The train report as a markdown table; without a GPU, with no hit-ratio columns (every row comes from
    host memory there)."""
    g = report["graph"]
    gpu = report.get("gpus", 1) > 0
    step = ("layers trimmed per hop" if report.get("trim", False) else "every layer over every node") + \
        (", TF32" if report.get("tf32") else ", float32")
    lines = [f"device: {report['device']}   graph: {g['name']} ({g['num_nodes']:,} nodes, {g['feat_dim']} features, "
             f"{g['x_gb']:.1f} GB; {g['train']:,} training nodes)   {report['model']}, batch {report['batch']}"
             + (f", cache {report['cache']:.0%}" if gpu else "") + _topology_cache(report, gpu)
             + f"   date: {report['date']}",
             *no_gpu_line(report, "stock PyG against hmgstore reading host memory on the CPU, with and without the "
                                  "pipeline", "the all-GPU ceiling, the GPU cache and its hit ratios"), "",
             *smoke_test_lines(report), "",
             *([f"unfinished: {len(report['configs_left'])} configuration(s) not run yet: "
                f"{', '.join(report['configs_left'])}", ""] if report.get("configs_left") else []),
             *(["profiled run (--profile): on the H100 its cached configurations ran 0.5-0.9x as fast as the same "
                "code unprofiled (strong-step-h100.md); take the timings from a run without it", ""]
               if report.get("profiled") and gpu else []),
             f"step: {step}; pipeline: depth {report['pipeline']['depth']}, fuse {report['pipeline'].get('fuse', 1)}; "
             f"features stored as {report.get('compress') or 'float32'}, cache host tier in "
             f"{report.get('host_layout', 'auto')} order"
             + ("; labels whole on the GPU" if report.get("labels_on_gpu") else "")
             + (f"; cache's host feature rows read by the CPU + copy engine: {_shares(report['split'])}"
                if any(report.get("split") or []) else "")
             + ("; sampler's CUDA graphs off" if report.get("sampler_graphs") == "off" else ""), ""]
    stock = _epoch(report, "stock")
    columns = ["config", "batches/s", "epoch s", *(["x stock"] if stock else []), "step alone",
               "loader alone, main thread", "loader alone, as run", "per batch (ms)",
               *(["feature hits", "topology hits"] if gpu else []),
               "host pages a batch", "build s", "peak host GB"]
    lines += ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1)]
    for name, c in report["configs"].items():
        split = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in c["split_s"].items())
        if c.get("step_issue_s"):
            split += f"; step alone issued in {1e3 * c['step_issue_s']:.1f}"
        calls = c.get("torch_calls") or {}
        if calls.get("loader") is not None and calls.get("step") is not None:
            split += f"; torch calls a batch: loader {calls['loader']:.0f}, step {calls['step']:.0f}"
        if c.get("gpu_time"):
            g = c["gpu_time"]
            split += (f"; GPU ms a batch: step {g['step_ms']:.2f} (alone {g['step_alone_ms']:.2f}), loader "
                      f"{g['loader_ms']:.2f}, both at once {g['overlap_ms']:.2f}, idle {g['idle_ms']:.2f}")
        if c.get("gc") and c["gc"]["collections"][2]:  # a full collection holds the GIL while it walks every object
            split += f"; full collections {c['gc']['collections'][2]} ({c['gc']['full_ms']:.0f} ms)"
        if c.get("trimmed") is False and report.get("trim", False):
            split += "; untrimmed (no per-hop counts)"
        speed = [f"{stock / c['epoch_s']:.1f}"] if stock else []
        pages = f"{c['pages_per_batch']:.0f}" if c.get("pages_per_batch") is not None else \
            "as +pipe" if "+proc" in name else "-"  # the producer's stores are not the trainer's to count
        build = f"{c['build_s']:.1f}" if c.get("build_s") is not None else \
            f"{c['loader_of']}'s" if c.get("loader_of") else "-"  # a loader kept from an earlier configuration
        hits = [_hits(c.get("feature_stats")), _hits(c.get("topology_stats"))] if gpu else []
        label = name + (" (disturbed)" if c.get("disturbed") else "")
        cells = [label, f"{c['batches_per_s']:.1f}", f"{c['epoch_s']:.2f}", *speed, *_alone(c), split, *hits, pages,
                 build, f"{c.get('peak_host_gb', 0):.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if any(c.get("disturbed") for c in report["configs"].values()):
        lines.append(f"\n(disturbed): its step alone ran under {DISTURBED_RATE:.0%} of the run's median rate or took "
                     f"over {DISTURBED_ISSUE}x its median to issue: the machine was disturbed while it ran; left out "
                     "of the ratios below")
    lines += _target_lines(report)
    if report.get("repeats"):
        lines.append("\nrepeated, in alternating order: " + "; ".join(
            f"{n} median {r['median']:.1f} batches/s ({r['min']:.1f}-{r['max']:.1f}, {r['runs']} runs)"
            for n, r in report["repeats"].items()))
    return "\n".join(lines)


def _target_lines(report: dict) -> list[str]:
    """The lines under the table: the ratios against their targets, then hmgstore.host_bound's estimates."""
    out: list[str] = []
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
    targets += [f"api+pipe (the README's swap, defaults) / best tuned cache, medians of "
                f"their runs: {t['api_vs_tuned_cache']:.2f}x (target >= 0.95)"] if t.get("api_vs_tuned_cache") else []
    if targets:
        out.append("\n" + "; ".join(targets))
    bounds = [(n, c) for n, c in report["configs"].items() if c.get("host_bound")]
    if bounds:  # hmgstore.host_bound's estimate beside the loader's own measured rate (its ceiling)
        out.append("\nhost reads allow at most (hmgstore.host_bound): " + "; ".join(
            f"{n} {c['host_bound']['batches_per_s']:.0f} batches/s ({c['host_bound']['by']}-bound; loader alone "
            f"{_loader_alone(c):.0f})" for n, c in bounds))
    return out


def _loader_alone(config: dict) -> float:
    """A configuration's loader-alone rate as it ran (through the pipeline when it had one), else NaN."""
    alone = config.get("alone_batches_per_s") or {}
    return alone.get("loader_pipe", alone.get("loader_main", float("nan")))


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


def _topology_cache(report: dict, gpu: bool) -> str:
    """The cache's topology share where --topology-cache set it apart from the features'."""
    shares = [t for t in report.get("topology_cache") or [] if t is not None and t != report["cache"]]
    return f" of the features, topology {_shares(report['topology_cache'])}" if gpu and shares else ""


def _shares(splits) -> str:
    return ", ".join("none" if not s else f"{s:.0%}" for s in splits)
