"""The checks public entry points share: counts, settings and sizes, timeouts, id lists, permutations, keywords,
table dtypes (the values of a write: :mod:`hmgstore.rows.writes`).

An entry point states its contract by calling these at its boundary, before
any work, so every entry point that takes a batch size, an SM cap, a list
of node ids or a row order refuses the same inputs with the same words.
The range check of ids itself is :func:`hmgstore.rows.ids.check_range` (the
one range check); scores and hot orders are :mod:`hmgstore.rows.hotness`;
files are :mod:`hmgstore.rows.file_identity`.

The errors follow one rule: TypeError for the wrong kind of value (a float,
a bool or a string where an integer goes; float ids, which would be
truncated), ValueError for the right kind with a wrong value (a count under
its minimum, a permutation that repeats a row, ids of the wrong rank),
IndexError for ids out of range. Ids read from a file are the file's fault,
not the caller's: with ``source=`` (the file's name) every refusal is a
ValueError naming it.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import operator
import os
from pathlib import Path

import numpy as np
import torch

from .ids import as_tensor, check_range


def count(value, name: str, *, at_least: int = 0) -> int:
    """``value`` as a Python int after checking it is an integer (not a bool) and at least ``at_least``.

    Accepts Python and numpy integers and 0-d integer tensors. Raises
    TypeError for floats (``2.5``, also ``2.0``), strings, bools and None;
    ValueError for a value under ``at_least``.
    """
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} takes an integer, got the bool {value!r}")
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim != 0:  # one-element arrays index as ints too
        raise TypeError(f"{name} takes one integer, got an array of shape {tuple(value.shape)}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} takes an integer, got {value!r} ({type(value).__name__})") from None
    if n < at_least:
        raise ValueError(f"{name} must be at least {at_least}, got {n}")
    return n


def real(value, name: str, *, at_least: float | None = None) -> float:
    """``value`` as a finite Python float after checking it is a real number (not a bool), at least ``at_least``.

    Accepts Python and numpy ints and floats and 0-d real tensors. Raises
    TypeError for bools, strings, None and complex numbers; ValueError for
    NaN, infinities and values under ``at_least``.
    """
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} takes a real number, got the bool {value!r}")
    if isinstance(value, torch.Tensor) and (value.numel() != 1 or value.is_complex()):
        raise TypeError(f"{name} takes a real number, got a tensor of shape {tuple(value.shape)} ({value.dtype})")
    if not isinstance(value, (int, float, np.integer, np.floating, torch.Tensor)):
        raise TypeError(f"{name} takes a real number, got {value!r} ({type(value).__name__})")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if at_least is not None and x < at_least:
        raise ValueError(f"{name} must be at least {at_least}, got {x}")
    return x


def integers(values, name: str) -> torch.Tensor:
    """``values`` as a 1-D integer tensor where it lies (converted to a tensor when it is a list or numpy array;
    no copy of a tensor), after checking its kind and rank: TypeError for floats (never truncated), bools and
    what is not numbers, ValueError for another rank."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise TypeError(f"{name} holds {values.dtype} values; it takes integers (floats are never truncated)")
        values = torch.from_numpy(np.ascontiguousarray(values))
    elif not isinstance(values, torch.Tensor):
        if isinstance(values, (list, tuple)) and any(isinstance(v, (bool, float)) for v in values):
            raise TypeError(f"{name} holds non-integers; it takes integers")
        try:
            values = torch.as_tensor(values) if len(values) else torch.empty(0, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise TypeError(f"{name} takes a 1-D integer tensor; could not read {type(values).__name__}: "
                            f"{err}") from None
    if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
        raise TypeError(f"{name} holds {values.dtype} values; it takes integers (floats are never truncated)")
    if values.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}")
    return values


def past_int64(values: torch.Tensor) -> bool:
    """Whether ``values`` is a uint64 tensor holding 2**63 or more, which a cast to int64 would wrap negative
    (ids, offsets and times are int64: such a value names nothing, and wrapped it names the wrong thing)."""
    return values.dtype == torch.uint64 and values.numel() > 0 and bool((values.view(torch.int64) < 0).any())


def offsets(ptr, name: str, total: int | None = None, *, length: int | None = None) -> torch.Tensor:
    """``ptr`` as a 1-D integer tensor after checking it is a list's offsets (CSR/CSC ``rowptr``/``colptr``).

    It holds at least one entry, starts at 0 and never decreases; with
    ``total``, it ends there (the number of edges); with ``length``, it has
    that many entries (nodes + 1). Raises TypeError for non-integers (see
    :func:`integers`) and ValueError for everything else. On a GPU the check
    reads one flag back (a synchronisation).
    """
    ptr = integers(ptr, name)
    if length is not None and ptr.numel() != length:
        raise ValueError(f"{name} has {ptr.numel()} entries; it needs {length} (one per node, plus one)")
    if ptr.numel() == 0:
        raise ValueError(f"{name} is empty; offsets hold one entry per node plus one (a graph of no nodes: [0])")
    if int(ptr[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(ptr[0])}")
    if bool((ptr.diff() < 0).any()):
        at = int((ptr.diff() < 0).nonzero()[0, 0])
        raise ValueError(f"{name} never decreases; it falls from {int(ptr[at])} to {int(ptr[at + 1])} at entry "
                         f"{at + 1}")
    if total is not None and int(ptr[-1]) != total:
        raise ValueError(f"{name} must end at the number of edges ({total}), got {int(ptr[-1])}")
    return ptr


def boolean(value, name: str) -> bool:
    """``value`` as a bool after checking it is one (Python or numpy): TypeError naming ``name`` otherwise, so
    that a string such as ``"no"``, which is truthy, is never taken for True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} is True or False, got {value!r}")
    return bool(value)


def seconds(value, name: str, *, allow_none: bool = False) -> float | None:
    """``value`` as a float after checking it is a finite number of seconds >= 0 (a timeout, a wait).

    Accepts Python and numpy ints and floats; None where ``allow_none`` (no limit). Raises TypeError for bools,
    strings, ``datetime.timedelta`` and other kinds (with None where it is not accepted), ValueError for a
    negative, infinite or NaN value.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        accepted = "a number of seconds or None" if allow_none else "a number of seconds"
        raise TypeError(f"{name} takes {accepted}, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return value


def shape(value, name: str = "shape") -> tuple[int, ...]:
    """A table's shape as a tuple of Python ints, each checked by :func:`count` (integers >= 0, never a
    truncated float). Raises TypeError for a non-sequence or non-integer sizes, ValueError for negative ones."""
    try:
        sizes = tuple(value)
    except TypeError:
        raise TypeError(f"{name} is a tuple of sizes, got {value!r}") from None
    return tuple(count(s, f"{name}[{k}]") for k, s in enumerate(sizes))


def setting(value, says: str, *, at_least=1, at_most=None, words=(), real_number: bool = False):
    """A constructor's setting (a depth, a number of SMs or of batches, a share) as a Python int (a float with
    ``real_number``), or one of the strings ``words`` (``"auto"``).

    Accepts what :func:`count` accepts (Python, numpy and 0-d torch
    integers; with ``real_number``, what :func:`real` accepts) from
    ``at_least`` to ``at_most``. Refuses everything else (bools, floats such
    as ``2.5`` or ``2.0`` for a count, other strings, values out of range)
    with one ValueError: ``says`` (what the setting is, e.g. ``"depth is the
    number of batches prepared ahead, at least 1"``) and the value given, so
    that every setting of every entry point is refused in the same words.
    """
    if isinstance(value, str) and value in words:
        return value
    try:
        number = real(value, "setting", at_least=at_least) if real_number else count(value, "setting",
                                                                                       at_least=at_least)
    except (TypeError, ValueError):
        number = None
    if number is None or (at_most is not None and number > at_most):
        raise ValueError(f"{says}; got {value!r}")
    return number


def sm_cap(max_sms, *, allow_auto: bool = False) -> int | str | None:
    """A cap on the SMs a gather holds: None (no cap), an integer >= 1, or ``"auto"`` where ``allow_auto``.

    What :class:`hmgstore.HybridTensor` and :class:`hmgstore.Pipeline` take as
    ``max_sms``. Raises ValueError for 0, negative numbers, floats, strings
    and bools, with what is accepted (:func:`setting`).
    """
    if max_sms is None:
        return None
    accepted = "a number of SMs (at least 1), 'auto' or None" if allow_auto else "a number of SMs (at least 1) or None"
    return setting(max_sms, f"max_sms is {accepted}", words=("auto",) if allow_auto else ())


def id_list(ids, name: str, num_rows: int, *, source: str | None = None) -> torch.Tensor:
    """``ids`` as 1-D int64 CPU ids after checking every one: integers, one dimension, each in ``[0, num_rows)``.

    ``ids``: integer tensor, numpy array or list (repeats allowed). Raises
    TypeError for floats (never truncated), bools and other non-integers,
    ValueError for another rank, IndexError naming the first id out of
    range; with ``source`` (the file the ids came from), ValueError naming
    ``source`` in every case.
    """
    try:
        if not isinstance(ids, (torch.Tensor, np.ndarray, list, tuple, range)):
            raise TypeError(f"{name} is row ids (an integer tensor, numpy array or list), got {type(ids).__name__}")
        if isinstance(ids, torch.Tensor) and ids.dtype == torch.uint8:  # ids: a list of rows is never a mask
            ids = ids.long()
        if isinstance(ids, np.ndarray) and ids.dtype.kind not in "iu":
            raise TypeError(f"{name} holds {ids.dtype} values; ids are integers (floats are never truncated)")
        if isinstance(ids, torch.Tensor) and (ids.dtype.is_floating_point or ids.dtype.is_complex
                                              or ids.dtype == torch.bool):
            raise TypeError(f"{name} holds {ids.dtype} values; ids are integers (floats are never truncated)")
        if isinstance(ids, (list, tuple)) and any(isinstance(v, (bool, float)) for v in ids):
            raise TypeError(f"{name} holds non-integers ({[v for v in ids if isinstance(v, (bool, float))][0]!r}); "
                            "ids are integers")
        tensor, _ = as_tensor(ids, num_rows) if not isinstance(ids, (list, tuple)) or len(ids) else \
            (torch.empty(0, dtype=torch.int64), (0,))
        if tensor.dim() != 1:
            raise ValueError(f"{name} must be 1-D ids, got shape {tuple(tensor.shape)}")
        tensor = tensor.to("cpu", torch.int64)
        try:
            check_range(tensor, num_rows)
        except IndexError as err:
            raise IndexError(f"{name}: {err}") from None
    except (TypeError, ValueError, IndexError) as err:
        if source is None:
            raise
        raise ValueError(f"{source}: {err}; the file is damaged or belongs to another graph") from None
    return tensor


def permutation(order, num_rows: int, name: str = "layout") -> torch.Tensor:
    """``order`` as int64 CPU ids after checking it is a permutation of ``range(num_rows)``: every row once.

    Raises TypeError for non-integer values, ValueError for another length
    or rank and naming a row listed twice (or one never listed), IndexError
    for ids out of range. Call it before inverting an order (``position[order] = arange``): the
    positions of rows it never lists would be whatever the memory held.
    """
    order = id_list(order, name, num_rows)
    if len(order) != num_rows:
        raise ValueError(f"{name} lists every row once: {num_rows} ids, got {len(order)}")
    marked = torch.zeros(num_rows, dtype=torch.bool).index_fill_(0, order, True)  # n ids in range, so all marked:
    if not bool(marked.all()):  # each row once (a bincount, 8x the memory, only names a repeat)
        seen = torch.bincount(order, minlength=num_rows)
        row = int((seen != 1).nonzero()[0, 0])
        raise ValueError(f"{name} lists every row once; row {row} is listed {int(seen[row])} times")
    return order


def inverse(order: torch.Tensor) -> torch.Tensor:
    """The position of each row in ``order``, a permutation already checked by :func:`permutation`."""
    position = torch.empty_like(order)  # every entry written: order lists each row once
    position[order] = torch.arange(len(order), dtype=order.dtype)
    return position


def keywords(function: str, given: dict, accepted, named=()) -> None:
    """Refuse keywords of ``given`` (a function's ``**options``) that are not ``accepted``, naming
    ``function`` (the one the user called, not the one the options travel to) and the closest spelling among
    ``accepted`` and ``named`` (the function's own named parameters). Raises TypeError."""
    unknown = [k for k in given if k not in accepted]
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(name, [*accepted, *named], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(sorted(accepted))}"
    raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}")


@functools.cache
def takes(*functions, without: tuple = ()) -> tuple[str, ...]:
    """The keywords ``functions`` (functions, classes, unbound methods) take, less ``self`` and ``without``:
    for :func:`keywords`, what an entry point may forward to them in its ``**kwargs`` (``without``: those it
    fills in itself). Read from their signatures, so it never falls behind them; cached, as hot paths call it."""
    names: dict[str, None] = {}  # a dict: insertion order, each name once
    for function in functions:
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY) and name != "self":
                names.setdefault(name)
    return tuple(name for name in names if name not in without)


def misspelt(function: str, given, named, others: str = "node attributes") -> None:
    """For a function whose ``**kwargs`` are open (feature names): refuse a keyword of ``given`` that is a near
    miss of one of its ``named`` parameters (``gpu_bugdet`` for ``gpu_budget``), naming ``function``
    (TypeError) and saying what its other keywords are (``others``); other names pass."""
    for name in given:
        close = difflib.get_close_matches(name, [n for n in named if n != name], n=1, cutoff=0.8)
        if close and name not in named:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}; did you mean {close[0]!r}? "
                            f"(other keywords are {others})")


#: The dtypes a table holds: those torch reads, writes (``index_copy_``) and sends between processes in full.
TABLE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
                torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
#: The dtype to hold the values of a dtype torch only half supports instead, and why it loses none.
_INSTEAD = {torch.uint16: (torch.int32, "which holds every uint16 value"),
            torch.uint32: (torch.int64, "which holds every uint32 value"),
            torch.uint64: (torch.int64, "if every value is under 2**63")}


def table_dtype(dtype, what: str = "the source table") -> torch.dtype:
    """``dtype`` after checking a table can hold it: one of :data:`TABLE_DTYPES`.

    Torch gathers rows of uint16/32/64 and float8 tensors but cannot write
    them (``index_copy_``) or pickle them, so a table of them would fail
    deep inside at its first write or its first trip to a DataLoader
    worker. Raises TypeError naming ``what`` (the source, a file), the
    supported dtypes and the dtype to use instead, for those and for what
    is not a torch dtype.
    """
    if isinstance(dtype, torch.dtype) and dtype in TABLE_DTYPES:
        return dtype
    names = ", ".join(str(d).removeprefix("torch.") for d in TABLE_DTYPES)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{what}: a table's dtype is a torch dtype ({names}); got {dtype!r}")
    instead, why = _INSTEAD.get(dtype, (torch.float32, "or keep float32 rows stored in a narrow format: "
                                        "compress='float8', 'bfloat16' ..."))
    raise TypeError(f"{what}: {dtype} is not a dtype hmgstore tables hold ({names}); use {instead} ({why}): "
                    f"x.to({instead})")


def path(value, what: str, call: str) -> Path:
    """``value``, a file or folder ``what`` that ``call`` takes, as a Path: a str, bytes (the file system's
    encoding) or os.PathLike. TypeError naming ``call``, ``what`` and the type for anything else (an array, an
    int, None), rather than pathlib's words."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise TypeError(f"{call} takes {what} as a path (str, bytes or os.PathLike), got {type(value).__name__}")
