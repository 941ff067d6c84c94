"""Which row of a table lives in which tier: placement policy, decided here and nowhere else.

A table of ``N`` rows is seen, from one GPU, as a short list of :class:`Tier`
objects, each a contiguous range of *new ids*: first the rows resident on
this GPU, then (for multi-GPU tables) the rows of each peer GPU's shard, last
the host tier. The host tier is the source table pinned in place, so it holds
every row in its original order and a host row's new id is ``host.start +
old_id``: no host data moves. ``new_of_old[old_id]`` gives any row's new id;
the kernel maps a new id to ``(tier, offset)`` by comparing it with the tier
boundaries.

Policies: :func:`for_table` (rows by id, or the hottest rows under a GPU
budget), :func:`sharded` (hot rows replicated and dealt over several GPUs)
and :func:`hot_rows_under_budget` (several tables, e.g. node types, sharing
one budget). Adapters pass hotness and budgets through to these. Budgets,
hot orders and scores are read and checked in :mod:`hmgstore.rows.hotness`
(public as ``hmgstore.hotness``). This module only computes ids; it does not
touch tables' data.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

from . import checks
from .formats import Format
from .hotness import by_hotness, check_order, check_score, order_by_score, parse_bytes, resolve_budget
from .ids import as_tensor, check_range


@dataclass(frozen=True, eq=False)
class Tier:
    """One contiguous range of new ids ``[start, end)`` and where its rows are.

    ``name``: ``"gpu"`` (a one-GPU table's resident rows), ``"replica"``
    (hot rows copied on every GPU), ``"shard{s}"`` (GPU ``s``'s share) or
    ``"host"`` (the pinned source). ``rows``: old ids of a resident tier's
    rows in slot order (int64, CPU); None for the host tier, which holds
    every row in id order. ``base`` and ``pitch``: the address of the tier's
    first row as seen from the GPU that reads it, and the bytes between rows;
    0 until a table binds them (:meth:`bind`). ``stored``: the
    :class:`hmgstore.rows.formats.Format` the tier keeps a float32 table's rows
    in (bfloat16, float16, float8 or int8 with a per-row scale), decoded by
    every gather; None when rows are kept as they read. ``own``: a shard
    bound by the rank whose GPU holds it (:attr:`local`).

    Args:
        name: ``"gpu"``, ``"replica"``, ``"shard{s}"`` (``s`` a whole
            number) or ``"host"``.
        start: the first new id, an integer >= 0.
        end: one past the last new id, an integer >= ``start``.
        rows: for a resident tier, 1-D integer old ids, ``end - start`` of
            them (kept as int64 on the CPU); None for the host tier.
        base: the address of the tier's first row, an integer >= 0.
        pitch: the bytes between rows, an integer >= 0.
        stored: None or a :class:`hmgstore.rows.formats.Format`.
        own: True only for a ``"shard{s}"`` tier read by GPU ``s`` itself.

    Raises:
        TypeError: ``name`` not a string; ``start``, ``end``, ``base`` or
            ``pitch`` not integers; ``rows`` not an integer tensor;
            ``stored`` not a Format; ``own`` not a bool.
        ValueError: another name; ``own`` for a tier other than a shard; a negative bound, ``base`` or ``pitch``;
            ``end < start``; ``rows`` not 1-D or not ``end - start`` ids; rows
            given for the host tier or missing for a resident one.
    """

    name: str
    start: int
    end: int
    rows: torch.Tensor | None = None
    base: int = 0
    pitch: int = 0
    stored: object = None  # hmgstore.rows.formats.Format
    own: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"a tier's name is a string, got {type(self.name).__name__}")
        if not re.fullmatch(r"gpu|replica|host|shard[0-9]+", self.name):
            raise ValueError(f"a tier is called 'gpu', 'replica', 'shard<s>' or 'host', not {self.name!r}")
        for name in ("start", "end", "base", "pitch"):
            object.__setattr__(self, name, checks.count(getattr(self, name), f"Tier.{name}"))
        if self.end < self.start:
            raise ValueError(f"tier {self.name!r} ends ({self.end}) before it starts ({self.start})")
        if (self.rows is None) != (self.name == "host"):
            raise ValueError(f"tier {self.name!r}: the host tier has no rows (it holds every row in id order), a "
                             "resident tier lists its rows")
        if self.rows is not None:
            if not isinstance(self.rows, torch.Tensor):
                raise TypeError(f"tier {self.name!r}: rows is an integer tensor, got {type(self.rows).__name__}")
            rows = checks.integers(self.rows, f"tier {self.name!r}'s rows").to("cpu", torch.int64)
            if len(rows) != self.end - self.start:
                raise ValueError(f"tier {self.name!r} spans {self.end - self.start} new ids but lists {len(rows)} rows")
            object.__setattr__(self, "rows", rows)
        if self.stored is not None and not isinstance(self.stored, Format):
            raise TypeError(f"tier {self.name!r}: stored is a hmgstore.rows.formats.Format or None, got "
                            f"{type(self.stored).__name__}")
        if not isinstance(self.own, bool):
            raise TypeError(f"tier {self.name!r}: own is a bool, got {type(self.own).__name__}")
        if self.own and not self.name.startswith("shard"):
            raise ValueError(f"tier {self.name!r}: only a shard is its own GPU's (own=True)")

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def local(self) -> bool:
        """Whether the reading GPU holds these rows in its own memory: a one-GPU table's resident rows, a replica,
        its own shard. Other tiers are read over a link (PCIe, NVLink)."""
        return self.name in ("gpu", "replica") or self.own

    def bind(self, base: int, pitch: int, stored=None, own: bool = False) -> Tier:
        """This tier read at ``base`` with ``pitch`` bytes between rows, its rows kept as ``stored``; ``own``: a
        shard read by the GPU that holds it."""
        return dataclasses.replace(self, base=base, pitch=pitch, stored=stored, own=own)


@dataclass(frozen=True, eq=False)
class Placement:
    """Where each row of a ``num_rows``-row table lives: its :class:`Tier` objects in new-id order.

    A table on one GPU has tiers ``gpu, host``; a table sharded over ``k``
    GPUs ``replica, shard0 .. shard{k-1}, host`` (empty tiers are left out,
    except shards). ``host_layout``: old ids in the order the host tier
    keeps its rows (a permutation: rows used together laid out together,
    :mod:`hmgstore.graph.locality`), or None for id order. The new-id map is
    derived where it is used: see :meth:`new_of_old`.

    Args:
        num_rows: an integer >= 0.
        tiers: :class:`Tier` objects (a tuple or list) of distinct names that
            follow each other from new id 0 (each starts where the one before
            ends); resident tiers' rows in ``[0, num_rows)``, no row in two of
            them; the host tier, if any, last and ``num_rows`` long; without
            one, the resident tiers hold every row.
        host_layout: None, or a permutation of ``range(num_rows)``
            (:func:`hmgstore.rows.checks.permutation`), with a host tier only.

    Raises:
        TypeError: ``num_rows`` not an integer; a tier not a :class:`Tier`;
            ``host_layout`` not integers.
        ValueError: a negative ``num_rows``; tiers that leave a gap, overlap,
            repeat a name, put the host tier anywhere but last or of another
            size, list a row twice, or (without a host tier) leave a row out;
            ``host_layout`` without a host tier, or not a permutation.
        IndexError: a resident row or a ``host_layout`` id outside
            ``[0, num_rows)``.
    """

    num_rows: int
    tiers: tuple[Tier, ...]
    host_layout: torch.Tensor | None = None

    def __post_init__(self):
        n = checks.count(self.num_rows, "num_rows")
        object.__setattr__(self, "num_rows", n)
        tiers = tuple(self.tiers)
        object.__setattr__(self, "tiers", tiers)
        bad = [t for t in tiers if not isinstance(t, Tier)]
        if bad:
            raise TypeError(f"a placement's tiers are hmgstore.Tier objects, got {type(bad[0]).__name__}")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"a placement names each tier once, got {names}")
        at = 0
        for t in tiers:
            if t.start != at:
                raise ValueError(f"tier {t.name!r} starts at new id {t.start}, where the tiers before it end at {at}")
            at = t.end
        host = "host" in names
        if host and (names[-1] != "host" or tiers[-1].size != n):
            raise ValueError(f"the host tier comes last and holds every one of the {n} rows; tiers: "
                             f"{[(t.name, t.size) for t in tiers]}")
        held = torch.zeros(n, dtype=torch.bool)  # one byte a row: O(N), no sort
        listed = 0
        for t in tiers:
            if t.rows is not None and len(t.rows):
                try:
                    check_range(t.rows, n)
                except IndexError as err:
                    raise IndexError(f"tier {t.name!r}: {err}") from None
                held[t.rows] = True
                listed += len(t.rows)
        if int(held.sum()) != listed:
            raise ValueError("a row is listed twice among the resident tiers; each lives in one tier (or the host)")
        if not host and listed != n:
            raise ValueError(f"without a host tier the resident tiers hold every row: {listed} of {n} listed")
        if self.host_layout is not None:
            if not host:
                raise ValueError("host_layout orders the host tier's rows, and this placement has no host tier")
            object.__setattr__(self, "host_layout", checks.permutation(self.host_layout, n, "host_layout"))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    @property
    def bounds(self) -> tuple[int, ...]:
        """``len(tiers) + 1`` new-id boundaries: tier ``t`` holds ``bounds[t] <= n < bounds[t+1]``."""
        return (self.tiers[0].start, *(t.end for t in self.tiers)) if self.tiers else (0,)

    @property
    def resident(self) -> tuple[torch.Tensor, ...]:
        """Old ids of every resident tier's rows, in tier order."""
        return tuple(t.rows for t in self.tiers if t.rows is not None)

    def tier(self, name: str) -> Tier:
        """The tier called ``name`` (KeyError for unknown tiers)."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no tier {name!r}; tiers are {self.names}")

    def rows_of(self, name: str) -> torch.Tensor:
        """Old ids of a resident tier's rows, in slot order (KeyError for unknown or host tiers)."""
        rows = self.tier(name).rows
        if rows is None:
            raise KeyError(f"tier {name!r} is not resident: it holds every row of the table")
        return rows

    def new_of_old(self, device=None, dtype: torch.dtype = torch.int64, *, host_tiers=()) -> torch.Tensor | None:
        """``[num_rows]`` new id of every old id, built on ``device``.

        ``host_tiers``: names of resident tiers this view cannot read (a peer
        GPU without peer access); their rows map to the host tier instead.
        None when the map is the identity (every row on the host, or every
        row on one GPU in id order).
        """
        count = self.resident_rows
        if (count == 0 and self.host_layout is None) or self.names == ("gpu",):
            return None
        if self.host_layout is None:
            new = torch.arange(count, count + self.num_rows, dtype=dtype, device=device)
        else:  # the host tier's row i holds old row host_layout[i]
            new = torch.empty(self.num_rows, dtype=dtype, device=device)
            new[self.host_layout.to(device)] = torch.arange(count, count + self.num_rows, dtype=dtype, device=device)
        for t in self.tiers:
            if t.rows is not None and t.name not in host_tiers and len(t.rows):
                new[t.rows.to(device)] = torch.arange(t.start, t.end, dtype=dtype, device=device)
        return new

    @property
    def index_dtype(self) -> torch.dtype:
        """dtype of ids inside the kernel: int32 while every new id fits."""
        return torch.int32 if self.bounds[-1] < 2**31 else torch.int64

    @property
    def resident_rows(self) -> int:
        """Rows held in GPU memory somewhere (each counted once)."""
        return sum(len(rows) for rows in self.resident)

    @property
    def gpu_rows(self) -> torch.Tensor:
        """Old ids of the rows resident on the GPU of a one-GPU table, in slot order."""
        first = self.tiers[0] if self.tiers else None
        if first is not None and first.name == "gpu" and first.rows is not None:  # a resident tier has its rows
            return first.rows
        return torch.empty(0, dtype=torch.int64)

    @property
    def num_gpu_rows(self) -> int:
        return len(self.gpu_rows)

    @property
    def num_shards(self) -> int:
        return sum(t.name.startswith("shard") for t in self.tiers)

    @property
    def has_host_tier(self) -> bool:
        """Whether some row is read from the host (always true for a table with no resident row)."""
        return self.resident_rows < self.num_rows


def _stack(num_rows: int, resident: list[tuple[str, torch.Tensor]], host: bool = True,
           host_layout: torch.Tensor | None = None) -> Placement:
    """Resident tiers in the given order, then the host tier (new id = its start + the row's host position)."""
    tiers, start = [], 0
    for name, rows in resident:
        tiers.append(Tier(name, start, start + len(rows), rows))
        start += len(rows)
    if host:
        tiers.append(Tier("host", start, start + num_rows))
    return Placement(num_rows, tuple(tiers), host_layout if host else None)


def host_only(num_rows: int, host_layout: torch.Tensor | None = None) -> Placement:
    """Every row read from the pinned host table (kept in ``host_layout`` order, see :class:`Placement`)."""
    return _stack(num_rows, [], host_layout=host_layout)


def check_layout(layout, num_rows: int) -> torch.Tensor:
    """``layout`` as int64 CPU ids after checking it is a permutation of ``range(num_rows)``
    (:func:`hmgstore.rows.checks.permutation`, the one check of orders).

    Raises TypeError for non-integers (floats and bools: a bool tensor is
    not read as a mask, which would make any all-True layout the identity),
    ValueError for another length or rank and naming a row listed twice,
    IndexError for ids out of range.
    """
    return checks.permutation(layout, num_rows, "layout")


def _ids(ids, num_rows: int, what: str) -> torch.Tensor:
    """1-D int64 CPU ids, each checked to be in ``[0, num_rows)`` and listed once."""
    try:
        ids, _ = as_tensor(ids, num_rows)
    except TypeError as err:
        raise TypeError(f"{what}: {err}") from None
    ids = ids.reshape(-1).to("cpu", torch.int64)
    check_range(ids, num_rows)
    if len(torch.unique(ids)) != len(ids):
        raise ValueError(f"{what} lists a row more than once; pass each id once")
    return ids


def by_ids(num_rows: int, gpu_rows, host_layout: torch.Tensor | None = None) -> Placement:
    """Rows ``gpu_rows`` resident on the GPU (slots in the given order), the rest on the host.

    When ``gpu_rows`` lists every row, slots follow row ids instead, so the
    kernel needs no map.

    ``gpu_rows``: 1-D integer ids, unique, each in ``[0, num_rows)``. Raises
    IndexError for an id out of range and ValueError for a repeated id.
    """
    ids = _ids(gpu_rows, num_rows, "gpu_rows")
    if len(ids) == 0:
        return host_only(num_rows, host_layout)
    if len(ids) == num_rows:  # every row resident: slot = id, so no map and no host tier
        return _stack(num_rows, [("gpu", torch.arange(num_rows))], host=False)
    return _stack(num_rows, [("gpu", ids)], host_layout=host_layout)


def for_table(num_rows: int, row_bytes: int, device: torch.device, *, gpu_rows=None, gpu_budget=None,
              hot_order=None, hotness=None, host_layout: torch.Tensor | None = None) -> Placement:
    """The placement of one table on ``device``, from the arguments :class:`~hmgstore.HybridTensor` takes.

    ``gpu_rows`` (ids), or ``gpu_budget`` (bytes, or ``"auto"``:
    :func:`~hmgstore.rows.hotness.resolve_budget`) filled hottest first by
    ``hot_order`` (row ids, hottest first: :func:`check_order`) or by
    ``hotness`` (a score per row, higher is hotter: :func:`order_by_score`),
    or, with neither, in id order (the first rows that fit: a table knows no
    hotness of its own; a graph's stores default to in-degree). They are
    checked on every device, so a script that runs on the CPU fails the same
    way it would on a GPU; on the CPU every row is then read from the
    source. ``host_layout``: see :class:`Placement` (checked by the table).
    Raises ValueError for conflicting arguments and repeated ids, TypeError
    for float ids, IndexError for ids out of range.
    """
    if gpu_rows is not None and (gpu_budget is not None or hot_order is not None or hotness is not None):
        raise ValueError("pass either gpu_rows, or gpu_budget (with hot_order or hotness), not both")
    if hot_order is not None and hotness is not None:
        raise ValueError("pass hot_order (row ids, hottest first) or hotness (a score per row), not both")
    gpu_budget = resolve_budget(gpu_budget, num_rows * row_bytes, device)  # "auto": see hotness.AUTO_SHARE
    if gpu_budget is not None:
        if hot_order is not None:
            order = check_order(hot_order, num_rows)
        elif hotness is not None:
            order = order_by_score(check_score(hotness, num_rows))
        else:  # no hotness known: the first rows that fit
            order = torch.arange(num_rows)
        gpu_rows = by_hotness(order, gpu_budget, row_bytes)
    elif hot_order is not None or hotness is not None:
        what = "hot_order" if hot_order is not None else "hotness"
        raise ValueError(f"{what} is only used with gpu_budget; pass gpu_budget too")
    placement = host_only(num_rows, host_layout) if gpu_rows is None else by_ids(num_rows, gpu_rows, host_layout)
    return host_only(num_rows, host_layout) if torch.device(device).type == "cpu" else placement


def sharded(num_rows: int, hot_order, row_bytes: int, num_shards: int, gpu_budget, replicate=0) -> Placement:
    """Rows spread over the memory of ``num_shards`` GPUs, hottest first, the rest on the host.

    Each GPU gets ``gpu_budget`` bytes (int or string, see :func:`parse_bytes`):
    first the ``replicate`` bytes' worth of the hottest rows, copied on every
    GPU, then its shard. The next hottest rows are dealt to the shards in
    turn (shard ``s`` takes every ``num_shards``-th row), so every GPU owns
    as many rows of each hotness as the others and serves as many peer reads.
    ``hot_order``: row ids hottest first (unique, in range; it may list only
    some rows: unlisted rows stay on the host).

    Tiers: ``replica, shard0, ..., host``, the replica tier left out when
    empty and the host tier always last (its new ids are ``host.start +
    old_id``). Raises ValueError for missing arguments, when ``replicate``
    exceeds the budget or the order repeats an id, TypeError for float ids,
    IndexError for ids out of range.
    """
    if hot_order is None:
        raise ValueError("a sharded table needs hot_order, the row ids hottest first (e.g. "
                         "hmgstore.hotness.order_by_score(in_degree)); torch.arange(N) keeps rows in id order")
    if gpu_budget is None:
        raise ValueError("a sharded table needs gpu_budget, the bytes each GPU gives to the table (e.g. '20GB')")
    if num_shards < 1 or num_shards > 8:
        raise ValueError(f"a table can be sharded over 1 to 8 GPUs, not {num_shards}")
    budget, rep_bytes = parse_bytes(gpu_budget), parse_bytes(replicate)
    if rep_bytes > budget:
        raise ValueError(f"replicate ({rep_bytes} B) must fit in gpu_budget ({budget} B): replicated rows "
                         "take part of each GPU's budget")
    order = check_order(hot_order, num_rows, hint="hmgstore.hotness.order_by_score(score) turns a score per row "
                                                   "(a degree, a count) into one")
    per_gpu = budget // row_bytes if row_bytes else 0
    rep = min(rep_bytes // row_bytes if row_bytes else 0, per_gpu, len(order))
    spread = order[rep:rep + (per_gpu - rep) * num_shards]
    resident = [("replica", order[:rep])] if rep else []
    resident += [(f"shard{s}", spread[s::num_shards]) for s in range(num_shards)]
    return _stack(num_rows, resident)

