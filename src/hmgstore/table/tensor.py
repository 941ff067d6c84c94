"""HybridTensor: one logical [N, ...] table whose rows live in several tiers.

On a CUDA device, chosen rows are copied into a GPU-resident tier and the host source is pinned in place as the
host tier; ``table[idx]`` is gathered in one kernel launch (two with ``CAPPED_ROWS="remote"``), whichever tiers
the ids hit. On the CPU the same API reads with ``torch.index_select``; results are bit-identical. ``gather_many``
fuses the gathers of several tables (a batch's features, labels, node types) into one launch.

The public functions here check their arguments, then :mod:`hmgstore.gather.plan` does the work; the table's
state and lifecycle are :mod:`hmgstore.table.state`; the tier counters and the split gather's setting are here.

Streams. A gather runs on ``stream`` if given, else on the current stream of the table's device, and its result is
ready on that stream; the host does not wait, except that ids already on a GPU are range-checked with one
device-to-host read. A caller who uses ``out`` or CUDA ids on another stream orders the streams itself.

Lifetime. ``close()`` waits for gathers in flight and for the device before it frees anything, and refuses new
gathers. A table sent to another process (pickle, torch's multiprocessing) is rebuilt there on its first use.
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
from ..rows.ids import CHECKS, last_writes, normalize, rows_only
from ..rows.placement import for_table
from ..rows.stats import TierCounter
from ..rows.writes import broadcast_rows, check_apart, rows_to_write
from ..util.device import resolve_device
from .state import Table

log = logging.getLogger(__name__)


class HybridTensor(Table):
    """A table of ``N`` rows spread over GPU memory and pinned host memory.

    Args:
        source: the full table, ``[N, *row_shape]``: a torch CPU tensor, numpy array or ``np.memmap``, pinned in place
            (under 64 MiB: copied to pinned memory) and kept alive by the table. Rows must be contiguous (column
            slices work); memory that moves under it (``resize_()``, ``share_memory_()``) makes gathers raise.
        device: where gathered rows go (``"cuda"``, ``"cuda:1"``, ``"cpu"``; None: the current GPU, or the CPU).
        gpu_rows: ids of rows to keep resident on the GPU (unique, in range).
        gpu_budget: instead of ``gpu_rows``, bytes of GPU memory (int or ``"8GB"``) filled hottest first by
            ``hot_order`` or ``hotness`` (with neither, in id order); ``"auto"``: the lesser of the table and half
            the GPU's free memory (:func:`hmgstore.rows.hotness.resolve_budget`); None: every row on the host.
        hot_order: row ids hottest first, each in range and listed at most once (all checked; floats raise).
        hotness: instead of ``hot_order``, a real score per row (``[N]``, higher is hotter, e.g. in-degree).
        max_sms: cap the gather at this many SMs' worth of blocks, leaving the rest to training kernels: an
            integer >= 1 or None, as :class:`hmgstore.Pipeline` takes it (0, -1, 2.5, "abc", True: ValueError).
        progress: show a progress bar while pinning or copying large tables.
        stats: count rows and time per tier from the start (see :meth:`stats`).
        copy: copy the source into owned host memory (``backing``) instead of pinning it in place: small rows read
            faster from it, and forked DataLoader workers share it (docs/host-memory.md).
        host_dtype: a float32 table's host tier in a stored row format (a copy), named as ``compress`` names them
            (:func:`hmgstore.rows.formats.get`: ``torch.bfloat16``, ``"float16"``, ``"int8"`` ...; anything else:
            ValueError listing them); 16-bit rows read as ``x.to(host_dtype).to(x.dtype)``. A finite value past the
            type's range (float16's 65504) would read back as infinity: refused (ValueError naming the row).
        backing: the owned memory: ``"auto"`` (cudaHostAlloc for a GPU table, 2 MiB pages for a CPU one),
            ``"hugepage"`` or ``"cuda"`` (:mod:`hmgstore.memory.owned`).
        compress: ``"int8"``, ``"float8"``, ``"bfloat16"`` or ``"float16"``: a float32 table's rows stored so in
            both tiers, decoded to float32 by gathers (:mod:`hmgstore.rows.formats`); not with another ``host_dtype``.
        layout: a permutation of ``range(N)``, the order the host tier keeps rows in (hottest first,
            :mod:`hmgstore.graph.locality`'s orders), so that rows read together share host pages.
        split: the CPU reads part of each batch's host rows while the kernel reads the rest
            (:mod:`hmgstore.gather.cpu_share`): ``"auto"`` (CPU ids; measured once per size class), a float in
            ``[0, 1]`` (the CPU's share; 0 as None) or None (the kernel reads every row).

    On the CPU, the placement arguments are checked the same way, then every row is read from the source.

    A memmap source's file is recorded (:mod:`hmgstore.rows.file_identity`): a copy of the table sent to another process
    refuses the file if it was replaced or rewritten since, and a file cut short, before the build or under the table,
    makes the build, the next gather or ``dense()`` raise RuntimeError instead of reading a lost page (SIGBUS). A
    copy-on-write memmap (``mode="c"``) is sent as its rows.

    Raises:
        TypeError: for unusable sources (a CUDA or sparse tensor: with the fix; uint16/32/64 or float8 values, which
            torch cannot write: naming the dtypes tables hold, :func:`hmgstore.rows.checks.table_dtype`) and ids that
            are not integers (a ``layout`` of floats or bools included).
        ValueError: for unusable sources, conflicting placement arguments, repeated ids, a ``layout`` that is not a
            1-D permutation, a ``hotness`` of another length or with NaN (on every device) and a bad ``max_sms``.
        IndexError: for placement ids out of range.
        RuntimeError: when CUDA is asked for without a GPU (ImportError without CuPy); for a memmap cut short.

    Example:
        >>> table = HybridTensor(x, "cuda", gpu_budget="4GB", hotness=in_degree)  # doctest: +SKIP
        >>> rows = table[batch_ids]  # [len(batch_ids), *x.shape[1:]] on the GPU
    """

    #: Writes so far (``table[ids] = rows``); a copy of the whole table taken at another count is old.
    writes: int = 0

    _counter: TierCounter | None = None  # per-tier statistics, once counting
    _tier_starts: torch.Tensor | None = None
    _split: cpu_share.Setting | None = None  # the split gather's setting when splitting

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
                                   host_layout=self.layout)
        self._build()
        if stats:
            self.reset_stats()
        self.set_split(split)

    def set_split(self, split, threads: int | None = None) -> None:
        """Set the split gather (:mod:`hmgstore.gather.cpu_share`), as the ``split`` argument does.

        Args:
            split: ``"auto"``, a float in ``[0, 1]`` (the CPU's share of host-tier rows) or None (off).
            threads: torch's intra-op threads for the CPU's reads (None: ``torch.get_num_threads()``).

        Raises:
            ValueError: for other values.
        """
        setting = None if split is None else cpu_share.Setting(split, plan.gather_with_share, threads)
        if setting is not None:
            setting.skipped = self.split_skipped  # the count goes on across settings
        if setting is None or not setting.value or self.device.type != "cuda" or not self.reads_host:
            setting = None  # every row is read on the CPU already, or none from the host
        self._split = setting

    @property
    def split_skipped(self) -> int:
        """Batches that ``split="auto"`` read with the kernel alone because other processes left too few idle
        cores (see :mod:`hmgstore.gather.cpu_share`)."""
        return self._split.skipped if self._split is not None else 0

    @property
    def split_setting(self):
        """The split gather's :class:`~hmgstore.gather.cpu_share.Setting`, or None when the kernel reads alone."""
        return self._split

    @property
    def counter(self) -> TierCounter | None:
        """The per-tier counters while statistics are on (``stats=True``, ``reset_stats()``), else None."""
        return self._counter

    @property
    def tier_starts(self) -> torch.Tensor | None:
        """Where each tier's rows start in the tiers' order (the per-tier counters look ids up in it)."""
        return self._tier_starts

    @classmethod
    def empty(cls, shape, dtype: torch.dtype = torch.float32, device=None, *, host_dtype=None, compress=None,
              backing: str = "auto", **kwargs) -> HybridTensor:
        """A table of ``shape`` (``(N, *row_shape)``) and ``dtype`` in owned host memory, zeros, to fill with
        ``table[ids] = rows``; the other arguments (``kwargs``: the placement, ``max_sms``, ``stats``, ``progress``,
        ``layout``) are the constructor's; another keyword raises TypeError naming ``empty``."""
        checks.keywords("HybridTensor.empty", kwargs, ("layout", "max_sms", "progress",
                                                       *checks.takes(cls._place_and_build)), checks.takes(cls.empty))
        device = resolve_device(device)
        host_format, gpu_format = formats.for_tiers(host_dtype, compress)
        shape = checks.shape(shape)  # integers >= 0: a float size is refused, never truncated
        dtype = checks.table_dtype(dtype, "HybridTensor.empty")  # before the memory is taken
        if host_format is None:
            host = owned.empty(shape, dtype, backing, device)
        else:  # zero bytes are zero rows in every format (a scaled row's scale 0 decodes to 0)
            host = owned.empty(host_format.stored_shape(shape), host_format.stored_dtype(), backing, device)
        return cls.over_host_tier(host, device, dtype, fmt=host_format, shape=shape, gpu_format=gpu_format, **kwargs)

    @classmethod
    def over_host_tier(cls, host: torch.Tensor, device, dtype: torch.dtype, *, fmt=None, shape=None,
                       gpu_format=None, layout=None, max_sms=None, progress=True, **placement) -> HybridTensor:
        """A table over ``host``, a host tier already stored as ``fmt`` (None: rows as they read), used in place.

        Rows read as ``dtype``; ``shape``: the table's (needed for scaled formats); ``layout``: the old ids in the
        order ``host`` keeps them; the other arguments are the constructor's (another keyword: TypeError naming
        ``over_host_tier``). :func:`hmgstore.load` and :meth:`empty` build tables with it."""
        checks.keywords("HybridTensor.over_host_tier", placement, checks.takes(cls._place_and_build),
                        checks.takes(cls.over_host_tier))
        self = cls.__new__(cls)
        self._setup(host, resolve_device(device), max_sms, progress, host_format=fmt, gpu_format=gpu_format,
                    dtype=dtype, shape=shape, layout=layout)
        self._place_and_build(**placement)
        return self

    def dense(self) -> torch.Tensor:
        """The whole table as a CPU tensor of :attr:`shape` and :attr:`dtype`.

        The host tier itself (no copy) when it keeps rows as they read, in id order, and is writable; a copy when it
        keeps a stored format or a layout, or is read-only. For PyG's whole-table reads and for checks. Raises
        RuntimeError for a closed table, and as a gather does for a memmap's file cut short, checked at the call only:
        the host tier handed back over a writable memmap (``mode="r+"``/``"c"``) reads the file itself, so a read of it
        once the file is cut short kills the process (SIGBUS); ``.clone()`` it while the file is whole."""
        if self.closing:
            raise RuntimeError("this table was closed; build a new HybridTensor")
        if self._file is not None:  # the check a gather makes (not its deferred CUDA build): no SIGBUS below
            self._file.check()
        source = self.host_tier
        host = source if self._layout is None else source[self.host_positions(torch.arange(self.num_rows))]
        if self.host_format is not None:
            return self.host_format.decode(host, self.row_shape)
        return host.clone() if self.read_only and host is source else host

    # ---- gathering -----------------------------------------------------------
    def gather(self, index, *, out: torch.Tensor | None = None, stream=None, check: str = "deferred") -> torch.Tensor:
        """Rows ``index`` of the table, on ``self.device``.

        Args:
            index: integer tensor (CPU or CUDA, any shape and integer dtype), numpy array, list, int, slice or
                bool mask.
            out: optional contiguous destination of the result's shape, dtype and device, not requiring grad.
            stream: torch CUDA stream to run on (default: the current one); the result is ready on it.
            check: ids already on a GPU are range-checked ``"deferred"`` (no waiting; a bad id raises at a later gather,
                :mod:`hmgstore.rows.ids`) or ``"sync"`` (one device-to-host read; raises here).

        Returns:
            ``[*index.shape, *row_shape]`` of the table's dtype (an int index drops the first dimension, as ``x[5]``).

        Raises:
            IndexError: for ids out of range (CPU ids: before any memory is read).
            TypeError: for non-integer indices.
            ValueError: for a bad ``out`` (one that requires grad: pass ``out.detach()``); RuntimeError for a
                closed table.
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
        """Overwrite rows ``index`` with ``value`` (broadcast to ``[len, *row_shape]``; a repeated id gets its last
        row) in every tier: the host tier at once, the GPU tier's copies on the current stream (gathers may see either).

        Raises:
            TypeError: for a read-only source, a view of a sharded table, a sparse value (with the fix) and a tensor
                or array value of a kind the table's dtype cannot hold (float into int, complex into float:
                ``torch.can_cast``), as torch's ``x[ids] = v`` refuses it; a list of such a kind, a complex number
                into a real table, and a value that is not rows (None, a string).
            IndexError: ids out of range. RuntimeError: closed, or a value in the table's own memory (as torch's
                ``x[ids] = x[a:b]``; pass a ``.clone()``). ValueError: a value that does not broadcast, numbers
                past the dtype's range (NaN or inf into integers, a float stored as inf)."""
        rows_only(index)
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            # expand() refuses a sparse value with a message that blames the shape, which is right
            raise TypeError(f"a {value.layout} sparse value is not rows to write; pass value.to_dense()")
        if self.read_only:
            raise TypeError("this table's source is read-only memory (e.g. a memmap opened with mode='r'); "
                            "build it with copy=True to write rows")
        if self.owner is not None:
            raise TypeError(f"this table is a view of {self.owner!r}; write to the table it was built from")
        self._enter()
        try:
            self._ready()
            index = normalize(index, self.num_rows, torch.device("cpu"))
            ids = index.ids.long()  # narrow ids index as int64
            rows = broadcast_rows(rows_to_write(value, self.dtype), index.shape, self.row_shape)
            fmt, source, pinned, gpu = self.host_format, self.host_tier, self.pinned, self.gpu_tier
            ids, rows = last_writes(ids, rows)  # an id given twice: its last row, on every device
            host_rows = (fmt.encode(rows.contiguous(), ids) if fmt else rows).contiguous()
            check_apart(host_rows, source, getattr(pinned, "tensor", None))  # CPU rows: the GPU tier is apart
            at = self.host_positions(ids)
            source.index_copy_(0, at, host_rows)
            if pinned is not None and pinned.tensor is not source:  # a small table's pinned copy
                pinned.tensor.index_copy_(0, at, host_rows)
            if gpu is not None and len(ids):
                new = ids.to(self.device) if self.row_map is None else self.row_map[ids.to(self.device)]
                resident = (new < self.num_gpu_rows).nonzero().flatten()
                if self.gpu_format is None and fmt is not None:  # the GPU tier keeps rows as they read
                    host_rows = fmt.decode(host_rows, self.row_shape)
                gpu[new[resident].long()] = host_rows.to(self.device)[resident]
            self.writes += 1  # copies made of the whole table (a DGL g.ndata view) know they are old
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
        host = [tier for tier in self.tiers if tier.name == "host" and tier.base]
        if self._counter is not None and self.device.type == "cuda" and host:  # zero-copy reads: count their pages
            tier = host[0]
            self._counter.watch_pages(self.placement.names.index("host"), tier.start, tier.base, tier.pitch, tier.size)

    def stats(self) -> dict:
        """Rows and bytes served per tier since :meth:`reset_stats`, the GPU hit ratio and GB/s (the fields of
        :mod:`hmgstore.rows.stats`; one synchronisation). Raises RuntimeError when not counting."""
        if self._counter is None:
            raise RuntimeError("this table is not counting statistics: call table.reset_stats() to start "
                               "(or build it with stats=True)")
        return self._counter.report()

    # ---- crossing processes ----------------------------------------------------
    def __reduce__(self):
        return self._reduce(for_process=False)

    def _reduce(self, for_process: bool):
        return _rebuild, (self.sent_state(for_process),)


def _reduce_for_process(table: HybridTensor):
    """How torch's multiprocessing (ForkingPickler: DataLoader workers, queues) sends a table."""
    return table._reduce(for_process=True)


ForkingPickler.register(HybridTensor, _reduce_for_process)


def _rebuild(state: dict) -> HybridTensor:
    """A table from :meth:`~hmgstore.table.state.Table.sent_state` (what unpickling calls)."""
    return HybridTensor.rebuilt(state)


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
    if any(not isinstance(out, torch.Tensor) for out in given):
        raise TypeError(f"outs holds a tensor (or None) per request; got {[type(o).__name__ for o in given]}")
    plan.check_outs_apart([table for table, _ in requests], outs)
    return device


def gather_many(requests: Sequence[tuple[HybridTensor, object]], *, outs=None, stream=None,
                check: str = "deferred") -> list[torch.Tensor]:
    """Gather from several tables at once: ``[table[index] for table, index in requests]``, in one launch on CUDA.

    Inside :func:`hmgstore.gather.fusion.fused` (without ``outs`` or ``stream``), the gather is recorded and its
    outputs written when the block ends.

    Args:
        requests: ``(table, index)`` pairs, every table on the same device; ``index`` as for
            :meth:`HybridTensor.gather`.
        outs: a destination (or None) per request, each its own buffer.
        stream: the CUDA stream to run on (default: the current one).
        check: how ids already on a GPU are checked (:meth:`HybridTensor.gather`).

    Returns:
        One tensor per request, ``[*index.shape, *row_shape]`` on the tables' device.

    Raises:
        IndexError: for an id out of range in any request, before any memory is read (and for an earlier
            gather's bad GPU id found since).
        TypeError: for requests that are not ``(HybridTensor, index)`` pairs and non-integer indices.
        ValueError: for tables on several devices, a bad ``outs``.

    Example:
        >>> x_rows, y_rows = hmgstore.gather_many([(x_table, ids), (y_table, ids)])  # doctest: +SKIP
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
    entered = []  # try/finally, not ExitStack + reading(): the context managers cost a small CPU gather_many much
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
