"""Printing and saving benchmark results: a table, a JSON file and a PNG plot."""
from __future__ import annotations

import datetime
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

_LABELS = {
    "hmg_host": "hmgstore, host tier pinned in place",
    "hmg_host_sync": "hmgstore, host tier, check='sync'",
    "hmg_owned": "hmgstore, owned 2 MiB pages (backing='hugepage')",
    "hmg_owned_cuda": "hmgstore, owned cudaHostAlloc (copy=True)",
    "hmg_bf16": "hmgstore, bf16 host rows (float32 delivered)",
    "hmg_split": "hmgstore, split CPU+GPU gather (owned, CPU ids)",
    "split_kernel": "split table, kernel alone (CPU ids)",
    "split_cpu": "split table, CPU threads alone",
    "hmg_gpu": "hmgstore, GPU tier",
    "gpu_index_select": "index_select in GPU memory",
    "pageable": 'x[idx].to("cuda")',
    "cpu_pinned": "CPU index_select + pinned copy",
    "hmg_host_out": "hmgstore, host tier, out= one reused buffer",
    "cpu_index_select": "CPU index_select into a new tensor",
}
HOST_VARIANTS = ("hmg_host", "hmg_owned", "hmg_owned_cuda", "hmg_bf16", "hmg_host_sync", "hmg_split",
                 "split_kernel", "split_cpu")


def committed_results(name: str, starts=None) -> Path | None:
    """``benchmarks/results/<name>`` of the hmgstore checkout at hand, or None where there is none.

    Looked for in each folder of ``starts`` and every folder above it. By
    default: the working directory, then the imported package's folder,
    which lies inside the checkout for an editable install, so that a
    notebook finds the committed results from any folder. An installed
    package carries no results: then None.
    """
    import hmgstore

    if starts is None:
        starts = [Path.cwd(), Path(hmgstore.__file__).resolve().parent]
    for start in map(Path, starts):
        for folder in (start, *start.parents):
            path = folder / "benchmarks" / "results" / name
            if path.is_file():
                return path
    return None


#: The line a --quick report carries: its sizes check that every variant runs, they measure nothing.
SMOKE_TEST_LINE = ("smoke test (--quick): tiny sizes check that every variant runs and gives the right rows; at "
                   "these sizes a time is mostly fixed overhead, so no ratios are printed (n/a). Run without "
                   "--quick to measure.")


def header(benchmark: str, device, quick: bool = False, prog: str = "python -m hmgstore.bench") -> dict:
    """What every report starts with: the benchmark, its command line (``prog`` and this process's arguments),
    the date, the device and versions; ``quick``: a ``--quick`` run, marked ``smoke_test`` (see
    :func:`ratio_text`)."""
    import torch

    import hmgstore

    return {
        "benchmark": benchmark,
        "command": f"{prog} " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch": torch.__version__, "hmgstore": hmgstore.__version__, "smoke_test": bool(quick),
    }


def smoke_test(report: dict) -> bool:
    """Whether ``report`` comes from a ``--quick`` run (its figures time overheads, not rates)."""
    return bool(report.get("smoke_test"))


def smoke_test_lines(report: dict) -> list[str]:
    """The smoke-test line, once, for a ``--quick`` report; nothing otherwise."""
    return [SMOKE_TEST_LINE] if smoke_test(report) else []


def ratio_text(report: dict, value, spec: str = ".2f", suffix: str = "") -> str:
    """A ratio as a table prints it: ``"n/a"`` in a ``--quick`` report (tiny sizes: ratios of overheads, such as
    an efficiency of 10.2, mean nothing), ``"-"`` where it was not measured, else ``value`` in ``spec``.
    Every benchmark's table prints its ratios through this, ``bench train``'s too."""
    if smoke_test(report):
        return "n/a"
    return "-" if value is None else format(value, spec) + suffix


def no_gpu_line(report: dict, shows: str, needs: str) -> list[str]:
    """The line a report made without a GPU carries, once: what it shows, and what needs a GPU. Empty where
    there is a GPU."""
    if report.get("gpus", 0):
        return []
    return [f"no GPU: {report['benchmark']} shows only the CPU figures ({shows}); {needs} need a GPU."]


def _gbps(size: dict, name: str):
    v = size["variants"].get(name)
    return None if v is None else v["gbps"]


def _ratio(a, b):
    return None if a is None or b is None else a / b


def add_ratios(report: dict) -> None:
    """Attach to every row size the ratios the targets are stated in."""
    limit = report.get("h2d_limit_gbps")
    for size in report["sizes"] + report.get("sweep", []):
        for v in size["variants"].values():
            v["x_h2d_limit"] = _ratio(v["gbps"], limit)
        size["host_vs_cpu_pinned"] = _ratio(_gbps(size, "hmg_host"), _gbps(size, "cpu_pinned"))
        size["host_vs_pageable"] = _ratio(_gbps(size, "hmg_host"), _gbps(size, "pageable"))
        size["gpu_vs_index_select"] = _ratio(_gbps(size, "hmg_gpu"), _gbps(size, "gpu_index_select"))
        size["owned_vs_host"] = _ratio(_gbps(size, "hmg_owned"), _gbps(size, "hmg_host"))
        alone = [_gbps(size, n) for n in ("split_kernel", "split_cpu")]
        size["split_vs_sum"] = _ratio(_gbps(size, "hmg_split"), None if None in alone else sum(alone))
        size["split_vs_better"] = _ratio(_gbps(size, "hmg_split"), None if None in alone else max(alone))


def _fmt(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def table_text(report: dict) -> str:
    """The gather report as a markdown table (GB/s and ratios); without a GPU, the CPU figures alone."""
    if report["device"] == "cpu":
        return _cpu_table_text(report)
    limit = report.get("h2d_limit_gbps")
    lines = [f"device: {report['device']}   H2D memcpy limit: {_fmt(limit)} GB/s (end of run: "
             f"{_fmt(report.get('h2d_limit_gbps_end'))})   batch: "
             f"{report['sizes'][0]['batch'] if report['sizes'] else '-'} distinct random ids   date: {report['date']}",
             *smoke_test_lines(report), *_size_note(report), "",
             "| table | row B | hmg host GB/s (x limit) | x cpu_pinned | x pageable | hmg GPU tier GB/s "
             "| x GPU index_select | pageable GB/s | cpu_pinned GB/s | GPU index_select GB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report["sizes"]:
        host = s["variants"].get("hmg_host", {})
        lines.append(
            f"| {_size_label(s['table_bytes'])} | {s['row_bytes']} | {_fmt(host.get('gbps'))} "
            f"({ratio_text(report, host.get('x_h2d_limit'))}) "
            f"| {ratio_text(report, s['host_vs_cpu_pinned'])} | {ratio_text(report, s['host_vs_pageable'], '.1f')} "
            f"| {_fmt(_gbps(s, 'hmg_gpu'))} | {ratio_text(report, s['gpu_vs_index_select'])} "
            f"| {_fmt(_gbps(s, 'pageable'))} | {_fmt(_gbps(s, 'cpu_pinned'))} | {_fmt(_gbps(s, 'gpu_index_select'))} |")
    for title, sizes in (("Host memory variants (GB/s, x limit; setup seconds)", report["sizes"]),
                         ("Table-size sweep (GB/s, x limit; setup seconds)", report.get("sweep", []))):
        if not sizes:
            continue
        names = [n for n in (*HOST_VARIANTS, "cpu_pinned") if any(n in s["variants"] for s in sizes)]
        lines += ["", f"{title}:", "", "| table | row B | " + " | ".join(names) + " |",
                  "|---|---:|" + "---:|" * len(names)]
        for s in sizes:
            cells = []
            for n in names:
                v = s["variants"].get(n)
                setup = f"; {v['setup_seconds']:.1f} s" if v and "setup_seconds" in v else ""
                ratio = ratio_text(report, None if v is None else v.get("x_h2d_limit"))
                cells.append("-" if v is None else f"{v['gbps']:.1f} ({ratio}{setup})")
            label = _size_label(s["table_bytes"]) if s in report["sizes"] else f"{s['table_bytes'] / 1e9:.0f} GB"
            lines.append(f"| {label} | {s['row_bytes']} | " + " | ".join(cells) + " |")
    split = [s for s in report["sizes"] + report.get("sweep", []) if "hmg_split" in s["variants"]]
    if split:
        lines += ["", "Split gather (x limit): the split against each path alone on the same table and ids:", "",
                  "| table | row B | CPU share | threads | split | kernel alone | CPU alone | x sum of both "
                  "| x better one |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in split:
            v = s["variants"]
            cells = [ratio_text(report, v.get(n, {}).get("x_h2d_limit")) for n in ("hmg_split", "split_kernel",
                                                                                    "split_cpu")]
            label = _size_label(s["table_bytes"]) if s in report["sizes"] else f"{s['table_bytes'] / 1e9:.0f} GB"
            lines.append(f"| {label} | {s['row_bytes']} | {v['hmg_split'].get('share', 0):.2f} "
                         f"| {v['hmg_split'].get('threads')} | " + " | ".join(cells)
                         + f" | {ratio_text(report, s.get('split_vs_sum'))} "
                         + f"| {ratio_text(report, s.get('split_vs_better'))} |")
    return "\n".join(lines)


def _cpu_table_text(report: dict) -> str:
    """Without a GPU: hmgstore's host tables, read by its CPU path, against ``torch.index_select``."""
    sizes = report["sizes"]
    names = [n for n in (*HOST_VARIANTS, "hmg_host_out", "cpu_index_select", "cpu_pinned")
             if any(n in s["variants"] for s in sizes)]
    lines = [f"device: cpu   batch: {report['batch']} distinct random ids   date: {report['date']}",
             *no_gpu_line(report, "hmgstore's host tables read by its CPU path, against torch.index_select",
                          "the PCIe limit, the GPU tier and the copies to a GPU"),
             *smoke_test_lines(report), *_size_note(report)[1:], "",
             ("GB/s (x index_select of the same kind: into a new tensor, or with out= into one reused buffer "
              "for hmg out=; setup seconds):"), "",
             "| table | row B | " + " | ".join(_CPU_LABELS.get(n, n) for n in names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    for s in sizes:
        cells = []
        for n in names:
            v = s["variants"].get(n)
            if v is None:
                cells.append("not run")
                continue
            base = _cpu_baseline(s, n)
            notes = [ratio_text(report, v['gbps'] / base, suffix="x")] if base and n.startswith("hmg") else []
            notes += [f"{v['setup_seconds']:.1f} s"] if "setup_seconds" in v else []
            cells.append(f"{v['gbps']:.1f}" + (f" ({'; '.join(notes)})" if notes else ""))
        lines.append(f"| {_size_label(s['table_bytes'])} | {s['row_bytes']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_baseline(size: dict, name: str):
    """GB/s of the index_select an hmg variant of the CPU table is held to: into one reused buffer for
    ``hmg_host_out``, else into a new tensor (``cpu_pinned`` in reports from before ``cpu_index_select``)."""
    if name == "hmg_host_out":
        return _gbps(size, "cpu_pinned")
    return _gbps(size, "cpu_index_select") or _gbps(size, "cpu_pinned")


#: Column titles of the CPU table: the CPU baseline copies nothing there.
_CPU_LABELS = {"hmg_host": "hmg host, pinned in place", "hmg_owned": "hmg owned 2 MiB pages",
               "hmg_bf16": "hmg bf16 host rows (float32 delivered)", "hmg_host_out": "hmg host, out= reused buffer",
               "cpu_index_select": "torch.index_select, new tensor",
               "cpu_pinned": "torch.index_select, out= reused buffer"}


def _size_note(report: dict) -> list[str]:
    """Where a table is larger than ``--table-gib`` asked (it holds at least ``min_batches`` batches of rows),
    a line saying so and why; else nothing."""
    asked, batch, least = report.get("table_gib"), report.get("batch"), report.get("min_batches")
    if asked is None or batch is None or least is None:
        return []
    bigger = [s for s in report["sizes"] if s["table_bytes"] > asked * 2**30]
    if not bigger:
        return []
    rows = " and ".join(f"{s['row_bytes']} B" for s in bigger)
    return ["", f"tables: --table-gib {asked:g} is {_size_label(asked * 2**30)}; at {rows} rows that is fewer than "
                f"{least} batches of {batch:,} ids, so those tables hold {least} batches of rows "
                f"({', '.join(_size_label(s['table_bytes']) for s in bigger)}) and a batch's ids stay scattered "
                "over the table"]


def _size_label(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 1000 * 2**20 else f"{nbytes / 2**20:.3g} MiB"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = report.get("sweep", [])
    gpu_tier = any(_gbps(s, n) is not None for s in report["sizes"] for n in ("hmg_gpu", "gpu_index_select"))
    panels = 1 + gpu_tier + bool(sweep)  # no empty panel for what a CPU machine does not measure
    fig, grid = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    axes = list(grid[0])
    ax_host = axes.pop(0)
    ax_gpu = axes.pop(0) if gpu_tier else None
    sizes = [s["row_bytes"] for s in report["sizes"]]
    labels = {**_LABELS, **_CPU_LABELS} if report["device"] == "cpu" else _LABELS
    for name in (*HOST_VARIANTS, "hmg_host_out", "cpu_index_select", "cpu_pinned", "pageable"):
        ys = [_gbps(s, name) for s in report["sizes"]]
        if any(y is not None for y in ys):
            ax_host.plot(sizes, ys, marker="o", label=labels[name])
    if report.get("h2d_limit_gbps"):
        ax_host.axhline(report["h2d_limit_gbps"], color="gray", ls="--", label="pinned H2D memcpy (limit)")
    if ax_gpu is not None:  # the GPU tier's panel
        for name in ("hmg_gpu", "gpu_index_select"):
            ys = [_gbps(s, name) for s in report["sizes"]]
            if any(y is not None for y in ys):
                ax_gpu.plot(sizes, ys, marker="o", label=_LABELS[name])
    if sweep:
        ax_sweep = axes.pop(0)
        for row_bytes in sorted({s["row_bytes"] for s in sweep}):
            points = [s for s in sweep if s["row_bytes"] == row_bytes]
            for name, style in (("hmg_host", "-"), ("hmg_owned", "--"), ("hmg_bf16", ":"), ("hmg_split", "-"),
                                ("cpu_pinned", "-.")):
                ys = [(s["table_bytes"] / 1e9, s["variants"][name].get("x_h2d_limit"))
                      for s in points if name in s["variants"]]
                if ys:
                    ax_sweep.plot(*zip(*ys), ls=style, marker="o", label=f"{row_bytes} B, {name}")
        ax_sweep.set_xscale("log")
        ax_sweep.set_xlabel("table size (GB)")
        ax_sweep.set_ylabel("x pinned H2D memcpy")
        ax_sweep.set_title("rate against table size")
        ax_sweep.grid(alpha=0.3)
        ax_sweep.legend(fontsize=7)
    for ax, title in ((ax_host, "rows from host memory"), (ax_gpu, "rows from GPU memory")):
        if ax is None:
            continue
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row size (bytes)")
        ax.set_ylabel("GB/s of gathered rows")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"hmgstore gather, {report['device']}, "
                 f"{report['sizes'][0]['batch'] if report['sizes'] else ''} random ids")
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
