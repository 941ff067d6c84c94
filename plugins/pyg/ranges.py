"""Contiguous rows read as one slice of host memory, not gathered row by row.

Layer-wise inference over all nodes (PyG's and DGL's GraphSAGE examples)
reads a table in large runs: ``store["paper", "x", 0:500_000]``, or a tensor
of consecutive ids. A gather builds an id per row and copies rows one at a
time; a run of rows is one slice of the host tier. On a CPU store
``get_tensor`` and ``store[...]`` hand the slice over as it is (a view, no
copy: as a whole-table read, ``index=None``, already is);
``multi_get_tensor``, which PyG's loaders fill batches with, hands over one
copy of it, since stock PyG's batches are copies and a transform that writes
to ``batch.x`` in place must not write to the table. On a GPU store it is one
host-to-device copy from the pinned host tier. Rows kept on the GPU tier are
the same rows in the host tier (``table[ids] = rows`` writes both), so the
host slice is exact.
"""
from __future__ import annotations

import numpy as np
import torch

from hmgstore import HybridTensor

#: Below this many ids a tensor is not checked for being a run: the gather is cheap, the check is not free.
MIN_RUN = 4096


def as_range(index, num_rows: int) -> tuple[int, int] | None:
    """``(lo, hi)`` when ``index`` names rows ``lo .. hi - 1`` in order, else None.

    ``index``: a slice of step 1 (or None; bounds clamped as torch clamps
    them), or a 1-d CPU integer tensor of at least :data:`MIN_RUN`
    consecutive ascending ids inside ``[0, num_rows)``. Anything else
    (other steps, CUDA ids, which would cost a synchronisation to inspect,
    bool masks, ids out of range, which the gather refuses with its own
    message) returns None. Never raises.
    """
    if isinstance(index, slice):
        if index.step not in (None, 1):
            return None
        try:
            lo, hi, _ = index.indices(num_rows)
        except TypeError:
            return None
        return lo, max(lo, hi)
    if not (isinstance(index, torch.Tensor) and index.device.type == "cpu" and index.dim() == 1
            and len(index) >= MIN_RUN and not index.dtype.is_floating_point and index.dtype != torch.bool
            and not index.is_complex()):
        return None
    lo, last = int(index[0]), int(index[-1])
    if last - lo + 1 != len(index) or lo < 0 or last >= num_rows:  # two reads rule out almost every batch
        return None
    if index.dtype in (torch.uint16, torch.uint32, torch.uint64):  # torch has no diff() for these; an id past
        index = index.to(torch.int64)  # int64 turns negative there, is no run, and reaches the gather's check
    if not bool((index.diff() == 1).all()):
        return None
    return lo, last + 1


def read_range(table: HybridTensor, lo: int, hi: int, *, copy: bool = False) -> torch.Tensor | None:
    """Rows ``lo .. hi - 1`` of ``table`` from its host tier: ``[hi - lo, *row_shape]`` of ``table.dtype`` on
    ``table.device``, or None when the host tier does not keep rows in id order (a ``layout``).

    ``0 <= lo <= hi <= table.num_rows`` (as :func:`as_range` gives them).
    CPU table: a view of the host memory (no copy) unless ``copy`` (one copy
    of the slice: a loader's batch, which must not alias the table, and a
    DataLoader worker's result, which crosses processes, where a view would
    move the table's memory into shared memory), the source is read-only (a
    copy: writing to a view of read-only memory crashes the process) or kept
    in a stored format (decoded). CUDA table: one copy from the pinned host
    tier on the current stream. Raises RuntimeError for a closed table.
    """
    if table.layout is not None:
        return None
    if table.closed:
        raise RuntimeError("the table is closed")
    source = table.source
    rows = source[lo:hi]
    if isinstance(rows, np.ndarray):  # a read-only source is handed out as the caller's numpy array
        rows, copy = torch.from_numpy(np.array(rows)), False
    if table.host_format is not None:
        rows, copy = table.host_format.decode(rows, table.row_shape), False
    if table.device.type == "cuda":
        return rows.to(table.device, non_blocking=True)
    # a torch tensor over read-only pages (torch.from_numpy of a memmap opened "r") is writable to torch: a view
    # of it handed out would kill the process at the caller's first in-place edit (SIGSEGV)
    return rows.clone() if copy or table.read_only else rows
