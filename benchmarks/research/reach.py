"""The GPU's reach into host memory: gather rates against the distinct 2 MiB pages a batch touches.

For each row size, batches of ids confined to ``K`` random 2 MiB pages of one
big host table (owned cudaHostAlloc memory) are gathered by hmgstore's
kernel (ids on the GPU) and by the CPU path (``index_select`` into pinned
staging, then one copy), for a sweep of ``K``; every rate is shown as a
ratio to the pinned H2D limit measured in the same run. The knee (the most
pages a batch may touch at 0.8x of the best rate) and the cost of each
further page (the slope of a batch's time past the knee) are given per path
(see :mod:`hmgstore.table.host_pages`). Without a GPU, the CPU path alone (no copy) is
measured: the CPU's own reach.
"""
from __future__ import annotations

import argparse

import torch

from hmgstore.bench.report import header, no_gpu_line, ratio_text, smoke_test_lines, write_report
from hmgstore.cli import flags
from hmgstore.table.host_pages import Reach, measure

from . import PROG

PAGES = (64, 256, 1024, 4096, 16384)
#: Sizes for a machine without a GPU, and for --quick (see hmgstore.bench.__main__.parse_args).
CPU = ["--table-gb", "1"]
QUICK = ["--table-gb", "0.125", "--pages", "4", "16", "32", "--batch-size", "20000", "--reps", "2"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table-gb", type=float, default=32, help="host table size in GB")
    p.add_argument("--row-bytes", type=int, nargs="+", default=[128, 512], help="row sizes (multiples of 4)")
    p.add_argument("--pages", type=int, nargs="+", default=list(PAGES), help="pages per batch to sweep")
    flags.add_batch_size(p, 500_000, "ids")
    p.add_argument("--reps", type=int, default=10, help="timed repeats of each kernel batch (half for the CPU path)")
    p.add_argument("--no-cpu", action="store_true", help="time the kernel only")
    p.add_argument("--out", default="bench-out/reach", help="folder for reach.json, .md and .png")
    flags.add_no_progress(p)
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def run(args) -> dict:
    """Measure the reach of this machine's GPU (or, without one, of its CPU path); write and return the report."""
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    reach = measure(device, table_bytes=int(args.table_gb * 1e9) // 8 * 8, row_bytes=args.row_bytes,
                    pages=args.pages, batch=args.batch_size, reps=args.reps, cpu=not args.no_cpu or not gpu,
                    progress=not args.no_progress)
    report = header("reach", device, quick=getattr(args, "quick", False), prog=PROG)
    report.update(reach.to_dict())
    report["device"] = report["device"] if gpu else "cpu"
    report["batch"] = args.batch_size
    write_report(report, args.out, ratios=_ratios, text_of=table_text, plot_to=plot)
    return report


def _ratios(report: dict) -> None:
    reach = Reach.from_dict(report)
    report["summary"] = {
        str(rb): {path: {"knee_pages": c.knee(path), "us_per_page": c.us_per_page(path),
                         "best_gbps": max(c.gbps(path), default=None)}
                  for path in ("kernel", "cpu") if (c.kernel_seconds if path == "kernel" else c.cpu_seconds)}
        for rb, c in reach.curves.items()}


def table_text(report: dict) -> str:
    """The reach report: per row size, rates against pages a batch, then each path's knee and cost per page."""
    reach = Reach.from_dict(report)
    limit = reach.limit_gbps
    lines = [f"device: {report['device']}   table: {report['table_bytes'] / 1e9:.1f} GB   up to {report['batch']} ids "
             f"a batch   date: {report['date']}" + (f"   H2D memcpy limit: {limit:.1f} GB/s" if limit else ""),
             *no_gpu_line(report, "the CPU path alone, index_select with no copy: the CPU's own reach",
                          "the kernel's figures and the H2D limit"), *smoke_test_lines(report), ""]
    for rb, curve in sorted(reach.curves.items()):
        paths = [p for p in ("kernel", "cpu") if (curve.kernel_seconds if p == "kernel" else curve.cpu_seconds)]
        unit = "x limit" if limit else "GB/s"
        lines += [f"{rb} B rows:", "", "| pages a batch | rows | " + " | ".join(f"{p} {unit}" for p in paths) + " |",
                  "|---:|---:|" + "---:|" * len(paths)]
        rates = {p: curve.gbps(p) for p in paths}
        for i, (k, n) in enumerate(zip(curve.pages, curve.rows)):
            cells = [ratio_text(report, rates[p][i] / limit) if limit else f"{rates[p][i]:.1f}" for p in paths]
            lines.append(f"| {k} | {n} | " + " | ".join(cells) + " |")
        lines += [""] + [f"- {p}: knee at {curve.knee(p)} pages (rate >= 0.8x its best), then "
                         f"{curve.us_per_page(p):.2f} us a page" for p in paths] + [""]
    return "\n".join(lines)


def plot(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reach = Reach.from_dict(report)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    scale = reach.limit_gbps or 1.0
    for rb, curve in sorted(reach.curves.items()):
        for p, style in (("kernel", "-"), ("cpu", "--")):
            rates = curve.gbps(p)
            if rates:
                ax.plot(curve.pages[:len(rates)], [r / scale for r in rates], style, marker="o", label=f"{rb} B, {p}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distinct 2 MiB host pages a batch touches")
    ax.set_ylabel("x pinned H2D memcpy" if reach.limit_gbps else "GB/s")
    ax.set_title(f"reach into host memory, {report['device']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
