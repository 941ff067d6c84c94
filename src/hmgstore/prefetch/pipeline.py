"""Pipeline: the next batches sampled and gathered on a side CUDA stream while the model trains.

``for batch in Pipeline(loader, depth=2)`` yields what ``for batch in
loader`` yields, in the same order, but a background thread pulls each batch
from the loader up to ``depth`` batches ahead, with a side CUDA stream
current: the GPU sampler's kernels, the feature gather and any copies of a
batch are queued there, overlapping the training kernels on the consumer's
stream. A batch is handed over with a CUDA event: the consumer's stream waits
for it on the GPU (the training thread itself never waits for the GPU to
finish a batch), and its tensors are marked as used by the consumer's stream
so their memory is not reused too early. Loader workers (CPU sampling in
other processes) keep working as before, now also overlapping the gather and
the training. With ``overlap_reads``, a split gather's CPU reads
(:mod:`hmgstore.gather.cpu_share`) also overlap the next batch's sampling:
they land on a copy stream that the consumer's stream waits for as well.

An exception raised while producing a batch is raised in the training loop,
with its traceback, at the batch where it happened (a bad GPU id, which
gathers check without waiting, at a later batch or at the end of the pass
at the latest: see :mod:`hmgstore.rows.ids`); stopping early (``break``)
stops the background thread. On the CPU the pipeline is a plain prefetching
iterator (a thread, no streams).
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import torch

from ..cuda.deferred import raise_deferred
from ..cuda.gather import capped_gathers
from ..gather.finish_scope import deferred_finishes
from ..gather.fusion import fused
from ..rows import checks
from ..table.host_pages import batches_to_fuse
from ..util.device import resolve_device

_DONE = object()


def _tensors(obj, seen=None):
    """Every tensor reachable from a batch: tensors, sequences, dicts, PyG Data/HeteroData stores."""
    if seen is None:
        seen = set()
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, seen)
    elif hasattr(obj, "stores"):  # torch_geometric Data / HeteroData
        for store in obj.stores:
            for value in store.values():
                yield from _tensors(value, seen)


def check_overlap_reads(overlap_reads) -> None:
    if overlap_reads != "auto" and not isinstance(overlap_reads, bool):
        raise ValueError(f"overlap_reads is True, False or 'auto'; got {overlap_reads!r}")


def reads_can_overlap(loader) -> bool:
    """``overlap_reads="auto"``: whether nothing in ``loader`` reads a batch's gathered rows after the gather.

    True for a PyG loader (``NodeLoader``, ``LinkLoader`` and their subclasses: a ``collate_fn`` that samples
    and a ``filter_fn`` that gathers and only puts the rows on the batch) without a ``transform``, which could
    read them before the CPU's share lands; False for anything else (a DGL loader, an unknown iterable), whose
    own code after the gather cannot be seen.
    """
    return (callable(getattr(loader, "collate_fn", None)) and callable(getattr(loader, "filter_fn", None))
            and hasattr(loader, "transform") and loader.transform is None)


def check_fuse(fuse) -> int | str:
    """``fuse`` as ``"auto"`` or a Python int >= 1 (numpy and torch integers too); ValueError for every other kind,
    as ``max_sms``."""
    return checks.setting(fuse, "fuse is the number of batches gathered together (at least 1) or 'auto'",
                          words=("auto",))


_USED_UP = ("Pipeline's loader is a one-shot iterator ({}), which its first epoch used up: a second epoch would "
            "yield no batches. Pass an iterable that starts again (a DataLoader, a list), or build a new Pipeline "
            "over a new iterator each epoch")


def check_max_sms(max_sms):
    """``max_sms`` checked by the tables' own rule, with ``"auto"`` (ValueError); integers become ints."""
    return checks.sm_cap(max_sms, allow_auto=True)


def auto_sms(device: torch.device) -> int:
    """The pipeline's default cap on its gathers' SMs: one SM in 11 of ``device``'s, at least 4 (12 on an H100
    or H200: beside the trimmed TF32 step, caps of 8-16 SMs gave the fastest epochs and 4 was slower,
    benchmarks/results/strong-step-h100.md)."""
    return max(4, torch.cuda.get_device_properties(device).multi_processor_count // 11)


#: Functions that find the hmgstore tables a loader gathers from (see :func:`register_table_finder`).
_finders: list[Callable[[object], list | None]] = []


def register_table_finder(finder: Callable[[object], list | None]) -> None:
    """Teach :class:`Pipeline` where a kind of loader keeps its hmgstore tables (for ``max_sms="auto"`` and
    ``fuse="auto"``).

    Args:
        finder: ``finder(loader)`` returns the tables (HybridTensors) the loader gathers from, or None for a
            loader it does not know. A framework adapter registers one for its loaders, once.
    """
    if finder not in _finders:
        _finders.append(finder)


def tables_of(loader) -> list:
    """The hmgstore tables ``loader`` gathers from, as the first finder that knows the loader says; ``[]`` when
    none does (the tables cannot be told)."""
    for finder in _finders:
        found = finder(loader)
        if found is not None:
            return list(found)
    return []


_side_streams: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every :class:`Pipeline` on ``device`` makes its batches on, epoch after epoch.

    torch's caching allocator reuses a freed block only for allocations on the stream that made it, so a new
    stream for each pipeline (a user's loop builds one an epoch) would leave every earlier epoch's blocks
    unusable, the memory reserved growing each epoch (``benchmarks/results/soak-gpu-h100.md``). Two pipelines
    iterated at once on one GPU (a training and a validation loader) therefore make their batches one after
    the other on that stream.
    """
    if device.index not in _side_streams:
        _side_streams[device.index] = torch.cuda.Stream(device)
    return _side_streams[device.index]


class Pipeline:
    """Iterate ``loader`` with up to ``depth`` batches prepared ahead on a side stream.

    Batches come out ready on the stream that is current when they are taken.
    The first :attr:`warm` batches of each pass are made in the consumer's
    thread before the background thread starts, so that one-off work (kernel
    compilation, the sampler's CUDA-graph capture) runs while nothing else
    uses the GPU.

    Args:
        loader: any iterable of batches (a PyG ``NeighborLoader``, a DGL
            ``DataLoader``, ...); it may be iterated several times (epochs).
            A one-shot iterator (a generator) gives one epoch: iterating
            the Pipeline again raises RuntimeError saying so. Each batch
            must be new memory: a loader that refills the tensors of its last
            batch would overwrite batches still queued (PyG's and DGL's
            loaders make new ones).
        depth: batches prepared ahead (1 or more; a Python, numpy or torch integer).
        device: the CUDA device whose streams are used (default: the current
            GPU; None on a machine without one: plain prefetching).
        max_sms: cap the gathers that make a batch at this many SMs' worth of
            blocks (:func:`hmgstore.cuda.gather.capped_gathers`), leaving the
            rest to training; the training thread's own gathers and the
            sampler's kernels are not capped, and a table's own tighter
            ``max_sms`` still holds. ``"auto"`` (the default): :func:`auto_sms`
            where a table the loader gathers from reads host memory
            (:func:`tables_of`), no cap where every table is whole on the
            GPU. A gather that reads host memory waits on PCIe, not on its
            SMs, so uncapped it holds SMs the step could use: on the
            papers-shaped graph with a 20% int8 cache, 12 SMs ran the epoch
            at 1.06x uncapped beside the trimmed TF32 step
            (``benchmarks/results/defaults-papers-h200.md``). None: no cap
            but the tables' own.
        fuse: make this many batches at a time and gather their rows together,
            one kernel job per table (:mod:`hmgstore.gather.fusion`): big host
            tables read several times faster per row in launches of more rows.
            Costs the memory of ``fuse`` batches' features and delays the first
            batch of each group by the group's sampling. ``"auto"``: as many as
            the loader's biggest host tier needs
            (:func:`hmgstore.table.host_pages.batches_to_fuse`, from this
            machine's measured reach, cached). Default 1.
        overlap_reads: let the loader thread sample the next batch while the
            CPU still reads this one's share of a split gather's rows
            (``HybridTensor(split=...)``, :mod:`hmgstore.gather.cpu_share`):
            each batch is made inside
            :func:`hmgstore.gather.finish_scope.deferred_finishes`, and its
            rows land on the copy stream, which the consumer's stream waits for
            before the batch is yielded (an error there is raised at that
            batch). The loader must not read a batch's gathered rows after the
            gather, on any stream, before handing the batch over. False (the
            default): off, since it did not pay on an H100
            (``benchmarks/results/strong-step-h100.md``). True: on for any
            loader; ``"auto"``: on where that is known to hold, a PyG loader
            without a ``transform`` (:func:`reads_can_overlap`).

    Raises:
        ValueError: for a ``depth``, ``max_sms``, ``fuse`` or ``overlap_reads`` out of range.

    Example:
        >>> for batch in hmgstore.Pipeline(loader, depth=2, max_sms="auto"):  # doctest: +SKIP
        ...     loss = model(batch.x, batch.edge_index)
    """

    warm = 2

    def __init__(self, loader: Iterable, depth: int = 2, *, device=None, max_sms: int | str | None = "auto",
                 fuse: int | str = 1, overlap_reads: bool | str = False):
        depth = checks.setting(depth, "depth is the number of batches prepared ahead, at least 1")
        max_sms, fuse = check_max_sms(max_sms), check_fuse(fuse)
        check_overlap_reads(overlap_reads)
        self.loader, self.depth, self.max_sms, self.fuse = loader, depth, max_sms, fuse
        self.overlap_reads = overlap_reads
        if device is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        if device is not None:
            device = resolve_device(device)
        self.device = device
        self.waited = 0.0  # seconds the consumer spent waiting for batches (last iteration)
        self._one_pass_done = False  # a one-shot iterator (a generator) was iterated once
        self._last_yield = 0  # batches the last whole pass yielded

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # a loader without len() raises TypeError, as torch's do

    def _auto_sms(self) -> int | None:
        """``max_sms="auto"``: :func:`auto_sms` where a table of the loader reads host memory (or the tables
        cannot be told: see :func:`tables_of`), else no cap."""
        tables = tables_of(self.loader)
        if tables and not any(t.placement.has_host_tier for t in tables):
            return None
        return auto_sms(self.device)

    def _overlaps_reads(self) -> bool:
        """Whether batches are made with their CPU reads finishing later (``overlap_reads``, ``"auto"`` decided)."""
        return self.overlap_reads if isinstance(self.overlap_reads, bool) else reads_can_overlap(self.loader)

    def _maker(self) -> _Maker:
        """How this pass makes its batches: the cap, the fusing and the overlap decided for ``self.device``."""
        cuda = self.device is not None and self.device.type == "cuda"
        max_sms: int | None = None
        if cuda:
            max_sms = self._auto_sms() if self.max_sms == "auto" else \
                self.max_sms if isinstance(self.max_sms, int) else None  # checked at construction: int or None
        fuse = self.fuse
        if isinstance(fuse, str):  # "auto": decided on the first pass, kept for the next
            fuse = self.fuse = batches_to_fuse(tables_of(self.loader), self.device) if cuda else 1
        return _Maker(self.device if cuda else None, max_sms, fuse, cuda and self._overlaps_reads())

    def __iter__(self) -> Iterator:
        maker = self._maker()
        batches = iter(self.loader)
        if batches is self.loader and self._one_pass_done:  # a generator: the first pass used it up
            raise RuntimeError(_USED_UP.format(type(self.loader).__name__))
        self._one_pass_done = batches is self.loader
        maker.batches = batches
        cuda = maker.cuda
        first = maker.warm_up(self.warm)
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        worker = threading.Thread(target=_produce, args=(maker, first, ready, stop), name="hmgstore-pipeline",
                                  daemon=True)
        worker.start()
        self.waited = 0.0
        yielded, previous = 0, self._last_yield
        try:
            while True:
                start = time.perf_counter()
                batch, event, failure, parts = first.pop(0) if first else ready.get()
                landed = [f.result() for f in parts]  # raises a batch's CPU reads' error here, at the batch
                self.waited += time.perf_counter() - start
                if failure is not None:
                    raise failure
                if batch is _DONE:
                    if cuda:  # a bad GPU id met by a gather of this pass (checked without waiting) raises here
                        raise_deferred(self.device)
                    empty_again, self._last_yield = yielded == 0 and self._last_yield > 0, yielded
                    if empty_again:  # an iterable that hands out its used-up iterator again: as a generator
                        raise RuntimeError(_USED_UP.format(type(self.loader).__name__) + f" (this epoch yielded "
                                           f"no batch, the last one {previous})")
                    return
                if cuda:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    for done in landed:
                        current.wait_event(done)
                    for t in _tensors(batch):
                        if t.is_cuda:
                            t.record_stream(current)
                yielded += 1
                yield batch
        finally:
            stop.set()
            while worker.is_alive():
                try:
                    ready.get(timeout=0.1)
                except queue.Empty:
                    pass
            worker.join()


class _Maker:
    """Makes one pass's batches on the side stream of ``device`` (None: on the CPU, no streams).

    Items: ``(batch or _DONE, its event on the side stream, an error raised making it, the futures of its split
    gathers' CPU parts)``: the futures' events, on the copy stream, are the batch's too.
    """

    batches: Iterator  # the loader's iterator for this pass, set once the pass's settings are decided

    def __init__(self, device: torch.device | None, max_sms: int | None, fuse: int, overlap: bool):
        self.device, self.max_sms, self.fuse, self.overlap = device, max_sms, fuse, overlap
        self.cuda = device is not None
        self.side = side_stream(device) if device is not None else None

    def finishes(self) -> contextlib.AbstractContextManager[list]:
        """The block a batch is made in, collecting its split gathers' futures (none without overlap)."""
        return deferred_finishes() if self.overlap else contextlib.nullcontext([])

    def one(self) -> tuple:
        """The next batch made on the side stream, with its event; _DONE at the end."""
        with torch.cuda.stream(self.side) if self.cuda else contextlib.nullcontext(), \
                capped_gathers(self.max_sms), self.finishes() as futures:
            batch = next(self.batches, _DONE)
            event = None
            if self.cuda and batch is not _DONE:
                event = torch.cuda.Event()
                event.record(self.side)
        return batch, event, None, futures

    def group(self) -> list:
        """The next ``fuse`` batches, their gathers run together at the end (one event for all); an error
        ends the group after the batches made before it, which are delivered first."""
        items, error = [], None
        # the window's gathers run as it closes, inside the scope (opened first, closed last)
        with torch.cuda.stream(self.side), capped_gathers(self.max_sms), self.finishes() as futures, \
                fused(self.device, self.fuse):
            try:
                for _ in range(self.fuse):
                    batch = next(self.batches, _DONE)
                    items.append(batch)
                    if batch is _DONE:
                        break
            except BaseException as err:  # noqa: BLE001 - raised where the batch would have been
                error = err
        event = torch.cuda.Event()
        event.record(self.side)
        made = [(b, None if b is _DONE else event, None, futures) for b in items]  # a group's rows: together
        return made + ([(None, None, error, [])] if error is not None else [])

    def next_items(self) -> list:
        """The next item, or the next group's items when batches are fused."""
        return self.group() if self.cuda and self.fuse > 1 else [self.one()]

    def warm_up(self, count: int) -> list:
        """The first ``count`` items, made in the calling thread (an error or the end stops early)."""
        first: list = []
        try:
            for _ in range(count):
                first.append(self.one())
                if first[-1][0] is _DONE:
                    break
        except BaseException as err:  # noqa: BLE001 - raised where the batch would have been
            first.append((None, None, err, []))
        return first


def _produce(maker: _Maker, first: list, ready: queue.Queue, stop: threading.Event) -> None:
    """The background thread: the pass's items after the warm ones into ``ready``, until the end, an error or
    ``stop``."""
    try:
        if maker.cuda:
            torch.cuda.set_device(maker.device)
        if first and (first[-1][0] is _DONE or first[-1][2] is not None):
            return
        while not stop.is_set():
            for item in maker.next_items():
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if item[0] is _DONE or item[2] is not None:
                    return
    except BaseException as err:  # noqa: BLE001 - re-raised in the consumer's thread
        ready.put((None, None, err, []))
