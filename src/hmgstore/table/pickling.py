"""Tables crossing processes: what a :class:`hmgstore.HybridTensor` sends, and how the source travels.

A table is sent as a small dict (:func:`state_of`): its source in a form
that is safe and cheap to send, its dtype, device, GPU rows and whether it
was closed. The receiving process rebuilds the table around that source and
builds its CUDA parts (GPU tier, pinning) on first use
(``hmgstore.table.tensor._rebuild``), so a DataLoader worker that never gathers
never touches the GPU. A view of a table whose GPU memory belongs to
another object (a sharded table) cannot be rebuilt elsewhere; its state
says why, and the first gather there raises with that text.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from ..memory.mapped import check_whole, root_memmap
from ..rows import file_identity

log = logging.getLogger(__name__)


def state_of(table, given, unusable: str | None, for_process: bool) -> dict:
    """What another process rebuilds ``table`` from.

    ``given``: the source as the caller passed it (a memmap travels as its
    file); ``unusable``: why the table cannot be rebuilt elsewhere, or None
    (the table says, :meth:`hmgstore.table.state.Table.why_not_sendable`);
    ``for_process``: sent through torch's multiprocessing (ForkingPickler),
    which moves tensors into shared memory in place (see :func:`sendable_source`).
    """
    return {"source": sendable_source(table, given, for_process), "dtype": table.dtype, "device": str(table.device),
            "max_sms": table.max_sms, "closed": table.closed, "shape": tuple(table.shape), "layout": table._layout,
            "format": table.host_format.name if table.host_format else None,
            "gpu_format": table.gpu_format.name if table.gpu_format else None,
            "gpu_rows": table.placement.gpu_rows if table.placement.num_gpu_rows else None,
            "unusable": unusable, "read_only": table.read_only}


def sendable_source(table, given, for_process: bool):
    """The table's source, in a form that is safe and cheap to send.

    - A memmap travels as its file name and the file's identity
      (:mod:`hmgstore.rows.file_identity`, recorded when the table was
      built) and is opened again (no copy) after the receiver checks that
      the file is still the one recorded; a changed file is refused with
      :class:`~hmgstore.rows.file_identity.FileChangedError` naming it.
    - A copy-on-write memmap (``mode="c"``) travels as its rows: its edits
      live in this process's memory only, and the file does not hold them.
    - torch's multiprocessing moves a tensor's memory into shared memory in
      place, unless it is shared already; that would pull pinned pages out
      from under this table (its kernels would read freed memory), so a
      pinned source that is not shared travels as a copy.
    - Otherwise the source itself (plain pickle copies its bytes).

    Every form but a file name reads the rows: a source over a memmap whose
    file was cut short raises RuntimeError first
    (:func:`hmgstore.memory.mapped.check_whole`), as a gather does, instead of
    dying of SIGBUS on a lost page; a file name is checked as the receiver
    checks it (:meth:`MemmapSpec.check_length`).
    """
    source = table.host_tier
    memmap = isinstance(given, np.memmap) and given.filename is not None
    if memmap and given.mode != "c" and given.flags.c_contiguous:
        return MemmapSpec.of(given)
    check_whole(given)  # every form below reads the rows, a copy-on-write memmap's unwritten pages from its file
    if memmap and given.mode == "c":
        return source.clone()  # the edits are in this process's pages only
    pinned = table.pinned is not None and (table.pinned.registered or table.pinned.owner_pinned)
    if for_process and pinned and not source.is_shared():
        if source.nbytes >= 1 << 30:
            log.warning("hmgstore: sending a CUDA table to another process copies its %.2f GB host source; use "
                        "the fork start method, or source.share_memory_() before building the table",
                        source.nbytes / 1e9)
        return source.clone()
    return given if isinstance(given, np.ndarray) else source


def source_of(state: dict):
    """The source a received state names: the tensor or array itself, or its memmap opened again."""
    source = state["source"]
    return source.open() if isinstance(source, MemmapSpec) else source


class MemmapSpec:
    """A memmap's file, layout and mode, to open it again in another process."""

    def __init__(self, filename, dtype, shape, offset, mode, order, identity=None):
        self.filename, self.dtype, self.shape, self.offset, self.mode, self.order = \
            filename, dtype, shape, offset, mode, order
        self.identity = identity  # the file as the table was built over it (a writable one: as of sending)

    @classmethod
    def of(cls, array: np.memmap) -> MemmapSpec:
        base = root_memmap(array)
        # Offset of this view from the file's start: the memmap's own offset plus the view's.
        view_offset = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        mode = {"w+": "r+", "write": "r+"}.get(array.mode, array.mode)  # never truncate the file again
        spec = cls(array.filename, array.dtype, array.shape, base.offset + view_offset, mode, "C",
                   file_identity.identity_of(array))  # as recorded: what a file gone since is said against
        spec.check_length("a table was built over it")  # before a writable file's identity is taken anew
        spec.identity = file_identity.identity_of(array, refresh=array.mode != "r")  # its own writes: no change
        # The receiver opens the name: refused here already where it names another file than the one mapped
        spec.identity.check("a table was built over it")
        return spec

    def check_length(self, why: str) -> None:
        """FileChangedError when the file holds fewer bytes than the table maps: a writable memmap opened over
        it would grow it with zeros (numpy does, for mode r+), and read those as rows. A file that cannot be
        opened (deleted, renamed away) raises FileChangedError too, saying so (:meth:`FileIdentity.check`)."""
        needed = self.offset + int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
        try:
            size = os.stat(self.filename).st_size
        except OSError as err:
            if self.identity is not None:
                self.identity.check(why)  # the file is gone: FileChangedError, with what that means for a table
            raise file_identity.FileChangedError(f"{self.filename} cannot be opened ({err}); {why}") from None
        if size < needed:
            raise file_identity.FileChangedError(
                f"{self.filename} was cut short ({size} bytes; {why}, mapping {needed}): its rows are gone. "
                "Rebuild the table over the file as it is now, or build it with copy=True")

    def open(self) -> np.memmap:
        """The memmap again, after checking the file is the one the table was built over (FileChangedError)."""
        self.check_length("a table was built over it and sent to this process")
        if self.identity is not None:
            self.identity.check("a table was built over it and sent to this process")
        return np.memmap(self.filename, dtype=self.dtype, mode=self.mode, offset=self.offset, shape=self.shape,
                         order=self.order)
