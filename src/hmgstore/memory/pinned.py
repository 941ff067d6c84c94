"""Host tables: turning user sources into tensors, and pinning them in place.

``as_host_tensor`` accepts a torch CPU tensor, a numpy array or an
``np.memmap`` and returns a torch view of the same memory (no copy).

:class:`PinnedHost` page-locks that memory with ``cudaHostRegister`` so that
GPU kernels can read it directly over PCIe (zero-copy). Four facts shape it:

- Registration is refcounted per page range, so tables over the same tensor
  (or over views of it) share registrations, and memory is unregistered when
  the last one closes or is garbage-collected. The handle holds a reference
  to the tensor, so the memory cannot be freed while registered
  (PyTorch-Direct's documented pitfall).
- ``cudaHostRegister`` works on whole pages, and a small tensor may share a
  page with another allocation that someone else registers; such tensors
  (under ``SMALL_COPY_BYTES``) are copied into pinned memory instead, which
  costs little and never collides.
- Memory another component pinned may be pinned only in part, while
  ``tensor.is_pinned()`` looks at its first byte: every page is looked at,
  and the pages no one pinned are registered here.
- Linux copies page-locked private anonymous memory into a child at
  ``fork`` (so that the parent's pinned pages stay its own), so every forked
  DataLoader worker gets a copy of a table pinned in place
  (``benchmarks/probes/probe_fork.py``). Memory that is shared already (``share_memory_()``,
  cudaHostAlloc, hmgstore's owned memory for GPU tables) is not copied. A
  fork that would copy more than ``FORK_WARN_BYTES`` logs a warning once,
  saying how to avoid it.
- Page-locking tens of GB takes seconds, so large tensors are registered in
  ``CHUNK_BYTES`` pieces under a progress bar. The pieces are adjacent in the
  unified address space and a kernel reads across their seams (GPU-tested
  with rows straddling a seam in tests/test_tensor.py).
"""
from __future__ import annotations

import logging
import math
import os
import threading
import weakref

import numpy as np
import torch

from ..cuda.host import AlreadyPinned, host_register, host_unregister, unpinned_ranges
from ..cuda.runtime import synchronize
from ..util.progress import tqdm
from . import owned
from .mapped import check_whole, mappings
from .numpy_source import numpy_tensor

log = logging.getLogger(__name__)

#: Tensors smaller than this are copied to pinned memory rather than
#: registered in place: they may share a page with other heap allocations.
SMALL_COPY_BYTES = 64 << 20
#: Registration piece size; aligned so that pieces never share a page.
CHUNK_BYTES = 1 << 30
#: A fork that copies at least this many bytes of tables pinned in place logs a warning (once per process).
FORK_WARN_BYTES = 256 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def as_host_tensor(source) -> tuple[torch.Tensor, bool]:
    """A torch CPU tensor sharing memory with ``source``, and whether it is read-only.

    ``source``: torch CPU tensor, numpy array or ``np.memmap`` with at least
    one dimension (rows first). The result is a new tensor object over the
    same memory, detached from autograd (gathers never carry gradients), so
    that later ``set_()``, ``.data = ...`` or ``requires_grad_()`` on the
    caller's tensor do not reach it. Read-only numpy arrays (e.g. memmaps
    opened with ``mode="r"``) are wrapped without a copy; hmgstore never
    writes to them, nor to a torch tensor over such memory (``torch.from_numpy``
    of one), which the process's memory map tells. Raises TypeError for CUDA
    tensors, sparse tensors (with the fix: ``source.to_dense()``), numpy
    dtypes torch lacks and other types; ValueError for lazy conjugate or
    negative views (``x.conj()``: their memory holds other values), numpy arrays torch
    cannot read in place (foreign byte order, backwards or column-major
    rows), with the numpy fix; RuntimeError for an array over a memory-mapped
    file that was cut short (:func:`hmgstore.memory.mapped.check_whole`), whose
    lost pages any read would die of (SIGBUS).
    """
    if isinstance(source, torch.Tensor):
        if source.layout != torch.strided:  # sparse rows have no place in memory a kernel could read
            raise TypeError(f"the source table is a {source.layout} tensor; a table reads dense rows in place: "
                            "pass source.to_dense() (a copy of all its values)")
        if source.device.type != "cpu":
            raise TypeError(
                f"the source table must live in host memory, got a tensor on {source.device}; "
                "pass the CPU tensor (hmgstore decides what to copy to the GPU)")
        if source.is_conj() or source.is_neg():  # its bytes hold the values before the lazy op: a kernel reads those
            raise ValueError(f"the source table is a lazy {'conjugate' if source.is_conj() else 'negative'} view, "
                             "whose memory holds other values than it shows; pass source.resolve_conj().resolve_neg() "
                             "(a copy holding the values)")
        tensor, read_only = source.detach(), _in_read_only_mapping(source)
    elif isinstance(source, np.ndarray):
        check_whole(source)  # a memmap's file cut short: refused here, before a copy or pin reads a lost page
        tensor, read_only = numpy_tensor(source), not source.flags.writeable
    else:
        file = " (a file's rows: hmgstore.load(path) reads .npy, .pt and raw files)" if isinstance(
            source, (str, bytes, os.PathLike)) else ""
        raise TypeError(
            f"cannot build a table from {type(source).__name__}; pass a torch CPU tensor, "
            f"a numpy array or an np.memmap{file}")
    if tensor.dim() == 0:
        raise ValueError("the source table must have at least one dimension (rows)")
    return tensor, read_only


def _in_read_only_mapping(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s storage lies (partly) in memory this process may not write, as a torch tensor made by
    ``torch.from_numpy`` over a memmap opened with ``mode="r"`` does: torch cannot tell, and a write there kills
    the process (SIGSEGV). Read from Linux's ``/proc/self/maps`` (once per table built); False where it cannot
    be read."""
    storage = tensor.untyped_storage()
    lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    if hi == lo:
        return False
    try:
        return any(m.start < hi and lo < m.end and m.perms[1] != "w" for m in mappings())
    except (OSError, ValueError):
        return False


def row_layout(tensor: torch.Tensor) -> tuple[int, int]:
    """``(row_bytes, pitch_bytes)`` of a table whose rows are ``tensor[i]``.

    Rows must each be contiguous (the trailing dimensions dense, row-major);
    the step between rows may be larger than a row (a column slice such as
    ``x[:, :64]``). Raises ValueError otherwise, saying how to fix it.
    """
    trailing = tensor.shape[1:]
    if 0 in trailing:  # empty rows: no byte to lay out, whatever strides torch gave the empty tensor
        return 0, 0
    if tensor.shape[0] == 0:  # no row: nothing is laid out, and numpy gives an empty array strides of 0
        row_bytes = math.prod(trailing) * tensor.element_size()
        return row_bytes, row_bytes
    expected = 1
    for size, stride in reversed(list(zip(trailing, tensor.stride()[1:]))):
        if size != 1 and stride != expected:
            raise ValueError(
                f"each row of the source must be contiguous in memory (strides {tensor.stride()} "
                f"for shape {tuple(tensor.shape)}); pass source.contiguous(), which copies "
                f"{tensor.numel() * tensor.element_size() / 1e9:.2f} GB")
        expected *= size
    row_bytes = expected * tensor.element_size()
    pitch = tensor.stride(0) * tensor.element_size() if tensor.shape[0] > 1 else row_bytes
    if pitch < row_bytes:
        raise ValueError(f"rows of the source overlap (row stride {tensor.stride(0)}); pass source.contiguous()")
    return row_bytes, pitch


def extent(tensor: torch.Tensor) -> tuple[int, int]:
    """``(first_byte_address, nbytes)`` spanned by the rows of ``tensor``."""
    row_bytes, pitch = row_layout(tensor)
    n = tensor.shape[0]
    return tensor.data_ptr(), 0 if n == 0 else (n - 1) * pitch + row_bytes


def _progress_bar(total: int, desc: str, progress: bool):
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False,
                disable=not progress or total < CHUNK_BYTES)


class _Registry:
    """Our own cudaHostRegister calls: disjoint page-aligned ranges, each refcounted.

    A request is covered by the ranges already registered that overlap it
    plus new registrations for the gaps between them, so views of one
    tensor, or one tensor used by several tables, share registrations.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._ranges: dict[tuple[int, int], list] = {}  # (start, end) -> [count, chunk ptrs, bytes a fork copies]

    def acquire(self, start: int, end: int, read_only: bool, progress: bool) -> list[tuple[int, int]]:
        """Make ``[start, end)`` (page-aligned) registered; returns the keys to release.

        Raises :class:`hmgstore.cuda.host.AlreadyPinned` when another
        component has pinned part of a gap; nothing stays registered then.
        """
        with self._lock:
            held = sorted(k for k in self._ranges if k[0] < end and start < k[1])
            gaps, cursor = [], start
            for s, e in held:
                if s > cursor:
                    gaps.append((cursor, s))
                cursor = max(cursor, e)
            if cursor < end:
                gaps.append((cursor, end))
            made = []
            bar = _progress_bar(sum(e - s for s, e in gaps), "pinning host table", progress)
            try:
                for s, e in gaps:
                    copied = private_anonymous_bytes(s, e)
                    self._ranges[(s, e)] = [0, self._register(s, e, read_only, bar), copied]
                    made.append((s, e))
            except BaseException:
                for key in made:
                    self._unregister(self._ranges.pop(key)[1])
                raise
            finally:
                bar.close()
            keys = held + made
            for key in keys:
                self._ranges[key][0] += 1
            return keys

    def release(self, keys: list[tuple[int, int]]) -> None:
        with self._lock:
            done = []
            for key in keys:
                entry = self._ranges.get(key)
                if entry is not None:
                    entry[0] -= 1
                    if entry[0] == 0:
                        done.append(self._ranges.pop(key)[1])
        errors = []
        for chunks in done:  # every count is settled before any unregistration can fail
            try:
                self._unregister(chunks)
            except Exception as err:
                errors.append(err)
        if errors:
            raise errors[0]

    def ranges(self) -> list[tuple[int, int]]:
        with self._lock:
            return sorted(self._ranges)

    def copied_at_fork(self) -> int:
        """Bytes of the ranges registered here that a fork copies into the child (private anonymous pages)."""
        return sum(entry[2] for entry in list(self._ranges.values()))

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any range registered here meets ``[start, end)``."""
        with self._lock:
            return any(s < end and start < e for s, e in self._ranges)

    @staticmethod
    def _register(start: int, end: int, read_only: bool, bar) -> list[int]:
        chunks = []
        try:
            for ptr in range(start, end, CHUNK_BYTES):
                size = min(CHUNK_BYTES, end - ptr)
                host_register(ptr, size, read_only)
                chunks.append(ptr)
                bar.update(size)
        except BaseException:
            _Registry._unregister(chunks)
            raise
        return chunks

    @staticmethod
    def _unregister(chunks: list[int]) -> None:
        for ptr in chunks:
            host_unregister(ptr)


_registry = _Registry()


def private_anonymous_bytes(start: int, end: int) -> int:
    """Bytes of ``[start, end)`` in private anonymous mappings, which a fork copies once they are pinned
    (``/proc/self/maps``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return 0
    total = 0
    for line in lines:
        fields = line.split()
        low, high = (int(a, 16) for a in fields[0].split("-"))
        if low < end and start < high and fields[1][3] == "p" and fields[4] == "0":
            total += min(high, end) - max(low, start)
    return total


_fork_warned = False


def _before_fork() -> None:
    """Warn (once per process) when a fork is about to copy tables pinned in place into the child."""
    global _fork_warned
    copied = 0 if _fork_warned else _registry.copied_at_fork()
    if copied >= FORK_WARN_BYTES:
        _fork_warned = True
        log.warning(
            "hmgstore: this fork copies the %.2f GB of page-locked private memory of host tables (pinned in "
            "place, or owned with backing='hugepage') into the new process (Linux copies such pages at fork), "
            "and so does every forked DataLoader worker. Build the tables with copy=True (or "
            "HybridTensor.empty / hmgstore.load) and the default backing, whose memory forked processes "
            "share, or call source.share_memory_() before building them.", copied / 1e9)


def _in_child() -> None:
    """A forked child's copies of the pinned pages are its own and not pinned: its forks copy nothing more."""
    global _fork_warned
    _fork_warned = False
    _registry._lock = threading.Lock()  # another thread may have held it at the fork
    for entry in _registry._ranges.values():
        entry[2] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def registered_ranges() -> list[tuple[int, int]]:
    """The host address ranges hmgstore itself has page-locked now (for checks and diagnostics)."""
    return _registry.ranges()


def _unpinned_pages(begin: int, end: int, progress: bool) -> list[tuple[int, int]]:
    """The parts of ``[begin, end)`` (page-aligned) that no one has page-locked."""
    with _progress_bar(end - begin, "checking pinned pages", progress) as bar:
        return unpinned_ranges(begin, end, PAGE, progress=lambda done: bar.update(done - bar.n))


class PinnedHost:
    """A host tensor readable by GPU kernels: pinned in place, or copied to pinned memory if small.

    ``tensor`` is what kernels read (the source itself, or its pinned copy for
    small sources) and ``pitch`` the bytes between its rows. ``devices``: the
    GPUs that may read it; :meth:`release` (or dropping the object) waits for
    all of them before unregistering, and the source stays referenced until
    then. Memory pinned by someone else is used where it is pinned; the pages
    they did not pin are registered here.
    """

    def __init__(self, source: torch.Tensor, devices, read_only: bool = False, progress: bool = True):
        self._finalizer = None
        self.registered = False  # True when ``tensor`` is the source and some of it was registered here
        self.owner_pinned = False  # True when someone else pinned (part of) the source
        self.devices = tuple(torch.device(d) for d in (devices if isinstance(devices, (list, tuple)) else [devices]))
        start, size = extent(source)
        begin, end = start - start % PAGE, -(-(start + size) // PAGE) * PAGE
        keys = None
        if size and source.is_pinned() and not _registry.overlaps(begin, end):
            # is_pinned() only looked at the first byte; memory hmgstore allocated page-locked needs no look
            gaps = [] if owned.page_locked_here(start, start + size) else _unpinned_pages(begin, end, progress)
            self.owner_pinned = True
            if gaps:
                keys = self._acquire_gaps(gaps, read_only, progress)
        elif size < SMALL_COPY_BYTES:
            self.tensor = torch.empty_like(source, pin_memory=True).copy_(source)
        else:
            try:
                keys = _registry.acquire(begin, end, read_only, progress)
            except AlreadyPinned:
                if _registry.overlaps(begin, end):
                    raise
                self.owner_pinned = True  # pinned by someone else in the middle: register around it
                keys = self._acquire_gaps(_unpinned_pages(begin, end, progress), read_only, progress)
        if self.owner_pinned or keys is not None:
            self.tensor = source
        if keys is not None:
            self.registered = True
            # The finalizer holds the source, so memory outlives its registration.
            self._finalizer = weakref.finalize(self, _release, keys, source, self.devices)
        self.address = self.tensor.data_ptr()
        self.pitch = row_layout(self.tensor)[1]

    @staticmethod
    def _acquire_gaps(gaps, read_only: bool, progress: bool) -> list[tuple[int, int]]:
        keys: list[tuple[int, int]] = []
        try:
            for s, e in gaps:
                keys += _registry.acquire(s, e, read_only, progress)
        except BaseException:
            _registry.release(keys)
            raise
        return keys

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


def _release(keys, source, devices) -> None:
    synchronize(devices)  # no kernel on any GPU that reads it may still be reading the range
    try:
        _registry.release(keys)
    except Exception as err:  # never raise from a finalizer
        log.warning("could not unregister pinned host memory: %s", err)
