"""``python -m hmgstore.bench scale``: GraphSAGE batches/s on 1 and N GPUs of this machine, and the scaling.

Runs ``examples/multi_gpu_pyg.py`` (DDP, one process per GPU, hmgstore's GPU
sampler and ``hmgstore.Pipeline``, features sharded over the GPUs) under
``torchrun`` once per ``--gpus`` value, in this one command, with the same
per-GPU batch and options, and reads each run's ``--json``. What it reports
per run: batches/s over all ranks (median of the epochs after the first),
per GPU, as a ratio to the 1-GPU run (the speed-up) and per GPU as a ratio
to it (the efficiency: 1.0 is linear); each rank's training time per step
and how long its loop waited for the pipeline (the sampling and gathering it
did not hide). Without a GPU, each "GPU" is a CPU process (gloo).

The script is the repository's ``examples/multi_gpu_pyg.py`` (``--example``
names another copy): what is measured is what a user runs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from ..cli import flags
from .report import header, no_gpu_line, ratio_text, smoke_test_lines, write_report

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "multi_gpu_pyg.py"
#: Sizes for a machine without a GPU, and for --quick (see __main__.parse_args).
CPU = ["--num-nodes", "3000", "--max-batches", "3", "--feat-dim", "32", "--hidden", "32"]
QUICK = ["--num-nodes", "3000", "--max-batches", "3", "--feat-dim", "32", "--hidden", "32", "--batch-size", "64"]
#: The lines of a failed run's log shown in the error.
TAIL = 25


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=flags.positive, nargs="+", default=None,
                   help="GPUs (processes) per run, e.g. 1 2 4 (default: 1 and every GPU; 1 2 without a GPU)")
    p.add_argument("--graph", type=flags.graph("synthetic", "papers:NODES:EDGES"), default="synthetic",
                   help="synthetic (--num-nodes, 10 edges per node, --feat-dim) or papers:NODES:EDGES "
                        "(papers:111M:1.6B: ogbn-papers100M's shape)")
    p.add_argument("--num-nodes", type=flags.synthetic_nodes, default="2M", help="synthetic graph: nodes (default: 2M)")
    p.add_argument("--feat-dim", type=flags.positive, default=128, help="features per node (default: 128)")
    p.add_argument("--hidden", type=flags.positive, default=256, help="GraphSAGE hidden width (default: 256)")
    p.add_argument("--gpu-budget", type=flags.size(), default="2GB",
                   help="GPU memory each GPU gives the features (default: 2GB)")
    p.add_argument("--replicate", type=flags.size(), default="256MB",
                   help="part of --gpu-budget replicated on every GPU")
    p.add_argument("--compress", default=None, choices=("int8", "float8", "bfloat16", "float16"),
                   help="the features' rows in this format in every tier (--gpu-budget counts stored bytes)")
    p.add_argument("--one-gpu-budget", type=flags.size(), default=None,
                   help="GPU memory the 1-GPU run gives the features, in float32 rows (default: --gpu-budget "
                        "and --compress as the other runs); e.g. 60GB for an all-GPU baseline")
    p.add_argument("--topology-budget", type=flags.size("all"), default="all",
                   help="GPU memory each GPU gives the topology ('all': replicated on every GPU, the default)")
    p.add_argument("--epochs", type=flags.whole(2, why=" (the first is warm-up, not timed)"), default=3,
                   help="epochs per run; the first is warm-up (default: 3)")
    p.add_argument("--no-trim", action="store_true",
                   help="every layer over the batch's whole subgraph (default: the step trims per hop)")
    p.add_argument("--no-tf32", action="store_true", help="full float32 matmuls (default: TF32 allowed)")
    p.add_argument("--max-sms", type=flags.as_written(flags.sm_cap), default="auto",
                   help="the pipeline's cap on its gathers' SMs: a number, 'none' or 'auto' (the default, "
                        "hmgstore.Pipeline's own)")
    p.add_argument("--pipeline", choices=("on", "off"), default=None,
                   help="off: sampling, gathering and training one after another, each timed (default: on with GPUs)")
    flags.add_batch_size(p, 1024, "seed nodes per GPU")
    flags.add_fanout(p)
    flags.add_max_batches(p)
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--example", default=str(EXAMPLE), help="the multi-GPU training script (default: the "
                                                           "repository's examples/multi_gpu_pyg.py)")
    p.add_argument("--out", default="bench-out/scale", help="folder for scale.json and .md, and each run's log")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def check(args) -> str | None:
    """Why the options cannot run together (None: they can), said before the first run starts: every run gets
    --replicate, the 1-GPU one within --one-gpu-budget when given."""
    for flag, budget in (("--gpu-budget", args.gpu_budget), ("--one-gpu-budget", args.one_gpu_budget)):
        problem = None if budget is None else flags.replicate_problem(args.replicate, budget, flag)
        if problem is not None:
            return problem
    return None


def gpu_counts(requested, available: int) -> list[int]:
    """The runs' GPU counts: ``requested`` (checked against ``available`` GPUs) or 1 and all of them (1 and 2
    CPU processes without a GPU), ascending, the 1-GPU baseline always included."""
    counts = sorted(set(requested or ([1, available] if available else [1, 2])) | {1})
    if available and counts[-1] > available:
        raise SystemExit(f"--gpus {counts[-1]}: this machine has {available} GPU(s)")
    return counts


def run(args) -> dict:
    """Run the example once per GPU count; write and return the report."""
    example = Path(args.example)
    if not example.is_file():
        raise SystemExit(f"{example} not found: bench scale runs the repository's examples/multi_gpu_pyg.py; run it "
                         "from a checkout of hmgstore (pip install -e .), or name the script with --example")
    if args.epochs < 2:
        raise SystemExit("--epochs must be at least 2: the first epoch is warm-up and is not timed")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {**header("scale", torch.device("cuda" if available else "cpu"), quick=getattr(args, "quick", False)),
              "graph": args.graph,
              "num_nodes": args.num_nodes if args.graph == "synthetic" else None, "feat_dim": args.feat_dim,
              "batch_size": args.batch_size, "fanout": args.fanout, "gpu_budget": args.gpu_budget,
              "replicate": args.replicate, "compress": args.compress, "one_gpu_budget": args.one_gpu_budget,
              "trim": not args.no_trim, "tf32": not args.no_tf32, "max_sms": args.max_sms, "pipeline": args.pipeline,
              "example": str(example), "runs": []}
    for n in gpu_counts(args.gpus, available):
        result = _one_run(args, example, n, out)
        total = result["aggregate"]
        report["runs"].append({
            "gpus": n, "command": result["command"], "batches_per_s": total["steady_batches_per_s"],
            "train_ms": total.get("steady_train_ms_per_batch"), "wait_ms": total.get("steady_wait_ms_per_batch"),
            "sampling_ms": total.get("steady_sampling_ms_per_batch"),
            "gather_ms": total.get("steady_gather_ms_per_batch"), "test_acc": result["test_acc"],
            "placement_rows": result["placement_rows"], "dataset": result["dataset"],
            "bytes_per_batch": _mean_bytes_per_batch(result["ranks"]),
            "per_rank_batches_per_s": [r["steady_batches_per_s"] for r in result["ranks"]]})
    write_report(report, out, ratios=_ratios, text_of=table_text, plot_to=_no_plot)
    return report


def _example_argv(args, n: int, json_path: Path) -> list[str]:
    one_gpu_baseline = n == 1 and args.one_gpu_budget is not None  # e.g. every row in GPU memory, float32
    budget = args.one_gpu_budget if one_gpu_baseline else args.gpu_budget
    argv = ["--graph", args.graph, "--feat-dim", str(args.feat_dim), "--hidden", str(args.hidden),
            "--gpu-budget", budget, "--replicate", args.replicate, "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--fanout", ",".join(map(str, args.fanout)),
            "--seed", str(args.seed), "--topology-budget", args.topology_budget, "--json", str(json_path),
            "--no-progress", *(["--no-trim"] if args.no_trim else []), *(["--no-tf32"] if args.no_tf32 else []),
            *(["--max-sms", args.max_sms] if args.max_sms else []),
            *(["--pipeline", args.pipeline] if args.pipeline else [])]
    if args.compress and not one_gpu_baseline:
        argv += ["--compress", args.compress]
    if args.graph == "synthetic":
        argv += ["--num-nodes", str(args.num_nodes)]
    if args.max_batches:
        argv += ["--max-batches", str(args.max_batches)]
    return argv


def _one_run(args, example: Path, n: int, out: Path) -> dict:
    """torchrun the example on ``n`` processes; its rank 0's JSON. SystemExit with the log's tail if it fails."""
    json_path, log_path = out / f"gpus{n}.json", out / f"gpus{n}.log"
    json_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
               os.path.relpath(example), *_example_argv(args, n, json_path)]  # relative: a command to rerun
    # torchrun gives each rank 1 CPU thread unless told: building a 57 GB table would then take minutes
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n)), **os.environ}
    if not args.no_progress:
        print(f"scale: {n} GPU(s): {' '.join(command[1:])}", file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if code or not json_path.is_file():
        tail = "".join(_ranks_output(log_path.read_text(errors="replace"))[-TAIL:])
        raise SystemExit(f"the {n}-GPU run failed (exit code {code}); the end of {log_path}:\n{tail}")
    result = json.loads(json_path.read_text())
    result["command"] = "torchrun --standalone " + " ".join(command[4:])
    return result


def _ranks_output(log: str) -> list[str]:
    """The lines of a run's log that its ranks wrote: torchrun's own (its logger's ``E1124 12:00:00.000 ...``
    lines, and its report of a failed rank, which names the rank but not the error) left out."""
    every = log.splitlines(keepends=True)
    lines = []
    for i, line in enumerate(every):
        if line.startswith("Traceback (most recent call last):") and any(
                "torch/distributed/run.py" in later for later in every[i:i + 6]):
            break  # torchrun's own traceback and failure report: the ranks' output is above it
        if not re.match(r"[IWE]\d{4} \d\d:\d\d:\d\d", line):
            lines.append(line)
    return lines


def _mean_bytes_per_batch(ranks: list[dict]) -> dict[str, float] | None:
    """Feature bytes a batch read per tier (own GPU, peers, host), the mean over ranks; None from an older
    example that did not count them."""
    counted = [r["bytes_per_batch"] for r in ranks if "bytes_per_batch" in r]
    if not counted:
        return None
    return {k: sum(c[k] for c in counted) / len(counted) for k in counted[0]}


def _ratios(report: dict) -> None:
    base = report["runs"][0]["batches_per_s"]
    for r in report["runs"]:
        r["per_gpu_batches_per_s"] = r["batches_per_s"] / r["gpus"]
        r["x_one_gpu"] = r["batches_per_s"] / base
        r["efficiency"] = r["x_one_gpu"] / r["gpus"]
        r["per_rank_x_one_gpu"] = [rate / base for rate in r.get("per_rank_batches_per_s", [])]


def _data_ms(r: dict) -> tuple[float, str]:
    """A step's time on data in the training loop, and what it was: the wait for the pipeline, or the
    sampling and gathering done in the loop (without the pipeline: on the CPU)."""
    if r["wait_ms"] is not None:
        return r["wait_ms"], "waited for the pipeline"
    return (r["sampling_ms"] or 0.0) + (r["gather_ms"] or 0.0), "sampled and gathered in the loop"


def table_text(report: dict) -> str:
    """The scale report as a markdown table, one line per GPU count."""
    first = report["runs"][0]["dataset"]
    lines = [f"device: {report['device']}   graph: {report['graph']} ({first['num_nodes']:,} nodes, "
             f"{first['num_edges']:,} edges, {first['feat_dim']} features, {first['x_gb']:.1f} GB)   batch: "
             f"{report['batch_size']} per GPU   features: {report['gpu_budget']} per GPU   date: {report['date']}",
             *no_gpu_line(report, "CPU processes over gloo, hmgstore's sampler on the CPU",
                          "GPU sampling, NVLink shards and the pipeline"), *smoke_test_lines(report), "",
             "| GPUs | batches/s | per GPU | x 1 GPU | efficiency | each GPU x 1 GPU | train ms a step "
             "| data ms a step | data | MB a batch: own GPU / peers / host | test acc |",
             "|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|"]
    for r in report["runs"]:
        data_ms, what = _data_ms(r)
        lines.append(f"| {r['gpus']} | {r['batches_per_s']:.1f} | {r['per_gpu_batches_per_s']:.1f} | "
                     f"{ratio_text(report, r['x_one_gpu'])} | {ratio_text(report, r['efficiency'])} | "
                     f"{' '.join(f'{x:.2f}' for x in r.get('per_rank_x_one_gpu', []))} | "
                     f"{r['train_ms']:.1f} | {data_ms:.1f} | {what} | {_tier_mb(r.get('bytes_per_batch'))} | "
                     f"{r['test_acc']:.4f} |")
    lines += ["", "Commands:", *(f"- `{r['command']}`" for r in report["runs"])]
    return "\n".join(lines)


def _tier_mb(where: dict | None) -> str:
    return "" if not where else " / ".join(f"{where[k] / 1e6:.1f}" for k in ("own_gpu", "peers", "host"))


def _no_plot(report: dict, path) -> None:
    """No plot: a handful of GPU counts read better as a table."""
