"""HybridTensor: one logical [N, ...] table whose rows live in several tiers.

A table is built from a host source (torch CPU tensor, numpy array or
memmap). On a CUDA device, chosen rows are copied into a GPU-resident tier
and the source is pinned in place as the host tier; ``table[idx]`` returns a
CUDA tensor gathered in one kernel launch, whichever tiers the ids hit. On
the CPU the same API gathers with ``torch.index_select``; results are
bit-identical either way.

``gather_many`` fuses the gathers of several tables (features, labels, node
types of a batch) into one launch; adapters call it once per batch.

This module is the public API and its validation: the public functions
check their arguments, then :mod:`hmgstore.gather.plan` does the work (jobs, the
one launch). The table's state and lifecycle are :mod:`hmgstore.table.state`, the
split CPU+GPU gather :mod:`hmgstore.gather.cpu_share`, and what a table sends to
another process :mod:`hmgstore.table.pickling`.

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

import logging
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler

import torch

from ..cuda.deferred import raise_deferred
from ..gather import cpu_share, fusion, plan
from ..memory import owned
from ..rows import checks, formats
from ..rows.ids import CHECKS, normalize, rows_only
from ..rows.placement import for_table
from ..rows.stats import TierCounter
from ..util.device import resolve_device
from . import pickling
from .state import Table

log = logging.getLogger(__name__)


class HybridTensor(Table):
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
            rows (int or ``"8GB"``), filled hottest first by ``hot_order`` or
            ``hotness``; with neither, in id order (the first rows that fit).
            ``"auto"``: the lesser of the whole table and half the GPU's free
            memory (:func:`hmgstore.rows.hotness.resolve_budget`); None (default):
            every row in the host tier.
        hot_order: row ids hottest first, used with ``gpu_budget``: integers,
            each in range and listed at most once (every id is checked, not
            only those the budget takes; float ids raise TypeError).
        hotness: instead of ``hot_order``, a score per row (``[N]``, any real
            dtype, higher is hotter: in-degree, access counts), ordered with
            :func:`hmgstore.hotness.order_by_score`.
        max_sms: cap the gather at this many SMs' worth of resident blocks, so
            that concurrent training kernels keep the rest of the GPU.
        progress: show a progress bar while pinning or copying large tables.
        stats: count rows and time per tier from the start (see :meth:`stats`).
        copy: copy the source into host memory hmgstore allocates (see
            ``backing``) instead of pinning it in place. Costs a copy and the
            memory of one; small-row tables read up to 1.4x faster from such
            memory, and forked DataLoader workers share it where a table
            pinned in place is copied into each of them (docs/host-memory.md,
            "Which host memory").
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
        compress: ``"int8"``, ``"float8"``, ``"bfloat16"`` or ``"float16"``
            to keep a float32 table's rows in that stored format in BOTH
            tiers (int8: about 4x the resident rows per GPU byte and 4x
            fewer bytes over PCIe; :mod:`hmgstore.rows.formats` gives each
            format's error); gathers decode to float32. Exclusive with a
            different ``host_dtype``.
        layout: old ids in the order the host tier keeps its rows (a
            permutation of ``range(N)``, e.g. hottest first, or
            :mod:`hmgstore.graph.locality`'s orders): rows read in few host
            pages read faster. The source is copied in that order; ids
            stay the caller's.
        split: let the CPU read part of each batch's host rows while the
            kernel reads the rest (:mod:`hmgstore.gather.cpu_share`):
            ``"auto"`` (CPU ids only) measures both paths on this kind of
            table at the first batch of each size class and caches the
            share; a float in ``(0, 1]`` fixes the CPU's share of host-tier
            rows, GPU ids included (read back once; ``1.0`` keeps the
            gather off the SMs, but its torch calls take the GIL from a
            training thread: see ``docs/host-memory.md``); None (default)
            reads every row with the kernel. The CPU reads use torch's
            intra-op threads (``set_split(threads=)`` caps them).

    On the CPU, ``gpu_rows``/``gpu_budget`` are checked the same way, then
    every row is read from the source, so the same code runs with and
    without a GPU.

    Raises TypeError/ValueError for unusable sources and placements,
    IndexError for placement ids out of range, RuntimeError when CUDA is
    asked for without a GPU, ImportError when CuPy is missing.
    """

    def __init__(self, source, device=None, *, gpu_rows=None, gpu_budget=None, hot_order=None, hotness=None,
                 max_sms: int | None = None, progress: bool = True, stats: bool = False, copy: bool = False,
                 host_dtype=None, compress=None, layout=None, backing: str = "auto", split=None):
        host_format, gpu_format = formats.for_tiers(host_dtype, compress)
        self._setup(source, resolve_device(device), max_sms, progress, copy=copy, host_format=host_format,
                    gpu_format=gpu_format, backing=backing, layout=layout)
        self._place_and_build(gpu_rows=gpu_rows, gpu_budget=gpu_budget, hot_order=hot_order, hotness=hotness,
                              stats=stats, split=split)

    def _place_and_build(self, gpu_rows=None, gpu_budget=None, hot_order=None, hotness=None, stats=False,
                         split=None) -> None:
        """Decide the placement (a GPU budget counts stored bytes), build the tiers, then the statistics and split
        settings."""
        self.placement = for_table(self.num_rows, self.gpu_row_bytes, self.device, gpu_rows=gpu_rows,
                                   gpu_budget=gpu_budget, hot_order=hot_order, hotness=hotness,
                                   host_layout=self._layout)
        self._build()
        if stats:
            self.reset_stats()
        self.set_split(split)

    def set_split(self, split, threads: int | None = None) -> None:
        """Set the split gather (see :mod:`hmgstore.gather.cpu_share`), as the ``split`` argument does.

        ``"auto"`` reads the cost model from the cache, or measures it at the
        first batch of each size class (a second or two, once) and caches it;
        a float in ``[0, 1]`` fixes the CPU's share of host-tier rows; None
        turns the split off. ``threads``: torch's
        intra-op threads for the CPU's reads (None: ``torch.get_num_threads()``; set in the
        reader thread for its reads only, then set back). Raises ValueError for other values."""
        setting = None if split is None else cpu_share.Setting(split, plan.gather_with_share, threads)
        if setting is not None:
            setting.skipped = self.split_skipped  # the count goes on across settings
        if setting is None or not setting.value or self.device.type != "cuda" or not self._reads_host:
            setting = None  # every row is read on the CPU already, or none from the host
        self._split = setting

    @property
    def split_skipped(self) -> int:
        """Batches that ``split="auto"`` read with the kernel alone because other processes left too few idle
        cores (see :mod:`hmgstore.gather.cpu_share`)."""
        return self._split.skipped if self._split is not None else 0

    @classmethod
    def empty(cls, shape, dtype: torch.dtype = torch.float32, device=None, *, host_dtype=None, compress=None,
              backing: str = "auto", **kwargs) -> HybridTensor:
        """A table of ``shape`` whose host tier is owned memory (see ``backing``), for the caller to fill.

        Rows start as zeros. Write them with
        ``table[ids] = rows`` (or slices), which also updates the GPU tier's
        copies. ``host_dtype``, ``compress``, ``backing`` and the placement
        arguments (``gpu_rows``, ``gpu_budget`` with ``hot_order`` or ``hotness``,
        ``max_sms``, ``stats``, ``progress``) are as for the constructor.
        """
        device = resolve_device(device)
        host_format, gpu_format = formats.for_tiers(host_dtype, compress)
        shape = checks.shape(shape)  # integers >= 0: a float size is refused, never truncated
        if host_format is None:
            host = owned.empty(shape, dtype, backing, device)
        else:  # zero bytes are zero rows in every format (a scaled row's scale 0 decodes to 0)
            host = owned.empty(host_format.stored_shape(shape), host_format.stored_dtype(), backing, device)
        return cls.over_host_tier(host, device, dtype, fmt=host_format, shape=shape, gpu_format=gpu_format, **kwargs)

    @classmethod
    def over_host_tier(cls, host: torch.Tensor, device, dtype: torch.dtype, *, fmt=None, shape=None,
                       gpu_format=None, layout=None, max_sms=None, progress=True, **placement) -> HybridTensor:
        """A table over ``host``, a host tier already in its stored form, used in place (no copy).

        Rows read as ``dtype``. ``fmt``: the stored :class:`~hmgstore.rows.formats.Format` (None: rows as
        they read); ``shape``: the table's shape (needed for scaled formats); ``gpu_format``: the GPU
        tier's format; ``layout``: the old ids in the order ``host`` keeps them. The placement arguments
        (``gpu_rows``, ``gpu_budget``, ...) are the constructor's. What :func:`hmgstore.load` and
        :meth:`empty` build tables with.
        """
        self = cls.__new__(cls)
        self._setup(host, resolve_device(device), max_sms, progress, host_format=fmt, gpu_format=gpu_format,
                    dtype=dtype, shape=shape, layout=layout)
        self._place_and_build(**placement)
        return self

    def dense(self) -> torch.Tensor:
        """The whole table as a CPU tensor of :attr:`shape` and :attr:`dtype`.

        The host tier itself (no copy) when it keeps rows as they read, in id
        order, and is writable; a copy when it keeps a stored format or a
        layout, or is read-only. For PyG's whole-table reads and for checks.
        Raises RuntimeError for a closed table.
        """
        if self._closing:
            raise RuntimeError("this table was closed; build a new HybridTensor")
        host = self._source if self._layout is None else self._source[self.host_positions(torch.arange(self.num_rows))]
        if self._format is not None:
            return self._format.decode(host, self.row_shape)
        return host.clone() if self._read_only and host is self._source else host

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
        bad id raises at a later gather, see :mod:`hmgstore.rows.ids`) or
        ``"sync"`` (one device-to-host read; raises here).
        Raises IndexError for ids out of range (CPU ids: before any memory is
        read), TypeError for non-integer indices, ValueError for a bad
        ``out``, RuntimeError for a closed table.
        """
        if (self.device.type == "cpu" and type(index) is torch.Tensor and index.device.type == "cpu"
                and index.dtype in (torch.int64, torch.int32) and index.dim() and index.layout == torch.strided
                and check in CHECKS):  # the common CPU case, without gather_many's per-batch set-up
            self._enter()
            try:
                self._ready()
                return plan.gather_cpu(self, index, out)
            finally:
                self._exit()
        return gather_many([(self, index)], outs=[out], stream=stream, check=check)[0]

    @staticmethod
    def gather_batch(requests, *, outs=None, stream=None) -> list[torch.Tensor]:
        """:func:`gather_many` (one launch): :class:`~hmgstore.FeatureTable`'s batch hook."""
        return gather_many(requests, outs=outs, stream=stream)

    def __getitem__(self, index) -> torch.Tensor:
        """``table[index]``: :meth:`gather` of rows ``index``. One index only: ``t[3, 1]`` (torch's element
        ``x[3, 1]``) raises TypeError saying how to index (``t[[3, 1]]`` rows, ``t[3][1]`` an element)."""
        return self.gather(rows_only(index))

    def __setitem__(self, index, value) -> None:
        """Overwrite rows ``index`` with ``value`` (broadcast to ``[len, *row_shape]``), in every tier.

        The host tier is written at once, from the CPU; the GPU tier's copies
        of those rows on the current stream. Gathers in flight that read the
        same rows may see old or new values: synchronise first. Raises
        TypeError for a read-only source or a view of a sharded table,
        IndexError for ids out of range, ValueError for a value that does not
        broadcast to the rows, RuntimeError for a closed table.
        """
        rows_only(index)
        if self._read_only:
            raise TypeError("this table's source is read-only memory (e.g. a memmap opened with mode='r'); "
                            "build it with copy=True to write rows")
        if self._owner is not None:
            raise TypeError(f"this table is a view of {self._owner!r}; write to the table it was built from")
        self._enter()
        try:
            self._ready()
            ids = normalize(index, self.num_rows, torch.device("cpu")).ids
            rows = torch.as_tensor(value).detach().to("cpu", self._dtype)  # a value requiring grad: its numbers
            try:
                rows = rows.expand(len(ids), *self.row_shape)
            except RuntimeError:
                raise ValueError(f"a value of shape {tuple(rows.shape)} does not broadcast to the {len(ids)} rows "
                                 f"written, {(len(ids), *self.row_shape)}") from None
            fmt = self._format
            host_rows = (fmt.encode(rows.contiguous(), ids) if fmt else rows).contiguous()
            at = self.host_positions(ids)
            self._source.index_copy_(0, at, host_rows)
            if self._pinned is not None and self._pinned.tensor is not self._source:  # a small table's pinned copy
                self._pinned.tensor.index_copy_(0, at, host_rows)
            if self._gpu is not None and len(ids):
                new = ids.to(self.device) if self._map is None else self._map[ids.to(self.device)]
                resident = (new < self.num_gpu_rows).nonzero().flatten()
                if self._gpu_format is None and fmt is not None:  # the GPU tier keeps rows as they read
                    host_rows = fmt.decode(host_rows, self.row_shape)
                self._gpu[new[resident].long()] = host_rows.to(self.device)[resident]
        finally:
            self._exit()

    def __iter__(self):
        raise TypeError("iterate over a HybridTensor by indexing it with a batch of ids")

    # ---- statistics ------------------------------------------------------------
    def reset_stats(self, counting: bool = True) -> None:
        """Start counting (again, from zero) the rows each tier serves and the gathers' time; ``False``: stop."""
        self._counter = TierCounter(self.placement.names, self.row_bytes, self.device) if counting else None
        starts = [t.start for t in self.placement.tiers]
        self._tier_starts = torch.tensor(starts, dtype=self.placement.index_dtype, device=self.device)

    def stats(self) -> dict:
        """Rows and bytes served per tier since :meth:`reset_stats`, the GPU hit ratio and GB/s.

        See :mod:`hmgstore.rows.stats` for the fields. Reads the device's counters
        (one synchronisation). Raises RuntimeError when not counting.
        """
        if self._counter is None:
            raise RuntimeError("this table is not counting statistics: call table.reset_stats() to start "
                               "(or build it with stats=True)")
        return self._counter.report()

    # ---- crossing processes ----------------------------------------------------
    def __reduce__(self):
        return self._reduce(for_process=False)

    def _reduce(self, for_process: bool):
        return _rebuild, (pickling.state_of(self, self._given, self.why_not_sendable(), for_process),)


def _reduce_for_process(table: HybridTensor):
    """How torch's multiprocessing (ForkingPickler: DataLoader workers, queues) sends a table."""
    return table._reduce(for_process=True)


ForkingPickler.register(HybridTensor, _reduce_for_process)


def _rebuild(state: dict) -> HybridTensor:
    """A table from :func:`hmgstore.table.pickling.state_of`: checked now, built (CUDA memory, pinning) on first use."""
    table = HybridTensor.__new__(HybridTensor)
    table._setup(pickling.source_of(state), resolve_device(state["device"]), state["max_sms"], False,
                 dtype=state["dtype"], shape=state["shape"], host_format=formats.get(state["format"]),
                 gpu_format=formats.get(state["gpu_format"]), layout=state["layout"])
    table.placement = for_table(table.num_rows, table.gpu_row_bytes, table.device,
                                gpu_rows=state["gpu_rows"], host_layout=table.layout)
    if state["closed"]:
        table._closing = table._closed = True
    elif table.device.type == "cuda" or state["unusable"]:
        table._deferred = state
    return table


_PAIRS = "gather_many takes a list of (table, ids) pairs, as in hmgstore.gather_many([(t, ids)])"


def _check_requests(requests, outs) -> torch.device:
    for k, request in enumerate(requests):
        if not isinstance(request, (tuple, list)) or len(request) != 2:
            what = type(request).__name__ + ("" if not isinstance(request, (tuple, list)) else f" of {len(request)}")
            raise TypeError(f"{_PAIRS}; request {k} is a {what}")
        table = request[0]
        if not isinstance(table, HybridTensor):
            raise TypeError(
                f"{_PAIRS}; request {k} starts with a {type(table).__name__}, not a HybridTensor: wrap a plain "
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
    since is raised here first. The work is :func:`hmgstore.gather.plan.run`; inside
    :func:`hmgstore.gather.fusion.fused` (and without ``outs`` or ``stream``), the
    gather is recorded and its outputs written when the block ends.
    """
    if isinstance(requests, Table):
        raise TypeError(f"{_PAIRS}; got a table alone")
    requests = list(requests)
    outs = [None] * len(requests) if outs is None else list(outs)
    if len(outs) != len(requests):
        raise ValueError(f"outs has {len(outs)} entries for {len(requests)} requests")
    if not requests:
        return []
    device = _check_requests(requests, outs)
    if device.type == "cuda":
        raise_deferred(device, wait=False)  # finished launches only: no waiting
    window = fusion.current(device) if stream is None and all(o is None for o in outs) else None
    entered = []  # try/finally, not ExitStack + reading(): 9 us a CPU gather_many of two tables, measured
    try:
        for table in {id(t): t for t, _ in requests}.values():
            table._enter()
            entered.append(table)
            table._ready()
        if window is not None:  # recorded: written when the window ends (see hmgstore.gather.fusion)
            return window.record(requests, check)
        return plan.run(requests, outs, device, stream, check)
    finally:
        for table in entered:
            table._exit()
