"""Host memory shared by the processes of one node: named segments in /dev/shm.

A segment is a file in a tmpfs (``/dev/shm``, or ``$HMGSTORE_SHM_DIR``)
mapped by every process that uses it, so a table built once is held once per
node. Its name starts with :data:`SEGMENT_PREFIX` and its creator's pid, so
segments of processes that died before removing them can be swept
(:func:`sweep_stale_segments`).
"""
from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import secrets
import tempfile

import torch

log = logging.getLogger(__name__)

#: Names of shared segments start with this, then the creating process's pid.
SEGMENT_PREFIX = "hmgstore-"


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
        fd = os.open(_segment_path(name), os.O_RDWR)
    except FileNotFoundError:
        raise FileNotFoundError(f"shared segment {name} is gone from {segment_dir()}: its creator removed it "
                                "or died before the others attached") from None
    try:
        mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # huge pages where the tmpfs allows them (shmem_enabled: advise)
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)


def unlink_segment(name: str) -> None:
    """Remove a segment's name (idempotent); mappings stay valid."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_segment_path(name))


def sweep_stale_segments() -> list[str]:
    """Remove segments whose creating process is gone (it was killed before removing them).

    Returns the names removed. Only names of this host's dead processes are touched.
    """
    removed: list[str] = []
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
