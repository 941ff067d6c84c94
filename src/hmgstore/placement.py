"""Which row of a table lives in which tier.

A table of ``N`` rows is seen, from one GPU, as a short list of tiers, each a
contiguous range of *new ids* (DESIGN.md): first the rows resident on this GPU,
then (for multi-GPU tables) the rows of each peer GPU's shard, last the host
tier. The host tier is the source table pinned in place, so it holds every row
in its original order and a host row's new id is ``host_start + old_id``: no
host data moves. ``new_of_old[old_id]`` gives any row's new id; a kernel maps a
new id to ``(tier, offset)`` by comparing it with the tier boundaries.

Placement is decided here and nowhere else; this module only computes ids and
does not touch tensors' data.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(size) -> int:
    """Read a byte count: an int, or a string such as ``"8GB"``, ``"512 MiB"``, ``"1.5e9"``.

    Raises ValueError for negative sizes and strings it cannot read.
    """
    if isinstance(size, bool):
        raise ValueError(f"not a byte count: {size!r}")
    if isinstance(size, (int, float)):
        value = int(size)
    else:
        m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(size))
        unit = m.group(2).upper() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(
                f"cannot read {size!r} as a size; write bytes as an int or a string like '8GB' or '512MiB'")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 0:
        raise ValueError(f"a size cannot be negative: {size!r}")
    return value


def order_by_score(score: torch.Tensor) -> torch.Tensor:
    """Row ids sorted hottest first, from a per-row score (e.g. in-degree).

    ``score``: 1-D tensor of shape [N], any real dtype, CPU. Returns int64 [N].
    Ties keep ascending id order (stable), so the result is deterministic.
    """
    if score.dim() != 1:
        raise ValueError(f"a hotness score must be 1-D, one value per row; got shape {tuple(score.shape)}")
    return torch.sort(score.cpu(), descending=True, stable=True).indices


def by_hotness(order: torch.Tensor, budget, row_bytes: int) -> torch.Tensor:
    """The rows that fit in ``budget`` bytes of GPU memory, hottest first.

    ``order``: 1-D integer tensor of row ids, hottest first (it may list only
    some rows). ``budget``: bytes (int or string, see :func:`parse_bytes`).
    Returns int64 ids, a prefix of ``order``.
    """
    if row_bytes <= 0:
        return order[:0].to(torch.int64)
    count = parse_bytes(budget) // row_bytes
    return order.reshape(-1)[:count].to(torch.int64)


def hot_rows_under_budget(hotness: dict, row_bytes: dict, budget) -> dict:
    """Per node type, the ids of the hottest rows that together fit in ``budget`` bytes.

    ``hotness``: node type -> 1-D score tensor [num_nodes] (higher is hotter,
    any real dtype). ``row_bytes``: node type -> bytes a row of that type costs
    on the GPU (all its attributes together). ``budget``: int or string such
    as ``"8GB"``. Rows of all types compete on one scale; ties keep type then
    id order. Returns node type -> int64 ids, hottest first.
    """
    groups = list(row_bytes)
    if len(groups) == 1:  # one node type: the same answer without a per-row cost tensor (16 B a row)
        (g,) = groups
        return {g: by_hotness(order_by_score(hotness[g].reshape(-1)), budget, row_bytes[g])}
    scores = torch.cat([hotness[g].reshape(-1).to(torch.float64) for g in groups])
    cost = torch.cat([torch.full((hotness[g].numel(),), row_bytes[g], dtype=torch.int64) for g in groups])
    order = order_by_score(scores)
    count = int((cost[order].cumsum(0) <= parse_bytes(budget)).sum())
    chosen, rows, start = order[:count], {}, 0
    for g in groups:
        end = start + hotness[g].numel()
        rows[g] = chosen[(chosen >= start) & (chosen < end)] - start
        start = end
    return rows


@dataclass(frozen=True)
class Placement:
    """Where each row of an ``num_rows``-row table lives.

    ``tiers``: names of the tiers in new-id order: ``("gpu", "host")`` for a
    table on one GPU; ``("replica", "shard0", ..., "shard{k-1}", "host")``
    for a table sharded over ``k`` GPUs (empty tiers are left out, except
    shards). ``bounds``: ``len(tiers) + 1`` new-id boundaries; tier ``t`` holds
    new ids ``bounds[t] <= n < bounds[t+1]``. ``resident``: for each tier but
    the host tier, the old ids of its rows in slot order (int64, CPU). The
    new-id map is derived from these, where it is used: see :meth:`new_of_old`.
    """

    num_rows: int
    tiers: tuple[str, ...]
    bounds: tuple[int, ...]
    resident: tuple[torch.Tensor, ...]

    def new_of_old(self, device=None, dtype: torch.dtype = torch.int64, *, host_tiers=()) -> torch.Tensor | None:
        """``[num_rows]`` new id of every old id, built on ``device``.

        ``host_tiers``: names of resident tiers this view cannot read (a peer
        GPU without peer access); their rows map to the host tier instead.
        None when the map is the identity (every row on the host, or every
        row on one GPU in id order).
        """
        count = self.resident_rows
        if count == 0 or self.tiers == ("gpu",):
            return None
        new = torch.arange(count, count + self.num_rows, dtype=dtype, device=device)
        for name, lo, rows in zip(self.tiers, self.bounds, self.resident):
            if name not in host_tiers and len(rows):
                new[rows.to(device)] = torch.arange(lo, lo + len(rows), dtype=dtype, device=device)
        return new

    def rows_of(self, tier: str) -> torch.Tensor:
        """Old ids of a resident tier's rows, in slot order (KeyError for unknown tiers)."""
        for name, rows in zip(self.tiers, self.resident):
            if name == tier:
                return rows
        raise KeyError(f"no resident tier {tier!r}; tiers are {self.tiers}")

    def tier_range(self, tier: str) -> tuple[int, int]:
        """``(first, end)`` new ids of ``tier``."""
        t = self.tiers.index(tier)
        return self.bounds[t], self.bounds[t + 1]

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
        return self.resident[0] if self.resident and self.tiers[0] == "gpu" else torch.empty(0, dtype=torch.int64)

    @property
    def num_gpu_rows(self) -> int:
        return len(self.gpu_rows)

    @property
    def num_shards(self) -> int:
        return sum(name.startswith("shard") for name in self.tiers)

    @property
    def has_host_tier(self) -> bool:
        """Whether some row is read from the host (always true for a table with no resident row)."""
        return self.resident_rows < self.num_rows


def host_only(num_rows: int) -> Placement:
    """Every row read from the pinned host table."""
    return Placement(num_rows, ("host",), (0, num_rows), ())


def by_ids(num_rows: int, gpu_rows) -> Placement:
    """Rows ``gpu_rows`` resident on the GPU (slots in the given order), the rest on the host.

    When ``gpu_rows`` lists every row, slots follow row ids instead, so the
    kernel needs no map.

    ``gpu_rows``: 1-D integer ids, unique, each in ``[0, num_rows)``. Raises
    IndexError for an id out of range and ValueError for a repeated id.
    """
    from .index import as_tensor, check_range

    ids, _ = as_tensor(gpu_rows, num_rows)
    ids = ids.reshape(-1).to("cpu", torch.int64)
    if len(ids) == 0:
        return host_only(num_rows)
    check_range(ids, num_rows)
    if len(torch.unique(ids)) != len(ids):
        raise ValueError("gpu_rows lists a row more than once; pass each id once")
    count = len(ids)
    if count == num_rows:  # every row resident: slot = id, so no map and no host tier
        return Placement(num_rows, ("gpu",), (0, count), (torch.arange(count),))
    # Host rows keep their position in the pinned table: new id = count + old id.
    return Placement(num_rows, ("gpu", "host"), (0, count, count + num_rows), (ids,))


def sharded(num_rows: int, hot_order, row_bytes: int, num_shards: int, gpu_budget, replicate=0) -> Placement:
    """Rows spread over the memory of ``num_shards`` GPUs, hottest first, the rest on the host.

    Each GPU gets ``gpu_budget`` bytes (int or string, see :func:`parse_bytes`):
    first the ``replicate`` bytes' worth of the hottest rows, copied on every
    GPU, then its shard. The next hottest rows are dealt to the shards in
    turn (shard ``s`` takes every ``num_shards``-th row), so every GPU owns
    as many rows of each hotness as the others and serves as many peer reads.
    ``hot_order``: row ids hottest first (unique, in range; it may list only
    some rows: unlisted rows stay on the host).

    Tiers: ``("replica", "shard0", ..., "host")``, the replica tier left out
    when empty and the host tier always last (its new ids are
    ``bounds[-2] + old_id``). Raises ValueError when ``replicate`` exceeds the
    budget or the order repeats an id, IndexError for ids out of range.
    """
    from .index import as_tensor, check_range

    if num_shards < 1 or num_shards > 8:
        raise ValueError(f"a table can be sharded over 1 to 8 GPUs, not {num_shards}")
    budget, rep_bytes = parse_bytes(gpu_budget), parse_bytes(replicate)
    if rep_bytes > budget:
        raise ValueError(f"replicate ({rep_bytes} B) must fit in gpu_budget ({budget} B): replicated rows "
                         "take part of each GPU's budget")
    order, _ = as_tensor(hot_order, num_rows)
    order = order.reshape(-1).to("cpu", torch.int64)
    check_range(order, num_rows)
    per_gpu = budget // row_bytes if row_bytes else 0
    rep = min(rep_bytes // row_bytes if row_bytes else 0, per_gpu, len(order))
    spread = order[rep:rep + (per_gpu - rep) * num_shards]
    if len(torch.unique(order[:rep + len(spread)])) != rep + len(spread):
        raise ValueError("hot_order lists a row more than once; pass each id once")
    tiers, resident = [], []
    if rep:
        tiers.append("replica")
        resident.append(order[:rep])
    for s in range(num_shards):
        tiers.append(f"shard{s}")
        resident.append(spread[s::num_shards])
    bounds = [0]
    for rows in resident:
        bounds.append(bounds[-1] + len(rows))
    tiers.append("host")
    bounds.append(bounds[-1] + num_rows)
    return Placement(num_rows, tuple(tiers), tuple(bounds), tuple(resident))
