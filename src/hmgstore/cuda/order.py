"""A gather's ids grouped by the host page they read (``kernels/order.cu``), in place of a full sort.

Why. The zero-copy kernel reads host rows fastest when the ids it reads at
the same time lie close together, so a gather used to sort its ids
(``torch.sort``). What the kernel needs is coarser: ids ordered by 2 MiB page
read about as fast as fully sorted ones (``benchmarks/probes/probe_sorted.py``).
A counting sort by page costs four launches, where ``torch.sort`` of 64-bit ids
runs about 30 (radix passes).

:func:`group_by_page` returns the ids in bucket order and each one's
position in the batch, like ``torch.sort``'s ``(values, indices)``.
"""
from __future__ import annotations

import numpy as np
import torch

from .runtime import launch

FILES = ("order.cu",)
#: A bucket covers about this many bytes of the host tier.
BUCKET_BYTES = 2 << 20


def bucket_shift(pitch: int) -> int:
    """log2 of the rows per bucket for rows ``pitch`` bytes apart (0 for rows of a bucket's size or more)."""
    return max(0, (BUCKET_BYTES // max(1, pitch)).bit_length() - 1)


def group_by_page(ids: torch.Tensor, num_rows: int, shift: int, map: torch.Tensor | None = None,
                  positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(grouped, perm)``: ``ids`` (1-D int32/int64 CUDA) grouped by their host position ``>> shift``, and each
    one's position in ``ids`` (int64), so that ``grouped == ids[perm]``; ``perm`` is None when the whole table
    is one group (``grouped`` is ``ids``).

    An id's host position is ``map[id]`` when ``map`` (int32/int64 CUDA, one entry per row: the table's new id
    of each old one) is given, among ``positions`` of them (default ``num_rows``), else the id itself. Ids
    outside ``[0, num_rows)`` are never looked up and go to the first or last group. Queued on the current
    stream; nothing waits."""
    if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1 or ids.device.type != "cuda":
        raise ValueError(f"ids must be a 1-D int32/int64 CUDA tensor, got {ids.dtype} {tuple(ids.shape)} "
                         f"on {ids.device}")
    if map is not None and (map.dtype not in (torch.int32, torch.int64) or map.device != ids.device):
        raise ValueError(f"map must be an int32/int64 tensor on {ids.device}, got {map.dtype} on {map.device}")
    ids = ids.contiguous()
    n, last = ids.shape[0], max(0, ((positions or num_rows) - 1) >> shift)
    if last == 0:  # one group: the order is the ids' own (every atomic would meet on one counter)
        return ids, None
    if n >= 2**31:  # the kernels count in int32
        keys = ids if map is None else map[ids.clamp(0, num_rows - 1)]
        perm = torch.sort(keys).indices
        return ids[perm], perm
    suffix = ("i64" if ids.dtype == torch.int64 else "i32") + ("_m64" if map is not None and map.dtype == torch.int64
                                                                 else "_m32")
    mapped = (np.uint64(0 if map is None else map.data_ptr()), np.int64(num_rows))
    counts = torch.zeros(last + 1, dtype=torch.int32, device=ids.device)
    ids_ptr = np.uint64(ids.data_ptr())  # read once (a torch call, per batch)
    launch(FILES, f"hmg_bucket_count_{suffix}", n, (ids_ptr, *mapped, np.int64(n), np.int32(shift),
                                                   np.int32(last), np.uint64(counts.data_ptr())), ids.device)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    grouped = torch.empty_like(ids)
    perm = torch.empty(n, dtype=torch.int64, device=ids.device)
    launch(FILES, f"hmg_bucket_place_{suffix}", n, (ids_ptr, *mapped, np.int64(n), np.int32(shift),
                                                   np.int32(last), np.uint64(ends.data_ptr()),
                                                   np.uint64(grouped.data_ptr()), np.uint64(perm.data_ptr())),
           ids.device)
    return grouped, perm
