"""The one timing harness of the benchmarks.

``median_seconds(fn, ...)`` and ``h2d_limit_gbps`` live in :mod:`hmgstore.util.timing`
(the library's own calibrations time with them too) and are re-exported here.

``concurrent_seconds(work, streams, ...)`` times rounds in which several
GPUs of this process work at once (for ``python -m hmgstore.bench peer``):
each GPU's share is queued behind a start gate (:mod:`.gate`) so that all
start together, and each GPU's time is taken with CUDA events on its own
stream.
"""
from __future__ import annotations

import gc
import statistics
import time

import torch

from ..util.timing import h2d_limit_gbps, median_seconds  # noqa: F401  (the benchmarks' harness)


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


class CollectorPauses:
    """Python's garbage collections in this process while the block runs (``gc.callbacks``): how many, and the
    seconds they held the interpreter, by generation. Each holds the GIL, so a collection in any thread (the
    pipeline's too) stalls the training thread's issue for as long; a full one walks every tracked object."""

    def __init__(self):
        self.reset()
        self._started = 0.0

    def reset(self) -> None:
        """Count from now (the warm-up's collections left out)."""
        self.counts, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0]

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            generation = min(int(info.get("generation", 0)), 2)
            self.counts[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._started

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._note)

    def per_batch(self, batches: int) -> dict:
        """``{"collections": [gen0, gen1, gen2], "ms_per_batch": the pauses' milliseconds / batches, "full_ms": the
        full collections' milliseconds}``."""
        return {"collections": list(self.counts), "ms_per_batch": 1e3 * sum(self.seconds) / max(1, batches),
                "full_ms": 1e3 * self.seconds[2]}
