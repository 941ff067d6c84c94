"""ShardedTensor: one table spread over the GPUs that one process drives.

Each GPU gets ``gpu_budget`` bytes: a copy of the hottest rows (``replicate``
bytes' worth), then its shard of the next hottest rows
(:func:`hmgstore.rows.placement.sharded`); every other row stays in the source,
pinned in place once for all GPUs. ``table.on(device)`` is a
:class:`~hmgstore.HybridTensor` view gathering into that GPU: one kernel
launch reads its local rows, its peers' shards over NVLink (peer access) and
host rows over PCIe. A pair of GPUs without peer access is noticed at setup:
that view reads the peer's rows from the host instead, with a warning.

For one process per GPU (torchrun), see :mod:`hmgstore.distributed`, which
builds the same placement and views from shards that processes share
(cuMemCreate memory mapped by each peer).
"""
from __future__ import annotations

import logging
import warnings
import weakref
from typing import cast

import torch

from ..cuda import check_device, peer
from ..cuda.runtime import synchronize
from ..gather.plan import fill_rows
from ..memory.pinned import PinnedHost, as_host_tensor, row_layout
from ..rows import checks
from ..rows.hotness import check_score, order_by_score
from ..rows.ids import rows_only
from ..rows.placement import Placement, host_only, sharded
from ..util.device import resolve_device
from .interface import gather_each
from .tensor import HybridTensor

log = logging.getLogger(__name__)


def allocate_tier(placement: Placement, tier: str, source: torch.Tensor, device: torch.device):
    """An empty ``[rows of tier, *row_shape]`` tensor on ``device``; a clear error when it does not fit."""
    rows = len(placement.rows_of(tier))
    try:
        return torch.empty((rows, *source.shape[1:]), dtype=source.dtype, device=device)
    except torch.cuda.OutOfMemoryError:
        free, _ = torch.cuda.mem_get_info(device)
        raise MemoryError(
            f"the {tier} tier ({rows} rows, {rows * row_layout(source)[0] / 1e9:.2f} GB) does not fit on {device} "
            f"({free / 1e9:.2f} GB free); lower gpu_budget") from None


def _hot_order(num_rows: int, hot_order, hotness):
    """Row ids hottest first, as :class:`~hmgstore.HybridTensor` reads its arguments: ``hot_order`` as given
    (checked by the placement), ``hotness`` scores ordered hottest first, or, with neither, id order. Raises
    ValueError for both, and what :func:`~hmgstore.hotness.check_score` raises for bad scores."""
    if hot_order is not None and hotness is not None:
        raise ValueError("pass hot_order (row ids, hottest first) or hotness (a score per row), not both")
    if hotness is not None:
        return order_by_score(check_score(hotness, num_rows))
    return torch.arange(num_rows) if hot_order is None else hot_order


class ShardedTensor:
    """A table of ``N`` rows over the memory of several GPUs of this process and the host.

    Args:
        source: the full table ``[N, *row_shape]`` in host memory (torch CPU
            tensor, numpy array, memmap); pinned in place, never copied.
        devices: the GPUs, e.g. ``["cuda:0", "cuda:1"]`` (2 to 8 of them; one
            works too). All ``"cpu"`` gives CPU views with the same API.
        gpu_budget: bytes each GPU gives the table (int or ``"20GB"``), filled
            hottest first by ``hot_order`` or ``hotness``; with neither, in
            id order (the first rows that fit), as for
            :class:`~hmgstore.HybridTensor`.
        hot_order: row ids hottest first; rows not listed stay on the host.
        hotness: instead of ``hot_order``, a score per row (``[N]``, any real
            dtype, higher is hotter), ordered with
            :func:`hmgstore.hotness.order_by_score`.
        replicate: bytes of each GPU's budget holding the hottest rows on
            every GPU (no peer read for them); the rest of the budget holds
            that GPU's shard.
        max_sms: as for :class:`~hmgstore.HybridTensor`.
        progress: as for :class:`~hmgstore.HybridTensor`.

    ``table.on(device)[idx]`` gathers into ``device``; ``table[idx]`` into
    the current GPU. Use it as a context manager or call :meth:`close`.

    Raises:
        TypeError: ``source`` not a CPU tensor, numpy array or memmap;
            ``devices`` a single device or string rather than a list;
            ``hot_order`` not integers, ``hotness`` not real numbers;
            ``progress`` not a bool.
        ValueError: ``source`` of no dimension; ``devices`` empty, repeated,
            mixing GPUs and the CPU, or more than 8; ``gpu_budget`` missing,
            negative or unreadable; ``replicate`` over ``gpu_budget``; both
            ``hot_order`` and ``hotness``; ``hot_order`` repeating a row;
            ``hotness`` not one score per row, or NaN; ``max_sms`` not None
            or an integer >= 1 (on every device).
        IndexError: a ``hot_order`` id outside ``[0, N)``.
        MemoryError: a GPU's tiers do not fit on it.
    """

    def __init__(self, source, devices, *, gpu_budget=None, hot_order=None, hotness=None, replicate=0,
                 max_sms: int | None = None, progress: bool = True):
        self._source, read_only = as_host_tensor(source)
        # The torch tensor over a read-only memmap cannot tell: dense() copies it, views hand out the array itself
        self._read_only, self._given = read_only, source
        if isinstance(devices, (str, torch.device, int)) or not hasattr(devices, "__iter__"):
            raise TypeError(f"devices is a list of devices, e.g. ['cuda:0', 'cuda:1'] (['cpu'] on the CPU), got "
                            f"{devices!r}")
        max_sms = cast("int | None", checks.sm_cap(max_sms))  # here, not only in the GPU views: a CPU run too
        if not isinstance(progress, bool):
            raise TypeError(f"progress is a bool, got {progress!r}")
        self.devices = [resolve_device(d) for d in devices]
        if not self.devices:
            raise ValueError("devices is empty; pass the GPUs to shard over, e.g. ['cuda:0', 'cuda:1']")
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"each device may appear once: {[str(d) for d in self.devices]}")
        kinds = {d.type for d in self.devices}
        if len(kinds) > 1:
            raise ValueError("shard over GPUs or over the CPU, not both")
        order = _hot_order(self._source.shape[0], hot_order, hotness)
        self.placement = sharded(self._source.shape[0], order, row_layout(self._source)[0],
                                 len(self.devices), gpu_budget, replicate)
        self._closed = False
        self._pinned: PinnedHost | None = None
        self._tiers: dict[tuple[int, str], torch.Tensor] = {}  # (device index, tier) -> rows on that GPU
        self.views: dict[torch.device, HybridTensor] = {}
        self.peer_access: dict[tuple[int, int], bool] = {}
        if kinds == {"cpu"}:
            host = host_only(self._source.shape[0])
            self.views = {self.devices[0]: HybridTensor.from_tiers(self._source, "cpu", host, (), owner=self,
                                                                   read_only=read_only, given=source)}
            return
        try:
            self._build(read_only, max_sms, progress)
        except BaseException:
            self.close()
            raise

    def _build(self, read_only: bool, max_sms, progress: bool) -> None:
        p, indices = self.placement, [d.index for d in self.devices]
        for d in self.devices:
            check_device(d)
        for i in indices:
            for j in indices:
                self.peer_access[i, j] = peer.can_access_peer(i, j)
                if self.peer_access[i, j]:
                    peer.enable_peer_access(i, j)
        unreachable = {i: [f"shard{s}" for s, j in enumerate(indices) if not self.peer_access[i, j]]
                       for i in indices}
        for i, lost in unreachable.items():
            if lost:
                warnings.warn(f"hmgstore: cuda:{i} has no peer access to the GPUs of {', '.join(lost)}; it reads "
                              "their rows from pinned host memory over PCIe instead", RuntimeWarning, stacklevel=3)
        # Dropped without close(): wait for every GPU before the tiers go, since any of them may read any shard.
        weakref.finalize(self, synchronize, list(self.devices))
        needs_host = p.has_host_tier or any(unreachable.values())
        # Every GPU may read the host tier: releasing it waits for all of them.
        self._pinned = PinnedHost(self._source, list(self.devices), read_only, progress)
        for s, d in enumerate(self.devices):
            for tier in ("replica", f"shard{s}"):
                if tier in p.names:
                    self._tiers[d.index, tier] = allocate_tier(p, tier, self._source, d)
                    fill_rows(self._pinned, p.rows_of(tier), self._tiers[d.index, tier], d)
        if not needs_host:  # every row lives on some GPU that every GPU reads: no host reads at all
            self._pinned.release()
            self._pinned = None
        row_bytes = row_layout(self._source)[0]
        shards = [p.tier(f"shard{s}").bind(self._tiers[d.index, f"shard{s}"].data_ptr(), row_bytes)
                  for s, d in enumerate(self.devices)]
        for k, d in enumerate(self.devices):  # a view reads its own GPU's shard as local (Tier.own)
            readable = [t.bind(t.base, t.pitch, t.stored, own=s == k) for s, t in enumerate(shards)
                        if t.name not in unreachable[d.index]]
            if "replica" in p.names:
                readable.append(p.tier("replica").bind(self._tiers[d.index, "replica"].data_ptr(), row_bytes))
            self.views[d] = HybridTensor.from_tiers(self._source, d, p, readable, owner=self, pinned=self._pinned,
                                                    unreachable=unreachable[d.index], max_sms=max_sms,
                                                    read_only=read_only, given=self._given)

    # ---- use ---------------------------------------------------------------------
    def on(self, device) -> HybridTensor:
        """The view gathering into ``device`` (one of :attr:`devices`)."""
        device = resolve_device(device)
        try:
            return self.views[device]
        except KeyError:
            raise ValueError(f"{device} is not one of this table's devices "
                             f"{[str(d) for d in self.views]}") from None

    def gather(self, index, device=None, **kwargs) -> torch.Tensor:
        """Rows ``index`` gathered into ``device`` (default: the only device, else the current GPU); the other
        keywords are :meth:`HybridTensor.gather`'s (another raises TypeError naming this method)."""
        checks.keywords("ShardedTensor.gather", kwargs, checks.takes(HybridTensor.gather, without=("index",)),
                        ("index", "device"))
        if device is None and len(self.views) == 1:
            device = next(iter(self.views))
        return self.on(device).gather(index, **kwargs)

    gather_batch = staticmethod(gather_each)  # one request at a time (hmgstore.FeatureTable's batch hook)

    def __getitem__(self, index) -> torch.Tensor:
        """``table[index]``: :meth:`gather` into the default device; one index only, as for
        :class:`~hmgstore.HybridTensor` (``t[3, 1]`` raises TypeError)."""
        return self.gather(rows_only(index))

    @property
    def source(self) -> torch.Tensor:
        """The host table every row is in (what :meth:`dense` hands out where it is writable)."""
        return self._source

    @property
    def pinned(self) -> PinnedHost | None:
        """The source pinned for every GPU's host reads, or None when every row lives on some GPU (or on the CPU)."""
        return self._pinned

    @property
    def shape(self) -> torch.Size:
        return self._source.shape

    @property
    def row_shape(self) -> torch.Size:
        return self._source.shape[1:]

    def dense(self) -> torch.Tensor:
        """The whole table as a CPU tensor: the host table itself (every row is there, pinned in place), or a copy
        where that memory is read-only (a write to it would kill the process)."""
        self.check()
        return self._source.clone() if self._read_only else self._source

    @property
    def dtype(self) -> torch.dtype:
        return self._source.dtype

    @property
    def device(self) -> torch.device:
        """Where ``table[idx]`` puts rows: the current GPU (the first device's type on the CPU)."""
        return resolve_device(None) if self.devices[0].type == "cuda" else self.devices[0]

    @property
    def num_rows(self) -> int:
        return self._source.shape[0]

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        p = self.placement
        sizes = ", ".join(f"{t.name}={t.size}" for t in p.tiers if t.name != "host")
        return (f"ShardedTensor(shape={tuple(self.shape)}, dtype={self._source.dtype}, "
                f"devices={[str(d) for d in self.devices]}, {sizes}, host={self.num_rows - p.resident_rows})")

    def check(self) -> None:
        """Raise RuntimeError once the table is closed (every shard belongs to this process,
        so nothing else can take them away)."""
        if self._closed:
            raise RuntimeError("this ShardedTensor was closed; build a new one")

    # ---- lifetime ----------------------------------------------------------------
    def close(self) -> None:
        """Free every GPU's tiers and unregister the host memory (idempotent); views stop working.

        Each view first waits for its gathers in flight; then every GPU is waited for.
        """
        self._closed = True
        for view in self.views.values():
            view.close()
        synchronize([d for d in self.devices if d.type == "cuda" and torch.cuda.is_available()])
        self._tiers.clear()
        if self._pinned is not None:
            self._pinned.release()
            self._pinned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        raise TypeError("a ShardedTensor holds GPU memory of this process and cannot be sent to another; "
                        "build it where it is used (one process per GPU: hmgstore.distributed.shard)")
