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

import queue
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator

import torch

from ..cuda.deferred import raise_deferred
from ..rows import checks
from ..table.host_pages import batches_to_fuse
from ..util.device import resolve_device
from .batch_maker import DONE, Maker, ends, left_over, produce, side_stream  # noqa: F401 - side_stream: re-exported


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


_USED_UP = ("Pipeline's loader is a one-shot iterator ({}) and the passes before used it up: this pass, as any "
            "second epoch over it, would yield no batches. Pass an iterable that starts again (a DataLoader, a "
            "list), or build a new Pipeline over a new iterator each epoch (an iterator whose __iter__ starts it "
            "over and returns itself counts as one-shot: its iter() is called once, so no batch comes twice)")
_HANDED_AGAIN = ("Pipeline's loader ({}) hands out the iterator of its last epoch again, used up: a one-shot "
                 "iterator in disguise (this epoch yielded no batch, the last one {}). Make its __iter__ return a "
                 "new iterator each time, or pass the iterator itself (iter(loader)) to have it read once, across "
                 "passes")


def is_one_shot(loader) -> bool:
    """Whether ``loader`` is one-shot: an iterator (a generator, ``iter(list)``, ``map(...)``), which is its own
    iterator and so is used up by reading it, rather than an iterable that starts again on every ``iter()``.
    Never starts a pass of an iterable (``iter()`` is only called on an iterator). Raises nothing."""
    return isinstance(loader, Iterator) and iter(loader) is loader


def _reference(obj) -> Callable[[], object]:
    """A reference to ``obj`` that keeps it alive only where it cannot be held weakly (builtin iterators)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


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
            Each pass calls ``iter(loader)`` and is an epoch of its own: one
            left early (``break``) drops the batches it made ahead, as
            leaving a DataLoader's epoch does, and an epoch may be empty.
            A one-shot loader, an iterator (a generator, ``iter(list)``:
            :func:`is_one_shot`), is read once across passes instead: a pass
            left early is resumed by the next pass, which yields first the
            batches made ahead, so that no batch is lost or repeated; once a
            pass has reached its end, or a pass after the first yields no
            batch, iterating the Pipeline again raises RuntimeError saying
            so. Starting a pass over a one-shot loader ends the one under
            way. Each batch
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
        TypeError: for a ``loader`` that is not iterable (at construction, not at the first batch).
        ValueError: for a ``depth``, ``max_sms``, ``fuse`` or ``overlap_reads`` out of range.
        RuntimeError: when a pass starts over a one-shot loader that is used up (see ``loader``), and at the end
            of an empty pass over an iterable whose ``iter()`` handed out the used-up iterator of its last
            epoch again.

    Example:
        >>> for batch in hmgstore.Pipeline(loader, depth=2, max_sms="auto"):  # doctest: +SKIP
        ...     loss = model(batch.x, batch.edge_index)
    """

    warm = 2

    def __init__(self, loader: Iterable, depth: int = 2, *, device=None, max_sms: int | str | None = "auto",
                 fuse: int | str = 1, overlap_reads: bool | str = False):
        if not isinstance(loader, Iterable) and not hasattr(type(loader), "__getitem__"):  # iter() takes either
            raise TypeError(f"Pipeline takes a loader, an iterable of batches (a PyG NeighborLoader, a DGL "
                            f"DataLoader, a list), got {type(loader).__name__}")
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
        self._one_shot = is_one_shot(loader)
        # A one-shot loader's state across passes: the items a pass left early had made ahead (the next pass's
        # first), whether a pass reached its end, the passes begun, and the pass under way (held weakly: one
        # dropped by its consumer ends at once and keeps its batches here).
        self._left: list = []
        self._iterator: Iterator | None = None  # a one-shot loader's iterator, from the first pass's iter()
        self._raised: BaseException | None = None  # what a one-shot loader raised last, which ended it
        self._ended = False
        self._passes = 0
        self._open: weakref.ref | None = None
        # Another loader's last whole pass: its iterator and its batches (an empty epoch is fine, unless iter()
        # handed out that used-up iterator again).
        self._last_whole: Callable[[], object] | None = None
        self._last_yield = 0

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

    def _maker(self) -> Maker:
        """How this pass makes its batches: the cap, the fusing and the overlap decided for ``self.device``."""
        cuda = self.device is not None and self.device.type == "cuda"
        max_sms: int | None = None
        if cuda:
            max_sms = self._auto_sms() if self.max_sms == "auto" else \
                self.max_sms if isinstance(self.max_sms, int) else None  # checked at construction: int or None
        fuse = self.fuse
        if isinstance(fuse, str):  # "auto": decided on the first pass, kept for the next
            fuse = self.fuse = batches_to_fuse(tables_of(self.loader), self.device) if cuda else 1
        return Maker(self.device if cuda else None, max_sms, fuse, cuda and self._overlaps_reads())

    def __iter__(self) -> Iterator:
        return self.epoch()

    def epoch(self, delivered: int = 0) -> Generator:
        """One pass over the loader, as ``iter(pipeline)``, for a caller that has already handed out
        ``delivered`` batches of it (:class:`hmgstore.Producer`'s ring keeps those a stopped pass had sent): they
        make the pass a non-empty one. Starting a pass over a one-shot loader ends the one under way, whose
        batches made ahead this one yields first.

        Raises:
            RuntimeError: as the class's docstring says, for a used-up one-shot loader.
        """
        under_way = self._open() if self._open is not None else None
        if under_way is not None:  # one reader of a one-shot loader at a time
            under_way.close()
        batches = self._pass(delivered)
        if self._one_shot:
            self._open = weakref.ref(batches)
        return batches

    def _pass(self, delivered: int) -> Generator:
        """The pass's batches (see :meth:`epoch`)."""
        maker = self._maker()
        first: list = []
        if self._one_shot:
            first, self._left = self._left, []
            self._passes += 1
            if self._ended and not first:
                raise RuntimeError(_USED_UP.format(type(self.loader).__name__))
        if self._one_shot and self._iterator is None:  # iter() once: one whose __iter__ starts it over repeats
            self._iterator = iter(self.loader)
        batches = self._iterator if self._iterator is not None else iter(self.loader)
        maker.batches = batches
        cuda = maker.cuda
        first = first or maker.warm_up(self.warm)
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        spill: list[tuple] = []  # items the background thread made after the stop
        worker = None
        if not (first and ends(first[-1])):  # the warm batches did not reach the end
            worker = threading.Thread(target=produce, args=(maker, ready, stop, spill), name="hmgstore-pipeline",
                                      daemon=True)
            worker.start()
        self.waited = 0.0
        yielded, finished = delivered, False
        try:
            while True:
                start = time.perf_counter()
                item = first.pop(0) if first else ready.get()
                finished = ends(item)
                batch, event, failure, parts = item
                landed = [f.result() for f in parts]  # raises a batch's CPU reads' error here, at the batch
                self.waited += time.perf_counter() - start
                if failure is not None:
                    self._raised = failure if self._one_shot else None  # a generator that raised is over
                    raise failure
                if batch is DONE:
                    if cuda:  # a bad GPU id met by a gather of this pass (checked without waiting) raises here
                        raise_deferred(self.device)
                    self._end(batches, yielded)
                    return
                if cuda:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    for done in landed:
                        current.wait_event(done)
                    for t in _tensors(batch):
                        if t.is_cuda:
                            t.record_stream(current)
                yielded, self._raised = yielded + 1, None  # what raised before did not end the loader
                yield batch
        finally:
            stop.set()
            if worker is not None:
                worker.join()
            if self._one_shot and not finished:  # left early: the next pass yields what this one made ahead
                self._left = left_over(first, ready, spill)

    def _end(self, batches: Iterator, yielded: int) -> None:
        """A pass reached the end of ``batches`` after ``yielded`` batches: raise if that shows a used-up
        iterator read again (see ``loader`` in the class's docstring)."""
        if self._one_shot:
            self._ended = True
            if yielded == 0 and self._passes > 1:
                raised = self._raised
                raise RuntimeError(_USED_UP.format(type(self.loader).__name__) + (
                    f"; it ended when it raised {type(raised).__name__}: {raised} (a generator that raised is over)"
                    if raised is not None else ""))
            return
        again = self._last_whole is not None and self._last_whole() is batches
        previous, self._last_yield, self._last_whole = self._last_yield, yielded, _reference(batches)
        if again and yielded == 0 and previous > 0:
            raise RuntimeError(_HANDED_AGAIN.format(type(self.loader).__name__, previous))
