"""Arrays over a memory-mapped file: whether the file still holds every byte they view.

A numpy array over a file's pages (an ``np.memmap``, ``np.load(..., mmap_mode=...)``, or a plain array viewing
one, as ``np.asarray(mm)`` is) reads the file when a page is touched. Once the file is cut short, touching a page
past its new end is a SIGBUS, which kills the process: no Python error to catch. So whatever reads such an array
whole (a copy, an encoding, a pickle of its rows, pinning a small source into pinned memory) calls
:func:`check_whole` first: one ``fstat`` of the descriptor the mapping itself keeps open, so the file measured is
the one the pages come from, even after it was renamed, replaced or deleted by name.

A torch tensor made from such an array (``torch.from_numpy``) does not show its file and is not checked here (a
table over one finds the file in the process's memory map: :func:`hmgstore.rows.file_identity.watch`); nor can a
file cut while a read is under way be caught (copy the rows while it is whole).
"""
from __future__ import annotations

import mmap
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class Mapping(NamedTuple):
    """One line of Linux's ``/proc/self/maps``: a range of this process's addresses and what backs it."""

    start: int
    end: int
    perms: str  # "rw-p" and the like
    offset: int  # the file offset of ``start``
    device: str  # "major:minor", hex
    inode: int
    name: str  # a file's path (without " (deleted)"), "[heap]" and the like, or "" for anonymous memory


def mappings() -> Iterator[Mapping]:
    """This process's memory map, in address order; raises OSError where ``/proc/self/maps`` cannot be read."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.rstrip("\n").split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5].removesuffix(" (deleted)") if len(fields) == 6 else ""
            yield Mapping(start, end, fields[1], int(fields[2], 16), fields[3], int(fields[4]), name)


def _mapping(source) -> tuple[np.memmap, mmap.mmap] | None:
    """The memmap that owns the mapping ``source`` views and that mapping, or None for memory no file backs."""
    array = source
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap):
            return array, array.base
        array = array.base
    return None


def check_whole(source) -> None:
    """Raise RuntimeError naming the file when ``source`` (any object; only numpy arrays over a memory-mapped
    file are checked) views bytes past its file's end: the file was cut short after it was mapped, and reading
    those bytes would kill the process (SIGBUS). Returns None otherwise; nothing is read."""
    found = _mapping(source)
    if found is None or source.size == 0:  # an empty view touches no page
        return
    root, pages = found
    # File offset of the last byte source views: root.offset is the file offset of root's first byte.
    needed = root.offset + np.lib.array_utils.byte_bounds(source)[1] - root.__array_interface__["data"][0]
    size = pages.size()  # fstat of the mapping's own descriptor
    if size < needed:
        raise RuntimeError(f"{root.filename} was cut short: it holds {size} bytes, and the array over it maps "
                           f"{needed}. Reading the lost pages would kill the process (SIGBUS); open the memmap "
                           "again over the file as it is now, or copy the rows while the file is whole")
