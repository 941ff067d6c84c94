"""``bench train``'s timed run of one configuration: its batches, each with the wait for (or the making of) the
batch and the step's issue, and, with ``--timeline``, where the GPU's time went after them."""
from __future__ import annotations

import time

import torch

from .timing import CollectorPauses
from .train_alone import PhaseTimer, _forever
from .train_setup import SAGE, train_step, trimmable


def timed(iterable, loader, pipe: bool, data, classes, device, args, reps: int, sync, trimmed, step_work) -> dict:
    """Train ``reps`` batches after 3 of warm-up; per batch: seconds, the wait for (or making of) the batch and
    the step's issue, and the phases when not pipelined. Also the GPU timeline (``--timeline``), after them."""
    model = SAGE([data.x.shape[1], *[256] * (len(args.fanout) - 1), classes]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    timer = PhaseTimer(device)
    if not pipe:
        timer.wrap(loader, "filter_fn", "gather")
    warmup, load_s, train_s = 3, 0.0, 0.0
    it = _forever(iterable)
    with CollectorPauses() as pauses:
        for step in range(warmup + reps):
            if step == warmup:
                sync()
                start = time.perf_counter()
                timer.seconds.clear()
                pauses.reset()
                load_s = train_s = 0.0
            t0 = time.perf_counter()
            batch = next(it)
            if not pipe:
                batch = batch.to(device, non_blocking=True)
                sync()
            t1 = time.perf_counter()
            if step == 0:
                trimmed = args.trim and trimmable(batch)
            loss = train_step(model, optimizer, batch, args.trim)
            if not pipe:
                sync()
            load_s += t1 - t0
            train_s += time.perf_counter() - t1
        sync()
        seconds = (time.perf_counter() - start) / reps
    timer.unwrap()
    out = {"seconds": seconds, "loss": loss.detach().item(), "trimmed": trimmed, "gpu_time": None,
           "split_s": {"wait": load_s / reps, "train_issue": train_s / reps}, "gc": pauses.per_batch(reps)}
    if not pipe:
        gather = timer.seconds["gather"] / reps
        out["split_s"] = {"sampling": load_s / reps - gather, "gather": gather, "train": train_s / reps}
    if getattr(args, "timeline", 0) and pipe and step_work is not None:  # after the timed batches: it slows them
        from .timeline import per_batch, profiled_intervals

        def trained():
            train_step(model, optimizer, next(it), args.trim)

        out["gpu_time"] = per_batch(step_work, args.timeline, profiled_intervals(trained, args.timeline), args.timeline)
    del batch  # a producer's batches are views into its ring: released before it is closed
    it.close()
    return out
