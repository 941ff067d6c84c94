"""One GPU budget shared by several tables: which rows of each group stay resident on the GPU.

A store holds several tables whose rows come in groups: every attribute of a
node type has one row per node, every attribute of an edge type one row per
edge. Keeping a row of a group on the GPU costs the bytes of that row in all
the group's tables. :func:`resident_rows` turns one ``gpu_budget`` into the
rows each group keeps, hottest first on one scale across the groups, after
the tables asked for whole (labels read for every node of a batch) have
taken their bytes. The adapters build tables with the ``gpu_rows`` it
returns; :func:`hmgstore.rows.placement.for_table` is the same rule for one
table alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .hotness import check_hotness, hot_rows_under_budget, parse_budget, resolve_budget


@dataclass(frozen=True)
class Cost:
    """What one table asks of a GPU budget.

    Attributes:
        group: the group its rows belong to (a node type, an edge type; None when homogeneous).
        num_rows: rows of the table (every table of a group has as many).
        row_bytes: bytes one resident row takes (its stored size in a compressed format).
        whole: whether the table is kept whole on the GPU, paid for before any group's rows.
        name: the table's name in error messages (an attribute name).
    """

    group: object
    num_rows: int
    row_bytes: int
    whole: bool = False
    name: object = None


def row_bytes(source, stored=None) -> int:
    """Bytes of GPU memory one row of ``source`` takes, kept as ``stored`` (a stored format) or as it reads.

    Args:
        source: a ``[N, *row_shape]`` torch tensor or numpy array (or memmap).
        stored: a :class:`~hmgstore.rows.formats.Format`, or None for the source's own dtype.

    Returns:
        The bytes of one row.
    """
    elems = int(np.prod(source.shape[1:], dtype=np.int64))
    if stored is not None:
        return stored.pitch(elems)
    item = source.element_size() if isinstance(source, torch.Tensor) else np.dtype(source.dtype).itemsize
    return item * elems


#: ``gpu_whole="auto"`` keeps whole on the GPU the tables whose rows are at most this many bytes (labels, masks):
#: a batch reads such a row for every sampled node, and over PCIe each costs a whole read transaction.
SMALL_ROW_BYTES = 16
#: ... provided together they take at most this share of the budget.
SMALL_SHARE = 0.25


def resolve(costs: list[Cost], gpu_budget, device) -> int | None:
    """The bytes ``gpu_budget`` gives the tables of ``costs`` on ``device``, read once for all of them.

    A store resolves its budget once and hands the bytes to :func:`small_tables` and :func:`resident_rows`, so
    that ``"auto"`` is one reading of the GPU's free memory.

    Args:
        costs: one :class:`Cost` per table.
        gpu_budget: as for :func:`resident_rows`.
        device: the tables' device.

    Returns:
        None where no row can be resident (no budget, or a CPU), else bytes.

    Raises:
        ValueError: for an unreadable budget, on every device.
    """
    if gpu_budget is None or torch.device(device).type != "cuda":
        parse_budget(gpu_budget)  # read on every device: a typo fails on a CPU as it would on a GPU
        return None
    return resolve_budget(gpu_budget, sum(c.num_rows * c.row_bytes for c in costs), device)


def small_tables(costs: list[Cost], gpu_budget, device) -> set:
    """The names of the tables ``gpu_whole="auto"`` keeps whole on the GPU: every table of narrow rows
    (:data:`SMALL_ROW_BYTES`), when together they fit :data:`SMALL_SHARE` of the budget; none on a CPU, with
    no budget (None), or when they do not fit. Labels kept whole make a cached epoch faster
    (benchmarks/results/strong-step-h100.md).

    Args:
        costs: one :class:`Cost` per table (``whole`` is ignored).
        gpu_budget: as for :func:`resident_rows`.
        device: the tables' device.

    Returns:
        A set of table names.
    """
    if gpu_budget is None or torch.device(device).type != "cuda":
        return set()
    small = [c for c in costs if c.row_bytes <= SMALL_ROW_BYTES]
    needed = sum(c.num_rows * c.row_bytes for c in small)
    total = resolve_budget(gpu_budget, sum(c.num_rows * c.row_bytes for c in costs), device)
    return {c.name for c in small} if small and total and needed <= SMALL_SHARE * total else set()


def resident_rows(costs: list[Cost], gpu_budget, device, hotness: dict | None, *,
                  what: str = "node type") -> dict:
    """Per group, the ids of the rows kept on the GPU under one ``gpu_budget`` shared by every table of ``costs``.

    Whole tables are paid for first; the hottest rows of the other groups share the rest, a row of a group
    costing the sum of its tables' ``row_bytes`` (:func:`~hmgstore.rows.hotness.hot_rows_under_budget`).

    Args:
        costs: one :class:`Cost` per table.
        gpu_budget: None (no resident rows), ``"auto"`` (the lesser of every table's bytes and
            :data:`~hmgstore.rows.hotness.AUTO_SHARE` of ``device``'s free memory), or bytes (int or ``"8GB"``).
            Read on every device, so a typo fails on a CPU as on a GPU.
        device: the tables' device; on a CPU no row is resident.
        hotness: group -> score per row (higher is hotter), needed for every group with a table not kept whole.
        what: what a group is, for the error messages (``"node type"``, ``"edge type"``).

    Returns:
        group -> int64 CPU ids, hottest first; groups with no table ranked are absent.

    Raises:
        ValueError: for an unreadable budget, a missing hotness or one of the wrong length, and whole tables
            larger than the budget.

    Example:
        >>> costs = [Cost("paper", 1000, 512, name="x"), Cost("paper", 1000, 8, whole=True, name="y")]
        >>> rows = resident_rows(costs, "100KB", "cuda", {"paper": in_degree})  # doctest: +SKIP
    """
    if gpu_budget is None or torch.device(device).type != "cuda":
        parse_budget(gpu_budget)  # read on every device: a typo fails on a CPU as it would on a GPU
        return {}
    per_row: dict = {}
    rows: dict = {}
    for c in costs:
        if not c.whole:
            per_row[c.group] = per_row.get(c.group, 0) + c.row_bytes
            rows[c.group] = c.num_rows
    if per_row and hotness is None:
        raise ValueError(f"gpu_budget needs a hotness per {what} (e.g. in-degree) to choose the rows kept on the "
                         f"GPU; pass hotness={{{what.replace(' ', '_')}: score}}")
    ranked = check_hotness(hotness, rows) if per_row and hotness is not None else {}
    budget = resolve_budget(gpu_budget, sum(c.num_rows * c.row_bytes for c in costs), device)
    assert budget is not None  # not None in, bytes out
    whole_bytes = sum(c.num_rows * c.row_bytes for c in costs if c.whole)
    if whole_bytes > budget:
        names = sorted({str(c.name) for c in costs if c.whole})
        raise ValueError(f"the gpu_whole tables {names} need {whole_bytes:,} bytes of GPU memory, more than the "
                         f"gpu_budget of {budget:,}: raise the budget or name fewer tables")
    return hot_rows_under_budget(ranked, per_row, budget - whole_bytes) if per_row else {}
