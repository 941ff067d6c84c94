"""Turning what users index with into checked, flat id tensors: the one range check.

Every gather goes through :func:`prepare_many` and :func:`check_pending`
before any kernel sees an id: a zero-copy kernel that reads one row past the end of a pinned table
touches an unmapped address, which kills the CUDA context of the whole
process. So an id that is negative or ``>= num_rows`` is refused here, with
its value and position, while the process can still recover. (Negative ids
are refused rather than wrapped as ``torch`` would: in a sampler's output
they are a bug, never a request for the last row.) The kernel checks again,
as a guard, and skips such a row rather than read it.

Ids that come from the CPU are checked on the CPU before they are copied.
Ids already on a GPU are checked in one of two ways (``check=``):

- ``"sync"``: on the GPU, all indices of one gather with a single
  device-to-host read (a synchronisation), which the gather overlaps with
  its own host work; the gather itself raises.
- ``"deferred"`` (the default): the gather kernel checks each id as it reads
  it, never reads a row for a bad one (it fills that output row with 0xFF
  bytes: NaN for floats) and records the first bad id in an error record
  that is copied to pinned memory on the gather's stream. Nothing waits: the
  error is raised, as IndexError with its value and position, by the first
  gather on that GPU that starts after the bad one has finished, or by
  :func:`hmgstore.raise_deferred` (which waits), which :class:`hmgstore.Pipeline`
  calls at the end of every epoch. The result of the bad gather must be
  thrown away. The records and their reading are :mod:`hmgstore.cuda.deferred`,
  beside the kernel's error-word layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch

_SIGNED = (torch.int64, torch.int32, torch.int16, torch.int8)
_UNSIGNED = tuple(getattr(torch, name) for name in ("uint8", "uint16", "uint32", "uint64") if hasattr(torch, name))
_INT64_MAX = 2**63 - 1
CHECKS = ("deferred", "sync")


@dataclass(frozen=True)
class Index:
    """A checked index: ``ids`` is 1-D int32/int64 on the table's device, each in range.

    ``shape`` is the shape the result takes in front of the row's own shape
    (``()`` for a scalar index, which drops the leading dimension as ``x[5]``
    does).
    """

    ids: torch.Tensor
    shape: tuple[int, ...]
    host: torch.Tensor | None = None  # the same ids on the CPU, when they came from there (int64)


def _scalar(value, num_rows: int) -> torch.Tensor:
    value = int(value)
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        _beyond_int64(value, None, num_rows)
    return torch.tensor([value], dtype=torch.int64)


def _beyond_int64(value: int, position: int | None, num_rows: int) -> NoReturn:
    """Raise IndexError naming an id past int64 (a uint64 of 2**63 or more, a Python int), which no table has."""
    at = "" if position is None else f" at position {position}"
    raise IndexError(f"id {value}{at} out of range [0, {num_rows}): the table has {num_rows} rows (valid ids are "
                     f"0..{num_rows - 1}), and ids past int64 name none")


def _list_beyond_int64(index: list | tuple, num_rows: int) -> None:
    """Raise IndexError naming the first id of a (nested) list past int64, when it holds one."""
    flat: list = []
    stack: list = [index]
    while stack:  # depth first, in order: the first id past int64 as the list is read
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    for k, value in enumerate(flat):
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and \
                not -_INT64_MAX - 1 <= int(value) <= _INT64_MAX:
            _beyond_int64(int(value), k, num_rows)


def as_tensor(index, num_rows: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Convert ``index`` to an integer tensor without checking its range.

    Accepts a torch tensor or numpy array of a signed or unsigned integer
    dtype (any shape, any device), a bool mask of length ``num_rows``, a
    Python/numpy int, a slice, a range, or a list of ints. Returns ``(ids, shape)``:
    ids int64 or int32 (uint64 ids are reinterpreted as int64, so ids of
    2^63 and above look negative and fail the range check; on the CPU they
    are reported here, as the uint64 values given). Raises TypeError for
    float, complex or other types, and for a torch uint8 tensor (torch reads
    one as a mask, numpy a uint8 array as ids: reading either way would
    silently answer another question than the caller's code asks of torch
    or numpy), IndexError for ints beyond int64.
    """
    if isinstance(index, (bool, np.bool_)):
        raise TypeError("a bool is not a row index; pass an int, a slice or an integer tensor")
    if isinstance(index, (int, np.integer)):
        return _scalar(index, num_rows), ()
    if isinstance(index, slice):  # an empty slice (t[10:3], t[-1:-5]) is empty, as in torch
        rows = range(*index.indices(num_rows))
        ids = torch.arange(rows.start, rows.stop, rows.step) if len(rows) else torch.empty(0, dtype=torch.int64)
        return ids, (len(ids),)
    if isinstance(index, range):  # ids as written (negative ones fail the range check), as torch reads them
        ids = torch.arange(index.start, index.stop, index.step) if len(index) else torch.empty(0, dtype=torch.int64)
        return ids, (len(ids),)
    if isinstance(index, np.ndarray):
        if index.dtype.kind not in "iub":
            raise TypeError(f"index must hold integers or bools, got numpy {index.dtype}")
        # reshape: ascontiguousarray makes a 0-d array 1-d, and t[np.array(3)] is one row, as x[3] is; ids in the
        # other byte order (which torch refuses) are read in this machine's
        dense = np.ascontiguousarray(index, index.dtype.newbyteorder("=")).reshape(index.shape)
        if dense.dtype == np.uint8:  # ids, as numpy reads them (a torch uint8 tensor is refused below)
            dense = dense.astype(np.int64)
        index = torch.from_numpy(dense.copy() if not dense.flags.writeable else dense)
    elif isinstance(index, (list, tuple)):
        if len(index) == 0:
            return torch.empty(0, dtype=torch.int64), (0,)
        try:
            index = torch.as_tensor(index)
        except (RuntimeError, OverflowError, TypeError, ValueError) as err:
            _list_beyond_int64(index, num_rows)
            raise TypeError(f"could not read a list index as integers: {err}") from None
    elif not isinstance(index, torch.Tensor):
        raise TypeError(
            f"cannot index a table with {type(index).__name__}; "
            "use an integer tensor, numpy array, list, int or slice")
    elif index.layout != torch.strided:
        raise TypeError(f"a {index.layout} sparse tensor is not an index; pass dense ids (ids.to_dense(), or "
                        "ids.indices() for the positions it holds)")
    elif index.device.type == "meta":
        raise TypeError("ids on the 'meta' device hold no values; pass ids on the CPU or the table's GPU")

    if index.dtype == torch.bool:
        if index.shape != (num_rows,):
            raise IndexError(
                f"a bool mask must have shape ({num_rows},), one entry per row; got {tuple(index.shape)}")
        ids = index.nonzero().flatten()
        return ids, (len(ids),)
    if index.dtype == torch.uint8:
        raise TypeError("a torch.uint8 index is ambiguous: torch reads it as a mask (deprecated), numpy as "
                        "integer ids; pass index.bool() for a mask or index.long() for ids")
    shape = tuple(index.shape)
    if index.dtype in (torch.int64, torch.int32):
        return index, shape
    if index.dtype in _SIGNED or index.dtype in _UNSIGNED[1:3]:
        return index.to(torch.int64), shape
    if _UNSIGNED and index.dtype == _UNSIGNED[-1]:  # uint64: same bits as int64; >= 2^63 looks negative
        ids = index.view(torch.int64)
        if ids.device.type == "cpu" and ids.numel() and int(ids.min()) < 0:  # report the value as given
            flat = ids.reshape(-1)
            bad = int((flat < 0).nonzero()[0, 0])
            raise IndexError(f"uint64 index {int(flat[bad]) + 2**64} at position {bad} is out of range "
                             f"for a table of {num_rows} rows (valid ids are 0..{num_rows - 1})")
        return ids, shape
    raise TypeError(f"index must be an integer tensor (int8 to int64, uint16 to uint64) or a bool mask, got "
                    f"{index.dtype}")


def rows_only(index):
    """``index`` unchanged, after refusing a tuple: a table is indexed by rows only, with one index.

    ``t[3, 1]`` reaches ``__getitem__`` as the tuple ``(3, 1)``; torch and
    numpy read it as the element ``x[3, 1]``, so reading it as rows 3 and 1
    would silently answer another question. Raises TypeError saying how to
    index instead.
    """
    if isinstance(index, tuple):
        raise TypeError(
            f"a table is indexed by rows only, with one index; got {len(index)} indices (a tuple). "
            "Write t[[3, 1]] for rows 3 and 1, t[3][1] for the element x[3, 1], and t[ids][:, cols] for "
            "columns of the rows gathered")
    return index


def check_range(ids: torch.Tensor, num_rows: int) -> None:
    """Raise IndexError naming the first id of ``ids`` outside ``[0, num_rows)``.

    ``ids``: 1-D integer tensor on any device. On CUDA this costs one small
    reduction and one device-to-host read (a synchronisation of the current
    stream).
    """
    if ids.numel() == 0:
        return
    if ids.device.type == "cpu":  # numpy: one thread, no second parallel region beside the gather's own
        values = ids.numpy()
        lo, hi = int(values.min()), int(values.max())
    else:
        lo, hi = (int(v) for v in torch.stack(list(torch.aminmax(ids))).tolist())
    if lo >= 0 and hi < num_rows:
        return
    _raise_first_bad(ids, num_rows)


def _raise_first_bad(ids: torch.Tensor, num_rows: int) -> None:
    if ids.dtype in (torch.uint16, torch.uint32, torch.uint64):  # torch has no comparisons for these; numpy has
        values = ids.cpu().numpy()
        bad = int(np.flatnonzero(values >= num_rows)[0])
        value = int(values[bad])
    else:
        bad = int(((ids < 0) | (ids >= num_rows)).nonzero()[0, 0])
        value = int(ids[bad])
    shown = f"{value} (or {value + 2**64} read as unsigned)" if value < 0 and value < -2**62 else str(value)
    raise IndexError(
        f"index {shown} at position {int(bad)} is out of range for a table of "
        f"{num_rows} rows (valid ids are 0..{num_rows - 1})")


def _flatten(index, num_rows: int, device: torch.device) -> tuple[torch.Tensor, tuple[int, ...]]:
    """1-D int32/int64 ids of ``index`` and the result's leading shape; CPU ids bound for a GPU are
    first copied to memory of our own, so the ids checked are the ids the kernel reads."""
    ids, shape = as_tensor(index, num_rows)
    if ids.device.type == "cpu" and device.type == "cuda" and ids.is_pinned():
        # A caller may reuse a pinned id buffer as soon as gather() returns, before an asynchronous
        # copy from it would run: check and copy a private copy instead (staged: pinned, ours).
        ids = _staged(ids)
    flat = ids if len(ids.shape) == 1 else ids.reshape(-1)  # a shape read, not a torch call: this runs per batch
    return flat.contiguous(), shape  # kernels read ids densely: no strided views


def _staged(ids: torch.Tensor) -> torch.Tensor:
    """A private copy of CPU ``ids`` in pinned memory from torch's caching host allocator.

    A copy to the GPU from pageable memory first waits for the stream to
    drain (CUDA stages it through a pinned buffer of its own), so every
    gather given CPU ids would stall the stream's queue and the host with it
    (peer reads of 128 B rows: 0.25x peer memcpy against 0.58x,
    benchmarks/results/peer-h200x2.md). From this buffer the copy is
    asynchronous, and the allocator does not hand the block out again before
    the copy queued from it has run (it records an event on the stream).
    """
    return torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True).copy_(ids)


def prepare_many(requests, device: torch.device, check: str = "sync") -> tuple[list[Index], list]:
    """Convert every ``(index, num_rows)`` of one gather for a table on ``device``; check CPU ids.

    Returns ``(indices, pending)``: one :class:`Index` per request (ids 1-D,
    int32 or int64 (int32 stays int32, other integer types become int64), on
    ``device``; a request whose index object and row count appeared before
    gets the same Index), and what is left to check: ids that were already on
    a GPU, as ``(ids, num_rows, bounds)``. With ``check="sync"`` pass
    ``pending`` to :func:`check_pending` before any kernel reads with those
    ids; work queued before then overlaps the check's read-back. With
    ``check="deferred"`` the gather kernel checks them (``bounds`` is None;
    see the module docstring). CPU ids are checked here, on the CPU, before
    they are copied. Raises TypeError for non-integer indices, IndexError for
    CPU ids out of range and ValueError for an unknown ``check``.
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    done: dict[tuple[int, int], Index] = {}
    pending = []
    for index, num_rows in requests:
        key = (id(index), num_rows)
        if key in done:
            continue
        ids, shape = _flatten(index, num_rows, device)
        host = None
        if ids.device.type == "cpu" or device.type == "cpu":
            host = ids.cpu()
            check_range(host, num_rows)
            if device.type == "cuda":  # copied from pinned memory of ours, so the host never waits
                ids = (host if host.is_pinned() else _staged(host)).to(device, non_blocking=True)
            else:
                ids = host.to(device)
        else:
            ids = ids if ids.device == device else ids.to(device)
            if ids.shape[0]:
                pending.append((ids, num_rows, torch.stack(torch.aminmax(ids)) if check == "sync" else None))
        done[key] = Index(ids, shape, host)
    return [done[(id(index), num_rows)] for index, num_rows in requests], pending


def check_pending(pending: list) -> None:
    """Finish :func:`prepare_many`'s check of GPU ids: one device-to-host read for all of them.

    Raises IndexError (value and position) for the first index out of range.
    """
    if not pending:
        return
    bounds = torch.cat([b for _, _, b in pending]).tolist()  # the one synchronisation
    for k, (ids, num_rows, _) in enumerate(pending):
        if bounds[2 * k] < 0 or bounds[2 * k + 1] >= num_rows:
            _raise_first_bad(ids, num_rows)


def normalize_many(requests, device: torch.device) -> list[Index]:
    """:func:`prepare_many` and :func:`check_pending` at once: every index checked and converted."""
    indices, pending = prepare_many(requests, device)
    check_pending(pending)
    return indices


def normalize(index, num_rows: int, device: torch.device) -> Index:
    """:func:`normalize_many` for one index."""
    return normalize_many([(index, num_rows)], device)[0]


def last_writes(ids: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, rows)`` of a write with each repeated id kept once, with the last row given for it.

    ``ids``: 1-D int64 ids, checked; ``rows``: ``[len(ids), ...]``. A write that names an id twice stores the
    row given last, as torch's ``x[ids] = rows`` does on the CPU for a few rows: the copies a table makes
    (``index_copy_`` on the host, an index put on a GPU) leave that order unspecified (on the CPU, a large
    write copies in parallel and another row may land last), so repeats are settled here, the same on every
    device. Ids without repeats come back as given, at the cost of one sort.
    """
    if len(ids) < 2:
        return ids, rows
    ordered, order = torch.sort(ids, stable=True)
    last = torch.ones(len(ids), dtype=torch.bool)
    torch.ne(ordered[1:], ordered[:-1], out=last[:-1])  # the last of each run of equal ids, in the order given
    if bool(last.all()):
        return ids, rows
    keep = order[last]
    return ids[keep], rows[keep]
