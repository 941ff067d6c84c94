"""HybridTensor: one logical [N, ...] table whose rows live in several tiers.

A table is built from a host source (torch CPU tensor, numpy array or
memmap). On a CUDA device, chosen rows are copied into a GPU-resident tier
and the source is pinned in place as the host tier; ``table[idx]`` returns a
CUDA tensor gathered in one kernel launch, whichever tiers the ids hit. On
the CPU the same API gathers with ``torch.index_select``; results are
bit-identical either way.

``gather_many`` fuses the gathers of several tables (features, labels, node
types of a batch) into one launch; adapters call it once per batch.
Validation lives in the public functions; ``_plan`` and ``_launch`` do the
work.
"""
from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Sequence

import torch

from . import placement as placement_mod
from .index import Index, check_range, normalize
from .memory import PinnedHost, as_host_tensor, row_layout

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
            between rows may be larger (column slices work).
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
        progress: show a progress bar while pinning large tables.

    On the CPU, ``gpu_rows``/``gpu_budget`` are accepted and ignored, so the
    same code runs with and without a GPU.

    Raises TypeError/ValueError for unusable sources and placements,
    RuntimeError when CUDA is asked for without a GPU, ImportError when CuPy
    is missing.
    """

    def __init__(self, source, device=None, *, gpu_rows=None, gpu_budget=None, hot_order=None,
                 max_sms: int | None = None, progress: bool = True):
        self._setup(source, resolve_device(device), max_sms, progress)
        read_only = self._read_only
        self.placement = self._choose_placement(gpu_rows, gpu_budget, hot_order)
        #: dtype of ids inside the kernel: int32 while every new id fits
        self._index_dtype = self.placement.index_dtype
        self._reads_host = self.placement.has_host_tier
        if self.device.type == "cuda":
            from . import _cuda

            _cuda.check_device(self.device)
            # Whenever the table goes, wait for kernels that may still read its memory.
            weakref.finalize(self, _synchronize, self.device)
            try:
                self._build_cuda(read_only, progress)
            except BaseException:
                self.close()
                raise

    def _setup(self, source, device: torch.device, max_sms, progress) -> None:
        self.device = device
        self._source, self._read_only = as_host_tensor(source)
        self.row_bytes = row_layout(self._source)[0]
        self.max_sms = max_sms
        self._pinned: PinnedHost | None = None
        self._gpu: torch.Tensor | None = None
        self._map: torch.Tensor | None = None
        self._bases: dict[str, tuple[int, int]] = {}  # tier name -> (base pointer, pitch) as read from device
        self._owner = None  # a sharded table whose memory this view reads (it frees it, not the view)
        self._sort_ids = True  # host reads in address order; the tuning script turns it off
        self._closed = False
        self._progress = progress

    @classmethod
    def _view(cls, source, device: torch.device, placement: placement_mod.Placement, bases: dict, *,
              pinned: PinnedHost | None, owner, unreachable=(), max_sms: int | None) -> "HybridTensor":
        """A table over tiers built by someone else (a sharded table): ``bases`` gives each
        readable tier's ``(pointer, pitch)`` as seen from ``device``, plus ``"host"`` when
        ``pinned`` is given; ``unreachable`` names the shards ``device`` reads from the host
        instead; ``owner`` keeps that memory alive and frees it."""
        self = cls.__new__(cls)
        self._setup(source, device, max_sms, False)
        self.placement, self._bases, self._owner, self._pinned = placement, dict(bases), owner, pinned
        if pinned is not None:
            self._bases["host"] = (pinned.tensor.data_ptr(), pinned.pitch)
        self._reads_host = placement.has_host_tier or bool(unreachable)
        self._index_dtype = placement.index_dtype
        with torch.cuda.device(device):
            self._map = placement.new_of_old(device, self._index_dtype, host_tiers=tuple(unreachable))
        weakref.finalize(self, _synchronize, device)
        return self

    def _choose_placement(self, gpu_rows, gpu_budget, hot_order) -> placement_mod.Placement:
        n = self.num_rows
        if gpu_rows is not None and (gpu_budget is not None or hot_order is not None):
            raise ValueError("pass either gpu_rows, or gpu_budget with hot_order, not both")
        if gpu_budget is not None:
            if hot_order is None:
                raise ValueError(
                    "gpu_budget needs hot_order, the row ids hottest first (e.g. "
                    "hmgstore.placement.order_by_score(in_degree)); or pass gpu_rows")
            gpu_rows = placement_mod.by_hotness(torch.as_tensor(hot_order), gpu_budget, self.row_bytes)
        elif hot_order is not None:
            raise ValueError("hot_order is only used with gpu_budget; pass gpu_budget too")
        if gpu_rows is None or self.device.type == "cpu":
            return placement_mod.host_only(n)
        return placement_mod.by_ids(n, gpu_rows)

    def _build_cuda(self, read_only: bool, progress: bool) -> None:
        p = self.placement
        with torch.cuda.device(self.device):
            if p.has_host_tier:
                self._pinned = PinnedHost(self._source, self.device, read_only, progress)
            if p.num_gpu_rows:
                self._map = p.new_of_old(self.device, self._index_dtype)
                self._gpu = torch.empty((p.num_gpu_rows, *self.row_shape), dtype=self.dtype, device=self.device)
                self._fill_gpu_tier(read_only)
                self._bases["gpu"] = (self._gpu.data_ptr(), self.row_bytes)
            if self._pinned is not None:
                self._bases["host"] = (self._pinned.tensor.data_ptr(), self._pinned.pitch)

    def _fill_gpu_tier(self, read_only: bool) -> None:
        """Copy the GPU tier's rows in, reading the host table through the gather kernel."""
        temporary = self._pinned is None  # every row resident: read the source through a temporary pin
        pinned = PinnedHost(self._source, self.device, read_only, self._progress) if temporary else self._pinned
        try:
            fill_rows(pinned, self.placement.gpu_rows, self._gpu, self.device)
        finally:
            if temporary:
                pinned.release()

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
        return self._source.dtype

    @property
    def num_gpu_rows(self) -> int:
        return self.placement.num_gpu_rows

    @property
    def source(self) -> torch.Tensor:
        """The host tensor the table reads from (the caller's memory)."""
        return self._source

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        return (f"HybridTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}, "
                f"gpu_rows={self.num_gpu_rows}, tiers={self.placement.tiers})")

    # ---- gathering -----------------------------------------------------------
    def gather(self, index, *, out: torch.Tensor | None = None, stream=None) -> torch.Tensor:
        """Rows ``index`` of the table, on ``self.device``.

        ``index``: int32/int64 tensor (CPU or CUDA, any shape), numpy array,
        list, int, slice or bool mask. Returns ``[*index.shape, *row_shape]``
        of the table's dtype (an int drops the first dimension, like
        ``x[5]``). ``out``: optional contiguous destination of that shape,
        dtype and device. ``stream``: torch CUDA stream to run on (default:
        the current stream); the result is ready on that stream.
        Raises IndexError for ids out of range (before any memory is read),
        TypeError for non-integer indices, ValueError for a bad ``out``.
        """
        return gather_many([(self, index)], outs=[out], stream=stream)[0]

    __getitem__ = gather

    def __iter__(self):
        raise TypeError("iterate over a HybridTensor by indexing it with a batch of ids")

    # ---- lifetime ------------------------------------------------------------
    def close(self) -> None:
        """Free the GPU tier and unregister the host memory (idempotent).

        Waits for the table's device first, so no kernel still reads what is freed.
        """
        if self.device.type == "cuda" and not self._closed and torch.cuda.is_available():
            _synchronize(self.device)
        if self._pinned is not None and self._owner is None:
            self._pinned.release()
        self._pinned = self._gpu = self._map = self._owner = None
        self._bases = {}
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        if self._owner is not None:
            raise TypeError(
                f"a view of a table sharded over several GPUs ({self._owner!r}) cannot be sent to another "
                "process; build the sharded table in each process (hmgstore.distributed.shard under "
                "torchrun), or gather in the main process (PyG: filter_per_worker=False)")
        # Worker processes rebuild the table around the source. torch's
        # multiprocessing pickler moves a tensor's memory into shared memory in
        # place, which would pull a registered source out from under this
        # table; such sources travel as a copy instead.
        source = self._source
        if self._pinned is not None and self._pinned.registered and not source.is_shared():
            if source.nbytes >= 1 << 30:
                log.warning("sending a CUDA table to another process copies its %.2f GB host source; use the "
                            "fork start method, or source.share_memory_() before building the table",
                            source.nbytes / 1e9)
            source = source.clone()
        return {"source": source, "device": str(self.device), "max_sms": self.max_sms,
                "gpu_rows": self.placement.gpu_rows if self.placement.num_gpu_rows else None}

    def __setstate__(self, state):
        self.__init__(state["source"], state["device"], gpu_rows=state["gpu_rows"],
                      max_sms=state["max_sms"], progress=False)

    # ---- the work behind gather_many ------------------------------------------
    def _tiers(self) -> list[tuple[int, int, int, int]]:
        # A tier without a base (a peer this GPU cannot read, a host tier no row maps to) is never
        # addressed: the map sends no row there.
        p = self.placement
        return [(lo, hi, *self._bases.get(name, (0, self.row_bytes)))
                for name, lo, hi in zip(p.tiers, p.bounds, p.bounds[1:])]

    def _plan(self, index: Index, out: torch.Tensor, prepared: dict):
        """The kernel job for one index, and what is left to check of it.

        Returns ``(job, bounds)``: ``bounds`` is None for checked ids, else a
        2-element device tensor ``[min, max]`` of the ids, which the caller
        reads back (one synchronisation for a whole batch) before launching.
        Unchecked ids are clamped to ``[-1, num_rows]`` before being narrowed
        to int32, so no out-of-range id can wrap into range. ``prepared``
        caches narrowed/sorted ids per index within one batch, so features
        and labels indexed by the same ids sort them once. Runs on the
        current stream.
        """
        from . import _cuda

        narrow = self._index_dtype
        sort = self._sort_ids and self._reads_host and len(index.ids) > 1
        key = (id(index), narrow, sort, None if index.checked else self.num_rows)
        if key not in prepared:
            ids = index.ids
            if ids.dtype != narrow:  # int64 -> int32 clamps first (unchecked ids must not wrap)
                wraps = not index.checked and narrow == torch.int32
                ids = (ids.clamp(-1, self.num_rows) if wraps else ids).to(narrow)
            perm, bounds = None, None
            if sort:
                ids, perm = torch.sort(ids)
                if not index.checked:  # sorted: the ends are the extremes, no reduction needed
                    bounds = ids[:: len(ids) - 1]
            elif not index.checked and len(ids):
                bounds = torch.stack(torch.aminmax(ids))
            prepared[key] = (ids, perm, bounds)
        ids, perm, bounds = prepared[key]
        job = _cuda.Job(ids, perm, out, self._map, self.num_rows, self.row_bytes, self._tiers())
        return job, bounds


def fill_rows(pinned: PinnedHost, rows: torch.Tensor, out: torch.Tensor, device: torch.device) -> None:
    """``out[i] = source[rows[i]]`` on ``device``, reading the pinned source with the gather kernel; waits."""
    from . import _cuda

    if not len(rows):
        return
    num_rows = pinned.tensor.shape[0]
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        ids = rows.to(device, placement_mod.host_only(num_rows).index_dtype)
        host = (0, num_rows, pinned.tensor.data_ptr(), pinned.pitch)
        _cuda.launch_gather([_cuda.Job(ids, None, out, None, num_rows, row_layout(pinned.tensor)[0], [host])],
                            device, stream, None)
        stream.synchronize()


def _check_out(out: torch.Tensor, shape, dtype, device) -> None:
    shape = torch.Size(shape)
    if out.shape != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous tensor of shape {tuple(shape)}, dtype {dtype} on {device}; "
            f"got shape {tuple(out.shape)}, dtype {out.dtype} on {out.device}"
            f"{'' if out.is_contiguous() else ', not contiguous'}")


def gather_many(requests: Sequence[tuple[HybridTensor, object]], *, outs=None, stream=None) -> list[torch.Tensor]:
    """Gather from several tables at once: ``[table[index] for table, index in requests]``.

    Every table must be on the same device. On CUDA, all gathers run in one
    kernel launch on ``stream`` (default: the current stream), which is what
    makes a batch's features, labels and node types cost one launch. ``outs``,
    if given, is a list of destinations (or None) matching ``requests``.
    Every index is validated before anything runs, so a bad index in any
    request raises (IndexError/TypeError) without reading memory.
    """
    requests = list(requests)
    if outs is None:
        outs = [None] * len(requests)
    if len(outs) != len(requests):
        raise ValueError(f"outs has {len(outs)} entries for {len(requests)} requests")
    if not requests:
        return []
    for table, _ in requests:
        if not isinstance(table, HybridTensor):
            raise TypeError(f"gather_many takes (HybridTensor, index) pairs, got {type(table).__name__}")
    device = requests[0][0].device
    for table, _ in requests:
        if table.device != device:
            raise ValueError(f"all tables of one gather_many must share a device: {device} and {table.device}")
        if table._closed:
            raise RuntimeError("this table was closed; build a new HybridTensor")
        if table._owner is not None:
            table._owner.check()  # a sharded table whose peer process died raises here

    ctx = contextlib.nullcontext() if device.type == "cpu" else _cuda_context(device, stream)
    with ctx as stream:
        indices = _normalize_all(requests, device)
        results = []
        for (table, _), index, out in zip(requests, indices, outs):
            if out is None:
                out = torch.empty((len(index.ids), *table.row_shape), dtype=table.dtype, device=device)
            else:
                _check_out(out, (*index.shape, *table.row_shape), table.dtype, device)
                out = out.view(len(index.ids), *table.row_shape)
            results.append(out)
        if device.type == "cpu":
            for (table, _), index, out in zip(requests, indices, results):
                torch.index_select(table._source, 0, index.ids, out=out)
        else:
            from . import _cuda

            prepared = {}
            plans = [table._plan(index, out, prepared) for (table, _), index, out in zip(requests, indices, results)]
            _check_bounds(plans, requests, indices)
            jobs = [job for job, _ in plans]
            _cuda.launch_gather(jobs, device, stream, min((t.max_sms or 1 << 30) for t, _ in requests)
                                if any(t.max_sms for t, _ in requests) else None)
    return [out.view(*index.shape, *table.row_shape) for (table, _), index, out in zip(requests, indices, results)]


def _normalize_all(requests, device) -> list[Index]:
    """Normalise each request's index; one index object shared by several tables is converted once."""
    done: dict[tuple[int, int], Index] = {}
    result = []
    for table, index in requests:
        key = (id(index), table.num_rows)
        if key not in done:
            done[key] = normalize(index, table.num_rows, device)
        result.append(done[key])
    return result


def _check_bounds(plans, requests, indices) -> None:
    """Read back every unchecked index's [min, max] at once; raise for the first bad one."""
    pending, seen = [], set()
    for (_, bounds), (table, _), index in zip(plans, requests, indices):
        if bounds is not None and (id(bounds), table.num_rows) not in seen:
            seen.add((id(bounds), table.num_rows))
            pending.append((bounds, table, index))
    if not pending:
        return
    values = (pending[0][0] if len(pending) == 1 else torch.cat([b for b, _, _ in pending])).tolist()  # the one sync
    for k, (_, table, index) in enumerate(pending):
        lo, hi = values[2 * k], values[2 * k + 1]
        if lo < 0 or hi >= table.num_rows:
            check_range(index.ids, table.num_rows)  # names the value and position


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


def _synchronize(device: torch.device) -> None:
    try:
        torch.cuda.synchronize(device)
    except Exception:  # interpreter shutdown or a dead context: nothing left to wait for
        pass
