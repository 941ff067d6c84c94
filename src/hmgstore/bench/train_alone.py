"""``bench train``'s ceilings, measured beside each configuration: the loader with no training (in the main
thread, through the pipeline, in the producer) and the step on batches made beforehand; and the profiles
``--profile`` writes (cProfile of the loader, the GPU's kernels of a batch and of a step)."""
from __future__ import annotations

import cProfile
import io
import itertools
import logging
import pstats
import time
from collections import defaultdict

import torch

from .train_setup import SAGE, train_step, trimmable

_NONE = object()  # PhaseTimer: the wrapped object had no attribute of its own by that name


class PhaseTimer:
    """Seconds per phase, the device synchronised at each boundary."""

    def __init__(self, device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds = defaultdict(float)
        self._wrapped: list = []

    def wrap(self, obj, name: str, phase: str) -> None:
        """Time ``obj.name`` as ``phase`` until :meth:`unwrap` (an instance attribute over the method)."""
        fn = getattr(obj, name)
        self._wrapped.append((obj, name, obj.__dict__.get(name, _NONE)))

        def timed(*args, **kwargs):
            self.sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.seconds[phase] += time.perf_counter() - start

        setattr(obj, name, timed)

    def unwrap(self) -> None:
        """Put back what :meth:`wrap` replaced, so a loader used again is timed once, not through two wrappers."""
        for obj, name, own in reversed(self._wrapped):
            if own is _NONE:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._wrapped.clear()


def _forever(iterable):
    """``iterable``'s batches, pass after pass (a small graph's epoch may be shorter than the timed batches)."""
    while True:
        yielded = False
        for item in iterable:
            yielded = True
            yield item
        if not yielded:
            raise RuntimeError("the loader yields no batch: use more training nodes or a smaller --batch-size")


def torch_calls(fn, reps: int = 5) -> float:
    """The torch functions and tensor methods ``fn()`` calls through Python, on average over ``reps`` calls
    (top-level calls only; attribute reads such as ``.shape`` not counted). Each is a point where torch may
    hand the GIL to another thread and wait to take it back: beside a training thread, a loader's count a
    batch is what its Python costs the step (``benchmarks/results/strong-step-h100.md``)."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") != "__get__":
                Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        for _ in range(reps):
            fn()
    return Count.calls / reps


def counted_calls(fn, what: str, reps: int = 5) -> float | None:
    """:func:`torch_calls`, or None with a warning where ``fn`` fails under the counting mode (a diagnostic
    column must not end the benchmark)."""
    try:
        return torch_calls(fn, reps)
    except Exception as err:  # noqa: BLE001 - reported, and the column left empty
        logging.getLogger(__name__).warning("could not count the %s's torch calls: %s", what, err)
        return None


def _rate(iterable, reps: int, sync, profile=None, warmup: int = 2) -> float:
    """Batches/s of ``iterable`` taken as fast as it makes them, after ``warmup`` batches (kernel
    compilation, the sampler's CUDA-graph capture); ``profile``: a path for a cProfile of the timed part.
    A producer's own rate too (its batches dropped at once, no training beside it)."""
    it = _forever(iterable)
    for _ in range(warmup):
        next(it)
    sync()
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(reps):
        next(it)  # each batch dropped at once
    sync()
    seconds = time.perf_counter() - start
    if profiler:
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        text.write(f"{reps} batches, {seconds:.3f} s\n")
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        profile.write_text(text.getvalue())
    it.close()
    return reps / seconds


def _profile_path(args, config: str, what: str = "loader"):
    if not getattr(args, "profile", False):
        return None
    from pathlib import Path

    Path(args.out).mkdir(parents=True, exist_ok=True)
    return Path(args.out) / f"profile-{what}-{config.replace('+', '-').replace('@', '-').replace('/', '-')}.txt"


def _gpu_profile(fn, path, reps: int = 10) -> None:
    """The GPU kernels (and CPU ops) of ``reps`` calls of ``fn``, by device time, into ``path``: where a
    batch's or a step's GPU time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    busy = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            table = events.table(sort_by=key, row_limit=30)
            break
        except (AttributeError, KeyError, ValueError):
            table = ""
    path.write_text(f"{reps} calls; {busy / reps / 1e3:.3f} ms a call summed over the rows below (user annotations "
                    "such as enumerate(DataLoader) carry their kernels' time again: read the kernel rows)\n" + table)


def _step_alone(loader, data, classes, device, args, reps: int, sync, profile=None,
                copy: bool = False) -> tuple[float, bool, float, float | None, list | None]:
    """The training step's own batches/s, over up to 8 batches made beforehand (its ceiling), whether its
    layers were trimmed, the seconds a step took to issue (its Python and launches: where this is
    close to the step's time, the step is bound by the CPU, not the GPU), its :func:`torch_calls` and,
    with ``args.timeline`` on a GPU, the GPU work of ``args.timeline`` steps
    (:func:`hmgstore.bench.timeline.profiled_intervals`). ``copy``: each batch is cloned as it is taken (a
    producer's batches are views into its ring, overwritten once the next is taken)."""
    batches = [b.clone() if copy else b.to(device) for b in itertools.islice(_forever(loader), min(reps, 8))]
    model = SAGE([data.x.shape[1], *[256] * (len(args.fanout) - 1), classes]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    for batch in batches[:2]:
        train_step(model, optimizer, batch, args.trim)
    sync()
    start = time.perf_counter()
    for i in range(reps):
        train_step(model, optimizer, batches[i % len(batches)], args.trim)
    issued = time.perf_counter() - start
    sync()
    rate = reps / (time.perf_counter() - start)
    trimmed = args.trim and trimmable(batches[0])
    steps = itertools.cycle(batches)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the timed run's draws kept
        calls = counted_calls(lambda: train_step(model, optimizer, next(steps), args.trim), "step", reps=2)
    if profile is not None and device.type == "cuda":
        _gpu_profile(lambda: train_step(model, optimizer, next(steps), args.trim), profile)
    work = None
    if getattr(args, "timeline", 0) and device.type == "cuda":
        from .timeline import profiled_intervals

        work = profiled_intervals(lambda: train_step(model, optimizer, next(steps), args.trim), args.timeline)
    del batches
    sync()
    return rate, trimmed, issued / reps, calls, work


def ceilings(loader, iterable, pipe: bool, data, classes, device, args, reps: int, sync, config: str) -> tuple:
    """The configuration's ceilings beside its timed run: the loader alone in the main thread (and as run,
    through its pipeline), the step alone on batches made beforehand, and the torch calls a batch of each.
    Returns ``(alone rates, trimmed, the step's issue seconds, torch calls, the step's GPU work)``."""
    alone = {"loader_main": _rate(loader, reps, sync, profile=_profile_path(args, config))}
    if pipe:
        alone["loader_pipe"] = _rate(iterable, reps, sync)
    alone["step"], trimmed, step_issue, step_calls, step_work = _step_alone(
        loader, data, classes, device, args, reps, sync, _profile_path(args, config, "step"))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the timed run's draws kept
        counted = _forever(loader)
        next(counted)  # the iterator's set-up is not a batch's
        calls = {"loader": counted_calls(lambda: next(counted), "loader"), "step": step_calls}  # this thread's
        counted.close()
    if pipe and device.type == "cuda" and args.profile:
        profiled = _forever(loader)
        _gpu_profile(lambda: next(profiled), _profile_path(args, config, "loader-gpu"))
    return alone, trimmed, step_issue, calls, step_work


def counted_stats(stores, sampler, loader, batches: int = 5) -> dict:
    """Hit ratios of the features and the topology over a few more batches (untimed), and the distinct 2 MiB
    host pages of the features' table that a batch's misses lie in. Counting is off again afterwards: a kept
    loader runs on uncounted (and with its sampler's CUDA graphs: counting samples eagerly)."""
    from ..graph.locality import pages_touched

    counters = [c for c in (stores[0] if stores else None, sampler) if c is not None]
    for c in counters:
        c.reset_stats()
    counting, pages, nodes = _forever(loader), [], 0
    for _ in range(batches):
        batch = next(counting)
        nodes += batch.num_nodes
        if stores is not None:
            table = stores[0].table(None, "x")
            ids = batch.n_id.cpu()
            ids = ids[~torch.isin(ids, table.placement.gpu_rows)]  # rows the GPU tier holds are not read there
            pages.append(pages_touched(ids, table.source[:1].nbytes, table.layout))
    counting.close()
    out: dict = {"nodes_per_batch": nodes / batches}
    if stores is not None:
        out["feature_stats"], out["pages_per_batch"] = stores[0].stats(), sum(pages) / len(pages)
    if sampler is not None:
        out["topology_stats"] = sampler.stats()
    for c in counters:
        c.reset_stats(counting=False)
    return out
