"""A numpy source table as a torch tensor over the same memory, refused with the numpy fix when torch cannot
read it in place (a dtype torch lacks, foreign byte order, backwards or column-major rows)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

#: numpy dtypes torch.from_numpy reads: the rest are refused with a conversion to suggest.
_TORCH_KINDS = {np.dtype(t) for t in ("float64", "float32", "float16", "complex64", "complex128", "int64", "int32",
                                      "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool")}


def numpy_tensor(source: np.ndarray) -> torch.Tensor:
    """``source`` as a CPU tensor sharing its memory. Raises TypeError for a dtype torch cannot hold and
    ValueError for foreign byte order, negative strides or rows that are not each contiguous, each with the
    numpy call that fixes it."""
    dtype = source.dtype
    if dtype.byteorder not in ("=", "|") and not dtype.isnative:
        raise ValueError(f"the source array's dtype {dtype.str} is not in this machine's byte order; pass "
                        "x.astype(x.dtype.newbyteorder('=')), which copies "
                        f"{source.nbytes / 1e9:.2f} GB into native byte order")
    if dtype not in _TORCH_KINDS:
        fix = "x.astype(np.int64) (the times as integers)" if dtype.kind in "Mm" else "x.astype(np.float32)"
        raise TypeError(f"a table cannot hold numpy dtype {dtype} ({_kind(dtype)}); convert it to a numeric "
                        f"dtype torch reads, e.g. {fix}")
    if any(step < 0 for step in source.strides):  # torch has no negative strides: say what to do instead
        raise ValueError(f"the source array runs backwards in memory (strides {source.strides}, e.g. x[::-1]); "
                         f"pass np.ascontiguousarray(x), which copies {source.nbytes / 1e9:.2f} GB, or build "
                         "the table over the forward array and reverse the ids you gather")
    if source.ndim > 1 and source.size and not _rows_contiguous(source):
        raise ValueError(f"each row of the source array must be contiguous in memory (strides {source.strides} "
                         f"for shape {source.shape}, e.g. a Fortran-order array); pass np.ascontiguousarray(x), "
                         f"which copies {source.nbytes / 1e9:.2f} GB")
    with warnings.catch_warnings():  # non-writable arrays: hmgstore only reads them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(source)


def _rows_contiguous(source: np.ndarray) -> bool:
    """Whether each ``source[i]`` is dense and row-major (the step between rows may be larger)."""
    expected = source.itemsize
    for size, stride in reversed(list(zip(source.shape[1:], source.strides[1:]))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _kind(dtype: np.dtype) -> str:
    names = {"O": "Python objects", "M": "datetimes", "m": "time deltas", "V": "structured records",
             "U": "strings", "S": "bytes", "f": "extended precision floats", "c": "extended precision complex"}
    return names.get(dtype.kind, "not a dtype torch reads")
