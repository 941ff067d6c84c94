"""What a table write ``t[ids] = value`` stores: :func:`rows_to_write` converts the value to the table's
rows, never cutting a number in silence (a float64 that float32 rows would hold as inf is refused), and
:func:`check_apart` refuses rows that lie in the table's own memory."""
from __future__ import annotations

import math

import numpy as np
import torch

_WRITES_TAKE = "a write takes rows as a tensor, a numpy array, a number or a nested list or tuple of numbers"


def rows_to_write(value, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as CPU rows of ``dtype`` (a value requiring grad: its numbers), never cut in silence.

    A tensor, array (any device, byte order or strides), list or tuple of a kind ``dtype`` cannot hold
    (``torch.can_cast``: float into int, complex into float) raises TypeError, as do a complex number into a
    real table and anything else (None, a string). Python and numpy numbers convert as torch's ``x[ids] = 2.5``
    does, at ``dtype``'s precision: a float into an integer table is truncated toward zero (-2.7 is -2), any
    nonzero number into a bool table is True. Numbers past ``dtype``'s range raise ValueError naming the first
    as given (uint64 ``2**64 - 1``, not the ``-1`` it would wrap to; a finite float64 past float32's largest,
    which would be stored as inf), as do NaN and infinities into integers.
    """
    if isinstance(value, np.generic):
        value = value.item()  # the Python number it holds; a long double stays, refused as arrays of it are
    if isinstance(value, np.ndarray) and value.dtype.kind == "O":
        value = value.tolist()  # the numbers an object array holds, read as a list of them is
    if isinstance(value, (bool, int, float, complex)):
        return _number(value, dtype).to(dtype)
    if isinstance(value, (list, tuple)):
        given = _sequence(value, dtype)
    elif isinstance(value, torch.Tensor) or hasattr(value, "__cuda_array_interface__"):
        given = torch.as_tensor(value).detach()
        if given.is_meta:
            raise TypeError("a value on the 'meta' device holds no numbers to write; pass real rows")
    elif hasattr(value, "__array__"):  # numpy arrays and what converts to one
        array = np.asarray(value)
        if not array.dtype.isnative or any(stride < 0 for stride in array.strides):  # torch reads neither
            array = array.astype(array.dtype.newbyteorder("="), order="C")  # only then: a broadcast stays a view
        try:
            given = torch.as_tensor(array)
        except TypeError:
            raise TypeError(f"{_WRITES_TAKE}; torch holds no numpy {array.dtype} values: convert the array "
                            "first (value.astype(np.float64))") from None
    else:
        raise TypeError(f"{_WRITES_TAKE}; got {type(value).__name__}")
    if not torch.can_cast(given.dtype, dtype):
        raise TypeError(f"a {given.dtype} value would be cut to this table's {dtype} rows; convert it first "
                        f"(value.to({dtype})) if that is what you mean")
    if given.dtype not in (dtype, torch.bool) and dtype != torch.bool and not dtype.is_floating_point \
            and not dtype.is_complex:  # integers into an integer table: can_cast let no other kind through
        _all_within(given, dtype)
    elif (dtype.is_floating_point or dtype.is_complex) and given.dtype not in (dtype, torch.bool) \
            and _largest(given.dtype) > torch.finfo(dtype).max:  # float64 1e39 into float32 rows would be inf
        _within_float(given, dtype)
    return given.to("cpu", dtype)


def broadcast_rows(rows: torch.Tensor, index_shape: tuple, row_shape: tuple) -> torch.Tensor:
    """``rows`` (a write's value) as one row per id, ``[n, *row_shape]`` for ``n`` ids in ``index_shape``: as
    torch's ``x[ids] = value`` takes it (broadcast to ``[*index_shape, *row_shape]``, what ``x[ids]`` gives),
    or broadcast to the rows written one by one. ValueError naming both shapes otherwise."""
    n = math.prod(index_shape)
    for shape in ((*index_shape, *row_shape), (n, *row_shape)):
        try:
            return rows.expand(shape).reshape(n, *row_shape)
        except RuntimeError:
            continue
    raise ValueError(f"a value of shape {tuple(rows.shape)} does not broadcast to the {n} rows written, "
                     f"{(*index_shape, *row_shape)} (or {(n, *row_shape)})")


def _largest(dtype: torch.dtype) -> float:
    return (torch.finfo if dtype.is_floating_point or dtype.is_complex else torch.iinfo)(dtype).max


def _number(value: bool | int | float | complex, dtype: torch.dtype) -> torch.Tensor:
    """A Python number as a 0-d CPU tensor that ``.to(dtype)`` rounds once at most, checked as documented."""
    if isinstance(value, complex) and not dtype.is_complex:
        raise TypeError(f"the complex {value!r} would lose its imaginary part in {dtype} rows; write value.real")
    if isinstance(value, bool) or dtype == torch.bool:
        return torch.tensor(bool(value))  # as torch: any nonzero number (NaN too) is True
    if isinstance(value, (int, float)) and not (dtype.is_floating_point or dtype.is_complex):  # an integer table
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"the value holds {value}; {dtype} rows hold no NaN or infinities: write a finite number")
        _within(value, dtype)  # a float before it is truncated: torch refuses 255.5 into uint8 too
        return torch.tensor(int(value))  # a float toward zero, as torch's x[ids] = 2.7 stores 2
    _within_float(value, dtype)
    if isinstance(value, int) and -2**63 <= value < 2**63:
        return torch.tensor(value)  # int64, which .to(dtype) rounds once
    return torch.tensor(value, dtype=torch.complex128 if isinstance(value, complex) else torch.float64)


def _sequence(value: list | tuple, dtype: torch.dtype) -> torch.Tensor:
    """A list or tuple of numbers as a CPU tensor of the kind torch infers, floats read as float64 (torch's float32
    rounds 0.1), checked as numbers are; TypeError for one torch cannot read (ragged, or holding non-numbers)."""
    try:
        given = torch.as_tensor(value).detach()
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        huge = [v for v in _leaves(value) if isinstance(v, int) and not -2**63 <= v < 2**63]
        if not huge:
            raise TypeError(f"{_WRITES_TAKE}, of one length along each dimension; could not read this "
                            f"{type(value).__name__}: {err}") from None
        if not (dtype.is_floating_point or dtype.is_complex):
            _within(huge[0], dtype if dtype != torch.bool else torch.int64)
        for number in huge:  # into a float table: named before float64 fails to read one past its range
            _within_float(number, dtype)
        given = torch.empty(1)  # only its kind counts: into a float table, integers past int64 read as floats
    if given.numel() == 0:  # an empty list has no kind to refuse: it writes no rows
        return given.to(dtype)
    if given.dtype.is_floating_point or given.dtype.is_complex:
        given = torch.as_tensor(value, dtype=torch.complex128 if given.dtype.is_complex else torch.float64).detach()
    if dtype.is_floating_point or dtype.is_complex:
        _within_float(given, dtype)
    return given


def _leaves(value) -> list:  # what nested lists and tuples hold at their bottom
    return [leaf for item in value for leaf in (_leaves(item) if isinstance(item, (list, tuple)) else [item])]


def _within(value: int | float, dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"the value holds {value}, past this table's {dtype} range [{info.min}, {info.max}]")


def _within_float(value: int | float | complex | torch.Tensor, dtype: torch.dtype) -> None:
    """Refuse a finite number (or one of a tensor of them) that ``dtype`` would store as inf: ValueError naming
    the first, an int compared exactly. Inf and NaN pass: they are stored as they are. A number a little past
    the largest that rounds down to it is stored as the largest, as a ``compress=`` format of that width does
    (float16 rows hold 65510.5 as 65504): the test is torch's own conversion, the one the write makes."""
    top = torch.finfo(dtype).max
    if isinstance(value, torch.Tensor):
        parts = torch.view_as_real(value) if value.is_complex() else value.double()
        past = parts[parts.isfinite() & parts.to(dtype).isinf()]
        value = float(past[0]) if len(past) else 0.0
    for part in (value.real, value.imag) if isinstance(value, complex) else (value,):
        if isinstance(part, float) and not math.isfinite(part):
            continue
        try:
            stored = torch.tensor(float(part), dtype=torch.float64).to(dtype)
        except OverflowError:  # an int past float64's range
            stored = torch.tensor(math.inf)
        if stored.isinf():
            raise ValueError(f"the value holds {value!r}, past this table's {dtype} range [{-top}, {top}]: it would be "
                             "stored as inf")


def _all_within(given: torch.Tensor, dtype: torch.dtype) -> None:
    """Refuse integers of ``given`` past ``dtype``'s range (ValueError naming the first, exactly as given).

    Compared in numpy within ``given``'s own dtype, against the bounds both
    dtypes share: a round trip through ``dtype`` misses a value that wraps and
    wraps back (uint64 ``2**64 - 1`` is int64 ``-1``, whose uint64 is it again).
    """
    values, info, have = given.cpu().numpy(), torch.iinfo(dtype), torch.iinfo(given.dtype)
    low, high = max(info.min, have.min), min(info.max, have.max)
    if low == have.min and high == have.max:
        return
    bad = (values < np.array(low, values.dtype)) | (values > np.array(high, values.dtype))
    if bool(bad.any()):
        _within(int(values[bad].flat[0]), dtype)


def shares_memory(a: torch.Tensor, b) -> bool:
    """Whether tensor ``a``'s bytes and tensor ``b``'s (anything else: none) lie in the same memory."""
    if not isinstance(b, torch.Tensor) or a.device != b.device or not a.numel() or not b.numel():
        return False
    lo, hi = a.data_ptr(), a.data_ptr() + a.numel() * a.element_size()
    if b.is_contiguous():  # its own bytes
        b_lo, b_hi = b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()
    elif b.dim() and b.stride(0) > 0 and b[0].is_contiguous():  # rows apart (a column slice, every other row)
        row, pitch = b[0].numel() * b.element_size(), b.stride(0) * b.element_size()
        first = max(0, -(-(lo - b.data_ptr() - row + 1) // pitch))  # the first row that ends after lo
        return first < b.shape[0] and b.data_ptr() + first * pitch < hi
    else:  # every byte of its storage, which holds them
        b_lo = b.untyped_storage().data_ptr()
        b_hi = b_lo + b.untyped_storage().nbytes()
    return lo < b_hi and b_lo < hi


def check_apart(rows: torch.Tensor, *tiers) -> None:
    """RuntimeError where the (contiguous) ``rows`` to write share memory with one of ``tiers`` (tensors, or None):
    rows copied one after another would read rows already overwritten. torch refuses ``x[ids] = x[a:b]`` only
    where both are views of one storage object; a numpy view of the table (``x.numpy()[a:b]``) is another. A
    second mapping of the table's file (another ``np.memmap`` of it) lies at other addresses: not caught."""
    if any(shares_memory(rows, tier) for tier in tiers):
        raise RuntimeError("the rows to write share memory with the table (some would be read after they were "
                           "overwritten); pass value.clone(), or a copy of the array")
