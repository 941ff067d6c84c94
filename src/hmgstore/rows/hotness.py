"""How hot each row is and how many rows a GPU budget holds: budgets, hot orders and scores, checked.

A GPU tier is filled hottest first. Callers say what is hot in one of two
ways: a *hot order* (row ids, hottest first; it may list only some rows) or
a *score* per row (in-degree, access counts: higher is hotter), which
:func:`order_by_score` turns into an order. Budgets are bytes, an int or a
string such as ``"8GB"`` (:func:`parse_bytes`). Scores are what users most
often pass where an order is wanted, so the checks here (:func:`check_order`,
:func:`check_score`) say which is which. A budget may also be ``"auto"``
(:func:`resolve_budget`: the lesser of what the table needs and
:data:`AUTO_SHARE` of the GPU's free memory; no GPU tier on a CPU). :mod:`hmgstore.rows.placement` turns the
rows chosen into tiers, and its names for these functions stay public.
"""
from __future__ import annotations

import math
import operator
import re
from fractions import Fraction

import numpy as np
import torch

from . import checks
from .ids import as_tensor, check_range

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
#: A number and a unit: digits with an optional point and exponent (``"1.5e9"``, ``"1e-3GB"``), read exactly.
_SIZE = re.compile(r"\s*\+?((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")
#: The most bytes a size may say: int64's largest, what torch and the kernels count bytes in (8 EiB).
MAX_BYTES = 2**63 - 1


def parse_bytes(size) -> int:
    """Read a byte count: an integer (Python, numpy or 0-d torch), or a string such as ``"8GB"``, ``"512 MiB"``,
    ``"1.5e9"``, ``"1e-3GB"``, read exactly (decimal, never through a float: ``"9007199254740993"`` is that many
    bytes, not 2**53).

    A size with a unit is rounded down to whole bytes (``"3.3KiB"`` is 3379). Raises ValueError for bools,
    negative or non-finite sizes, strings it cannot read, a number of bytes with a fraction (``2.5``: bytes come
    whole, and a user who wrote it meant gigabytes or a share; ``"2.5GB"`` is read), a size under one byte that
    is not 0 (``"1e-12GB"``) and one past :data:`MAX_BYTES`.
    """
    if isinstance(size, (bool, np.bool_)):
        raise ValueError(f"not a byte count: {size!r}")
    if isinstance(size, str):
        value, whole = _size_text(size)
    else:
        try:
            value, whole = Fraction(operator.index(size)), False
        except TypeError:
            if not isinstance(size, (float, np.floating)):
                raise ValueError(f"not a byte count: {size!r} ({type(size).__name__}); give an int or a string "
                                 "like '8GB'") from None
            if not math.isfinite(size):
                raise ValueError(f"a size must be finite, got {size!r}") from None
            value, whole = Fraction(float(size)), False
    if value.denominator != 1 and not whole:
        raise ValueError(f"{size!r} is not a whole number of bytes; write the unit for a size such as {size!r} "
                         f"gigabytes ('{size}GB'), or give bytes as an int")
    if value < 0:
        raise ValueError(f"a size cannot be negative: {size!r}")
    if 0 < value < 1:
        raise ValueError(f"{size!r} is less than one byte; give 0 for none, or check its unit")
    if value > MAX_BYTES:
        raise ValueError(f"{size!r} is past {MAX_BYTES} bytes (8 EiB), more than any machine holds; for a table "
                         "whole on the GPU give its size, or gpu_budget='auto'")
    return math.floor(value)


def _size_text(size: str) -> tuple[Fraction, bool]:
    """``(bytes, whether a unit was written)`` of a size string, exactly; the float reading only guards the exact
    one against exponents whose powers of ten would take long to build (``"1e999999999"``)."""
    m = _SIZE.fullmatch(size)
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"cannot read {size!r} as a size; write bytes as an int or a string like '8GB', "
                         "'512MiB' or '1.5e9'")
    number, whole = m.group(1), unit not in ("", "B")  # "3.3KiB" is rounded down; "2.5" and "2.5B" refused
    approx = float(number) * _UNITS[unit]
    try:
        if approx > 2 * MAX_BYTES:  # inf included
            return Fraction(2 * MAX_BYTES), whole
        if approx < 1e-30:  # 0, or far under a byte
            return (Fraction(0) if Fraction(number.lower().partition("e")[0]) == 0 else Fraction(1, 2)), whole
        value = Fraction(number) * _UNITS[unit]
    except ValueError:  # more digits than Python reads as an int
        raise ValueError(f"cannot read {size!r} as a size: too many digits") from None
    if not whole and value.denominator != 1:
        raise ValueError(f"{size!r} is not a whole number of bytes; write its unit, e.g. '{number}GB'")
    return value, whole


#: ``gpu_budget="auto"``: the share of the GPU memory free at build time (``torch.cuda.mem_get_info``) that one
#: table, one feature store or one sampler's topology may take. Each build takes its share of what is free then,
#: so a store's features and then its sampler's topology leave at least a quarter of the free memory to the
#: model, its activations and torch's caching allocator.
AUTO_SHARE = 0.5


def parse_budget(budget):
    """A ``gpu_budget`` read on any device: None, ``"auto"`` (any case), or bytes (:func:`parse_bytes`).

    Raises ValueError for what is neither, so a typo (``"16XB"``) fails on a
    CPU machine as it would on a GPU.
    """
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        return "auto"
    return None if budget is None else parse_bytes(budget)


def resolve_budget(budget, needed: int, device) -> int | None:
    """Bytes of GPU memory a ``gpu_budget`` gives a table that needs ``needed`` bytes to be whole on ``device``.

    None stays None (no GPU tier asked for); bytes are parsed
    (:func:`parse_bytes`); ``"auto"`` is ``min(needed, AUTO_SHARE * free)``
    with ``free`` the device's free memory now (``torch.cuda.mem_get_info``),
    and 0 on a CPU, which has no GPU tier. Raises ValueError for an
    unreadable budget (on every device).
    """
    budget = parse_budget(budget)
    if budget != "auto":
        return budget
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, min(int(needed), int(AUTO_SHARE * free)))


def order_by_score(score: torch.Tensor) -> torch.Tensor:
    """Row ids sorted hottest first, from a per-row score (e.g. in-degree).

    ``score``: 1-D tensor of shape [N] (or what ``torch.as_tensor`` reads as
    one), any real dtype, any device. Returns int64 [N], on the CPU.
    Ties keep ascending id order (stable), so the result is deterministic.
    Raises as :func:`check_score` does: ValueError for other shapes and for
    NaN scores, TypeError for booleans (a mask: ``mask.float()`` ranks the
    marked rows first), complex numbers and what is not numbers.
    """
    score = check_score(score, None, "a hotness score")
    return torch.sort(score, descending=True, stable=True).indices


def by_hotness(order: torch.Tensor, budget, row_bytes: int) -> torch.Tensor:
    """The rows that fit in ``budget`` bytes of GPU memory, hottest first.

    Args:
        order: 1-D integer tensor of row ids, hottest first (it may list only some rows; checked by
            :func:`check_order` where a table takes it).
        budget: bytes (int or string, see :func:`parse_bytes`).
        row_bytes: bytes of GPU memory one row takes, an integer >= 0 (0: no row is resident).

    Returns:
        int64 ids, a prefix of ``order``.

    Raises:
        TypeError: ``order`` of floats or bools, or ``row_bytes`` not an integer.
        ValueError: ``order`` not 1-D, ``row_bytes`` negative, or a ``budget`` :func:`parse_bytes` refuses.
    """
    order = checks.integers(order, "order")
    row_bytes = checks.count(row_bytes, "row_bytes")
    if row_bytes == 0:
        return order.reshape(-1)[:0].to(torch.int64)
    count = parse_bytes(budget) // row_bytes
    return order.reshape(-1)[:count].to(torch.int64)


def hot_rows_under_budget(hotness: dict, row_bytes: dict, budget) -> dict:
    """Per group (e.g. node type), the ids of the hottest rows that together fit in ``budget`` bytes.

    ``hotness``: group -> 1-D score tensor [rows of the group] (higher is
    hotter, any real dtype). ``row_bytes``: group -> bytes a row of that group
    costs on the GPU (all its attributes together). ``budget``: int or string
    such as ``"8GB"``. Rows of all groups compete on one scale; ties keep
    group then id order. Returns group -> int64 ids, hottest first. Raises
    ValueError when a group of ``row_bytes`` has no score.
    """
    groups = list(row_bytes)
    missing = [g for g in groups if g not in hotness]
    if missing:
        raise ValueError(f"no hotness for {missing}; pass one score per row of every node type "
                         "(e.g. hotness={node_type: in_degree})")
    hotness = {g: torch.as_tensor(hotness[g]).reshape(-1) for g in groups}
    if len(groups) == 1:  # one group: the same answer without a per-row cost tensor (16 B a row)
        (g,) = groups
        return {g: by_hotness(order_by_score(hotness[g]), budget, row_bytes[g])}
    cost = torch.cat([torch.full((hotness[g].numel(),), row_bytes[g], dtype=torch.int64) for g in groups])
    order = _order_across(hotness)
    count = int((cost[order].cumsum(0) <= parse_bytes(budget)).sum())
    chosen, rows, start = order[:count], {}, 0
    for g in groups:
        end = start + hotness[g].numel()
        rows[g] = chosen[(chosen >= start) & (chosen < end)] - start
        start = end
    return rows


#: The largest float64 under 2**63: integer scores are ranked by their nearest float64, capped here, which
#: int64 holds, and the rest (n - that float), so that no integer past 2**53 ties with another in silence.
_BELOW_2_63 = 2.0**63 - 1024


def _order_across(hotness: dict) -> torch.Tensor:
    """The rows of all groups' scores (``hotness``: group -> 1-D real tensor) hottest first, ranked exactly
    whatever their dtypes; ties keep group then id order.

    Integer scores alone are compared as int64, floats alone as float64 (which holds every float32 exactly).
    Both together: each integer ``n`` as the pair (its nearest float64 ``f``, ``n - f``) against a float's
    ``(x, 0)``; rounding never reorders, so the pairs order as the scores do, where ``.double()`` would tie
    ``2**53`` with ``2**53 + 1``. Raises ValueError for uint64 scores past int64 beside other groups.
    """
    scores = [torch.as_tensor(s).reshape(-1) for s in hotness.values()]
    for s in scores:
        if s.dtype == torch.uint64 and s.numel() and int(s.numpy().max()) > 2**63 - 1:
            raise ValueError("hotness scores past 2**63 - 1 (uint64) cannot be ranked against other node types' "
                             "scores; scale them down (the order within a type is all that counts)")
    if not any(s.is_floating_point() for s in scores):
        return order_by_score(torch.cat([s.to(torch.int64) for s in scores]))
    if all(s.is_floating_point() for s in scores):
        return order_by_score(torch.cat([s.to(torch.float64) for s in scores]))
    first, rest = [], []
    for s in scores:
        if s.is_floating_point():
            first.append(s.to(torch.float64))
            rest.append(torch.zeros(s.numel(), dtype=torch.int64))
        else:
            n = s.to(torch.int64)
            near = n.to(torch.float64).clamp(max=_BELOW_2_63).to(torch.int64)
            first.append(near.to(torch.float64))
            rest.append(n - near)
    by_rest = order_by_score(torch.cat(rest))  # stable sorts: by the rest, then by the float (ties keep the rest's)
    return by_rest[order_by_score(torch.cat(first)[by_rest])]


def check_hotness(hotness: dict, num_rows: dict) -> dict:
    """``hotness`` as tensors, after checking each group's score has one entry per row.

    ``num_rows``: group -> rows of that group. Each score is checked as
    :func:`check_score` checks it, on every device. Raises ValueError naming
    the group that is missing, unknown or has the wrong length or rank,
    TypeError for scores that are not real numbers.
    """
    unknown = [g for g in hotness if g not in num_rows]
    if unknown:
        raise ValueError(f"hotness names node type {unknown[0]!r}, which has no node attributes here; the types "
                         f"are {list(num_rows)}")
    checked = {}
    for group, count in num_rows.items():
        if group not in hotness:
            raise ValueError(f"no hotness for node type {group!r}; pass one score per node of every type")
        what = "hotness" if group is None else f"hotness of node type {group!r}"
        checked[group] = check_score(hotness[group], count, what)
    return checked


def hotness_or_default(hotness: dict | None, default, num_rows: dict) -> dict:
    """Group -> score: ``hotness`` when given, else ``default()`` (called only then: it may cost a pass over
    the edges), with zeros for the groups it leaves out (no edge draws them).

    ``default``: a callable returning group -> 1-D score tensor [rows]; ``num_rows``: group -> rows of the
    group.

    Raises:
        ValueError: as :func:`check_hotness`, for a given ``hotness`` that lacks a group of ``num_rows``, holds
            a score of another length, or NaN.
    """
    if hotness is not None:
        return check_hotness(hotness, num_rows)  # the caller's scores: checked on every device
    scores = default()
    return {g: scores.get(g, torch.zeros(n, dtype=torch.float64)) for g, n in num_rows.items()}


_SCORES_HINT = ("a score per row (a degree, a count, a float) goes in hotness=score, or through "
                "hmgstore.hotness.order_by_score(score) as hot_order")


def check_order(order, num_rows: int, what: str = "hot_order", hint: str = _SCORES_HINT) -> torch.Tensor:
    """``order`` as 1-D int64 CPU ids after checking every one of them, not only those a budget takes.

    ``order``: 1-D row ids hottest first (integer tensor, numpy array or list;
    it may list only some rows), each in ``[0, num_rows)`` and listed at
    most once. Raises TypeError for non-integer values (float ids are
    refused, never truncated), IndexError for an id out of range and
    ValueError for a repeated id; the messages name ``what`` and say where
    a score per row goes (``hint``), since scores are what is usually passed
    by mistake.
    """
    if isinstance(order, np.ndarray) and order.dtype.kind in "iu":
        order = as_tensor(order, num_rows)[0]  # numpy ids as a gather reads them (uint8 included, either byte order)
    if not isinstance(order, torch.Tensor):
        try:
            order = torch.as_tensor(order) if len(order) else torch.empty(0, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError, OverflowError) as err:
            raise TypeError(f"{what} is row ids, hottest first (integers); could not read it: {err}") from None
    if order.dtype.is_floating_point or order.dtype.is_complex or order.dtype == torch.bool:
        raise TypeError(f"{what} is row ids, hottest first (integers), got {order.dtype} values; {hint}")
    if order.dim() != 1:
        raise ValueError(f"{what} must be 1-D, row ids hottest first; got shape {tuple(order.shape)}")
    order = as_tensor(order, num_rows)[0].reshape(-1).to("cpu", torch.int64)
    try:
        check_range(order, num_rows)
    except IndexError as err:
        raise IndexError(f"{what}: {err}") from None
    seen = torch.zeros(num_rows, dtype=torch.bool)  # one byte a row, O(N), where unique() would sort
    seen[order] = True
    if int(seen.sum()) != len(order):
        counts = torch.bincount(order, minlength=num_rows)
        first = order[counts[order] > 1][0]
        raise ValueError(f"{what} lists row {int(first)} more than once ({int(counts[first])} times): it is an "
                         f"ordering of row ids, hottest first, each at most once; {hint}")
    return order


def check_score(score, num_rows: int | None, what: str = "hotness") -> torch.Tensor:
    """``score``, one real number per row (higher is hotter), as a 1-D CPU tensor, after checking it.

    ``num_rows``: the rows the scores are for (None: any number). Raises
    ValueError for another shape or length and for NaN scores, TypeError
    for what is not real numbers (a bool mask, named by its dtype, included);
    on every device, whether or not a budget uses the scores.
    """
    try:
        score = torch.as_tensor(score).cpu()
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        shape = "N" if num_rows is None else num_rows
        raise TypeError(f"{what} is one real score per row (a tensor of shape [{shape}]); could not read "
                        f"{type(score).__name__} as one: {err}") from None
    if score.is_complex():
        raise TypeError(f"{what} is one real score per row, got {score.dtype}")
    if score.dtype == torch.bool:  # refused as everywhere: a mask read as 0/1 scores is rarely what was meant
        raise TypeError(f"{what} is one real score per row, got a {score.dtype} mask of booleans; pass mask.float() "
                        "to rank marked rows first")
    if score.dim() != 1:
        raise ValueError(f"{what} must be 1-D, one score per row; got shape {tuple(score.shape)}")
    if num_rows is not None and score.numel() != num_rows:
        raise ValueError(f"{what} has {score.numel()} entries for {num_rows} rows; give one score per row "
                         "(0 for rows never touched)")
    if score.is_floating_point() and bool(torch.isnan(score).any()):
        raise ValueError(f"{what}: the score of row {int(torch.isnan(score).nonzero()[0, 0])} is NaN; give every "
                         "row a number (0 for rows never touched)")
    return score
