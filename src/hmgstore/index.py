"""Turning what users index with into a checked, flat id tensor.

Every gather goes through :func:`normalize` before any kernel sees an id: a
zero-copy kernel that reads one row past the end of a pinned table touches an
unmapped address, which kills the CUDA context of the whole process. So an id
that is negative or ``>= num_rows`` is refused here, with its value and
position, while the process can still recover. (Negative ids are refused
rather than wrapped as ``torch`` would: in a sampler's output they are a bug,
never a request for the last row.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclass(frozen=True)
class Index:
    """A normalised index: ``ids`` is 1-D int32/int64 on the table's device.

    ``shape`` is the shape the result takes in front of the row's own shape
    (``()`` for a scalar index, which drops the leading dimension as ``x[5]``
    does). ``checked`` says whether the range check is done: ids that came
    from the CPU are checked there; ids already on a GPU are checked by the
    gather itself, folded into work it does anyway (see tensor.py), before
    any kernel reads a row.
    """

    ids: torch.Tensor
    shape: tuple[int, ...]
    checked: bool


def as_tensor(index, num_rows: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Convert ``index`` to an integer tensor without checking its range.

    Accepts a torch tensor or numpy array of an integer dtype (any shape, any
    device), a bool mask of length ``num_rows``, a Python/numpy int, a slice,
    or a list of ints. Raises TypeError for float, complex or other dtypes.
    """
    if isinstance(index, (bool, np.bool_)):
        raise TypeError("a bool is not a row index; pass an int, a slice or an integer tensor")
    if isinstance(index, (int, np.integer)):
        return torch.tensor([int(index)], dtype=torch.int64), ()
    if isinstance(index, slice):
        ids = torch.arange(*index.indices(num_rows), dtype=torch.int64)
        return ids, (len(ids),)
    if isinstance(index, np.ndarray):
        if index.dtype.kind not in "iub":
            raise TypeError(f"index must hold integers or bools, got numpy {index.dtype}")
        index = torch.from_numpy(np.ascontiguousarray(index).copy() if not index.flags.writeable else np.ascontiguousarray(index))
    elif isinstance(index, (list, tuple)):
        if len(index) == 0:
            return torch.empty(0, dtype=torch.int64), (0,)
        try:
            index = torch.as_tensor(index)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"could not read a list index as integers: {err}") from None
    elif not isinstance(index, torch.Tensor):
        raise TypeError(
            f"cannot index a table with {type(index).__name__}; "
            "use an integer tensor, numpy array, list, int or slice")

    if index.dtype == torch.bool:
        if index.shape != (num_rows,):
            raise IndexError(
                f"a bool mask must have shape ({num_rows},), one entry per row; got {tuple(index.shape)}")
        ids = index.nonzero().flatten()
        return ids, (len(ids),)
    if index.dtype not in _INT_DTYPES:
        raise TypeError(f"index must be an integer tensor (int32 or int64), got {index.dtype}")
    return index, tuple(index.shape)


def check_range(ids: torch.Tensor, num_rows: int) -> None:
    """Raise IndexError naming the first id of ``ids`` outside ``[0, num_rows)``.

    ``ids``: 1-D integer tensor on any device. On CUDA this costs one small
    reduction and one device-to-host read (a synchronisation of the current
    stream): the price of never launching a gather on a bad id.
    """
    if ids.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.stack(list(torch.aminmax(ids))).tolist())
    if lo >= 0 and hi < num_rows:
        return
    bad = ((ids < 0) | (ids >= num_rows)).nonzero()[0, 0]
    value = int(ids[bad])
    raise IndexError(
        f"index {value} at position {int(bad)} is out of range for a table of "
        f"{num_rows} rows (valid ids are 0..{num_rows - 1})")


def normalize(index, num_rows: int, device: torch.device) -> Index:
    """Convert ``index`` for a table of ``num_rows`` rows on ``device``.

    Returns an :class:`Index` whose ``ids`` are 1-D, int32 or int64 (int32
    stays int32, narrower types become int64), on ``device``. Indices from the
    CPU are range-checked on the CPU before they are copied (no GPU
    synchronisation); indices already on a GPU are left for the caller to
    check (``checked=False``). Raises TypeError for non-integer indices and
    IndexError for CPU ids out of range.
    """
    ids, shape = as_tensor(index, num_rows)
    ids = ids.reshape(-1).contiguous()  # kernels read ids densely: no strided or expanded views
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    if ids.device.type == "cpu" or device.type == "cpu":
        ids = ids.cpu()
        check_range(ids, num_rows)
        return Index(ids.to(device, non_blocking=True), shape, True)
    return Index(ids.to(device), shape, False)
