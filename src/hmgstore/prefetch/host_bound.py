"""How fast host memory lets a loader go: the batches per second its zero-copy reads allow, and the fix.

Why. A budget that leaves many of a batch's rows in host memory makes the
epoch PCIe-bound, and nothing else says so: a float32 table with 15% of its
rows on the GPU trains at a third of the all-GPU rate where int8 rows train at
0.9x (``docs/performance.md``). :func:`host_bound` measures what a few of the
loader's own batches read from host memory (rows, stored bytes, distinct
2 MiB pages, from the tables' per-tier counters) and turns it into a rate with
this machine's calibrated reach (:func:`hmgstore.table.host_pages.calibrated`,
measured once and cached): a batch's host reads take about

    max(stored bytes / the kernel's best rate at that row size, pages * cost per page)

(the model of :mod:`hmgstore.table.host_pages`), so the loader makes at most
one batch per that time whatever the GPU does beside it. The result prints as
one line with the fix that cuts the bytes most.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..rows import checks


@dataclass(frozen=True)
class HostBound:
    """What a loader's batches read from host memory, and the rate that allows (see :func:`host_bound`).

    Per batch: ``rows`` gathered in all, ``host_rows`` of them from host
    memory, ``host_bytes`` (as stored: int8 rows are a quarter of float32's)
    and ``host_pages`` (distinct 2 MiB pages). ``gbps``: the gather kernel's
    best measured rate from host memory at the nearest row size;
    ``limit_gbps``: the pinned H2D copy rate (the PCIe limit);
    ``us_per_page``: a page's cost past the knee. ``batches_per_s``: the
    bound, ``math.inf`` when no row is read from host memory; ``by``:
    ``"bytes"`` or ``"pages"``, whichever term of the model is larger;
    ``fix``: what would cut the host reads most, or None. :func:`host_bound`
    makes them; building one by hand checks nothing and raises nothing.
    """

    batches: int
    rows: float
    host_rows: float
    host_bytes: float
    host_pages: float
    gbps: float
    limit_gbps: float
    us_per_page: float
    batches_per_s: float
    by: str
    fix: str | None

    def __str__(self) -> str:
        if not self.host_rows:
            return "hmgstore: the loader reads no rows from host memory: its rate is not bound by PCIe"
        line = (f"hmgstore: a batch reads {self.host_bytes / 1e6:.1f} MB from host memory "
                f"({self.host_rows / max(self.rows, 1):.0%} of its rows, {self.host_pages:.0f} pages of 2 MiB); "
                f"at {self.gbps:.1f} GB/s (PCIe limit {self.limit_gbps:.1f}) the loader makes at most "
                f"{self.batches_per_s:.0f} batches/s")
        return line + (f" ({self.by}-bound); {self.fix}" if self.fix else f" ({self.by}-bound)")


def host_bound(loader, batches: int = 4, *, reach=None) -> HostBound | None:
    """The batches per second that ``loader``'s reads from host memory allow, from a few of its own batches.

    Draws ``batches`` batches from ``loader`` after one to warm up (a
    DataLoader's next ones; a one-shot iterator loses them), counting per
    table the rows each tier served (tables that were counting keep their
    counts: the batches' rows are added to them). Call it before training,
    once; a PyG NeighborLoader over hmgstore stores (or any loader that
    :func:`hmgstore.prefetch.pipeline.tables_of` knows) takes a few
    milliseconds a batch, plus the reach calibration's few seconds the first
    time on a machine.

    Args:
        loader: a loader whose batches gather from hmgstore tables.
        batches: batches to count (an integer of at least 1).
        reach: this machine's :class:`~hmgstore.table.host_pages.Reach`;
            default the calibrated one.

    Returns:
        A :class:`HostBound`, or None on a machine without a GPU (there is
        no PCIe to be bound by) or when the loader's tables cannot be told.

    Raises:
        TypeError: ``batches`` not an integer.
        ValueError: ``batches`` under 1, or a loader that gives fewer than
            ``batches + 1`` batches.
    """
    from .pipeline import tables_of

    batches = checks.count(batches, "batches", at_least=1)
    tables = [t for t in tables_of(loader) if getattr(t, "device", torch.device("cpu")).type == "cuda"]
    if not tables:
        return None
    counting = [t.counter is not None for t in tables]
    for table, on in zip(tables, counting):
        if not on:
            table.reset_stats()
    try:
        drawn = iter(loader)
        if next(drawn, None) is None:
            raise ValueError(f"the loader gave no batch; host_bound needs {batches + 1}")
        before = [t.stats() for t in tables]
        got = sum(1 for _ in itertools.islice(drawn, batches))
        after = [t.stats() for t in tables]
    finally:
        for table, on in zip(tables, counting):
            if not on:
                table.reset_stats(False)
    if got < batches:
        raise ValueError(f"the loader gave {got + 1} batches; host_bound needs {batches + 1} (pass batches={got})")
    return _model(tables, before, after, batches, reach)


def _model(tables, before, after, batches: int, reach) -> HostBound:
    """The bound from the tables' counters before and after ``batches`` batches."""
    rows = host_rows = host_bytes = host_pages = 0.0
    widest = (0.0, 0)  # (host bytes, stored row bytes) of the table that reads the most host bytes
    fixes = []
    for table, b, a in zip(tables, before, after):
        rows += a["rows"] - b["rows"]
        served = a["tiers"].get("host", {}).get("rows", 0) - b["tiers"].get("host", {}).get("rows", 0)
        if not served:
            continue
        stored = _stored_row_bytes(table)
        host_rows += served
        host_bytes += served * stored
        host_pages += a.get("host_pages", 0) - b.get("host_pages", 0)
        widest = max(widest, (served * stored, stored))
        if table.host_format is None and table.dtype == torch.float32:
            fixes.append("compress='int8' stores rows in 4x fewer bytes")
    per = 1.0 / batches
    if not host_rows:
        return HostBound(batches, rows * per, 0.0, 0.0, 0.0, math.nan, math.nan, math.nan, math.inf, "bytes", None)
    if reach is None:
        from ..table.host_pages import calibrated
        reach = calibrated(tables[0].device)
    curve = reach.curve(widest[1])
    gbps = max(curve.gbps())
    us_per_page = curve.us_per_page()
    by_bytes = host_bytes * per / (gbps * 1e9)
    by_pages = host_pages * per * us_per_page * 1e-6
    seconds = max(by_bytes, by_pages)
    if not fixes:
        fixes.append("a larger gpu_budget keeps more of a batch's rows on the GPU")
    return HostBound(batches, rows * per, host_rows * per, host_bytes * per, host_pages * per, gbps,
                     reach.limit_gbps or math.nan, us_per_page, 1.0 / seconds if seconds > 0 else math.inf,
                     "pages" if by_pages > by_bytes else "bytes", fixes[0])


def _stored_row_bytes(table) -> int:
    """Bytes of host memory one row of ``table`` takes as stored (its format's pitch, or the row as it reads)."""
    fmt = table.host_format
    return table.row_bytes if fmt is None else fmt.pitch(math.prod(table.shape[1:]))
