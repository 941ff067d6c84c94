"""Each GPU's share of a round of ``python -m hmgstore.bench peer``, and the Runner that checks and times them.

A work function ``fn(k, stream)`` queues item k of its GPU on ``stream``
(the GPU's main stream, current while it runs; None on the CPU). Work on
other streams first waits for ``stream`` (so that it starts after the start
gate) and is joined back into it (so that it ends before the GPU's end
event). The same functions run serially on the CPU, each "GPU" a CPU
device, which is how the tests exercise them.
"""
from __future__ import annotations

import contextlib
import logging
import time

import torch

from .gate import StartGate
from .peer_report import summarize
from .timing import GateTimedOut, concurrent_seconds, run_round

log = logging.getLogger(__name__)

WARMUP = 3


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _after(waiter, stream) -> None:
    if waiter is not None and stream is not None:
        waiter.wait_stream(stream)


def gather_work(views, outs, ids) -> list:
    """GPU g: ``views[g].gather(ids[g][k % sets], out=outs[g])`` on its stream."""
    def make(g):
        def fn(k, stream):
            views[g].gather(ids[g][k % len(ids[g])], out=outs[g], stream=stream)
        return fn
    return [make(g) for g in range(len(views))]


def copy_work(dsts, srcs, stream_for) -> list:
    """GPU g: ``dsts[g].copy_(srcs[g])`` (``srcs[g]`` on another GPU).

    torch runs a copy between GPUs on the *source* GPU's current stream,
    with a two-way barrier to the destination's current stream; on shared
    streams those barriers would chain every GPU's copy behind the previous
    one, so each copy gets its own stream on the source GPU.
    """
    def make(g):
        side = stream_for(("copy", g), srcs[g].device)

        def fn(k, stream):
            _after(side, stream)
            with _on(side):
                dsts[g].copy_(srcs[g], non_blocking=True)
        return fn
    return [make(g) for g in range(len(dsts))]


def ids_copy_work(scratch, ids) -> list:
    """GPU g: copy the host ids of item k into ``scratch[g]``: the part of a hmgstore gather that is not the kernel."""
    def make(g):
        def fn(k, stream):
            scratch[g].copy_(ids[g][k % len(ids[g])], non_blocking=True)
        return fn
    return [make(g) for g in range(len(scratch))]


def index_select_copy_work(shards, segments, outs, stream_for) -> list:
    """GPU g: for each owner j of item k's rows, ``index_select`` on ``shards[j]`` then a copy into ``outs[g]``.

    ``segments[g][set]``: ``[(owner j, slots on j's device, start, end)]``,
    from :meth:`RemoteBatch.grouped`. Each (requester, owner) pair has its own
    stream on the owner (index_select, then the copy, which torch runs on the
    source's stream) and one on the requester (the copy's other barrier end),
    so that the owners of one requester, and the requesters of one owner, all
    work at once.
    """
    def make(g):
        owners = sorted({seg[0] for sets in segments[g] for seg in sets})
        rows = {j: max(end - start for sets in segments[g] for o, _, start, end in sets if o == j) for j in owners}
        staging = {j: torch.empty((rows[j], *shards[j].shape[1:]), dtype=shards[j].dtype, device=shards[j].device)
                   for j in owners}
        sides = {j: (stream_for(("owner", g, j), shards[j].device), stream_for(("requester", g, j), outs[g].device))
                 for j in owners}

        def fn(k, stream):
            for j, slots, start, end in segments[g][k % len(segments[g])]:
                at_owner, at_requester = sides[j]
                _after(at_owner, stream)
                buf = staging[j][: end - start]
                with _on(at_owner):
                    torch.index_select(shards[j], 0, slots, out=buf)
                with _on(at_requester), _on(at_owner):
                    outs[g][start:end].copy_(buf, non_blocking=True)
                _after(stream, at_requester)
        return fn
    return [make(g) for g in range(len(outs))]


class Runner:
    """The GPUs of the run, a main stream on each, the start gate, and the repeat counts.

    ``devices`` all ``cpu`` (any number of them, standing for GPUs) gives a
    CPU dry run: work runs serially and is timed by the wall clock; the
    checks are the same.
    """

    def __init__(self, devices, reps: int, warmup: int = WARMUP, use_gate: bool = True):
        self.devices = [torch.device(d) for d in devices]
        self.reps, self.warmup = reps, warmup
        self.cuda = self.devices[0].type == "cuda"
        self._streams: dict = {}
        self.streams = [self.stream_for(("main", g), d) for g, d in enumerate(self.devices)]
        self.gate, self.start_mode = None, "each GPU's work queued in turn (--no-gate)"
        if not self.cuda:
            self.start_mode = "CPU dry run, serial"
        elif use_gate:
            try:
                gate = StartGate(self.devices)
                gate.prepare()
                self.gate, self.start_mode = gate, "start gate"
            except Exception as err:  # noqa: BLE001 - any failure of the gate leaves the plain start
                log.warning("start gate unavailable (%s); queueing each GPU's work in turn", err)
                self.start_mode = f"each GPU's work queued in turn (gate unavailable: {err})"

    def stream_for(self, key, device):
        """A stream of its own for ``key`` on ``device`` (the same one on every call); None on the CPU.

        torch hands out streams from a pool of 32 per device in turn; this
        checks that no two keys got the same stream (which would serialise
        work meant to overlap).
        """
        device = torch.device(device)
        if device.type != "cuda":
            return None
        if key not in self._streams:
            s = torch.cuda.Stream(device)
            if any(t.cuda_stream == s.cuda_stream for t in self._streams.values()):
                raise RuntimeError(f"torch's stream pool on {device} ran out of distinct streams")
            self._streams[key] = s
        return self._streams[key]

    def _run_item(self, work, item: int) -> None:
        if self.cuda:
            run_round(work, self.streams[: len(work)], item)
        else:
            for fn in work:
                fn(item, None)

    def check(self, work, outs, expected, name: str, items: int = 1) -> None:
        """For each item ``i < items``: poison ``outs`` (0xFF bytes), run item i on every GPU at once,
        and compare each ``outs[g]`` with ``expected(i)[g]`` bit for bit (``expected``: a callable,
        or the list for item 0). AssertionError naming the variant, item and GPU otherwise."""
        for i in range(items):
            for out in outs:
                out.view(torch.uint8).fill_(0xFF)
            self._run_item(work, i)
            for g, (out, exp) in enumerate(zip(outs, expected(i) if callable(expected) else expected)):
                got = out if out.device == exp.device else out.to(exp.device)
                if got.shape != exp.shape or not torch.equal(got.view(torch.uint8), exp.view(torch.uint8)):
                    raise AssertionError(f"{name}: GPU {g} ({self.devices[g]}) received wrong bytes for item {i}; "
                                         "the benchmark refuses to time a wrong result")

    def measure(self, work, per_round: int, bytes_per_gpu: int) -> dict:
        """:func:`.peer_report.summarize` of ``work`` run by the GPUs ``0..len(work)-1`` at once."""
        streams = self.streams[: len(work)]
        if not self.cuda:
            return summarize(bytes_per_gpu, self._serial_seconds(work, per_round))
        try:
            timing = concurrent_seconds(work, streams, per_round=per_round, reps=self.reps, warmup=self.warmup,
                                        gate=self.gate)
        except GateTimedOut as err:
            log.warning("%s; timing the rest of the run without the gate", err)
            self.gate, self.start_mode = None, "each GPU's work queued in turn (the start gate timed out)"
            timing = concurrent_seconds(work, streams, per_round=per_round, reps=self.reps, warmup=self.warmup)
        return summarize(bytes_per_gpu, timing)

    def _serial_seconds(self, work, per_round: int) -> dict:
        times = []
        for i in range(self.warmup + self.reps):
            t0 = time.perf_counter()
            for fn in work:
                for k in range(i * per_round, (i + 1) * per_round):
                    fn(k, None)
            times.append(time.perf_counter() - t0)
        times = sorted(times[self.warmup:])
        med = times[len(times) // 2]
        return {"seconds": [med] * len(work), "wall_seconds": med, "times": [[t] * len(work) for t in times],
                "wall_times": times, "gated": False}
