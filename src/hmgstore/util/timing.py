"""Timing GPU work: the median of repeated calls, and the PCIe limit of this run.

``median_seconds(fn, ...)`` calls ``fn(i)`` for warm-up and timed repeats
(``i`` lets the caller rotate inputs, so repeats do not hit a warm cache) and
returns the median. GPU-only work is timed with CUDA events on the current
stream; work that involves the host (``wall=True``) with ``perf_counter``
between device synchronisations. The benchmarks (:mod:`hmgstore.bench`) and
the library's calibrations (:mod:`hmgstore.table.host_pages`) share it.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

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
