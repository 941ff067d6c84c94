"""The split gather: part of a batch's host rows read by the CPU while the kernel reads the rest.

Why. The zero-copy kernel's rate over a host table falls with the table's
size (:mod:`hmgstore.table.host_pages`), while the CPU's own gather into pinned
staging, followed by one copy over the copy engine, holds its rate at any
size. The two use different
resources (the GPU's reach over scattered host pages; the CPU's memory
system and the copy engine), so a batch finishes soonest when each path gets
the share of rows it can read in the same time::

    share_cpu = rate_cpu / (rate_cpu + rate_kernel)      (rows per second, measured)

How a split gather runs (``HybridTensor(..., split=...)``, CPU ids only):

1. The kernel is launched first, for every id except the CPU's share (the
   first ``share`` of the batch's host-tier ids), exactly as an unsplit
   gather would read them.
2. While it runs, one background thread reads the CPU's rows into pinned
   staging with ``torch.index_select`` (torch's intra-op threads, in two
   chunks), and the main thread copies each chunk to the GPU on a copy
   stream as soon as it is read.
3. The current stream then scatters the rows into the output (widening
   half-width rows); with no GPU tier the CPU's rows are the output's first
   rows and land there directly.

Threads. The CPU reads use torch's intra-op pool: ``split_threads`` of a
table caps them in the reader thread, else ``torch.set_num_threads`` does.
A few threads read about as fast as many. An ``"auto"`` split also reads
``/proc/stat`` (:class:`CpuLoad`): when other processes leave fewer idle cores
than this process's main thread plus torch's threads, the batch is read by
the kernel alone, so that CPU sampler workers keep their cores
(``benchmarks/results/split-loop-h100.md``). Reads from a pool of Python threads
(``numpy.take``) lost: each chunk waits for the GIL that the thread queueing
the kernel holds (``benchmarks/probes/probe_split.py --variance``).

The output is bit-identical to an unsplit gather; only the time differs.

Finishing later: inside :func:`~hmgstore.gather.finish_scope.deferred_finishes`
the reader thread does step 3 itself on the copy stream (:func:`finish_later`).

The cost model. ``split="auto"`` measures both paths on the table at the
first batch of each size class (a power of two of ids: the kernel's rate per
row depends on how many rows it reads) and caches the share in
``$HMGSTORE_CACHE_DIR/split.json`` (default ``~/.cache/hmgstore``), keyed by
the GPU, the CPU count, the host table's size class, the stored row, torch's
thread count and the batch class. The two paths' rates alone predict the
share at which both finish together, but neither rate holds at every share
(the kernel reads more rows per page when it gets more of them; both pay
fixed costs per batch), so the probe batch is also timed at shares around
it and the fastest is kept: 0, the split off, where splitting does not pay.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cuda.runtime import synchronize
from ..rows import checks
from ..util.cpu_load import CpuLoad, cpu_load  # noqa: F401  (CpuLoad: part of this module's story)
from . import finish_scope

log = logging.getLogger(__name__)

#: Shares tried around the predicted one (as factors of it) when measuring.
AROUND = (0.75, 1.0, 1.25, 1.5, 2.0)
#: Batches with fewer host-tier ids than this are read by the kernel alone (a thread hand-off costs ~50 us).
MIN_IDS = 4096


def cache_path() -> Path:
    """Where measured shares are kept: ``$HMGSTORE_CACHE_DIR/split.json``, default ``~/.cache/hmgstore``."""
    root = os.environ.get("HMGSTORE_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                        Path.home() / ".cache") / "hmgstore"
    return Path(root) / "split.json"


@dataclass(frozen=True)
class Model:
    """A measured cost model of one kind of table: each path's rate alone, and the best share found. ``seconds``:
    the time of one probe batch at each share tried (0: the kernel alone, 1: the CPU alone); ``share``: the fastest."""

    kernel_rows_per_s: float
    cpu_rows_per_s: float
    seconds: dict
    key: str

    @property
    def share(self) -> float:
        return float(min(self.seconds, key=lambda s: (self.seconds[s], s)))

    @property
    def predicted(self) -> float:
        """The share at which both paths would finish together if each one's rate held at any share."""
        return self.cpu_rows_per_s / (self.cpu_rows_per_s + self.kernel_rows_per_s)


def batch_class(n: int) -> int:
    """The power of two at or above ``n``: batches of one class share a measurement."""
    return 1 << max(0, (n - 1).bit_length())


def cache_key(table, batch: int) -> str:
    """What a measurement depends on: machine, host table size class, stored row, torch's threads, batch class."""
    size_class = batch_class(table.host_tier.nbytes)
    name = torch.cuda.get_device_name(table.device)
    stored_row = table.host_tier[:1].numel() * table.host_tier.element_size()
    threads = getattr(table.split_setting, "threads", None) or torch.get_num_threads()  # the reads' own count
    return (f"{name}|cpus={os.cpu_count()}|table<={size_class >> 20}MiB|row={stored_row}B|"
            f"{table.host_format.name if table.host_format else str(table.dtype).removeprefix('torch.')}|"
            f"threads={threads}|batch<={batch_class(batch)}")


_cache_lock = threading.Lock()


def _read_cache() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, model: Model) -> None:
    path = cache_path()
    with _cache_lock:
        entries = _read_cache()
        entries[key] = {"kernel_rows_per_s": model.kernel_rows_per_s, "cpu_rows_per_s": model.cpu_rows_per_s,
                        "seconds": {str(s): t for s, t in model.seconds.items()}, "share": model.share,
                        "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
            tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
        except OSError as err:
            log.warning("hmgstore: could not cache the split gather's measurement in %s (%s); it will be "
                        "measured again next time", path, err)


def model_for(table, batch: int, run) -> Model:
    """The table's cost model for batches of ``batch`` ids' class: from the cache, else measured on the table
    now with ``run`` (see :func:`measure`) and cached."""
    key = cache_key(table, batch)
    entry: Any = _read_cache().get(key)  # whatever the file holds: a missing or stale entry raises below
    try:
        return Model(entry["kernel_rows_per_s"], entry["cpu_rows_per_s"],
                     {float(s): float(t) for s, t in entry["seconds"].items()}, key)
    except (KeyError, TypeError, ValueError, AttributeError):
        pass  # none cached, or an entry from another version: measure
    model = measure(table, batch_class(batch), key, run)
    _write_cache(key, model)
    log.info("hmgstore: split gather measured for %s: kernel %.3g rows/s, CPU %.3g rows/s; CPU share %.2f "
             "(predicted %.2f)", key, model.kernel_rows_per_s, model.cpu_rows_per_s, model.share, model.predicted)
    return model


def measure(table, batch: int, key: str, run, repeats: int = 3) -> Model:
    """Time a probe batch of ``batch`` random host-tier ids on ``table``: each path alone, then shares around
    the one their rates predict; best of ``repeats`` each. ``run(table, ids, out, share)`` gathers CPU ids
    with the CPU reading ``share`` of the host rows (:func:`hmgstore.gather.plan.gather_with_share`)."""
    host_rows = host_rows_of(table.placement)
    n = min(batch, len(host_rows))
    ids = host_rows[torch.randint(len(host_rows), (n,), generator=torch.Generator().manual_seed(0))]
    out = torch.empty((n, *table.row_shape), dtype=table.dtype, device=table.device)

    def seconds(share: float) -> float:
        best = float("inf")
        for _ in range(repeats + 1):  # the first run warms up (kernel build, page tables, staging)
            torch.cuda.synchronize(table.device)
            start = time.perf_counter()
            with finish_scope.inline():  # even in a pipeline's thread: the timing must include the reads
                run(table, ids, out, share)
            torch.cuda.synchronize(table.device)
            best = min(best, time.perf_counter() - start)
        return best

    times = {0.0: seconds(0.0), 1.0: seconds(1.0)}
    predicted = times[0.0] / (times[0.0] + times[1.0])  # rows/s of the CPU over the sum of both
    for factor in AROUND:
        share = round(min(1.0, predicted * factor), 3)
        if share not in times:
            times[share] = seconds(share)
    return Model(n / times[0.0], n / times[1.0], times, key)


class Setting:
    """A table's split: the CPU's fixed share of host-tier rows, or ``"auto"`` and the shares measured so far.

    ``run``: how the table gathers at a given share (for measuring, see
    :func:`measure`); ``threads``: torch's intra-op threads for the reads
    (None: torch's count). Raises ValueError for values other than
    ``"auto"`` and shares in ``[0, 1]``, or a count under 1.
    """

    def __init__(self, value, run, threads: int | None = None):
        self.value = checks.setting(value, "split must be None, 'auto' or a share in [0, 1]", at_least=0.0,
                                    at_most=1.0, words=("auto",), real_number=True)
        self.threads = None if threads is None else checks.setting(threads, "the split's threads must be None or "
                                                                            "a count >= 1")
        self.run = run
        self.shares: dict[int, float] = {}  # "auto": the measured share by batch size class
        self.skipped = 0  # "auto": batches read by the kernel alone because the CPUs were busy
        self._on_host: torch.Tensor | None = None

    def share(self, table, batch: int) -> float:
        """The CPU's share for a batch of ``batch`` ids: fixed, or the cost model's for its size class (0 while
        other processes leave too few idle cores, see :class:`hmgstore.util.cpu_load.CpuLoad`)."""
        if self.value != "auto":
            return self.value
        size = batch_class(batch)
        if size not in self.shares:
            self.shares[size] = model_for(table, size, self.run).share
        share = self.shares[size]
        if share and not cpu_load.room_for(self.threads or torch.get_num_threads()):
            self.skipped += 1
            return 0.0
        return share

    def on_host(self, placement) -> torch.Tensor | None:
        """bool [num_rows] (CPU): rows read from the host tier; None when every row is."""
        if self._on_host is None and placement.resident_rows:
            self._on_host = host_mask(placement)
        return self._on_host


def host_mask(placement) -> torch.Tensor:
    """bool [num_rows] (CPU): rows of ``placement`` read from the host tier."""
    mask = torch.ones(placement.num_rows, dtype=torch.bool)
    for rows in placement.resident:
        mask[rows] = False
    return mask


def host_rows_of(placement) -> torch.Tensor:
    """Ids (int64, CPU) of the rows ``placement`` reads from the host tier."""
    if not placement.resident_rows:
        return torch.arange(placement.num_rows)
    return host_mask(placement).nonzero().flatten()


# ---- the CPU path ------------------------------------------------------------------------------------------------
_reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hmgstore-split")
_deferred_any = False  # set by the first finish_later: until then settle() need not wait for the reader


def read_chunks(source: torch.Tensor, ids: torch.Tensor, into: torch.Tensor, chunks: int = 2,
                threads: int | None = None) -> list:
    """Queue ``into[i] = source[ids[i]]`` on the background thread, in ``chunks`` pieces, with ``threads`` of
    torch's intra-op threads (None: its count). ``source``: the host table ([N, ...] CPU tensor); ``ids``: int64
    CPU, in range; ``into``: CPU tensor of ``len(ids)`` rows. Returns ``[((start, end), future)]`` in order: the
    first pieces can be copied to the GPU while the later ones are read."""
    step = max(MIN_IDS, -(-len(ids) // chunks))
    return [((a, min(len(ids), a + step)), _reader.submit(_read, source, ids[a:a + step], into[a:a + step], threads))
            for a in range(0, len(ids), step)]


def _read(source: torch.Tensor, ids: torch.Tensor, into: torch.Tensor, threads: int | None) -> None:
    before = torch.get_num_threads()
    wanted = before if threads is None else threads  # for this read only: torch gives later threads its count
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        torch.index_select(source, 0, ids, out=into)
    finally:
        if wanted != before:
            torch.set_num_threads(before)


def settle(device: torch.device) -> None:
    """Wait for every finish queued on the reader thread so far (once any was), then for ``device``: what a
    table's close() does, so that it returns with no deferred finish of its gathers still to run. Skipped on
    the reader thread itself (it would wait for itself) and at interpreter shutdown (the pool's exit hook has
    run what was queued, and takes nothing new)."""
    if _deferred_any and threading.current_thread().name.partition("_")[0] != "hmgstore-split":
        with contextlib.suppress(RuntimeError):  # "cannot schedule new futures after interpreter shutdown"
            _reader.submit(int).result()  # one thread, first in first out: behind everything queued before
    synchronize((device,))


_copy_streams: dict[int, torch.cuda.Stream] = {}


def copy_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per GPU for the staging copies, so they overlap the kernel on the gather's stream."""
    if device.index not in _copy_streams:
        _copy_streams[device.index] = torch.cuda.Stream(device)
    return _copy_streams[device.index]


@dataclass
class CpuPart:
    """The rows of one gather that the CPU reads, and its work in flight. ``ids``: source row ids (CPU int64);
    ``positions``: their output positions (int64, on the CPU or already on the output's GPU), or None for the first
    ``len(ids)`` positions; ``decode``: turns the host tier's stored rows (on the GPU) into the output's, or None
    when a dtype conversion does (rows kept as they read, or half-width)."""

    ids: torch.Tensor
    positions: torch.Tensor | None
    decode: Callable[[torch.Tensor], torch.Tensor] | None = None
    threads: int | None = None  # torch's intra-op threads for the reads (None: its count)
    chunks: list = dataclasses.field(default_factory=list)  # ((start, end), future of the read)
    staging: torch.Tensor | None = None  # pinned, the host tier's dtype
    started: torch.cuda.Event | None = None  # on the gather's stream at start(): the copies wait for it
    landed: torch.Tensor | None = None  # the staging's copy on the GPU, when it cannot land in the output


def divide(host_ids: torch.Tensor, on_host: torch.Tensor | None, share: float
           ) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """Split a batch of ``n`` ids: ``(k, cpu_positions, kernel_positions)``.

    ``on_host``: bool [num_rows] of rows read from the host tier (None: all
    of them). The CPU gets the first ``share`` of the host-tier positions,
    ``k`` of them, or none when that is under :data:`MIN_IDS`. With every
    row on the host the parts are the ranges ``[0, k)`` and ``[k, n)``, and
    both position tensors are None (nothing to index or scatter).
    """
    if on_host is None:
        k = int(round(share * len(host_ids)))
        return (k, None, None) if k >= MIN_IDS else (0, None, None)
    host = on_host[host_ids].nonzero().flatten()
    k = int(round(share * len(host)))
    if k < MIN_IDS:
        return 0, None, None
    keep = torch.ones(len(host_ids), dtype=torch.bool)
    keep[host[:k]] = False
    return k, host[:k], keep.nonzero().flatten()


def start(part: CpuPart, source: torch.Tensor, out: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Queue the part's CPU reads on the thread pool (they run while the caller queues the kernel) and
    mark ``stream`` here, before the kernel: the copy stream waits for that mark, not for the kernel."""
    n, row_shape = len(part.ids), source.shape[1:]
    part.staging = torch.empty((n, *row_shape), dtype=source.dtype, pin_memory=True)
    if part.positions is not None or source.dtype != out.dtype or part.decode is not None:
        part.landed = torch.empty((n, *row_shape), dtype=source.dtype, device=out.device)
    # The output, landing buffer and GPU positions are the gather stream's. An event, waited for by the copy
    # stream when the part's copies are queued: a wait queued on the shared copy stream now could land, under
    # finish_later, before an earlier batch's copies still to be queued, and hold them behind this batch's work.
    part.started = stream.record_event()
    part.chunks = read_chunks(source, part.ids, part.staging, threads=part.threads)


def finish(part: CpuPart, out: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Wait for the part's CPU reads, copy each chunk over as it is read, and put the rows into ``out``
    (``[n, ...]`` on ``stream``'s GPU): straight into its first rows when they are the part's, else by a
    scatter on ``stream``, widening half-width rows. ``stream`` is the current stream: the gather's, or the
    copy stream itself when :func:`finish_later` runs this on the reader thread (then nothing waits here)."""
    side = copy_stream(out.device)
    into = part.landed if part.landed is not None else out
    with torch.cuda.stream(side):
        assert part.started is not None  # start() marked the gather's stream
        side.wait_event(part.started)
        for (a, b), future in part.chunks:
            future.result()
            assert part.staging is not None  # start() made it with the chunks
            into[a:b].copy_(part.staging[a:b], non_blocking=True)
        positions = part.positions if part.positions is None or part.positions.is_cuda else \
            part.positions.pin_memory().to(out.device, non_blocking=True)
    if stream != side:
        stream.wait_stream(side)
    rows = None if part.landed is None else \
        part.landed.to(out.dtype) if part.decode is None else part.decode(part.landed)
    if positions is not None:
        positions.record_stream(stream)  # made on the copy stream, or (GPU ids) on the gather's
        assert rows is not None  # start() gives a part with positions a landing buffer
        out.index_copy_(0, positions, rows)
    elif rows is not None:
        out[:len(part.ids)].copy_(rows)


def finish_later(part: CpuPart, out: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """:func:`finish` on the reader thread, after the part's reads, with every step on the copy stream (which
    first waits for the mark :func:`start` left on ``stream``); its future, whose result is a CUDA event
    recorded on the copy stream after the last step, goes into this thread's
    :func:`~hmgstore.gather.finish_scope.deferred_finishes` list. Arguments as :func:`finish`'s; call inside
    that block only (RuntimeError otherwise): the caller's stream must wait for the event before it reads
    ``out``."""
    futures = finish_scope.current()  # raises outside the block, before anything is queued
    side = copy_stream(out.device)
    # Lifetimes. torch's caching allocator reuses a freed block at once for work on the stream that allocated
    # it, and after an event for the streams record_stream() added, recorded when the block is freed. ``out``
    # and ``landed`` are the gather stream's, which does not wait for the copy stream, so without the record
    # a batch dropped early (a pipeline stopped) or a landing buffer freed with its part could be handed to
    # the gather stream's next allocation while the copy stream still writes or reads it. The record must
    # precede the free, and the free's event must follow the copy stream's work: the queued task holds
    # ``part`` and ``out`` until it has queued all of it, so the last reference goes only after that. GPU
    # positions (GPU ids: the gather stream's) are recorded in finish(); positions uploaded there and the
    # decoded rows are the copy stream's own, freed after their use on it; the pinned staging and position
    # copies get an event on the copy stream from torch's host allocator at each non-blocking copy.
    out.record_stream(side)
    if part.landed is not None:
        part.landed.record_stream(side)
    global _deferred_any
    _deferred_any = True
    futures.append(_reader.submit(_finish_on_reader, part, out, side))  # one thread: after the part's reads


def _finish_on_reader(part: CpuPart, out: torch.Tensor, side: torch.cuda.Stream) -> torch.cuda.Event:
    with torch.cuda.device(out.device), torch.cuda.stream(side):  # a new thread's current device is GPU 0
        finish(part, out, side)
        done = torch.cuda.Event()
        done.record(side)
    return done
