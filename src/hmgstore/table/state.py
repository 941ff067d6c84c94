"""The table's state and lifecycle: :class:`Table`, what every :class:`hmgstore.HybridTensor` is.

A table of ``N`` rows is built from a host source (torch CPU tensor, numpy array or memmap) and a
:class:`~hmgstore.rows.placement.Placement`. On a GPU, :meth:`Table._build` copies the resident rows into a GPU
tier, pins the source (or the owned copy made of it) as the host tier, and binds each tier to its address: the
kernel's view of the table, which other layers read through properties. On the CPU every row is read from the
source.

Lifecycle. Gathers register themselves per thread (:meth:`Table._enter`); :meth:`Table.close` waits for those in
flight in other threads, refuses new ones, waits for the device, then frees the GPU tier and the host registration,
so no kernel still reads what it frees. A table sent to another process (:meth:`Table.sent_state`) is rebuilt there
(:meth:`Table.rebuilt`) and builds its CUDA parts on first use (:meth:`Table._ready`).

The gathering API (indexing, writes, statistics, ``gather_many``) is :class:`hmgstore.HybridTensor`.
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TypeVar

import torch

from .. import cuda
from ..cuda.runtime import synchronize
from ..gather import cpu_share, plan
from ..memory import owned
from ..memory.pinned import PinnedHost, as_host_tensor, row_layout
from ..rows import checks, file_identity, formats
from ..rows.placement import Placement, Tier, check_layout, for_table
from ..util.device import resolve_device
from . import pickling

log = logging.getLogger(__name__)
_T = TypeVar("_T", bound="Table")  # from_tiers makes the class it is called on


class Table:
    """A table's rows, where they live and whether it may be read; built as :class:`hmgstore.HybridTensor`."""

    placement: Placement  # where each row lives (set by the subclass's constructor, or by from_tiers)
    def _setup(self, source, device: torch.device, max_sms, progress, *, copy=False, host_format=None,
               gpu_format=None, backing="auto", dtype=None, shape=None, layout=None) -> None:
        """Take ``source`` as the host tier. A table's own source is copied (``copy``, or encoded in ``host_format``, a
        :class:`~hmgstore.rows.formats.Format`) into owned memory. ``dtype``: the table's dtype when ``source`` is
        already a stored host tier (rebuilt, loaded or empty tables) in ``host_format`` (16-bit formats are also
        recognised by their dtype), of table shape ``shape`` (needed for scaled formats). ``gpu_format``: the GPU
        tier's format (None: the table's dtype). ``layout``: old ids in the order the host tier keeps them (a
        permutation); a table's own source is copied in that order, a stored host tier is in it already.
        """
        self.device = device
        if backing not in owned.BACKINGS:  # checked even where nothing is copied: a misspelt value is not ignored
            raise ValueError(f"backing must be one of {owned.BACKINGS}, got {backing!r}")
        self._given = source  # what the caller passed: a read-only array is handed back as it is
        self._source, self._read_only = as_host_tensor(source)  # a memmap cut short raises: not SIGBUS in a copy
        checks.table_dtype(self._source.dtype if dtype is None else dtype)  # before any copy, write or pickle
        row_layout(self._source)  # unusable layouts raise before any copy
        if layout is not None:  # our own copy: the map of ids to host rows is built from it on first read
            layout = check_layout(layout, self._source.shape[0] if shape is None else shape[0]).clone()
        if dtype is None:  # the caller's own table: rows as they read
            self._dtype, self._shape = self._source.dtype, tuple(self._source.shape)
            formats.check_table(self._dtype, host_format)
            if host_format is not None or copy or layout is not None:
                fmt = host_format
                stored = owned.empty(fmt.stored_shape(self._shape) if fmt else self._shape,
                                     fmt.stored_dtype() if fmt else self._dtype, backing, device, zero=False)
                what = f"encoding host tier as {fmt.name}" if fmt else "copying into host tier"
                self._source = owned.copy_in(stored, self._source, progress,
                                             what + (" in layout order" if layout is not None else ""),
                                             encode=fmt.encode if fmt else None, order=layout)
                self._given, self._read_only = self._source, False
        else:  # already the stored host tier
            self._dtype = dtype
            host_format, self._shape = formats.of_host_tier(self._source, dtype, shape, host_format)
        if gpu_format is not None and gpu_format != host_format:
            raise ValueError(f"the GPU tier stores rows as the host tier does ({host_format}), not as {gpu_format}")
        self._format, self._gpu_format, self._file = host_format, gpu_format, file_identity.watch(self._given)
        self._layout = layout
        self._host_pos: torch.Tensor | None = None  # host position of each old id, once asked for (see host_positions)
        self.row_bytes = math.prod(self._shape[1:]) * torch.empty(0, dtype=self._dtype).element_size()
        self.max_sms = checks.sm_cap(max_sms)  # what Pipeline takes, but "auto"
        self._progress = progress
        self._pinned: PinnedHost | None = None
        self._gpu: torch.Tensor | None = None
        self._map: torch.Tensor | None = None
        self._tiers: tuple[Tier, ...] = ()  # bound to this device's addresses
        self._reads_host = False
        self._host_address: int | None = None  # the source's address when the host tier is the source itself
        self._owner = None  # an owner whose memory this view reads (it frees it, not the view)
        self._deferred: dict | None = None  # why and how the table is built on first use (after unpickling)
        self.sort_ids = True  # host reads grouped by page (cuda/order.py); the tuning script turns it off
        self._closing = self._closed = False
        self._users: dict[int, int] = {}  # thread id -> gathers in flight on this table

    def _build(self) -> None:
        p = self.placement
        self._reads_host = p.has_host_tier
        if self.device.type != "cuda":
            return
        cuda.check_device(self.device)
        # Whenever the table goes, wait for kernels that may still read its memory.
        weakref.finalize(self, synchronize, (self.device,))
        try:
            with torch.cuda.device(self.device):
                tiers = []
                if p.has_host_tier:
                    self._pinned = PinnedHost(self._source, self.device, self._read_only, self._progress)
                if p.num_gpu_rows or p.host_layout is not None:  # rows renumbered: a GPU tier or a host layout
                    self._map = p.new_of_old(self.device, p.index_dtype)
                if p.num_gpu_rows:
                    fmt = self._gpu_format
                    shape = (p.num_gpu_rows, *self.row_shape)
                    self._gpu = torch.empty(fmt.stored_shape(shape) if fmt else shape,
                                            dtype=fmt.stored_dtype() if fmt else self.dtype, device=self.device)
                    self._fill_gpu_tier(self._gpu)
                    tiers.append(p.tier("gpu").bind(self._gpu.data_ptr(), self.gpu_row_bytes, fmt))
                if self._pinned is not None:
                    tiers.append(p.tier("host").bind(self._pinned.address, self._pinned.pitch, self._format))
                    self._host_address = self._pinned.address if self._pinned.tensor is self._source else None
                self._tiers = tuple(tiers)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_tiers(cls: type[_T], source, device, placement: Placement, tiers: Sequence[Tier], *, owner,
                   pinned: PinnedHost | None = None, unreachable=(), max_sms: int | None = None, stored=None,
                   shape=None, read_only: bool = False, given=None) -> _T:
        """A view over tiers that ``owner`` built and frees (a table sharded over several GPUs).

        ``tiers``: the resident tiers ``device`` reads, bound to their addresses as seen from it
        (:meth:`hmgstore.rows.placement.Tier.bind`); ``pinned``: the source pinned for ``device``, when some rows are
        read from the host; ``unreachable``: resident tiers ``device`` cannot read, whose rows it reads from the host;
        ``stored``: the :class:`~hmgstore.rows.formats.Format` every tier keeps rows in (``source`` is then that stored
        host tier of a float32 table of ``shape``), or None. ``owner`` must have ``check()``, which a gather calls
        first, raising when the view cannot be read; the view's :meth:`close` leaves the memory to the owner. On the
        CPU, pass ``tiers=()``. ``read_only``: the owner's source is read-only memory (a memmap opened with
        ``mode="r"``), which the torch tensor ``source`` cannot tell: the view refuses writes and copies ``dense()``;
        ``given``: then the caller's read-only array, which :attr:`source` hands out (a write to it raises)."""
        self = cls.__new__(cls)
        if stored is None:
            self._setup(source, resolve_device(device), max_sms, False)
        else:
            self._setup(source, resolve_device(device), max_sms, False, host_format=stored, gpu_format=stored,
                        dtype=torch.float32, shape=shape)
        self.placement, self._owner, self._pinned = placement, owner, pinned
        self._read_only = self._read_only or read_only
        self._given = given if read_only and given is not None else self._source
        bound = {t.name: t for t in tiers}
        if pinned is not None:
            bound["host"] = placement.tier("host").bind(pinned.address, pinned.pitch, stored)
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

    def host_positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Where old row ids ``ids`` (int64 CPU, in range) are in the host tier: themselves, or their layout places."""
        if self._layout is None:
            return ids
        if self._host_pos is None:  # the layout is a permutation, checked at build: every position is written
            self._host_pos = checks.inverse(self._layout)
        return self._host_pos[ids]

    @property
    def layout(self) -> torch.Tensor | None:
        """Old ids in the order the host tier keeps its rows (int64 CPU; a copy: the table reads through its
        own), or None for id order."""
        return None if self._layout is None else self._layout.clone()

    def _fill_gpu_tier(self, gpu: torch.Tensor) -> None:
        """Copy the GPU tier's rows in through the gather kernel: stored rows as they are, or decoded."""
        temporary = self._pinned is None  # every row resident: read the source through a temporary pin
        pinned = self._pinned or PinnedHost(self._source, self.device, self._read_only, self._progress)
        try:
            decode = None if self._gpu_format is not None else self._format
            plan.fill_rows(pinned, self.host_positions(self.placement.gpu_rows), gpu, self.device, decode)
        finally:
            if temporary:
                pinned.release()

    # ---- shape and identity -------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self._shape[0]

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._shape)

    @property
    def row_shape(self) -> torch.Size:
        return torch.Size(self._shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def host_dtype(self) -> torch.dtype:
        """The dtype of the values the host tier keeps (narrower than :attr:`dtype` in a stored format)."""
        return self._format.element if self._format is not None else self._dtype

    @property
    def host_format(self):
        """The :class:`~hmgstore.rows.formats.Format` of the host tier's rows, or None when kept as they read."""
        return self._format

    @property
    def gpu_format(self):
        """The :class:`~hmgstore.rows.formats.Format` of the GPU tier's rows, or None when kept as they read."""
        return self._gpu_format

    @property
    def gpu_row_bytes(self) -> int:
        """Bytes of GPU memory a resident row takes (its stored size with ``compress``)."""
        fmt = self._gpu_format
        return self.row_bytes if fmt is None else fmt.pitch(math.prod(self._shape[1:]))

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

        A torch CPU tensor; for a read-only source, the caller's read-only numpy array itself, so that writing to
        it raises instead of crashing. Change rows through ``table[ids] = rows``, which keeps the GPU tier in step.
        Its rows are in the host tier's order: with a ``layout``, row ``i`` holds id ``layout[i]``, not id ``i``
        (``table[ids]`` answers by id); in a stored format (``compress``, ``host_dtype``), they are encoded.
        """
        return self._given if self._read_only else self._source

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` has begun: new gathers are refused."""
        return self._closing

    # ---- the gather's view: what hmgstore.gather and the topology read; only this class sets it --------------
    @property
    def host_tier(self) -> torch.Tensor:
        """The host tier as stored: the source, or the owned copy made of it (encoded, or in layout order)."""
        return self._source

    @property
    def pinned(self) -> PinnedHost | None:
        """The host tier's registration for zero-copy reads; None on the CPU or before the table is built."""
        return self._pinned

    @property
    def row_map(self) -> torch.Tensor | None:
        """Each old id's place in the tiers' order (hot rows first), on the device; None: ids are places."""
        return self._map

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """The tiers, bound to this device's addresses: what the gather kernel reads."""
        return self._tiers

    @property
    def reads_host(self) -> bool:
        """Whether a gather reads some rows from host memory."""
        return self._reads_host

    @property
    def gpu_tier(self) -> torch.Tensor | None:
        """The GPU tier's rows as stored (slot order, on the device), or None without one."""
        return self._gpu

    @property
    def owner(self):
        """The table whose memory this view reads and frees (a sharded table), or None for a table of its own."""
        return self._owner

    def sent_state(self, for_process: bool) -> dict:
        """What another process rebuilds this table from (:func:`hmgstore.table.pickling.state_of`)."""
        return pickling.state_of(self, self._given, self.why_not_sendable(), for_process)

    @classmethod
    def rebuilt(cls: type[_T], state: dict) -> _T:
        """A table from :meth:`sent_state`'s ``state``: checked now, built (CUDA memory, pinning) on first use."""
        table = cls.__new__(cls)  # HybridTensor's constructor places and builds at once
        table._setup(pickling.source_of(state), resolve_device(state["device"]), state["max_sms"], False,
                     dtype=state["dtype"], shape=state["shape"], host_format=formats.get(state["format"]),
                     gpu_format=formats.get(state["gpu_format"]), layout=state["layout"])
        table.placement = for_table(table.num_rows, table.gpu_row_bytes, table.device, gpu_rows=state["gpu_rows"],
                                    host_layout=table.layout)
        table._read_only = table._read_only or state.get("read_only", False)  # as sent: a copy of read-only rows
        if state["closed"]:
            table._closing = table._closed = True
        elif table.device.type == "cuda" or state["unusable"]:
            table._deferred = state
        return table

    def why_not_sendable(self) -> str | None:
        """Why a copy of this table in another process could not gather (None: it can), in that process's words."""
        if self._owner is not None:
            return (f"this table is a view of {self._owner!r}, whose GPU memory belongs to the process that built "
                    "it; build the sharded table in each process that gathers (hmgstore.distributed.shard under "
                    "torchrun), or gather in the main process (PyG: filter_per_worker=False)")
        return self._deferred.get("unusable") if self._deferred is not None else None

    @contextlib.contextmanager
    def reading(self):
        """Hold the table for one gather on this thread: refused once closing, built on first use."""
        self._enter()
        try:
            self._ready()
            yield self
        finally:
            self._exit()

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ", not built yet (on first use)" if self._deferred else ""
        kind = "compress" if self._gpu_format is not None else "host_dtype"
        narrow = "" if self._format is None else f", {kind}={self._format.name!r}"
        return (f"HybridTensor(shape={tuple(self.shape)}, dtype={self.dtype}{narrow}, device={self.device}, "
                f"gpu_rows={self.num_gpu_rows}, tiers={self.placement.names}{state})")

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
        if self._file is not None:  # a memmap's file: one fstat, so a file cut short raises here, not SIGBUS
            self._file.check()  # before a deferred build, which reads rows (a small source's pinned copy)
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
        """Free the GPU tier and unregister the host memory (idempotent), once no thread or kernel reads them.

        Waits for gathers in flight in other threads and refuses new ones (RuntimeError), then for split gathers'
        CPU reads still queued (``overlap_reads``) and the table's device."""
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
            cpu_share.settle(self.device)
        if self._pinned is not None and self._owner is None:
            self._pinned.release()
        self._pinned = self._gpu = self._map = self._owner = self._file = None
        self._tiers = ()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _build_deferred(self) -> None:
        with _deferred_lock:
            state = self._deferred
            if state is not None and state["unusable"]:
                raise RuntimeError(state["unusable"])
            if state is not None:
                self._build()
                self._deferred = None


_deferred_lock = threading.Lock()
