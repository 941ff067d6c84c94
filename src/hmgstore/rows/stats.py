"""Per-tier counters: how many rows (and bytes) each tier of a table served, and how fast.

Counting is off until a table's ``reset_stats()`` (or ``stats=True`` at
build): then every gather adds, on the device and without waiting for it,
the rows it read from each tier, and times its kernel with CUDA events.
``stats()`` reads the counters back (one synchronisation) and returns::

    {"gathers": 12, "rows": 1200000, "bytes": 614400000, "seconds": 0.0123, "gbps": 49.9,
     "hit_ratio": 0.83,                      # rows served from GPU memory (this GPU's or a peer's)
     "tiers": {"gpu": {"rows": ..., "bytes": ...}, "host": {...}}}

``seconds`` is the gathers' kernel time (CPU tables: wall time), so
``gbps`` is the rate the rows arrived at. Tables that are not counting pay
one attribute test per gather.
"""
from __future__ import annotations

import time
from typing import Any

import torch

#: Timed gathers kept before their events are folded into a sum (each read waits for its event).
_FOLD_AT = 256
#: log2 of the host page size the GPU reaches host memory by (2 MiB: :data:`hmgstore.table.host_pages.PAGE_BYTES`).
PAGE_SHIFT = 21


class TierCounter:
    """Counters of one table (or topology): rows per tier, gathers, time."""

    def __init__(self, tiers: tuple[str, ...], row_bytes: int, device: torch.device):
        self.tiers, self.row_bytes, self.device = tiers, row_bytes, device
        self.rows = torch.zeros(len(tiers), dtype=torch.int64, device=device)
        self.gathers = 0
        self._seconds = 0.0
        self._events: list = []
        self.pages: torch.Tensor | None = None  # distinct pages of a watched tier, summed over gathers

    def add(self, tier_of_rows: torch.Tensor) -> None:
        """Count rows by tier index (a device tensor of ints in ``[0, len(tiers))``), without waiting."""
        self.rows += torch.bincount(tier_of_rows, minlength=len(self.tiers))[:len(self.tiers)]

    def watch_pages(self, tier: int, start: int, base: int, pitch: int, rows: int) -> None:
        """Also count, gather by gather, the distinct 2 MiB pages of tier ``tier`` read (new id ``start + i`` at
        address ``base + i * pitch``, as the kernel reads it): past a few hundred pages a batch, each page costs a
        zero-copy gather a fixed time (:mod:`hmgstore.table.host_pages`), so :func:`hmgstore.host_bound` needs them."""
        first, last = base >> PAGE_SHIFT, (base + max(rows, 1) * pitch - 1) >> PAGE_SHIFT
        self._pages = (tier, start, base, pitch, first)
        # one flag a page, and a last slot that rows of other tiers are sent to (no boolean indexing: no waiting)
        self._seen = torch.zeros(last - first + 2, dtype=torch.bool, device=self.device)
        self.pages = torch.zeros((), dtype=torch.int64, device=self.device)

    def add_pages(self, new: torch.Tensor, tier_of_rows: torch.Tensor) -> None:
        """Count the distinct watched pages of one gather's rows (new ids and their tiers; device work only)."""
        if self.pages is None:
            return
        tier, start, base, pitch, first = self._pages
        page = ((base + (new.to(torch.int64) - start) * pitch) >> PAGE_SHIFT) - first
        self._seen[torch.where(tier_of_rows == tier, page, len(self._seen) - 1)] = True
        self.pages += self._seen[:-1].sum()
        self._seen.zero_()

    def add_counts(self, counts: torch.Tensor) -> None:
        """Add rows per tier given as a ``[len(tiers)]`` int64 tensor."""
        self.rows += counts

    def start(self):
        """Begin timing one gather; pass the result to :meth:`stop`."""
        self.gathers += 1
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started) -> None:
        if self.device.type != "cuda":
            self._seconds += time.perf_counter() - started
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._events.append((started, end))
        if len(self._events) >= _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        for start, end in self._events:
            end.synchronize()
            self._seconds += start.elapsed_time(end) / 1e3
        self._events.clear()

    def report(self) -> dict:
        self._fold()
        rows = [int(r) for r in self.rows.tolist()]
        total = sum(rows)
        resident = sum(r for name, r in zip(self.tiers, rows) if name != "host")
        seconds = self._seconds
        return {
            "gathers": self.gathers, "rows": total, "bytes": total * self.row_bytes, "seconds": seconds,
            "gbps": total * self.row_bytes / seconds / 1e9 if seconds > 0 else None,
            "hit_ratio": resident / total if total else None,
            "tiers": {name: {"rows": r, "bytes": r * self.row_bytes} for name, r in zip(self.tiers, rows)},
            **({"host_pages": int(self.pages)} if self.pages is not None else {}),
        }


def merge(reports) -> dict:
    """Several tables' ``stats()`` as one (e.g. every attribute of a feature store)."""
    reports = [r for r in reports if r]
    out: dict[str, Any] = {"gathers": 0, "rows": 0, "bytes": 0, "seconds": 0.0, "tiers": {}}
    resident = 0
    for r in reports:
        out["gathers"] = max(out["gathers"], r["gathers"])  # fused gathers run together
        for key in ("rows", "bytes"):
            out[key] += r[key]
        out["seconds"] = max(out["seconds"], r["seconds"])
        for name, t in r["tiers"].items():
            into = out["tiers"].setdefault(name, {"rows": 0, "bytes": 0})
            into["rows"] += t["rows"]
            into["bytes"] += t["bytes"]
            resident += t["rows"] if name != "host" else 0
    out["gbps"] = out["bytes"] / out["seconds"] / 1e9 if out["seconds"] > 0 else None
    out["hit_ratio"] = resident / out["rows"] if out["rows"] else None
    return out
