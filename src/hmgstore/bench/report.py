"""Printing and saving benchmark results: a table, a JSON file and a PNG plot."""
from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

_LABELS = {
    "hmg_host": "hmgstore, host tier",
    "hmg_gpu": "hmgstore, GPU tier",
    "gpu_index_select": "index_select in GPU memory",
    "pageable": 'x[idx].to("cuda")',
    "cpu_pinned": "CPU index_select + pinned copy",
}


def _gbps(size: dict, name: str):
    v = size["variants"].get(name)
    return None if v is None else v["gbps"]


def _ratio(a, b):
    return None if a is None or b is None else a / b


def add_ratios(report: dict) -> None:
    """Attach to every row size the ratios the targets are stated in."""
    limit = report.get("h2d_limit_gbps")
    for size in report["sizes"] + ([report["big_table"]] if report.get("big_table") else []):
        for v in size["variants"].values():
            v["x_h2d_limit"] = _ratio(v["gbps"], limit)
        size["host_vs_cpu_pinned"] = _ratio(_gbps(size, "hmg_host"), _gbps(size, "cpu_pinned"))
        size["host_vs_pageable"] = _ratio(_gbps(size, "hmg_host"), _gbps(size, "pageable"))
        size["gpu_vs_index_select"] = _ratio(_gbps(size, "hmg_gpu"), _gbps(size, "gpu_index_select"))


def _fmt(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def table_text(report: dict) -> str:
    """The gather report as a markdown table (GB/s and ratios)."""
    limit = report.get("h2d_limit_gbps")
    lines = [f"device: {report['device']}   H2D memcpy limit: {_fmt(limit)} GB/s (end of run: "
             f"{_fmt(report.get('h2d_limit_gbps_end'))})   batch: "
             f"{report['sizes'][0]['batch'] if report['sizes'] else '-'} distinct random ids   date: {report['date']}",
             "",
             "| table | row B | hmg host GB/s (x limit) | x cpu_pinned | x pageable | hmg GPU tier GB/s "
             "| x GPU index_select | pageable GB/s | cpu_pinned GB/s | GPU index_select GB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [(_size_label(s["table_bytes"]), s) for s in report["sizes"]]
    if report.get("big_table"):
        rows.append((f"{report['big_table']['table_bytes'] / 1e9:.0f} GB", report["big_table"]))
    for label, s in rows:
        host = s["variants"].get("hmg_host", {})
        lines.append(
            f"| {label} | {s['row_bytes']} | {_fmt(host.get('gbps'))} ({_fmt(host.get('x_h2d_limit'), '.2f')}) "
            f"| {_fmt(s['host_vs_cpu_pinned'], '.2f')} | {_fmt(s['host_vs_pageable'], '.1f')} "
            f"| {_fmt(_gbps(s, 'hmg_gpu'))} | {_fmt(s['gpu_vs_index_select'], '.2f')} "
            f"| {_fmt(_gbps(s, 'pageable'))} | {_fmt(_gbps(s, 'cpu_pinned'))} | {_fmt(_gbps(s, 'gpu_index_select'))} |")
    return "\n".join(lines)


def _size_label(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_host, ax_gpu) = plt.subplots(1, 2, figsize=(12, 4.5))
    sizes = [s["row_bytes"] for s in report["sizes"]]
    for name in ("hmg_host", "cpu_pinned", "pageable"):
        ys = [_gbps(s, name) for s in report["sizes"]]
        if any(y is not None for y in ys):
            ax_host.plot(sizes, ys, marker="o", label=_LABELS[name])
    if report.get("h2d_limit_gbps"):
        ax_host.axhline(report["h2d_limit_gbps"], color="gray", ls="--", label="pinned H2D memcpy (limit)")
    for name in ("hmg_gpu", "gpu_index_select"):
        ys = [_gbps(s, name) for s in report["sizes"]]
        if any(y is not None for y in ys):
            ax_gpu.plot(sizes, ys, marker="o", label=_LABELS[name])
    for ax, title in ((ax_host, "rows from host memory"), (ax_gpu, "rows from GPU memory")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row size (bytes)")
        ax.set_ylabel("GB/s of gathered rows")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"hmgstore gather, {report['device']}, {report['sizes'][0]['batch'] if report['sizes'] else ''} random ids")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, out_dir, *, ratios=add_ratios, text_of=table_text, plot_to=plot) -> Path:
    """Add ratios, write ``<name>.json``, ``<name>.md`` and ``<name>.png`` under ``out_dir``; return the folder.

    ``ratios``, ``text_of``, ``plot_to``: the benchmark's own ratio, table and
    plot functions (default: the gather benchmark's).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ratios(report)
    name = report["benchmark"]
    text = text_of(report)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{name}.md").write_text(f"# {name}\n\ncommand: `{report['command']}`\n\n{text}\n")
    try:
        plot_to(report, out / f"{name}.png")
    except ImportError:
        log.warning("matplotlib is not installed: no plot (pip install 'hmgstore[bench]')")
    report["_table_text"] = text
    return out
