"""The one timing harness of the benchmarks.

``median_seconds(fn, ...)`` calls ``fn(i)`` for warm-up and timed repeats
(``i`` lets the caller rotate inputs, so repeats do not hit a warm cache) and
returns the median. GPU-only work is timed with CUDA events on the current
stream; work that involves the host (``wall=True``) with ``perf_counter``
between device synchronisations.

``concurrent_seconds(work, streams, ...)`` times rounds in which several
GPUs of this process work at once (for ``python -m hmgstore.bench peer``):
each GPU's share is queued behind a start gate (:mod:`.gate`) so that all
start together, and each GPU's time is taken with CUDA events on its own
stream.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_seconds(fn: Callable[[int], object], *, reps: int = 20, warmup: int = 3, wall: bool = False,
                   device: torch.device | None = None) -> tuple[float, list[float]]:
    """Median time of ``fn(i)`` over ``reps`` timed calls, after ``warmup`` untimed ones.

    Returns ``(median, all_times)`` in seconds. ``device``: the CUDA device
    to time on, or None / a CPU device for a plain wall clock.
    """
    cuda = device is not None and device.type == "cuda"
    for i in range(warmup):
        fn(i)
    if cuda:
        torch.cuda.synchronize(device)
    times = []
    for i in range(warmup, warmup + reps):
        if cuda and not wall:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(i)
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def h2d_limit_gbps(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Pinned host-to-device ``cudaMemcpy`` rate in GB/s (10^9 B/s): the PCIe limit of this run."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.view(torch.int64).copy_(torch.arange(nbytes // 8))  # not zeros
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    median, _ = median_seconds(lambda i: dst.copy_(src, non_blocking=True), reps=reps, warmup=2, device=device)
    return nbytes / median / 1e9


class GateTimedOut(RuntimeError):
    """A start gate gave up before it was opened: the issue path waited for a GPU."""


def run_round(work, streams, i: int = 0, *, per_round: int = 1, gate=None) -> tuple[list[float], float]:
    """Run one round of ``work`` on every GPU at once; return ``(seconds per GPU, wall seconds)``.

    ``work[g](i, stream)`` queues GPU ``g``'s share of item ``i`` on
    ``streams[g]`` (current on its device during the call); whatever it
    queues on other streams must first wait for ``stream`` and be joined back
    into it, so that it starts after the gate and ends before the GPU's end
    event. A round is ``per_round`` consecutive items per GPU, from item
    ``i * per_round``. With a :class:`~hmgstore.bench.gate.StartGate`, every
    GPU's share is queued behind the gate and all start when it opens; the
    wall time runs from the opening (else from the first issue) until every
    GPU is synchronised. A GPU's time is measured by CUDA events on its own
    stream, from its start to the end of its share. Raises
    :class:`GateTimedOut` when the gate gave up (the round is then worthless).
    """
    for s in streams:
        torch.cuda.synchronize(s.device)
    if gate is not None:
        gate.close()
    events = []
    t0 = time.perf_counter()
    for fn, s in zip(work, streams):
        with torch.cuda.device(s.device), torch.cuda.stream(s):
            if gate is not None:
                gate.hold(s)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(s)
            for k in range(i * per_round, (i + 1) * per_round):
                fn(k, s)
            end.record(s)
        events.append((start, end))
    if gate is not None:
        t0 = time.perf_counter()
        gate.open()
    for s in streams:
        torch.cuda.synchronize(s.device)
    wall = time.perf_counter() - t0
    if gate is not None and gate.timed_out():
        raise GateTimedOut("the start gate gave up before it was opened: queueing the work waited for a GPU")
    return [start.elapsed_time(end) / 1e3 for start, end in events], wall


def concurrent_seconds(work, streams, *, per_round: int = 1, reps: int = 10, warmup: int = 3,
                       gate=None) -> dict:
    """Median times of rounds in which every GPU runs its share of ``work`` at the same time.

    ``work``, ``streams``, ``per_round``, ``gate``: as for :func:`run_round`.
    The first warm-up round runs without the gate (first-use allocations and
    compilation happen there, outside any held stream). Returns
    ``{"seconds": [median per GPU], "wall_seconds": median, "times": [[per GPU] per round],
    "wall_times": [...], "gated": bool}``; rounds rotate their items by ``i``.
    """
    for i in range(warmup):
        run_round(work, streams, i, per_round=per_round, gate=gate if i else None)
    times, walls = [], []
    for i in range(warmup, warmup + reps):
        per_gpu, wall = run_round(work, streams, i, per_round=per_round, gate=gate)
        times.append(per_gpu)
        walls.append(wall)
    return {"seconds": [statistics.median(t[g] for t in times) for g in range(len(streams))],
            "wall_seconds": statistics.median(walls), "times": times, "wall_times": walls,
            "gated": gate is not None}
