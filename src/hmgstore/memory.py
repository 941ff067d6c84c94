"""Host memory: turning user sources into tensors, and pinning them in place.

``as_host_tensor`` accepts a torch CPU tensor, a numpy array or an
``np.memmap`` and returns a torch view of the same memory (no copy).

``pin_in_place`` page-locks that memory with ``cudaHostRegister`` so that GPU
kernels can read it directly over PCIe (zero-copy). Three facts shape it:

- Registration is refcounted per page range, so tables over the same tensor
  (or over views of it) share registrations, and memory is unregistered when
  the last one closes or is garbage-collected. The handle holds a reference to the
  tensor, so the memory cannot be freed while registered (PyTorch-Direct's
  documented pitfall).
- ``cudaHostRegister`` works on whole pages, and a small tensor may share a
  page with another allocation that someone else registers; such tensors
  (under ``SMALL_COPY_BYTES``) are copied into pinned memory instead, which
  costs little and never collides.
- Page-locking tens of GB takes seconds, so large tensors are registered in
  ``CHUNK_BYTES`` pieces under a progress bar. The pieces are adjacent in the
  unified address space and a kernel reads across their seams (GPU-tested
  with rows straddling a seam in tests/test_gpu_tensor.py).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import tempfile
import threading
import warnings
import weakref

import numpy as np
import torch
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

#: Tensors smaller than this are copied to pinned memory rather than
#: registered in place: they may share a page with other heap allocations.
SMALL_COPY_BYTES = 64 << 20
#: Registration piece size; aligned so that pieces never share a page.
CHUNK_BYTES = 1 << 30
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def as_host_tensor(source) -> tuple[torch.Tensor, bool]:
    """A torch CPU tensor sharing memory with ``source``, and whether it is read-only.

    ``source``: torch CPU tensor, numpy array or ``np.memmap`` with at least
    one dimension (rows first). Read-only numpy arrays (e.g. memmaps opened
    with ``mode="r"``) are wrapped without a copy; hmgstore never writes to
    them. Raises TypeError for CUDA tensors and other types.
    """
    if isinstance(source, torch.Tensor):
        if source.device.type != "cpu":
            raise TypeError(
                f"the source table must live in host memory, got a tensor on {source.device}; "
                "pass the CPU tensor (hmgstore decides what to copy to the GPU)")
        tensor, read_only = source, False
    elif isinstance(source, np.ndarray):
        read_only = not source.flags.writeable
        with warnings.catch_warnings():  # non-writable arrays: we only read them
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(source)
    else:
        raise TypeError(
            f"cannot build a table from {type(source).__name__}; pass a torch CPU tensor, "
            "a numpy array or an np.memmap")
    if tensor.dim() == 0:
        raise ValueError("the source table must have at least one dimension (rows)")
    return tensor, read_only


def row_layout(tensor: torch.Tensor) -> tuple[int, int]:
    """``(row_bytes, pitch_bytes)`` of a table whose rows are ``tensor[i]``.

    Rows must each be contiguous (the trailing dimensions dense, row-major);
    the step between rows may be larger than a row (a column slice such as
    ``x[:, :64]``). Raises ValueError otherwise, saying how to fix it.
    """
    trailing = tensor.shape[1:]
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


class _Registry:
    """Our own cudaHostRegister calls: disjoint page-aligned ranges, each refcounted.

    A request is covered by the ranges already registered that overlap it
    plus new registrations for the gaps between them, so views of one
    tensor, or one tensor used by several tables, share registrations.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._ranges: dict[tuple[int, int], list] = {}  # (start, end) -> [count, chunk ptrs]

    def acquire(self, start: int, end: int, read_only: bool, progress: bool) -> list[tuple[int, int]]:
        """Make ``[start, end)`` (page-aligned) registered; returns the keys to release."""
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
            bar = tqdm(total=sum(e - s for s, e in gaps), unit="B", unit_scale=True, desc="pinning host table",
                       disable=not progress or end - start < CHUNK_BYTES, leave=False)
            try:
                for s, e in gaps:
                    self._ranges[(s, e)] = [0, self._register(s, e, read_only, bar)]
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

    def holds(self, address: int) -> bool:
        with self._lock:
            return any(s <= address < e for s, e in self._ranges)

    @staticmethod
    def _register(start: int, end: int, read_only: bool, bar) -> list[int]:
        from . import _cuda

        chunks = []
        try:
            for ptr in range(start, end, CHUNK_BYTES):
                size = min(CHUNK_BYTES, end - ptr)
                _cuda.host_register(ptr, size, read_only)
                chunks.append(ptr)
                bar.update(size)
        except BaseException:
            _Registry._unregister(chunks)
            raise
        return chunks

    @staticmethod
    def _unregister(chunks: list[int]) -> None:
        from . import _cuda

        for ptr in chunks:
            _cuda.host_unregister(ptr)


_registry = _Registry()


class PinnedHost:
    """A host tensor readable by GPU kernels, pinned in place or copied if small.

    ``tensor`` is what kernels read (the source itself, or its pinned copy for
    small sources) and ``pitch`` the bytes between its rows. Call :meth:`release` (or drop the object) to unregister;
    the source stays referenced until then.
    """

    def __init__(self, source: torch.Tensor, device: torch.device, read_only: bool = False, progress: bool = True):
        self._finalizer = None
        self.registered = False  # True when ``tensor`` is the source, registered in place by us
        start, size = extent(source)
        if source.is_pinned() and not _registry.holds(source.data_ptr()):
            self.tensor = source  # pinned by its owner (cudaHostAlloc, pin_memory): use as is
        elif size < SMALL_COPY_BYTES:
            self.tensor = torch.empty_like(source, pin_memory=True).copy_(source)
        else:
            begin, end = start - start % _PAGE, -(-(start + size) // _PAGE) * _PAGE
            keys = _registry.acquire(begin, end, read_only, progress)
            self.tensor = source
            self.registered = True
            # The finalizer holds the source, so memory outlives its registration.
            self._finalizer = weakref.finalize(self, _release, keys, source, device)
        self.pitch = row_layout(self.tensor)[1]

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


def _release(keys, source, device) -> None:
    try:
        torch.cuda.synchronize(device)  # no kernel may still be reading the range
    except Exception:  # interpreter shutdown or a dead context: unregister anyway
        pass
    try:
        _registry.release(keys)
    except Exception as err:  # never raise from a finalizer
        log.warning("could not unregister pinned host memory: %s", err)


# ---- host memory shared by the processes of a node ------------------------------
#: Names of shared segments start with this, then the creating process's pid.
SEGMENT_PREFIX = "hmgstore-"
COPY_CHUNK_BYTES = 256 << 20


def segment_dir() -> str:
    """Where shared segments live: ``$HMGSTORE_SHM_DIR``, else /dev/shm (tmpfs), else the temp dir."""
    chosen = os.environ.get("HMGSTORE_SHM_DIR")
    if chosen:
        return chosen
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _segment_path(name: str) -> str:
    return os.path.join(segment_dir(), name)


def create_segment(shape, dtype: torch.dtype) -> tuple[str, torch.Tensor]:
    """A new named shared segment holding an uninitialised ``shape`` tensor of ``dtype``.

    The memory is reserved up front, so a full /dev/shm raises MemoryError
    here (saying how much is free and what to do) instead of killing the
    process with SIGBUS later. Other processes of the node map it with
    :func:`attach_segment`; :func:`unlink_segment` removes the name (the memory
    lives until the last mapping goes).
    """
    sweep_stale_segments()
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    name = f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    path = _segment_path(name)
    stat = os.statvfs(os.path.dirname(path))
    free = stat.f_bavail * stat.f_frsize
    if nbytes > free:
        raise MemoryError(
            f"a node-shared table of {nbytes / 1e9:.2f} GB does not fit in {os.path.dirname(path)} "
            f"({free / 1e9:.2f} GB free). Enlarge it (docker: --shm-size; or mount -o remount,size=...), or "
            "point HMGSTORE_SHM_DIR at a larger tmpfs")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if nbytes:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as err:
                raise MemoryError(f"could not reserve {nbytes / 1e9:.2f} GB in {os.path.dirname(path)}: {err}; "
                                  "free space there or point HMGSTORE_SHM_DIR elsewhere") from None
        os.close(fd)
        return name, attach_segment(name, shape, dtype)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        unlink_segment(name)
        raise


def attach_segment(name: str, shape, dtype: torch.dtype) -> torch.Tensor:
    """Map the shared segment ``name`` as a ``shape`` tensor of ``dtype`` (no copy).

    The tensor keeps the mapping alive. Raises FileNotFoundError naming the
    segment when it is gone.
    """
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    try:
        raw = np.memmap(_segment_path(name), dtype=np.uint8, mode="r+", shape=(nbytes,))
    except FileNotFoundError:
        raise FileNotFoundError(f"shared segment {name} is gone from {segment_dir()}: its creator removed it "
                                "or died before the others attached") from None
    return torch.from_numpy(raw).view(dtype).view(shape)


def unlink_segment(name: str) -> None:
    """Remove a segment's name (idempotent); mappings stay valid."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_segment_path(name))


def sweep_stale_segments() -> list[str]:
    """Remove segments whose creating process is gone (it was killed before removing them).

    Returns the names removed. Only names of this host's dead processes are touched.
    """
    removed = []
    try:
        names = os.listdir(segment_dir())
    except OSError:
        return removed
    for name in names:
        if not name.startswith(SEGMENT_PREFIX):
            continue
        pid = name[len(SEGMENT_PREFIX):].split("-")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            unlink_segment(name)
            removed.append(name)
    if removed:
        log.warning("hmgstore: removed %d shared segment(s) left by processes that died: %s", len(removed),
                    ", ".join(removed))
    return removed


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def copy_in_chunks(dst: torch.Tensor, src: torch.Tensor, progress: bool, desc: str) -> None:
    """``dst.copy_(src)`` row block by row block, under a progress bar for large tables."""
    rows = dst.shape[0]
    row_bytes = max(1, dst[:1].nbytes)
    step = max(1, COPY_CHUNK_BYTES // row_bytes)
    with tqdm(total=rows * row_bytes, unit="B", unit_scale=True, desc=desc, leave=False,
              disable=not progress or rows * row_bytes < CHUNK_BYTES) as bar:
        for start in range(0, rows, step):
            end = min(rows, start + step)
            dst[start:end].copy_(src[start:end])
            bar.update((end - start) * row_bytes)
