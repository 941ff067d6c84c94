"""Which file a table reads, recorded once, so a changed file is refused instead of read.

A table over a memory-mapped file (an ``np.memmap`` source) reads whatever
the file holds when a page is touched, and a process it is sent to opens
the file again by name. Both go wrong in silence when the file changes:
another file renamed into its place hands the new process the new file's
rows, and a file truncated under the mapping makes the next read of a lost
page a SIGBUS that kills the interpreter. So:

- :class:`FileIdentity` records what identifies a file's contents: device,
  inode, size, ``mtime_ns``, ``ctime_ns`` and a CRC-32 of its first page and
  :data:`SAMPLED_PAGES` pages spread over it. ``ctime_ns`` is there because
  the others can all be kept by a rewrite in place: ``os.utime`` (``cp -p``,
  ``rsync -t``, ``touch -r``) puts the old mtime back, and a change outside the
  sampled pages leaves the checksum. The kernel sets ``ctime`` on every write
  and every ``utime``, and no call sets it back; a ``chmod`` or a new hard
  link sets it too, which is refused as a change (rebuild the table). :meth:`FileIdentity.check`
  compares the file on disk with the record and raises
  :class:`FileChangedError` (a ValueError) naming the file, what changed and
  what that means for a table built over it, with the fix
  (:meth:`FileIdentity.advice`: replaced, rewritten in place, or only its
  ``ctime`` moved; a caller with another fix passes it).
  A process that reopens a table's file (unpickling, spawn, fork) and
  :func:`hmgstore.distributed.load_partition` check it.
- :func:`watch` keeps a descriptor of a table's mapped file open and checks
  its size with one ``fstat`` per gather (:meth:`LiveFile.check`), so a file
  cut short under a live table raises RuntimeError at the next gather rather
  than killing the process. The cost is one system call a gather, a few
  microseconds, 1-3% of the smallest CPU gather (see :meth:`LiveFile.check`).
  A file truncated while a gather is reading it can still fault: no check closes that window, short of copying the rows
  (``HybridTensor(..., copy=True)``).
"""
from __future__ import annotations

import mmap
import os
import warnings
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..memory.mapped import file_span, is_file, mapping_at, open_mapped, root_memmap

#: Bytes per sampled page of the checksum.
PAGE_BYTES = 4096
#: Pages sampled besides the first (the header's): at evenly spaced offsets, the last page included.
SAMPLED_PAGES = 4

class FileChangedError(ValueError):
    """A file is not the one a table was built over: replaced, rewritten, cut short or gone."""


def _checksum(f, size: int) -> int:
    """CRC-32 of the first page and :data:`SAMPLED_PAGES` pages spread to the file's end."""
    crc = 0
    offsets = sorted({0, *(max(0, (size - PAGE_BYTES) * k // SAMPLED_PAGES) for k in range(1, SAMPLED_PAGES + 1))})
    for offset in offsets:
        f.seek(offset)
        crc = zlib.crc32(f.read(PAGE_BYTES), crc)
    return crc


@dataclass(frozen=True)
class FileIdentity:
    """A file as it was when recorded: see the module docstring."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    checksum: int
    ctime_ns: int = 0

    @classmethod
    def of(cls, path) -> FileIdentity:
        """The identity of the file at ``path`` now. Raises FileNotFoundError/OSError as ``open`` does."""
        with open(path, "rb") as f:
            return cls.of_descriptor(f.fileno(), path)

    @classmethod
    def of_descriptor(cls, fd: int, path) -> FileIdentity:
        """The identity of the file open as ``fd`` (named ``path``, which may name another file by now)."""
        with os.fdopen(fd, "rb", closefd=False) as f:
            st = os.fstat(fd)
            return cls(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, _checksum(f, st.st_size),
                       st.st_ctime_ns)

    def changes(self, other: FileIdentity) -> list[str]:
        """What differs between two identities of the same path, in words (empty: the same file)."""
        said = []
        if (self.device, self.inode) != (other.device, other.inode):
            said.append("it was replaced by another file (another inode)")
        if self.size != other.size:
            said.append(f"its size went from {self.size} to {other.size} bytes")
        if self.mtime_ns != other.mtime_ns:
            said.append("it was modified (mtime)")
        elif self.ctime_ns != other.ctime_ns:
            said.append("it was written to, its times set back, or its mode or links changed (ctime)")
        if self.checksum != other.checksum:
            said.append("its sampled pages differ (checksum)")
        return said

    def advice(self, other: FileIdentity) -> str:
        """What the change from this identity to ``other`` means for a table built over the file, and the fix.

        A table maps its file's pages: a file renamed into its place leaves the table on the old file (kept
        alive by the mapping) while a process that opens the name reads the new one; a file rewritten in
        place shows its new bytes through the mapping at once, beside the rows the table copied when it was
        built (its GPU tier, a pinned copy). Only ``ctime`` moved: the rows may be the same (a ``chmod``, a
        new hard link) or not (a write with its times set back), which nothing tells apart.
        """
        if (self.device, self.inode) != (other.device, other.inode):
            return ("A table built over it before still reads the old file, which its mapping keeps alive, and "
                    "anything that opens the name now reads the new one. Build the table again over the file "
                    "now at that path (to keep the old rows, build it with copy=True before the file is "
                    "replaced)")
        if (self.size, self.mtime_ns, self.checksum) == (other.size, other.mtime_ns, other.checksum):
            return ("Its size, mtime and sampled pages are as recorded: a chmod or a new hard link leaves the "
                    "rows as they were, a write with its times set back (cp -p, rsync -t, touch -r) does not, "
                    "and the two cannot be told apart. Build the table again over the file as it is now")
        return ("It was rewritten in place: a table built over it before reads the new bytes through its mapping "
                "already, beside the old rows it copied when it was built (its GPU tier, a pinned copy), so it "
                "can serve old and new rows mixed. Build the table again over the file as it is now; to change "
                "rows of a live table, write them through it (table[ids] = rows, on a table over a memmap opened "
                "with mode='r+'), which updates every copy of them")

    def check(self, why: str = "a table was built over it", fix: str | None = None) -> None:
        """Raise :class:`FileChangedError` naming the file, what changed since it was recorded (``why``: when
        that was) and ``fix`` (default: :meth:`advice`, what the change means for a table built over it)."""
        try:
            now = FileIdentity.of(self.path)
        except OSError as err:
            gone = ("A table built over it before still reads it (its mapping keeps the file alive), but nothing "
                    "can open it by name again: put the file back, or build the table with copy=True to hold its "
                    "rows in memory")
            raise FileChangedError(f"{self.path} cannot be opened again ({err}); {why}, and it is gone. "
                                   f"{gone if fix is None else fix}") from None
        if (self.device, self.inode) != (now.device, now.inode):  # what else differs says nothing more
            raise FileChangedError(f"{self.path} was replaced by another file (another inode) since {why}. "
                                   f"{self.advice(now) if fix is None else fix}")
        changed = self.changes(now)
        if changed:
            raise FileChangedError(f"{self.path} changed since {why}: {'; '.join(changed)}. "
                                   f"{self.advice(now) if fix is None else fix}")


#: The identity recorded for each mapped file, by the id of its base memmap, while that memmap lives.
_recorded: dict[int, FileIdentity] = {}


def identity_of(array: np.memmap, *, refresh: bool = False) -> FileIdentity:
    """The identity of the file ``array``'s pages come from, as recorded when a table was first built over it
    (now, if never).

    The file is found through the mapping (:func:`hmgstore.memory.mapped.file_span`), not by the memmap's
    name, which may name another file by now (one renamed into its place, or none); :meth:`FileIdentity.check`
    against the name then tells the two apart when the table is sent. Where the mapped file cannot be opened
    again (deleted or replaced by name, and ``/proc/self/map_files`` not open to this process), the record holds
    its device, inode and size from the map and nothing else; where ``/proc`` cannot be read, the file at the
    name. ``refresh``: record the file again (its own writes through a writable memmap change it).
    """
    base = root_memmap(array)
    recorded = _recorded.get(id(base))
    if recorded is None or refresh:
        if refresh and hasattr(array, "flush"):
            array.flush()
        recorded = _identity_now(array)
        if id(base) not in _recorded:  # forgotten with the mapping (ids are reused once it is gone)
            weakref.finalize(base, _recorded.pop, id(base), None)
        _recorded[id(base)] = recorded
    return recorded


def _identity_now(array: np.memmap) -> FileIdentity:
    span = file_span(array)
    if span is None or span.mapping is None:  # an empty view, or no /proc/self/maps: the file at the name
        try:
            return FileIdentity.of(array.filename)
        except OSError as err:
            raise FileChangedError(
                f"{array.filename} cannot be opened ({err}), and this system does not show which file a memmap "
                "maps: a table over it could not be sent to another process. Put the file back, or build the "
                "table with copy=True") from None
    found = span.mapping
    fd = open_mapped(found)
    if fd is None:  # out of reach by name, or a map whose numbers are not stat's (overlayfs before Linux 6.8)
        by_name = _same_bytes_by_name(array, span.size())
        return by_name or FileIdentity(str(array.filename), found.device_number, found.inode, span.size(), -1, -1, -1)
    try:
        return FileIdentity.of_descriptor(fd, array.filename)
    finally:
        os.close(fd)


def _same_bytes_by_name(array: np.memmap, mapped_size: int) -> FileIdentity | None:
    """The identity of the file at ``array``'s name where it holds, at :data:`SAMPLED_PAGES` + 1 pages spread over
    the memmap's range, the bytes the memmap shows (so it is the mapped file, as far as its sampled pages tell);
    None otherwise (another file renamed into the name, or none there)."""
    base = root_memmap(array)
    name, pages = base.filename, base.base
    if name is None or not isinstance(pages, mmap.mmap):
        return None
    try:
        named = FileIdentity.of(name)
        if named.size != mapped_size or mapped_size < base.offset + base.nbytes:
            return None
        # the memmap's bytes as the map holds them (no copy, whatever its order); the whole range is in the file
        skip = base.offset % mmap.ALLOCATIONGRANULARITY  # numpy maps from an aligned offset
        mapped = np.frombuffer(pages, np.uint8)[skip:skip + base.nbytes]
        with open(name, "rb") as f:
            for k in range(SAMPLED_PAGES + 1):
                at = max(0, (len(mapped) - PAGE_BYTES) * k // SAMPLED_PAGES)
                f.seek(base.offset + at)
                if f.read(PAGE_BYTES) != mapped[at:at + PAGE_BYTES].tobytes():
                    return None
        return named
    except (OSError, ValueError, TypeError):
        return None


class LiveFile:
    """A live table's mapped file, measured before each gather to refuse one once the file is cut short."""

    def __init__(self, path: str, needed: int, size: Callable[[], int], fd: int | None = None):
        """``path``: the file, named in messages; ``needed``: the bytes the table maps (from the file's start);
        ``size``: the file's size now, measured on a descriptor of the very file mapped; ``fd``: that descriptor,
        closed with this object (None: ``size`` measures one its owner keeps, an ``mmap.mmap``'s own)."""
        self.path, self.needed, self._size = path, needed, size
        self._closer = weakref.finalize(self, os.close, fd) if fd is not None else None

    def check(self) -> None:
        """Raise RuntimeError when the file now holds fewer bytes than the table maps.

        One ``fstat`` a gather, cheap enough to pay every time. Measured with
        timeit on the dev VM (2 cores, sandboxed system calls, load 9 from
        other jobs; 2026-11-27): ``os.fstat`` 5.1-10 us (``os.getpid`` 0.86
        us), against 330-390 us for a CPU gather of one 512-byte row of a
        100k-row memmap table and 5.7 ms for 1,024 rows: 1.5-3% of the
        smallest gather, 0.1% of a batch. A CUDA gather costs more host time
        than either.
        """
        size = self._size()
        if size < self.needed:
            raise RuntimeError(f"{self.path} was cut short under a live table: it holds {size} bytes, the table "
                               f"maps {self.needed}. Reading the lost pages would kill the process (SIGBUS); "
                               "rebuild the table over the file as it is now, or build it with copy=True")

    def close(self) -> None:
        if self._closer is not None:
            self._closer()


def _mapped_file(tensor) -> LiveFile | None:
    """A :class:`LiveFile` over the regular file whose pages a CPU tensor's storage lies in (a ``torch.from_numpy``
    of a memmap, which does not show its file), found in Linux's ``/proc/self/maps``; None for memory no such file
    backs (anonymous, shared memory) or where ``/proc`` cannot be read, and, with a warning, for a file that can
    no longer be opened."""
    storage = tensor.untyped_storage()
    lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    found = mapping_at(lo)
    if hi == lo or not is_file(found):
        return None
    fd = open_mapped(found)
    if fd is None and found.name.startswith("/dev/shm/"):  # shared memory whose name is gone (a segment's): kept
        return None
    if fd is None:
        warnings.warn(f"hmgstore: {found.name}, the file under this table's rows, cannot be opened again to watch "
                      "it: if it is cut short, a gather dies by SIGBUS; build the table with copy=True to hold its "
                      "rows", RuntimeWarning, stacklevel=4)
        return None
    return LiveFile(found.name, found.offset + hi - found.start, lambda: os.fstat(fd).st_size, fd)


def watch(source) -> LiveFile | None:
    """For a numpy ``source`` over a mapped file's pages (a memmap, a view of one, an array over an
    ``mmap.mmap``): a :class:`LiveFile` over the bytes ``source`` spans, measured on the mapping's own
    descriptor, and, for a memmap, its file's identity recorded (:func:`identity_of`) for the processes it is sent
    to; None for any other source (nothing can change under it). A CPU torch tensor over a file's pages
    (``torch.from_numpy`` of a memmap) is found through the process's memory map and watched alike (its
    identity is not recorded: it is sent as its rows)."""
    if isinstance(source, torch.Tensor):
        return _mapped_file(source) if source.device.type == "cpu" else None
    span = file_span(source)
    if span is None:
        return None
    if span.memmap is not None:
        identity_of(span.memmap)
    return LiveFile(span.name, span.needed, span.size)
