"""HybridFeatureStorage: a DGL ``FeatureStorage`` over a HybridTensor, with fused fetches.

``fetch`` only records the request; the first ``wait()`` gathers every request
that the same thread recorded for the same table device and stream, in one
:func:`hmgstore.gather_many` call (one kernel launch on CUDA), on the stream
that was current when they were recorded (see the package docstring).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from hmgstore import FeatureTable, HybridTensor, resolve_device
from hmgstore.rows import checks
from hmgstore.rows.ids import check_range

from ._compat import import_dgl

dgl: Any = import_dgl()  # untyped: its classes are subclassed here

#: Live fetches a batch holds before its dead ones (dropped unwaited) are pruned.
PRUNE_AT = 64


def rows_elsewhere(table) -> bool:
    """Whether GPUs hold copies of some of ``table``'s rows (a GPU cache, shards on the node's GPUs): rows that an
    in-place edit of its host rows (``g.ndata[key]``) cannot reach."""
    if isinstance(table, HybridTensor):  # a one-GPU cache, or a view of shards and replicas (resident tiers all)
        return table.placement.resident_rows > 0
    return table.device.type == "cuda"  # a ShardedTensor or DistributedTensor over GPUs


def _cluster_tensor():
    from hmgstore.distributed import ClusterTensor

    return ClusterTensor


class HybridFeatureStorage(dgl.storages.FeatureStorage):
    """A DGL ``FeatureStorage`` over one :class:`hmgstore.HybridTensor`, or over a
    :class:`hmgstore.distributed.ClusterTensor` (a graph partitioned over machines: then every fetch is
    collective, and every rank's loader must run the same batches with the same keys).

    Pickles with its table, which a DataLoader worker process rebuilds only
    if it gathers (hmgstore's rule for tables): workers that only sample
    never pin memory or create a CUDA context. A storage serves its table as
    it is: DGL asks the graph for the storage before every fetch, and that
    is where a graph changed since ``attach`` is refused
    (:class:`~hmgstore.plugins.dgl.HybridDGLGraph`), not in a storage kept
    by hand across the change.

    Args:
        table: ``[N, *row_shape]`` rows of one node (or edge) feature of one type, any ``hmgstore.FeatureTable``.

    Raises:
        TypeError: ``table`` is not an hmgstore table (a plain tensor: wrap it with ``attach`` or HybridTensor);
            and what :meth:`fetch` and :meth:`whole` raise.
    """

    def __init__(self, table: FeatureTable):
        if not isinstance(table, FeatureTable):
            raise TypeError(f"HybridFeatureStorage wraps an hmgstore table (HybridTensor, ShardedTensor, "
                            f"DistributedTensor, ClusterTensor: any hmgstore.FeatureTable), got {type(table).__name__}")
        self.table: FeatureTable = table
        self._whole: torch.Tensor | None = None  # a decoded or copied whole table, made once (see whole())
        self._whole_writes: int | None = 0  # the table's writes when it was made (None: a table without writes)
        self._whole_version = 0  # its torch version counter then: a change means an in-place edit of the copy
        self._whole_kind = ""  # what the kept tensor is, for the error that refuses an edit of it

    def whole(self, key: str = "") -> torch.Tensor:
        """Every row: ``[N, *row_shape]`` of the table's dtype, a CPU tensor, for ``g.ndata[key]``/``g.edata[key]``.

        The host tier itself (no copy) when it keeps rows as they read and
        is writable; otherwise (a stored format, a layout, read-only memory)
        a copy made on the first call and kept. That copy is not the table,
        and where GPUs hold copies of some rows (a GPU cache, shards) neither
        is the host tier: an in-place edit of either (``g.ndata[key].mul_(0)``)
        would not reach every row the DataLoader gathers, so once it has been
        edited this, and every :meth:`fetch`, raises RuntimeError until the
        table is written (``table[ids] = rows``) or the key assigned whole
        (``g.ndata[key] = edited``, which detaches it). A table held whole on
        the host alone serves the edit of its host tier, as plain DGL does. Raises KeyError naming
        ``key`` for a ClusterTensor (its rows live on several machines:
        gather them with ``table[ids]``) and RuntimeError for a closed table.
        """
        if isinstance(self.table, _cluster_tensor()):
            raise KeyError(f"{key!r} is served by a ClusterTensor, whose rows live on several machines: there is no "
                           "whole table here; read rows with table[ids]")
        self._unedited(f"g.ndata[{key!r}] (or g.edata[{key!r}])")
        writes = getattr(self.table, "writes", None)  # a HybridTensor's count of writes (others take none)
        if self._whole is not None and self._whole_writes == writes:
            return self._whole
        if getattr(self.table, "closed", False):
            raise RuntimeError(f"the table of {key!r} is closed")
        rows = self.table.dense()  # type: ignore[attr-defined]  # every table but a ClusterTensor has dense()
        source = getattr(self.table, "source", None)
        copied = not (isinstance(source, torch.Tensor) and rows.data_ptr() == source.data_ptr())
        elsewhere = rows_elsewhere(self.table)
        if copied or elsewhere:
            # kept: a copy, so that g.ndata[key] in a loop does not decode every time; the host rows themselves
            # where GPUs hold some rows too, so that an in-place edit, which cannot reach those, is seen
            self._whole, self._whole_writes, self._whole_version = rows, writes, rows._version
            self._whole_kind = ("a decoded copy of its attached table {} (rows stored compressed, laid out or "
                                "read-only)" if copied else "the host rows of its attached table {}, whose GPUs "
                                "hold copies of some of its rows")
        return rows

    def _unedited(self, name: str = "g.ndata[key] (or g.edata[key])") -> None:
        """Refuse to go on once the kept tensor of :meth:`whole` (``name``) was edited in place while the table
        was not written: ``g.ndata[key]`` and the DataLoader would serve different rows. One integer compare."""
        whole = self._whole
        if whole is None or whole._version == self._whole_version or self._whole_writes != getattr(
                self.table, "writes", None):  # a write to the table drops the kept tensor (whole())
            return
        raise RuntimeError(
            f"{name} is {self._whole_kind.format(self.table)}, and it was changed in place (mul_, +=, "
            "x[...] = ...): the edit did not reach every copy of the rows, so the DataLoader would serve old "
            f"rows. Assign the edited tensor whole instead ({name} = edited, which detaches the key: the loader "
            "then serves it), or write the table itself (table[ids] = rows)")

    def __getstate__(self):
        return {**self.__dict__, "_whole": None}  # a copy of the table's rows: the worker decodes its own

    def __setstate__(self, state):
        self.__dict__.update({"_whole": None, **state})

    def __repr__(self) -> str:
        return f"HybridFeatureStorage({self.table})"

    def fetch(self, indices, device, pin_memory=False, **kwargs) -> PendingFetch:
        """Request rows ``indices``; ``.wait()`` on the result returns them on ``device``.

        The gather happens at the first ``wait()`` of any fetch of this thread, for all of them at once: rows
        written to the table between ``fetch`` and that ``wait()`` come back as written (DGL's own
        ``TensorStorage`` reads at ``fetch``).

        Args:
            indices: int32 or int64 tensor ``[n]`` (n may be 0) on the CPU or a GPU, each id in ``[0, N)``.
            device: where the rows should land (``torch.device`` or str, ``cpu`` or ``cuda``).
            pin_memory: True, False or None (False): for a CPU table and a CUDA ``device``, stage the rows in
                pinned memory and copy them asynchronously.
            **kwargs: other keywords of DGL's signature, ignored; a near miss of ``pin_memory`` (or of another
                parameter) is refused.

        Returns:
            A :class:`PendingFetch` whose ``wait()`` returns ``[n, *row_shape]`` of the table's dtype on
            ``device``.

        Raises:
            TypeError: ``indices`` not a tensor, or of float, bool or complex dtype (never truncated); a
                ``pin_memory`` other than True, False or None; a misspelt keyword (naming ``fetch``).
            ValueError: ``indices`` not 1-D; a device type other than cpu and cuda.
            IndexError: an id outside ``[0, N)``: at ``fetch`` for CPU ids, at ``wait()`` (for every fetch of
                that gather, before any memory is read) for GPU ids, whose check would wait for the GPU.
            RuntimeError: a CUDA ``device`` where torch sees no GPU, a device string torch does not know
                (torch's own words); ``g.ndata[key]``'s decoded copy edited in place (see :meth:`whole`); at
                ``wait()``, a closed table.

        Each fetch reads its own copy of ``indices``, taken here: the caller may reuse its id buffer at once.
        Each ``wait()`` returns its own rows or raises its own error: a bad fetch does not fail the other
        fetches gathered with it (except on a ClusterTensor, whose gather is one exchange among machines).
        """
        checks.misspelt("fetch", kwargs, ("indices", "device", "pin_memory"), others="ignored, as in DGL's signature")
        self._unedited()
        return PendingFetch(self.table, indices, device, pin_memory)


class PendingFetch:
    """A recorded fetch; ``wait()`` returns its rows, gathering its whole batch the first time.

    Made by :meth:`HybridFeatureStorage.fetch`, which documents the arguments and what they raise;
    ``PendingFetch(table, indices, device, pin_memory)`` records the same fetch of ``table``.
    """

    __slots__ = ("table", "indices", "device", "pin_memory", "_batch", "_rows", "_error", "__weakref__")

    def __init__(self, table: FeatureTable, indices: torch.Tensor, device, pin_memory=False):
        if not isinstance(table, FeatureTable):
            raise TypeError(f"PendingFetch reads an hmgstore table (any hmgstore.FeatureTable), "
                            f"got {type(table).__name__}")
        if not isinstance(indices, torch.Tensor):
            raise TypeError(f"fetch takes a tensor of node ids, got {type(indices).__name__}")
        if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
            raise TypeError(f"fetch takes integer node ids (int32 or int64), got {indices.dtype}; "
                            "floats are never truncated, bools are not masks here")
        if indices.dim() != 1:
            raise ValueError(f"fetch takes 1-D node ids [n], got shape {tuple(indices.shape)}")
        if pin_memory is not None and not isinstance(pin_memory, (bool, np.bool_)):
            raise TypeError(f"pin_memory is True, False or None, got {pin_memory!r}")
        ids = _private_ids(indices)
        if ids.device.type == "cpu":  # here, so a bad fetch fails alone; GPU ids are checked by the gather
            try:
                check_range(indices if indices.dtype == torch.uint64 else ids, table.shape[0])  # uint64: as given
            except IndexError as err:
                raise IndexError(f"fetch: {err}") from None
        self.table, self.indices, self.device, self.pin_memory = table, ids, resolve_device(device), bool(pin_memory)
        self._batch: _Batch | None = None
        self._rows: torch.Tensor | None = None
        self._error: Exception | None = None  # this fetch's own failure, raised by every wait()
        _record(self)

    def wait(self) -> torch.Tensor:
        """The rows ``[n, *row_shape]`` on the requested device (see ``HybridFeatureStorage.fetch``)."""
        if self._rows is None and self._error is None:
            assert self._batch is not None  # __init__ records every fetch in a batch
            self._batch.run()
        if self._error is not None:
            raise self._error
        assert self._rows is not None  # the batch's run gave every live fetch its rows or its error
        return self._rows


def _private_ids(indices: torch.Tensor) -> torch.Tensor:
    """The fetch's own int32/int64 copy of ``indices`` (read at ``wait()``, so a caller's later write to its
    buffer must not reach it); a conversion from another integer dtype is already a copy."""
    if indices.dtype in (torch.int32, torch.int64):
        return indices.clone(memory_format=torch.contiguous_format)
    if indices.dtype == torch.uint64:  # as hmgstore reads uint64: the same bits, ids >= 2**63 negative
        return indices.view(torch.int64).clone(memory_format=torch.contiguous_format)
    return indices.to(torch.int64)  # uint8..uint32, int8, int16: every value fits


class _Batch:
    """The fetches one thread recorded for one table device and stream since its last gather."""

    def __init__(self, stream):
        self.stream = stream  # torch CUDA stream, or None for CPU tables
        self._fetches: list[weakref.ref] = []  # weak: a fetch dropped unwaited is not gathered
        self._lock = threading.Lock()
        self._done = False

    def add(self, fetch: PendingFetch) -> bool:
        """Record ``fetch``; False once this batch has been gathered."""
        with self._lock:
            if self._done:
                return False
            if len(self._fetches) >= PRUNE_AT and len(self._fetches) & (len(self._fetches) - 1) == 0:
                self._fetches = [ref for ref in self._fetches if ref() is not None]  # fetches never waited on
            self._fetches.append(weakref.ref(fetch))
            fetch._batch = self
            return True

    def run(self) -> None:
        """Gather every live fetch of the batch (once), leaving each its rows or its own error, which its
        ``wait()`` raises (see :func:`_gather_alone` for a failed fused gather)."""
        with self._lock:
            if self._done:
                return
            self._done = True
            fetches = [f for f in (ref() for ref in self._fetches) if f is not None]
            self._fetches = []
            try:
                _gather(fetches, self.stream)
            except Exception as err:  # noqa: BLE001 - handed to the fetches it belongs to
                _gather_alone([f for f in fetches if f._rows is None], err, self.stream)


def _gather_alone(fetches: list[PendingFetch], err: Exception, stream) -> None:
    """After the fused gather of ``fetches`` failed with ``err``: gather each alone, so that one bad fetch (a
    closed table, a GPU id out of range) fails only itself and the others get their rows. ``err`` goes to
    every fetch when no fetch fails alone (it is not theirs: an earlier gather's GPU id check, deferred and
    reported once, whose rows must be thrown away) and on ClusterTensors, whose gathers are collective (every
    rank must run the same ones, so one rank may not retry alone)."""
    if fetches and not isinstance(fetches[0].table, _cluster_tensor()):
        for fetch in fetches:
            try:
                _gather([fetch], stream)
            except Exception as own:  # noqa: BLE001 - this fetch's own, raised by its wait()
                fetch._error = own
        if any(fetch._error is not None for fetch in fetches):
            return
    for fetch in fetches:
        fetch._error, fetch._rows = err, None


def _gather(fetches: list[PendingFetch], stream) -> None:
    """Gather ``fetches`` (all of one kind of table) in one batch gather; give each its rows."""
    if not fetches:
        return
    # One kind of table per batch (see _record): its own batch gather, e.g. one launch for HybridTensors, one
    # exchange among machines for ClusterTensors. It sets the CUDA device itself (DGL's prefetch thread
    # starts on GPU 0).
    outs = [_pinned_staging(f) for f in fetches]
    rows = fetches[0].table.gather_batch([(f.table, f.indices) for f in fetches], outs=outs, stream=stream)
    for fetch, r in zip(fetches, rows):
        if r.device != fetch.device:
            # Into a GPU: ordered on its current stream. Into host memory: blocking, because
            # a non-blocking copy to the CPU returns before the rows have arrived.
            r = r.to(fetch.device, non_blocking=fetch.device.type == "cuda")
        fetch._rows = r
        fetch.table = fetch.indices = None  # type: ignore[assignment]  # done: the table and ids may go


def _pinned_staging(fetch: PendingFetch) -> torch.Tensor | None:
    """A pinned host buffer for a CPU table's rows bound for a GPU, when pinning was asked for."""
    table = fetch.table
    if not (fetch.pin_memory and table.device.type == "cpu" and fetch.device.type == "cuda"):
        return None
    return torch.empty((*fetch.indices.shape, *table.row_shape), dtype=table.dtype, pin_memory=True)


_open_batches = threading.local()  # per thread: {(table device, stream id): _Batch}


def _record(fetch: PendingFetch) -> PendingFetch:
    device = fetch.table.device
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    key = (device, None if stream is None else stream.cuda_stream, type(fetch.table))  # cluster tables apart
    batches = _open_batches.__dict__.setdefault("batches", {})
    batch = batches.get(key)
    if batch is None or not batch.add(fetch):
        batch = batches[key] = _Batch(stream)
        batch.add(fetch)
    return fetch


