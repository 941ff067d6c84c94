"""Host memory hmgstore allocates itself, backed by huge pages.

Where hmgstore creates a host tier (``HybridTensor(..., copy=True)``,
``HybridTensor.empty``, :func:`hmgstore.load`, the OGB reader) it does not
take what ``malloc`` gives: a GPU reading scattered rows zero-copy has to
translate every host page it touches, and memory mapped in 2 MiB pages is
read faster than 4 KiB pages at small rows (benchmarks/NOTES.md). Two backings:

- ``"cuda"``: ``cudaHostAlloc``: page-locked by the driver at allocation.
  It needs a GPU, and takes longer to set up than the mmap, but it is a shared mapping:
  forked processes (DataLoader workers) see the same pages and copy nothing
  (so a worker's writes to such a table reach its parent's too).
- ``"hugepage"``: an anonymous private ``mmap``, 2 MiB aligned, with
  ``madvise(MADV_HUGEPAGE)``, so the kernel backs it with transparent huge
  pages when the system allows them (``/sys/kernel/mm/transparent_hugepage/
  enabled`` set to ``always`` or ``madvise``). It needs no GPU, and a GPU
  table registers it in place; it reads as fast as ``"cuda"``. But Linux
  copies private pages that are pinned for DMA into a child at ``fork``
  (so that the parent's pinned pages stay its own; seen on 6.18): every forked
  DataLoader worker would get a copy of a registered table
  (``benchmarks/probes/probe_fork.py``).

``"auto"`` (the default) takes ``"cuda"`` for a table that a GPU reads and
``"hugepage"`` for a CPU table (never registered, so forks share it
copy-on-write). Both return a plain torch CPU tensor; the memory is freed
when the last tensor over it goes.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import threading
import weakref

import numpy as np
import torch

from ..cuda.runtime import cupy, synchronize
from ..util.progress import tqdm

#: Huge page size the allocations are aligned to.
HUGE_PAGE = 2 << 20
#: Rows are copied into owned memory in pieces of about this many bytes (one progress step each).
COPY_CHUNK_BYTES = 256 << 20
#: Copies smaller than this show no progress bar.
QUIET_BYTES = 1 << 30
BACKINGS = ("auto", "hugepage", "cuda")
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"

_cuda_ranges: dict[int, int] = {}  # start -> end of live cudaHostAlloc allocations made here
_cuda_lock = threading.Lock()


def transparent_huge_pages() -> str:
    """The system's transparent huge page mode: ``"always"``, ``"madvise"``, ``"never"`` or ``"unknown"``."""
    try:
        with open(_THP) as f:
            text = f.read()
    except OSError:
        return "unknown"
    chosen = [w.strip("[]") for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else "unknown"


def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty(0, dtype=dtype).element_size()


def _check_backing(backing: str) -> None:
    if backing not in BACKINGS:
        raise ValueError(f"backing must be one of {BACKINGS}, got {backing!r}")


def chosen(backing: str, device=None) -> str:
    """The backing ``"auto"`` stands for: ``"cuda"`` when ``device`` is a GPU (or, with no device given, when
    a GPU is present), else ``"hugepage"``; any other backing is checked and returned as it is."""
    _check_backing(backing)
    if backing != "auto":
        return backing
    gpu = torch.cuda.is_available()
    if device is None:
        return "cuda" if gpu else "hugepage"
    return "cuda" if torch.device(device).type == "cuda" and gpu else "hugepage"  # no GPU: the device check says so


def empty(shape, dtype: torch.dtype, backing: str = "auto", device=None, zero: bool = True) -> torch.Tensor:
    """A zero-filled CPU tensor on owned memory (cudaHostAlloc's pages are zeroed here: rows start as zeros
    whatever the backing; ``zero=False`` skips that for a caller that writes every byte at once).

    ``shape``: sequence of ints; ``dtype``: torch dtype; ``backing``: see the
    module docstring; ``device``: the device of the table it is for (decides
    ``"auto"``). Raises ValueError for an unknown backing, MemoryError when
    the memory cannot be had, RuntimeError for ``"cuda"`` without a GPU.
    """
    backing = chosen(backing, device)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"a shape cannot have negative sizes: {shape}")
    nbytes = _nbytes(shape, dtype)
    if backing == "hugepage":
        raw = _hugepage_bytes(nbytes)  # anonymous pages come zeroed
    else:
        raw = _cuda_bytes(nbytes)
        if zero:
            raw.view(torch.int64 if nbytes % 8 == 0 else torch.uint8).zero_()
    return raw.view(dtype).view(shape)


def _hugepage_bytes(nbytes: int) -> torch.Tensor:
    rounded = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
    try:
        mapping = mmap.mmap(-1, rounded + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as err:
        raise MemoryError(f"could not map {nbytes / 1e9:.2f} GB of host memory: {err}") from None
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive as long as any view
    offset = (-whole.data_ptr()) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE, offset, rounded)
        except OSError:  # a kernel without THP: 4 KiB pages, still correct
            pass
    return whole[offset:offset + nbytes]


class _CudaHostBlock:
    """A cudaHostAlloc allocation; freed (after every GPU is idle) when this object goes."""

    def __init__(self, nbytes: int):
        if not torch.cuda.is_available():
            raise RuntimeError("backing='cuda' needs a GPU (cudaHostAlloc); use backing='hugepage'")
        cp = cupy()
        try:
            self.ptr = cp.cuda.runtime.hostAlloc(max(nbytes, 1), cp.cuda.runtime.hostAllocPortable)
        except cp.cuda.runtime.CUDARuntimeError as err:
            raise MemoryError(f"cudaHostAlloc of {nbytes / 1e9:.2f} GB failed: {err}") from None
        # Every tensor over the block holds this buffer, and the block is freed when the buffer goes. Nothing
        # refers back to the buffer: a cycle (buffer -> block -> buffer) would keep the memory until a garbage
        # collection, after its last tensor was dropped.
        self.buffer = (ctypes.c_uint8 * max(nbytes, 1)).from_address(self.ptr)
        with _cuda_lock:
            _cuda_ranges[self.ptr] = self.ptr + nbytes
        weakref.finalize(self.buffer, _free_cuda_block, self.ptr, os.getpid())


def _free_cuda_block(ptr: int, owner: int) -> None:
    if os.getpid() != owner:  # a forked child shares the parent's block and cannot use CUDA: the parent frees it
        return
    with _cuda_lock:
        _cuda_ranges.pop(ptr, None)
    synchronize([torch.device("cuda", d) for d in range(torch.cuda.device_count())])
    try:
        cupy().cuda.runtime.freeHost(ptr)
    except Exception:  # interpreter shutdown
        pass


def _cuda_bytes(nbytes: int) -> torch.Tensor:
    block = _CudaHostBlock(nbytes)
    return torch.frombuffer(block.buffer, dtype=torch.uint8)[:nbytes]


def page_locked_here(start: int, end: int) -> bool:
    """Whether ``[start, end)`` lies inside one cudaHostAlloc allocation made by :func:`empty`."""
    with _cuda_lock:
        return any(s <= start and end <= e for s, e in _cuda_ranges.items())


def copy_in(dst: torch.Tensor, src, progress: bool = True, desc: str = "copying into host tier",
            encode=None, order: torch.Tensor | None = None) -> torch.Tensor:
    """``dst[:] = src`` row block by row block (converting dtype), under a progress bar for large tables.

    ``src``: a CPU tensor or numpy array (a memmap is read piece by piece,
    never whole) with ``dst``'s shape; either may be strided. ``encode``:
    instead of a dtype conversion, ``encode(rows, first_row, out=dst_rows)`` writes each
    block of ``src`` rows (a CPU tensor) as ``dst``'s rows, whose shape
    may then differ from ``src``'s past the first dimension (stored row
    formats, :mod:`hmgstore.rows.formats`). ``order``: ``dst[i] = src[order[i]]``
    (int64 CPU, a permutation: a host tier laid out by locality). Returns
    ``dst``.
    """
    same_rows = encode is not None and src.shape[0] == dst.shape[0]
    if not same_rows and tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"cannot copy a {tuple(src.shape)} source into a {tuple(dst.shape)} table")
    rows = dst.shape[0]
    row_bytes = max(1, dst[:1].numel() * dst.element_size())  # blocks of the destination's bytes
    step = max(1, COPY_CHUNK_BYTES // row_bytes)
    with tqdm(total=rows * row_bytes, unit="B", unit_scale=True, desc=desc, leave=False,
              disable=not progress or rows * row_bytes < QUIET_BYTES) as bar:
        for start in range(0, rows, step):
            end = min(rows, start + step)
            piece = src[start:end] if order is None else src[order[start:end].numpy()] if isinstance(src, np.ndarray) \
                else torch.index_select(src, 0, order[start:end])  # rows by index: faster than src[ids]
            if isinstance(piece, np.ndarray):
                piece = torch.from_numpy(np.ascontiguousarray(piece))
            if encode is None:
                dst[start:end].copy_(piece)
            else:
                ids = start if order is None else order[start:end]  # the caller's ids, for error messages
                encode(piece, ids, out=dst[start:end])  # straight into place: no block-sized temporary
            bar.update((end - start) * row_bytes)
    return dst


def copy_of(source: torch.Tensor, dtype: torch.dtype | None = None, backing: str = "auto",
            progress: bool = True, device=None) -> torch.Tensor:
    """A copy of ``source`` on owned memory (in ``dtype``, default the source's), made piece by piece, for a
    table on ``device`` (see :func:`chosen`)."""
    out = empty(source.shape, dtype or source.dtype, backing, device, zero=False)
    return copy_in(out, source, progress)
