"""Figures, ratios, table and plot of ``python -m hmgstore.bench peer`` (saved by :func:`.report.write_report`).

Every figure is GB/s (10^9 B/s) of rows delivered into one GPU: the bytes
of the rows each GPU received in a round over that GPU's own time (CUDA
events on its stream, from the common start to the end of its share).
"mean" and "min" are over the GPUs of the run.
"""
from __future__ import annotations

from pathlib import Path

from .report import ratio_text, smoke_test_lines

_LABELS = {
    "hmg_remote": "hmgstore, every row on a peer",
    "hmg_mixed": "hmgstore, uniform ids (1/k local)",
    "hmg_alone": "hmgstore, every row on a peer, GPU 0 alone",
    "index_select_copy": "index_select on the owner + peer copy",
}


def summarize(bytes_per_gpu: int, timing: dict) -> dict:
    """One variant's figures from :func:`.timing.concurrent_seconds`'s result.

    ``bytes_per_gpu``: bytes each GPU receives in one round. Adds per-GPU
    GB/s (``gbps``), their mean and minimum, and the wall-clock figure
    (bytes per GPU over the wall time of the whole round).
    """
    gbps = [bytes_per_gpu / s / 1e9 for s in timing["seconds"]]
    return {**timing, "bytes_per_gpu": bytes_per_gpu, "gbps": gbps, "gbps_mean": sum(gbps) / len(gbps),
            "gbps_min": min(gbps), "gbps_wall": bytes_per_gpu / timing["wall_seconds"] / 1e9}


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _mean(size: dict, name: str):
    v = size["variants"].get(name)
    return None if v is None else v["gbps_mean"]


def add_ratios(report: dict) -> None:
    """Ratios of the hmgstore remote gather to the baselines of the same run, per row size."""
    memcpy = (report.get("peer_memcpy") or {}).get("start")
    limit = memcpy["gbps_mean"] if memcpy else None
    for size in report["sizes"]:
        remote = _mean(size, "hmg_remote")
        size["remote_x_memcpy"] = _ratio(remote, limit)
        size["remote_x_index_select_copy"] = _ratio(remote, _mean(size, "index_select_copy"))
        size["remote_x_alone"] = _ratio(remote, _mean(size, "hmg_alone"))
        size["mixed_x_memcpy"] = _ratio(_mean(size, "hmg_mixed"), limit)
        size["remote_less_ids_gbps"] = _less_ids(size["variants"])
        size["remote_less_ids_x_memcpy"] = _ratio(size["remote_less_ids_gbps"], limit)
        size["remote_gpu_ids_x_memcpy"] = _ratio(_mean(size, "hmg_remote_gpu_ids"), limit)


def _less_ids(variants: dict):
    """Mean over GPUs of the remote gather's GB/s with the ids' host-to-device copy taken out of its time.

    The copy runs on the gather's stream before each kernel, so the two
    times add up; an estimate of what the gather delivers once its ids are
    already on the GPU (today that costs a range-check read-back instead).
    """
    remote, ids = variants.get("hmg_remote"), variants.get("ids_copy")
    if remote is None or ids is None:
        return None
    rates = [remote["bytes_per_gpu"] / (t - i) / 1e9 for t, i in zip(remote["seconds"], ids["seconds"]) if t > i]
    return sum(rates) / len(rates) if rates else None


def _fmt(value, spec=".1f"):
    return "-" if value is None else format(value, spec)


def _mean_min(v: dict | None) -> str:
    return "-" if v is None else f"{v['gbps_mean']:.1f} ({v['gbps_min']:.1f})"


def table_text(report: dict) -> str:
    """The peer report as a markdown table (GB/s per GPU and ratios)."""
    memcpy = report.get("peer_memcpy") or {}
    start, end = memcpy.get("start"), memcpy.get("end")
    names = report.get("device_names") or []
    devices = f"{report['num_gpus']} x {names[0]}" if names and len(set(names)) == 1 else ", ".join(names)
    lines = [f"devices: {devices}   date: {report['date']}   start: {report.get('start_mode', '-')}",
             f"peer memcpy (GPU i <- GPU i+1, all at once, {_size(memcpy.get('bytes'))} each): "
             f"{_mean_min(start)} GB/s per GPU, mean (min); end of run: {_mean_min(end)}"]
    missing = [f"{i}->{j}" for i, j, ok in report.get("peer_access", []) if not ok]
    lines += smoke_test_lines(report)
    if missing:
        lines.append(f"NO PEER ACCESS for {', '.join(missing)}: those rows were read from host memory")
    lines += ["",
              "| row B | batch | hmg remote GB/s mean (min) | x peer memcpy | x index_select+copy | x alone "
              "| less ids H2D: GB/s (x memcpy) | ids on the GPU: GB/s mean (min) | x peer memcpy "
              "| hmg mixed GB/s mean (min) | hmg alone GB/s | index_select+copy GB/s mean (min) | ids H2D us |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in report["sizes"]:
        v = s["variants"]
        ids = v.get("ids_copy")
        ids_us = None if ids is None else max(ids["seconds"]) / s["batches_per_round"] * 1e6
        lines.append(
            f"| {s['row_bytes']} | {s['batch']} | {_mean_min(v.get('hmg_remote'))} "
            f"| {ratio_text(report, s.get('remote_x_memcpy'))} "
            f"| {ratio_text(report, s.get('remote_x_index_select_copy'))} "
            f"| {ratio_text(report, s.get('remote_x_alone'))} "
            f"| {_fmt(s.get('remote_less_ids_gbps'))} ({ratio_text(report, s.get('remote_less_ids_x_memcpy'))}) "
            f"| {_mean_min(v.get('hmg_remote_gpu_ids'))} | {ratio_text(report, s.get('remote_gpu_ids_x_memcpy'))} "
            f"| {_mean_min(v.get('hmg_mixed'))} "
            f"| {_fmt(_mean(s, 'hmg_alone'))} | {_mean_min(v.get('index_select_copy'))} | {_fmt(ids_us, '.0f')} |")
    lines += ["",
              "GB/s: bytes of rows delivered into a GPU per second of that GPU's own time, all GPUs starting "
              "together; mean (min) over GPUs. remote: distinct random ids all owned by other GPUs; mixed: "
              "distinct uniform ids over the whole table; alone: GPU 0's remote batch while the others idle; "
              "index_select+copy: the owners index_select the same rows (grouped by owner) and copy them over; "
              "ids on the GPU: the remote batch with its ids already on the requesting GPU, checked by the "
              "kernel (no copy, no read-back). "
              "The other hmgstore figures include copying the ids from pinned host memory (ids H2D: that copy alone, "
              "per batch, slowest GPU; less ids H2D: the remote figure with that copy's time taken out, an "
              "estimate from two separate medians, noisy where the copy is a large share: 128 B rows)."]
    return "\n".join(lines)


def _size(nbytes) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.{1 if unit == 'GiB' else 0}f} {unit}"
    return f"{nbytes} B"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    sizes = [s["row_bytes"] for s in report["sizes"]]
    for name, label in _LABELS.items():
        found = [(rb, s["variants"][name]) for rb, s in zip(sizes, report["sizes"]) if name in s["variants"]]
        if not found:
            continue
        xs = [rb for rb, _ in found]
        line, = ax.plot(xs, [v["gbps_mean"] for _, v in found], marker="o", label=label)
        if name != "hmg_alone":
            ax.fill_between(xs, [v["gbps_min"] for _, v in found], [max(v["gbps"]) for _, v in found],
                            color=line.get_color(), alpha=0.15)
    start = (report.get("peer_memcpy") or {}).get("start")
    if start:
        ax.axhline(start["gbps_mean"], color="gray", ls="--", label="peer memcpy, all GPUs at once")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("row size (bytes)")
    ax.set_ylabel("GB/s delivered per GPU (band: min-max over GPUs)")
    ax.set_title(f"hmgstore peer gathers, {report['num_gpus']} GPUs gathering at once")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
