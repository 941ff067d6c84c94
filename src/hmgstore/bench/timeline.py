"""``bench train --timeline``: where the GPU's time goes while a pipelined configuration trains.

A few batches of the epoch run under torch's profiler (GPU activity only: kernels, copies and fills, each with
its stream). Each is put on one side: the training step's streams (found from a profile of the step alone, in
the same process) or the loader's (every other stream: the pipeline's sampling, gathers, copies). Per batch:

- ``step_ms``: the step's kernels' summed time, beside ``step_alone_ms``, the same step's with no loader.
  Grown beside the loader, the step shares SMs or memory with it;
- ``loader_ms``: the loader's kernels' and copies' summed time;
- ``overlap_ms``: the time both sides ran at once;
- ``busy_ms`` and ``idle_ms``: the GPU's time with any work, and with none, over the window;
- ``loader_kernels``: the loader's milliseconds a batch by kernel (or copy) name, the largest first, and
  ``step_grown``: the step's kernels whose time grew most beside the loader, ``[alone, beside]`` milliseconds:
  which of the loader's work to cut, and which of the step's it slows.

Read: ``wall = busy + idle``, and ``busy <= step + loader - overlap`` (equal where no two streams of one side
run at once; the loader's streams often do), so a GPU-bound epoch (idle near 0) gains only by more overlap or
fewer kernel milliseconds; idle time belongs to the CPU (the training thread's issue, the loader's Python and
read-backs).
"""
from __future__ import annotations

import json
import os
import tempfile

#: The trace's categories of GPU work (torch's Kineto chrome trace).
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


#: How many kernel names ``loader_kernels`` and ``step_grown`` list.
TOP_KERNELS = 12


def short_name(name: str) -> str:
    """A kernel's name without its return type and its argument list (a demangled name can run to kilobytes); the
    namespaces and template arguments stay, "(anonymous namespace)" among them: they tell torch's kernels apart."""
    name = name.removeprefix("void ").strip()
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):  # the "(" that opens the trailing argument list
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i].strip() or name
    return name


def gpu_intervals(trace: dict) -> list[tuple[int, float, float, str]]:
    """``(stream, start_us, end_us, name)`` of each piece of GPU work in a chrome trace (``export_chrome_trace``),
    ``name`` as :func:`short_name` gives it."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and "stream" in e.get("args", {}):
            start, name = float(e["ts"]), e.get("name", "")  # a copy's name says its kind: kept whole
            name = short_name(name) if e.get("cat") == "kernel" else name
            out.append((int(e["args"]["stream"]), start, start + float(e.get("dur", 0.0)), name))
    return out


def by_name(intervals, reps: int) -> dict[str, float]:
    """Milliseconds a batch (of ``reps``) by name, the largest first."""
    totals: dict[str, float] = {}
    for _, start, end, name in intervals:
        totals[name] = totals.get(name, 0.0) + (end - start) / reps / 1e3
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def grown(alone: dict[str, float], beside: dict[str, float]) -> dict[str, list[float]]:
    """``[alone, beside]`` of the :data:`TOP_KERNELS` names whose time grew most from ``alone`` to ``beside``
    (those that grew only)."""
    names = sorted((n for n in beside if beside[n] > alone.get(n, 0.0)), key=lambda n: alone.get(n, 0.0) - beside[n])
    names = names[:TOP_KERNELS]
    return {n: [alone.get(n, 0.0), beside[n]] for n in names}


def union(intervals) -> list[tuple[float, float]]:
    """``intervals`` (``(start, end)`` pairs) merged where they overlap or touch, in order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def intersection(a, b) -> float:
    """The time two merged, ordered interval lists (:func:`union`'s) share."""
    i = j = 0
    shared = 0.0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def split_by_stream(intervals, step_streams) -> dict:
    """The metrics of this module's docstring, in microseconds over the whole window (not yet per batch), for
    GPU work ``intervals`` (:func:`gpu_intervals`) whose streams in ``step_streams`` are the step's."""
    if not intervals:
        return {"wall": 0.0, "step": 0.0, "loader": 0.0, "overlap": 0.0, "busy": 0.0, "idle": 0.0}
    step = [(s, e) for stream, s, e, *_ in intervals if stream in step_streams]
    loader = [(s, e) for stream, s, e, *_ in intervals if stream not in step_streams]
    wall = max(e for _, _, e, *_ in intervals) - min(s for _, s, *_ in intervals)
    busy = length(union([(s, e) for _, s, e, *_ in intervals]))
    return {"wall": wall, "step": sum(e - s for s, e in step), "loader": sum(e - s for s, e in loader),
            "overlap": intersection(union(step), union(loader)), "busy": busy, "idle": wall - busy}


def profiled_intervals(fn, reps: int) -> list[tuple[int, float, float, str]]:
    """:func:`gpu_intervals` of ``reps`` calls of ``fn`` (the GPU synchronised before and after)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return gpu_intervals(json.load(f))
    finally:
        os.unlink(path)


def per_batch(alone, alone_reps: int, epoch, reps: int) -> dict:
    """Per-batch milliseconds (this module's docstring) of ``epoch``, the GPU work of ``reps`` batches taken
    from the pipeline and trained on, with the step's streams and ``step_alone_ms`` from ``alone``, that of
    ``alone_reps`` steps on batches made beforehand (both :func:`profiled_intervals`). ``step_streams`` is
    empty where the step alone ran no GPU work: then every stream counts as the loader's."""
    streams = sorted({stream for stream, *_ in alone})
    out = {f"{k}_ms": v / reps / 1e3 for k, v in split_by_stream(epoch, set(streams)).items()}
    out["step_alone_ms"] = sum(e - s for _, s, e, *_ in alone) / alone_reps / 1e3
    out["step_streams"] = streams
    out["batches"] = reps
    loader = by_name([w for w in epoch if w[0] not in streams], reps)
    out["loader_kernels"] = dict(list(loader.items())[:TOP_KERNELS])
    out["step_grown"] = grown(by_name(alone, alone_reps), by_name([w for w in epoch if w[0] in streams], reps))
    return out
