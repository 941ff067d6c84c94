"""HybridTensor: one logical [N, ...] table whose rows live in several tiers.

A table is built from a host source (torch CPU tensor, numpy array or
memmap). On a CUDA device, chosen rows are copied into a GPU-resident tier
and the source is pinned in place as the host tier; ``table[idx]`` returns a
CUDA tensor gathered in one kernel launch, whichever tiers the ids hit. On
the CPU the same API gathers with ``torch.index_select``; results are
bit-identical either way.

``gather_many`` fuses the gathers of several tables (features, labels, node
types of a batch) into one launch; adapters call it once per batch.
Validation lives in the public functions; ``_job`` and the launch do the
work.

Streams. A gather runs on ``stream`` if given, else on the current stream
of the table's device, and its result is ready on that stream; the host
does not wait for it, except that ids already on a GPU are range-checked
with one device-to-host read. Output buffers it allocates belong to that
stream. A caller who passes ``out`` or CUDA ids and then uses them on
another stream orders the streams itself (events, or ``record_stream``), as
with any torch operation.

Lifetime. ``close()`` waits for gathers in flight in other threads and
refuses new ones; it then waits for the device, so no kernel still reads
what it frees. A table sent to another process (pickle, or torch's
multiprocessing) is rebuilt there, around the same source, on its first use.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Sequence

import numpy as np
import torch

from . import placement as placement_mod
from .index import Index, check_pending, prepare_many
from .memory.pinned import PinnedHost, as_host_tensor, row_layout, synchronize
from .placement import Placement, Tier
from .stats import TierCounter

log = logging.getLogger(__name__)


def resolve_device(device) -> torch.device:
    """The device a table lives on: ``None`` means the current GPU, or the CPU without one.

    A bare ``"cuda"`` gets the current GPU's index. Raises ValueError for
    device types other than cpu and cuda.
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        if not torch.cuda.is_available():
            return device  # check_device explains
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"hmgstore tables live on 'cpu' or 'cuda' devices, not {device}")
    return device


class HybridTensor:
    """A table of ``N`` rows spread over GPU memory and pinned host memory.

    Args:
        source: the full table, ``[N, *row_shape]``: a torch CPU tensor, a
            numpy array or an ``np.memmap``. It is pinned in place (no second
            host copy; sources under 64 MiB are copied to pinned memory) and
            kept alive by the table. Each row must be contiguous; the step
            between rows may be larger (column slices work). Its shape and
            memory are fixed at build: ``requires_grad`` is dropped (gathers
            carry no gradient), and a later ``set_()`` or ``.data = ...`` on
            the caller's tensor does not reach the table. Memory that moves
            under it (``resize_()`` past its size, ``share_memory_()``) makes
            the next gather raise RuntimeError.
        device: where gathered rows go: ``"cuda"``, ``"cuda:1"``, ``"cpu"``;
            ``None`` picks the current GPU, or the CPU when there is none.
        gpu_rows: ids of rows to keep resident on the GPU (unique, in range).
        gpu_budget: instead of ``gpu_rows``, bytes of GPU memory for resident
            rows (int or ``"8GB"``), filled in ``hot_order``.
        hot_order: row ids hottest first, used with ``gpu_budget``
            (:func:`hmgstore.placement.order_by_score` turns a score such as
            in-degree into one).
        max_sms: cap the gather at this many SMs' worth of resident blocks, so
            that concurrent training kernels keep the rest of the GPU.
        progress: show a progress bar while pinning or copying large tables.
        stats: count rows and time per tier from the start (see :meth:`stats`).
        copy: copy the source into host memory hmgstore allocates (see
            ``backing``) instead of pinning it in place. Costs a copy and the
            memory of one; small-row tables read up to 1.4x faster from such
            memory, and forked DataLoader workers share it where a table
            pinned in place is copied into each of them (README, "Which host
            memory").
        host_dtype: ``torch.bfloat16`` or ``torch.float16`` to keep a float32
            table's host tier in half-width rows (a copy in owned memory,
            half the bytes over PCIe); gathers widen them to float32, so
            every row reads as ``x.to(host_dtype).to(x.dtype)``, the GPU
            tier's rows included.
        backing: the owned memory's kind for ``copy``/``host_dtype``:
            ``"auto"`` (default: cudaHostAlloc for a GPU table, which forked
            DataLoader workers share without a copy; 2 MiB pages for a CPU
            table), ``"hugepage"`` or ``"cuda"`` (see
            :mod:`hmgstore.memory.owned`).
        split: let the CPU read part of each batch's host rows while the
            kernel reads the rest (:mod:`hmgstore.split`; for tables of
            more than a few GB, gathered with CPU ids): ``"auto"`` measures
            both paths on this kind of table at the first batch of each
            size class and caches the share, a float in ``[0, 1]`` fixes
            the CPU's share of host-tier rows,
            None (default) reads every row with the kernel. The CPU reads
            use torch's intra-op threads (``torch.set_num_threads`` caps
            them).

    On the CPU, ``gpu_rows``/``gpu_budget`` are checked the same way, then
    every row is read from the source, so the same code runs with and
    without a GPU.

    Raises TypeError/ValueError for unusable sources and placements,
    IndexError for placement ids out of range, RuntimeError when CUDA is
    asked for without a GPU, ImportError when CuPy is missing.
    """

    def __init__(self, source, device=None, *, gpu_rows=None, gpu_budget=None, hot_order=None,
                 max_sms: int | None = None, progress: bool = True, stats: bool = False, copy: bool = False,
                 host_dtype: torch.dtype | None = None, backing: str = "auto", split=None):
        self._setup(source, resolve_device(device), max_sms, progress, copy=copy, host_dtype=host_dtype,
                    backing=backing)
        self._place_and_build(gpu_rows=gpu_rows, gpu_budget=gpu_budget, hot_order=hot_order, stats=stats,
                              split=split)

    def _place_and_build(self, gpu_rows=None, gpu_budget=None, hot_order=None, stats=False, split=None) -> None:
        self.placement = placement_mod.for_table(self.num_rows, self.row_bytes, self.device, gpu_rows=gpu_rows,
                                                 gpu_budget=gpu_budget, hot_order=hot_order)
        self._build()
        if stats:
            self.reset_stats()
        self.set_split(split)

    def set_split(self, split) -> None:
        """Set the split gather (see :mod:`hmgstore.split`), as the ``split`` argument does.

        ``"auto"`` reads the cost model from the cache, or measures it on
        this table at the first batch of each size class (a second or two,
        once) and caches it; a float in
        ``[0, 1]`` fixes the CPU's share of host-tier rows; None turns the
        split off. Raises ValueError for other values.
        """
        if split is not None and split != "auto" and (
                not isinstance(split, (int, float)) or isinstance(split, bool) or not 0 <= split <= 1):
            raise ValueError(f"split must be None, 'auto' or a share in [0, 1], got {split!r}")
        self._split = None
        if split is None or self.device.type != "cuda" or not self._reads_host:
            return  # every row is read on the CPU already, or none from the host
        self._split = split if split == "auto" else (float(split) or None)
        self._split_shares = {}

    @property
    def split_skipped(self) -> int:
        """Batches that ``split="auto"`` read with the kernel alone because other processes left too few idle
        cores (see :mod:`hmgstore.split`)."""
        return self._split_skipped

    def _split_share(self, batch: int) -> float:
        """The CPU's share for a batch of ``batch`` ids: fixed, or the cost model's for its size class (0 while
        other processes leave too few idle cores, see :class:`hmgstore.split.CpuLoad`)."""
        if self._split != "auto":
            return self._split
        from . import split as split_mod

        size = split_mod.batch_class(batch)
        if size not in self._split_shares:
            self._split_shares[size] = split_mod.model_for(self, size).share
        share = self._split_shares[size]
        if share and not split_mod.cpu_load.room_for(torch.get_num_threads()):
            self._split_skipped += 1
            return 0.0
        return share

    def _host_rows(self) -> torch.Tensor:
        """Ids (int64, CPU) of the rows this table reads from the host tier."""
        on_host = self._on_host()
        return torch.arange(self.num_rows) if on_host is None else on_host.nonzero().flatten()

    def _on_host(self) -> torch.Tensor | None:
        """bool [num_rows] (CPU): rows read from the host tier; None when every row is."""
        if self._split_mask is None and self.placement.resident_rows:
            mask = torch.ones(self.num_rows, dtype=torch.bool)
            for rows in self.placement.resident:
                mask[rows] = False
            self._split_mask = mask
        return self._split_mask

    @classmethod
    def empty(cls, shape, dtype: torch.dtype = torch.float32, device=None, *, host_dtype: torch.dtype | None = None,
              backing: str = "auto", **kwargs) -> "HybridTensor":
        """A table of ``shape`` whose host tier is owned memory (see ``backing``), for the caller to fill.

        Rows start as zeros. Write them with
        ``table[ids] = rows`` (or slices), which also updates the GPU tier's
        copies. ``host_dtype``, ``backing`` and the placement arguments
        (``gpu_rows``, ``gpu_budget`` with ``hot_order``, ``max_sms``,
        ``stats``, ``progress``) are as for the constructor.
        """
        from .memory import owned

        device = resolve_device(device)
        host = owned.empty(shape, host_dtype or dtype, backing, device)
        return cls._of_host(host, device, dtype, **kwargs)

    @classmethod
    def _of_host(cls, host: torch.Tensor, device, dtype: torch.dtype, *, max_sms=None, progress=True,
                 **placement) -> "HybridTensor":
        """A table over ``host`` (owned memory, used in place), whose rows read as ``dtype``."""
        self = cls.__new__(cls)
        self._setup(host, resolve_device(device), max_sms, progress, dtype=dtype)
        self._place_and_build(**placement)
        return self

    def _setup(self, source, device: torch.device, max_sms, progress, *, copy=False, host_dtype=None,
               backing="auto", dtype=None) -> None:
        """``dtype``: the table's dtype when ``source`` is already a narrow host tier (rebuilt tables)."""
        from .memory import owned

        self.device = device
        self._given = source  # what the caller passed: a read-only array is handed back as it is
        self._source, self._read_only = as_host_tensor(source)
        self._dtype = dtype or self._source.dtype
        row_layout(self._source)  # unusable layouts raise before any copy
        stored = host_dtype if host_dtype is not None else self._source.dtype
        if stored != self._dtype:
            _check_narrow(self._dtype, stored)
        if copy or stored != self._source.dtype:
            self._source = owned.copy_of(self._source, stored, backing, progress, device)
            self._given, self._read_only = self._source, False
        host_row = row_layout(self._source)[0]
        self.row_bytes = host_row // self._source.element_size() * torch.empty(0, dtype=self._dtype).element_size()
        self.max_sms = max_sms
        self._progress = progress
        self._pinned: PinnedHost | None = None
        self._gpu: torch.Tensor | None = None
        self._map: torch.Tensor | None = None
        self._tiers: tuple[Tier, ...] = ()  # bound to this device's addresses
        self._reads_host = False
        self._host_address = None  # the source's address when the host tier is the source itself
        self._owner = None  # an owner whose memory this view reads (it frees it, not the view)
        self._deferred = None  # why and how the table is built on first use (after unpickling)
        self._sort_ids = True  # host reads grouped by page (cuda/order.py); the tuning script turns it off
        self._closing = False
        self._closed = False
        self._users: dict[int, int] = {}  # thread id -> gathers in flight on this table
        self._counter: TierCounter | None = None  # per-tier statistics, once counting
        self._tier_starts: torch.Tensor | None = None
        self._split: float | str | None = None  # the CPU's share of host-tier rows, or "auto", when splitting
        self._split_shares: dict[int, float] = {}  # "auto": the measured share by batch size class
        self._split_skipped = 0  # "auto": batches read by the kernel alone because the CPUs were busy
        self._split_mask: torch.Tensor | None = None

    def _build(self) -> None:
        p = self.placement
        self._reads_host = p.has_host_tier
        if self.device.type != "cuda":
            return
        from . import cuda

        cuda.check_device(self.device)
        # Whenever the table goes, wait for kernels that may still read its memory.
        weakref.finalize(self, synchronize, (self.device,))
        try:
            with torch.cuda.device(self.device):
                tiers = []
                if p.has_host_tier:
                    self._pinned = PinnedHost(self._source, self.device, self._read_only, self._progress)
                if p.num_gpu_rows:
                    self._map = p.new_of_old(self.device, p.index_dtype)
                    self._gpu = torch.empty((p.num_gpu_rows, *self.row_shape), dtype=self.dtype, device=self.device)
                    self._fill_gpu_tier()
                    tiers.append(p.tier("gpu").bind(self._gpu.data_ptr(), self.row_bytes))
                if self._pinned is not None:
                    tiers.append(p.tier("host").bind(self._pinned.address, self._pinned.pitch, self._narrow))
                    self._host_address = self._pinned.address if self._pinned.tensor is self._source else None
                self._tiers = tuple(tiers)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_tiers(cls, source, device, placement: Placement, tiers: Sequence[Tier], *, owner,
                   pinned: PinnedHost | None = None, unreachable=(), max_sms: int | None = None) -> "HybridTensor":
        """A view over tiers that ``owner`` built and frees (a table sharded over several GPUs).

        ``tiers``: the resident tiers ``device`` reads, bound to their
        addresses as seen from it (:meth:`hmgstore.placement.Tier.bind`);
        ``pinned``: the source pinned for ``device``, when some rows are read
        from the host; ``unreachable``: names of resident tiers ``device``
        cannot read, whose rows it reads from the host instead. ``owner``
        must have ``check()``, which raises when the view can no longer be
        read (a gather calls it first); the view's :meth:`close` leaves the
        memory to the owner. On the CPU, pass ``tiers=()``.
        """
        self = cls.__new__(cls)
        self._setup(source, resolve_device(device), max_sms, False)
        self.placement, self._owner, self._pinned = placement, owner, pinned
        bound = {t.name: t for t in tiers}
        if pinned is not None:
            bound["host"] = placement.tier("host").bind(pinned.address, pinned.pitch)
            self._host_address = pinned.address if pinned.tensor is self._source else None
        # A tier without an address (a peer this GPU cannot read) is never addressed: the map sends no row there.
        self._tiers = tuple(bound.get(t.name, t) for t in placement.tiers) if self.device.type == "cuda" else ()
        self._reads_host = placement.has_host_tier or bool(unreachable)
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                self._map = placement.new_of_old(self.device, placement.index_dtype, host_tiers=tuple(unreachable))
                # A first gather may run on another stream (DGL's prefetch thread): the map must be written by then.
                torch.cuda.current_stream(self.device).synchronize()
            weakref.finalize(self, synchronize, (self.device,))
        return self

    def _fill_gpu_tier(self) -> None:
        """Copy the GPU tier's rows in, reading the host table through the gather kernel."""
        temporary = self._pinned is None  # every row resident: read the source through a temporary pin
        pinned = PinnedHost(self._source, self.device, self._read_only, self._progress) if temporary else self._pinned
        try:
            fill_rows(pinned, self.placement.gpu_rows, self._gpu, self.device, self._narrow)
        finally:
            if temporary:
                pinned.release()

    def _gather_split(self, ids: torch.Tensor, out: torch.Tensor, share: float) -> None:
        """Gather CPU ids (int64, in range) into ``out`` with the CPU reading ``share`` of the host rows
        (the cost model's measurement)."""
        with _cuda_context(self.device, None) as stream:
            index = Index(ids.to(self.device, non_blocking=True), (len(ids),), ids)
            _gather_cuda([(self, ids)], [index], [out], [], "sync", self.device, stream, [share])

    # ---- shape and identity -------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self._source.shape[0]

    @property
    def shape(self) -> torch.Size:
        return self._source.shape

    @property
    def row_shape(self) -> torch.Size:
        return self._source.shape[1:]

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def host_dtype(self) -> torch.dtype:
        """The dtype the host tier keeps rows in (narrower than :attr:`dtype` for half-width host rows)."""
        return self._source.dtype

    @property
    def _narrow(self) -> torch.dtype | None:
        return self._source.dtype if self._source.dtype != self._dtype else None

    @property
    def num_gpu_rows(self) -> int:
        return self.placement.num_gpu_rows

    @property
    def read_only(self) -> bool:
        """Whether the source is read-only memory (e.g. a memmap opened with ``mode="r"``)."""
        return self._read_only

    @property
    def source(self):
        """The host table the table reads from (the caller's memory, unless ``copy``/``host_dtype`` made one).

        A torch CPU tensor; for a read-only source, the caller's read-only
        numpy array itself, so that writing to it raises instead of crashing.
        Change rows through ``table[ids] = rows``, which keeps the GPU tier
        in step.
        """
        return self._given if self._read_only else self._source

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ", not built yet (on first use)" if self._deferred else ""
        narrow = f", host_dtype={self.host_dtype}" if self._narrow else ""
        return (f"HybridTensor(shape={tuple(self.shape)}, dtype={self.dtype}{narrow}, device={self.device}, "
                f"gpu_rows={self.num_gpu_rows}, tiers={self.placement.names}{state})")

    # ---- gathering -----------------------------------------------------------
    def gather(self, index, *, out: torch.Tensor | None = None, stream=None, check: str = "deferred") -> torch.Tensor:
        """Rows ``index`` of the table, on ``self.device``.

        ``index``: integer tensor (CPU or CUDA, any shape; int32/int64, or
        another integer dtype, converted), numpy array, list, int, slice or
        bool mask. Returns ``[*index.shape, *row_shape]`` of the table's
        dtype (an int or a 0-d tensor drops the first dimension, like
        ``x[5]``). ``out``: optional contiguous destination of that shape,
        dtype and device. ``stream``: torch CUDA stream to run on (default:
        the current stream); the result is ready on that stream (see the
        module docstring for the stream contract). ``check``: how ids
        already on a GPU are range-checked: ``"deferred"`` (no waiting; a
        bad id raises at a later gather, see :mod:`hmgstore.index`) or
        ``"sync"`` (one device-to-host read; raises here).
        Raises IndexError for ids out of range (CPU ids: before any memory is
        read), TypeError for non-integer indices, ValueError for a bad
        ``out``, RuntimeError for a closed table.
        """
        return gather_many([(self, index)], outs=[out], stream=stream, check=check)[0]

    __getitem__ = gather

    def __setitem__(self, index, value) -> None:
        """Overwrite rows ``index`` with ``value`` (broadcast to ``[len, *row_shape]``), in every tier.

        The host tier is written at once, from the CPU; the GPU tier's copies
        of those rows on the current stream. Gathers in flight that read the
        same rows may see old or new values: synchronise first. Raises
        TypeError for a read-only source or a view of a sharded table,
        IndexError for ids out of range, RuntimeError for a closed table.
        """
        from .index import normalize

        if self._read_only:
            raise TypeError("this table's source is read-only memory (e.g. a memmap opened with mode='r'); "
                            "build it with copy=True to write rows")
        if self._owner is not None:
            raise TypeError(f"this table is a view of {self._owner!r}; write to the table it was built from")
        self._enter()
        try:
            self._ready()
            ids = normalize(index, self.num_rows, torch.device("cpu")).ids
            rows = torch.as_tensor(value).to("cpu", self._dtype).expand(len(ids), *self.row_shape)
            host_rows = rows.to(self._source.dtype).contiguous()
            self._source.index_copy_(0, ids, host_rows)
            if self._pinned is not None and self._pinned.tensor is not self._source:  # a small table's pinned copy
                self._pinned.tensor.index_copy_(0, ids, host_rows)
            if self._gpu is not None and len(ids):
                new = self._map[ids.to(self.device)]
                resident = (new < self.num_gpu_rows).nonzero().flatten()
                self._gpu[new[resident].long()] = host_rows.to(self.device)[resident].to(self._dtype)
        finally:
            self._exit()

    def __iter__(self):
        raise TypeError("iterate over a HybridTensor by indexing it with a batch of ids")

    # ---- statistics ------------------------------------------------------------
    def reset_stats(self) -> None:
        """Start counting (again, from zero) the rows each tier serves and the gathers' time."""
        self._counter = TierCounter(self.placement.names, self.row_bytes, self.device)
        starts = [t.start for t in self.placement.tiers]
        self._tier_starts = torch.tensor(starts, dtype=self.placement.index_dtype, device=self.device)

    def stats(self) -> dict:
        """Rows and bytes served per tier since :meth:`reset_stats`, the GPU hit ratio and GB/s.

        See :mod:`hmgstore.stats` for the fields. Reads the device's counters
        (one synchronisation). Raises RuntimeError when not counting.
        """
        if self._counter is None:
            raise RuntimeError("this table is not counting statistics: call table.reset_stats() to start "
                               "(or build it with stats=True)")
        return self._counter.report()

    def _count(self, job) -> None:
        """Add a CUDA job's rows to the per-tier counters (device work only, no waiting)."""
        ids = job.ids.clamp(0, self.num_rows - 1)  # ids of a deferred check may be out of range (reported later)
        new = ids if self._map is None else self._map[ids]
        self._counter.add(torch.searchsorted(self._tier_starts, new.to(self._tier_starts.dtype), right=True) - 1)

    # ---- lifetime ------------------------------------------------------------
    def _enter(self) -> None:
        """Count a gather in flight on this thread; refuse it if the table is closing."""
        me = threading.get_ident()
        self._users[me] = self._users.get(me, 0) + 1  # only this thread writes its own entry
        if self._closing:
            self._exit()
            raise RuntimeError("this table was closed; build a new HybridTensor")

    def _exit(self) -> None:
        me = threading.get_ident()
        left = self._users[me] - 1
        if left:
            self._users[me] = left
        else:
            del self._users[me]

    def _ready(self) -> None:
        """Raise if a gather cannot read this table now; build it first if it was unpickled."""
        if self._deferred is not None:
            self._build_deferred()
        if self._owner is not None:
            self._owner.check()  # e.g. a sharded table whose peer process died raises here
        if self._host_address is not None and self._source.data_ptr() != self._host_address:
            raise RuntimeError(
                "the source's memory moved after the table was built (resize_() past its size or "
                "share_memory_() on the tensor it was built from); the table cannot read it any more. "
                "Build the table after such changes, and leave its source alone while it is in use")

    def close(self) -> None:
        """Free the GPU tier and unregister the host memory (idempotent).

        Waits for gathers in flight on this table in other threads and
        refuses new ones (RuntimeError), then waits for the table's device,
        so no kernel still reads what is freed.
        """
        if self._closed:
            return
        self._closing = True  # a gather that registers itself from now on sees this and backs out
        me, start, warned = threading.get_ident(), time.monotonic(), False
        while any(t != me for t in list(self._users)):  # list(): one atomic snapshot of the dict
            time.sleep(0.001)
            if not warned and time.monotonic() - start > 10:
                log.warning("hmgstore: close() has waited 10 s for a gather on another thread to finish")
                warned = True
        if self.device.type == "cuda" and torch.cuda.is_available():
            synchronize((self.device,))
        if self._pinned is not None and self._owner is None:
            self._pinned.release()
        self._pinned = self._gpu = self._map = self._owner = None
        self._tiers = ()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- crossing processes ----------------------------------------------------
    def _state(self, for_process: bool) -> dict:
        """What another process rebuilds this table from (see :func:`_reduce`)."""
        source = _sendable_source(self, for_process)
        unusable = None
        if self._owner is not None:
            unusable = (f"this table is a view of {self._owner!r}, whose GPU memory belongs to the process that "
                        "built it; build the sharded table in each process that gathers "
                        "(hmgstore.distributed.shard under torchrun), or gather in the main process "
                        "(PyG: filter_per_worker=False)")
        elif self._deferred is not None:
            unusable = self._deferred.get("unusable")
        return {"source": source, "dtype": self._dtype, "device": str(self.device), "max_sms": self.max_sms,
                "closed": self._closed,
                "gpu_rows": self.placement.gpu_rows if self.placement.num_gpu_rows else None,
                "unusable": unusable}

    def __reduce__(self):
        return _rebuild, (self._state(for_process=False),)

    def _build_deferred(self) -> None:
        with _deferred_lock:
            state = self._deferred
            if state is None:
                return
            if state["unusable"]:
                raise RuntimeError(state["unusable"])
            self._build()
            self._deferred = None


_deferred_lock = threading.Lock()


def _reduce_for_process(table: HybridTensor):
    """How torch's multiprocessing (ForkingPickler: DataLoader workers, queues) sends a table."""
    return _rebuild, (table._state(for_process=True),)


ForkingPickler.register(HybridTensor, _reduce_for_process)


def _sendable_source(table: HybridTensor, for_process: bool):
    """The table's source, in a form that is safe and cheap to send.

    - A memmap travels as its file name and is opened again (no copy).
    - torch's multiprocessing moves a tensor's memory into shared memory in
      place, unless it is shared already; that would pull pinned pages out
      from under this table (its kernels would read freed memory), so a
      pinned source that is not shared travels as a copy.
    - Otherwise the source itself (plain pickle copies its bytes).
    """
    given = table._given
    if isinstance(given, np.memmap) and given.filename is not None and given.flags.c_contiguous:
        return _MemmapSpec.of(given)
    source = table._source
    pinned = table._pinned is not None and (table._pinned.registered or table._pinned.owner_pinned)
    if for_process and pinned and not source.is_shared():
        if source.nbytes >= 1 << 30:
            log.warning("hmgstore: sending a CUDA table to another process copies its %.2f GB host source; use "
                        "the fork start method, or source.share_memory_() before building the table",
                        source.nbytes / 1e9)
        return source.clone()
    return given if isinstance(given, np.ndarray) else source


class _MemmapSpec:
    """A memmap's file, layout and mode, to open it again in another process."""

    def __init__(self, filename, dtype, shape, offset, mode, order):
        self.filename, self.dtype, self.shape, self.offset, self.mode, self.order = \
            filename, dtype, shape, offset, mode, order

    @classmethod
    def of(cls, array: np.memmap) -> "_MemmapSpec":
        base = array
        while isinstance(base.base, np.memmap):
            base = base.base
        # Offset of this view from the file's start: the memmap's own offset plus the view's.
        view_offset = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        mode = {"w+": "r+", "write": "r+"}.get(array.mode, array.mode)  # never truncate the file again
        return cls(array.filename, array.dtype, array.shape, base.offset + view_offset, mode, "C")

    def open(self) -> np.memmap:
        return np.memmap(self.filename, dtype=self.dtype, mode=self.mode, offset=self.offset, shape=self.shape,
                         order=self.order)


def _rebuild(state: dict) -> HybridTensor:
    """A table from :meth:`HybridTensor._state`: checked now, built (CUDA memory, pinning) on first use."""
    source = state["source"]
    if isinstance(source, _MemmapSpec):
        source = source.open()
    table = HybridTensor.__new__(HybridTensor)
    table._setup(source, resolve_device(state["device"]), state["max_sms"], False, dtype=state["dtype"])
    table.placement = placement_mod.for_table(table.num_rows, table.row_bytes, table.device,
                                              gpu_rows=state["gpu_rows"])
    if state["closed"]:
        table._closing = table._closed = True
    elif table.device.type == "cuda" or state["unusable"]:
        table._deferred = state
    return table


# ---- the work behind gather_many ----------------------------------------------
def _page_shift(table: HybridTensor) -> int:
    """log2 of the rows per ~2 MiB of the table's host tier: the groups a gather's ids are ordered in."""
    from .cuda import order

    return order.bucket_shift(table._pinned.pitch if table._pinned is not None else table.row_bytes)


def _job(table: HybridTensor, index: Index, out: torch.Tensor, prepared: dict, checked: bool):
    """The kernel job for one table's ids. Runs on the current stream.

    ``prepared`` caches narrowed/grouped ids per index within one batch, so
    features and labels indexed by the same ids convert and group them once
    (grouped by host page: :mod:`hmgstore.cuda.order`).
    Ids not ``checked`` yet (the kernel checks them) are never narrowed,
    which could wrap a bad id into range.
    """
    from .cuda import gather, order

    narrow = table.placement.index_dtype if checked else index.ids.dtype
    shift = _page_shift(table) if table._sort_ids and table._reads_host and len(index.ids) > 1 else None
    key = (id(index), narrow, shift)  # tables with the same bucket size share a grouping
    if key not in prepared:
        ids = index.ids if index.ids.dtype == narrow else index.ids.to(narrow)  # checked ids cannot wrap
        perm = None
        if shift is not None:
            ids, perm = order.group_by_page(ids, table.num_rows, shift)
        prepared[key] = (ids, perm)
    ids, perm = prepared[key]
    return gather.Job(ids, perm, out, table._map, table.num_rows, table.row_bytes, table._tiers)


def fill_rows(pinned: PinnedHost, rows: torch.Tensor, out: torch.Tensor, device: torch.device,
              stored: torch.dtype | None = None) -> None:
    """``out[i] = source[rows[i]]`` on ``device``, reading the pinned source with the gather kernel; waits.

    ``rows``: ids in range (they come from a placement); ``stored``: the
    source's dtype when narrower than ``out``'s (widened on the way).
    """
    from .cuda import gather

    if not len(rows):
        return
    num_rows = pinned.tensor.shape[0]
    host = placement_mod.host_only(num_rows)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        ids = rows.to(device, host.index_dtype)
        tiers = [host.tier("host").bind(pinned.address, pinned.pitch, stored)]
        row_bytes = out[0].numel() * out.element_size()
        gather.launch_gather([gather.Job(ids, None, out, None, num_rows, row_bytes, tiers)], device, stream, None)
        stream.synchronize()


def _check_narrow(dtype: torch.dtype, host_dtype: torch.dtype) -> None:
    from .cuda.gather import NARROW

    if dtype != torch.float32 or host_dtype not in NARROW:
        raise ValueError(f"half-width host rows keep a float32 table in {' or '.join(map(str, NARROW))}; "
                         f"got a {dtype} table with host_dtype={host_dtype}")


def _check_out(out: torch.Tensor, shape, dtype, device) -> None:
    shape = torch.Size(shape)
    if out.shape != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous tensor of shape {tuple(shape)}, dtype {dtype} on {device}; "
            f"got shape {tuple(out.shape)}, dtype {out.dtype} on {out.device}"
            f"{'' if out.is_contiguous() else ', not contiguous'}")


def _check_requests(requests, outs) -> torch.device:
    for table, _ in requests:
        if not isinstance(table, HybridTensor):
            raise TypeError(
                f"gather_many takes (HybridTensor, index) pairs, got {type(table).__name__}; wrap a plain "
                "tensor once, hmgstore.HybridTensor(x, device), and gather from the table")
    device = requests[0][0].device
    for table, _ in requests:
        if table.device != device:
            raise ValueError(f"all tables of one gather_many must share a device: {device} and {table.device}")
    given = [out for out in outs if out is not None]
    if len({out.data_ptr() for out in given if out.numel()}) != len([o for o in given if o.numel()]):
        raise ValueError("the same out buffer is given for two requests; give each its own")
    return device


def gather_many(requests: Sequence[tuple[HybridTensor, object]], *, outs=None, stream=None,
                check: str = "deferred") -> list[torch.Tensor]:
    """Gather from several tables at once: ``[table[index] for table, index in requests]``.

    Every table must be on the same device. On CUDA, all gathers run in one
    kernel launch on ``stream`` (default: the current stream), which is what
    makes a batch's features, labels and node types cost one launch. ``outs``,
    if given, is a list of destinations (or None) matching ``requests``, each
    its own buffer. Every index is validated before it is read, so a bad
    index in any request raises (IndexError/TypeError) without reading
    memory; ids already on a GPU are checked as ``check`` says (see
    :meth:`HybridTensor.gather`), and an earlier gather's bad GPU id found
    since is raised here first.
    """
    from . import index as index_mod

    requests = list(requests)
    outs = [None] * len(requests) if outs is None else list(outs)
    if len(outs) != len(requests):
        raise ValueError(f"outs has {len(outs)} entries for {len(requests)} requests")
    if not requests:
        return []
    device = _check_requests(requests, outs)
    if device.type == "cuda":
        index_mod.raise_deferred(device, wait=False)  # finished launches only: no waiting
    tables = list({id(t): t for t, _ in requests}.values())
    entered = []
    try:
        for table in tables:
            table._enter()
            entered.append(table)
            table._ready()
        context = contextlib.nullcontext() if device.type == "cpu" else _cuda_context(device, stream)
        with context as stream:
            indices, pending = prepare_many([(index, table.num_rows) for table, index in requests], device, check)
            results = []
            for (table, _), index, out in zip(requests, indices, outs):
                if out is None:
                    out = torch.empty((len(index.ids), *table.row_shape), dtype=table.dtype, device=device)
                else:
                    _check_out(out, (*index.shape, *table.row_shape), table.dtype, device)
                    out = out.view(len(index.ids), *table.row_shape)
                results.append(out)
            counting = [t for t in tables if t._counter is not None]
            started = [t._counter.start() for t in counting]
            if device.type == "cpu":
                check_pending(pending)
                for (table, _), index, out in zip(requests, indices, results):
                    if table._narrow:
                        out.copy_(torch.index_select(table._source, 0, index.ids))
                    else:
                        torch.index_select(table._source, 0, index.ids, out=out)
                    if table._counter is not None:
                        table._counter.rows[-1] += len(index.ids)  # a CPU table is its host tier
            else:
                _gather_cuda(requests, indices, results, pending, check, device, stream)
            for table, start in zip(counting, started):
                table._counter.stop(start)
    finally:
        for table in entered:
            table._exit()
    return [out.view((*index.shape, *table.row_shape)) for (table, _), index, out in zip(requests, indices, results)]


def _gather_cuda(requests, indices, results, pending, check, device, stream, shares=None) -> None:
    """Queue one launch for every request on ``stream``, and the CPU's share of split tables' rows.

    ``shares``: per request, the CPU's share of the split gather, or None
    to use each table's own setting.
    """
    from . import index as index_mod
    from . import split as split_mod
    from .cuda import gather

    prepared = {}
    unchecked = {id(ids) for ids, _, _ in pending} if check == "deferred" else set()
    if shares is None:  # each table's own (an "auto" table's first batch of a size class measures it here)
        shares = [None if index.host is None or table._split is None else table._split_share(len(index.host))
                  for (table, _), index in zip(requests, indices)]
    jobs, parts = [], []
    for (table, _), index, out, share in zip(requests, indices, results, shares):
        job, part = (None, None) if not share or index.host is None else _split_job(table, index, out, share, stream)
        jobs.append(job or _job(table, index, out, prepared, id(index.ids) not in unchecked))
        if part is not None:
            parts.append((table, part, out))
    caps = [t.max_sms for t, _ in requests if t.max_sms]
    packed = gather.pack(jobs, device)
    record = None
    if check == "sync":
        check_pending(pending)  # the range check's read-back, after the host work it overlaps
    elif pending and packed is not None:
        record = index_mod.error_record(device)
    gather.run(packed, device, stream, min(caps) if caps else None, record)
    if record is not None:
        described = [(requests[k][0].num_rows, f"a table of shape {tuple(requests[k][0].shape)}")
                     for k in packed.kept]
        index_mod.deferred(device, stream, record, described)
    for table, part, out in parts:  # the CPU's rows, read while the kernel runs
        split_mod.finish(part, out, stream)
        if table._counter is not None:
            table._counter.rows[-1] += len(part.ids)  # served by the host tier, through the CPU
    for (table, _), job in zip(requests, jobs):
        if table._counter is not None:
            table._count(job)


def _split_job(table: HybridTensor, index: Index, out: torch.Tensor, share: float, stream):
    """The kernel's job and the CPU's part of a split gather, or ``(None, None)`` when too few rows."""
    from . import split as split_mod
    from .cuda import gather, order

    k, cpu, rest = split_mod.divide(index.host, table._on_host(), share)
    if not k:
        return None, None
    part = split_mod.CpuPart((index.host[:k] if cpu is None else index.host[cpu]).to(torch.int64), cpu)
    split_mod.start(part, table._source, out, stream)
    if rest is None:  # every row on the host: the kernel reads positions k..n
        ids, positions = index.ids[k:], torch.arange(k, len(index.ids), device=table.device)
    else:
        positions = rest.to(table.device, non_blocking=True)
        ids = index.ids[positions]
    ids = ids.to(table.placement.index_dtype)  # CPU ids: checked, cannot wrap
    perm = positions
    if table._sort_ids and len(ids) > 1:
        ids, by_page = order.group_by_page(ids, table.num_rows, _page_shift(table))
        perm = positions if by_page is None else positions[by_page]
    return gather.Job(ids, perm, out, table._map, table.num_rows, table.row_bytes, table._tiers), part


@contextlib.contextmanager
def _cuda_context(device: torch.device, stream):
    """Run on ``device`` with ``stream`` (default: its current stream) current, so every
    allocation and copy of the gather is ordered on that one stream."""
    if stream is not None and stream.device != device:
        raise ValueError(f"stream is on {stream.device} but the tables are on {device}")
    with torch.cuda.device(device):
        stream = stream if stream is not None else torch.cuda.current_stream(device)
        with torch.cuda.stream(stream):
            yield stream
