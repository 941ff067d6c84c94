"""Arrays over a memory-mapped file: whether the file still holds every byte they view.

A numpy array over a file's pages (an ``np.memmap``, ``np.load(..., mmap_mode=...)``, a plain array viewing
one, as ``np.asarray(mm)`` is, or one over an ``mmap.mmap``, as ``np.frombuffer(m)`` is) reads the file when a
page is touched. Once the file is cut short, touching a page past its new end is a SIGBUS, which kills the
process: no Python error to catch. So whatever reads such an array whole (a copy, an encoding, a pickle of its
rows, pinning a small source into pinned memory) calls :func:`check_whole` first: one ``fstat`` of the
descriptor the mapping itself keeps open, so the file measured is the one the pages come from, even after it
was renamed, replaced or deleted by name (:func:`file_span`).

A torch tensor made from such an array (``torch.from_numpy``) does not show its file and is not checked here (a
table over one finds the file in the process's memory map, :func:`mapping_at`, and opens the very file mapped,
:func:`open_mapped`: :func:`hmgstore.rows.file_identity.watch`); nor can a file cut while a read is under way be
caught (copy the rows while it is whole).
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeGuard

import numpy as np

#: How a mapped file is opened.
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class Mapping(NamedTuple):
    """One line of Linux's ``/proc/self/maps``: a range of this process's addresses and what backs it."""

    start: int
    end: int
    perms: str  # "rw-p" and the like
    offset: int  # the file offset of ``start``
    device: str  # "major:minor", hex
    inode: int
    name: str  # a file's path (without " (deleted)"), "[heap]" and the like, or "" for anonymous memory

    @property
    def device_number(self) -> int:
        """``device`` as ``os.stat``'s ``st_dev``."""
        major, minor = (int(x, 16) for x in self.device.split(":"))
        return os.makedev(major, minor)


def mappings() -> Iterator[Mapping]:
    """This process's memory map, in address order; raises OSError where ``/proc/self/maps`` cannot be read."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.rstrip("\n").split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5].removesuffix(" (deleted)") if len(fields) == 6 else ""
            yield Mapping(start, end, fields[1], int(fields[2], 16), fields[3], int(fields[4]), name)


def mapping_at(address: int) -> Mapping | None:
    """The line of ``/proc/self/maps`` whose range holds ``address``; None where none does or the map cannot be
    read."""
    try:
        return next((m for m in mappings() if m.start <= address < m.end), None)
    except (OSError, ValueError):
        return None


def is_file(found: Mapping | None) -> TypeGuard[Mapping]:
    """Whether ``found`` maps a file's pages, which may be cut short under it: a path, ``/dev/shm`` files included,
    but not a device's memory, a memfd or anonymous memory."""
    return found is not None and found.name.startswith("/") and (
        found.name.startswith("/dev/shm/") or not found.name.startswith(("/dev/", "/memfd:")))


def open_mapped(found: Mapping) -> int | None:
    """A descriptor of the very file ``found`` maps: through ``/proc/self/map_files`` (which asks CAP_SYS_ADMIN
    or CAP_CHECKPOINT_RESTORE of the process), else by its name where the file there is still the one mapped
    (its inode: the device is not compared, as btrfs shows another in the map than ``stat`` gives, and a file
    renamed into the name comes from the same filesystem, where a mapped file's inode is not reused); None where
    neither (the file was replaced or deleted by name, and the process may not open it through the map)."""
    try:
        return os.open(f"/proc/self/map_files/{found.start:x}-{found.end:x}", _READ)  # names: no leading zeros
    except OSError:
        pass
    try:
        fd = os.open(found.name, _READ)
    except OSError:
        return None
    if os.fstat(fd).st_ino == found.inode:
        return fd
    os.close(fd)
    return None


def root_memmap(array: np.memmap) -> np.memmap:
    """The memmap a view of a memmap comes from, down its ``.base`` chain: the one whose ``offset`` is its first
    byte's offset in the file."""
    while isinstance(array.base, np.memmap):
        array = array.base
    return array


class FileSpan(NamedTuple):
    """The file under a numpy array's pages: its mapping, the bytes of it the array reaches (from the file's
    start), and the file's size now, measured on the mapping's own descriptor (so the file measured is the one
    mapped, even after it was renamed, replaced or deleted by name)."""

    name: str
    needed: int
    size: Callable[[], int]
    mapping: Mapping | None  # the /proc/self/maps line (None where it cannot be read)
    memmap: np.memmap | None  # the memmap down the array's .base chain, if one


def file_span(source) -> FileSpan | None:
    """:class:`FileSpan` of ``source`` when it is a numpy array over a memory-mapped file: an ``np.memmap``, a
    view of one (``np.asarray(mm)``), or any array whose ``.base`` chain ends in an ``mmap.mmap``
    (``np.frombuffer(m)``); None for anything else, and for an empty view (it touches no page)."""
    array, memmap = source, None
    while isinstance(array, (np.ndarray, memoryview)):
        if memmap is None and isinstance(array, np.memmap) and getattr(array, "filename", None) is not None:
            memmap = array
        array = array.obj if isinstance(array, memoryview) else array.base  # np.frombuffer(m): via a memoryview
    if not isinstance(array, mmap.mmap) or not isinstance(source, np.ndarray) or source.size == 0:
        return None
    lo, hi = np.lib.array_utils.byte_bounds(source)
    found = mapping_at(lo)
    found = found if is_file(found) else None
    if memmap is not None:
        root = root_memmap(memmap)  # root.offset is the file offset of root's first byte
        needed, name = root.offset + hi - root.__array_interface__["data"][0], str(memmap.filename)
    elif found is not None:
        needed, name = found.offset + hi - found.start, found.name
    else:
        return None  # anonymous memory, or no /proc to find the file in: nothing to name or measure by offset
    return FileSpan(name, needed, array.size, found, memmap)


def check_whole(source) -> None:
    """Raise RuntimeError naming the file when ``source`` (any object; only numpy arrays over a memory-mapped
    file are checked, see :func:`file_span`) views bytes past its file's end: the file was cut short after it
    was mapped, and reading those bytes would kill the process (SIGBUS). Returns None otherwise; nothing is
    read."""
    span = file_span(source)
    if span is None:
        return
    size = span.size()
    if size < span.needed:
        raise RuntimeError(f"{span.name} was cut short: it holds {size} bytes, and the array over it maps "
                           f"{span.needed}. Reading the lost pages would kill the process (SIGBUS); open the memmap "
                           "again over the file as it is now, or copy the rows while the file is whole")
