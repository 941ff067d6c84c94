"""The GPU's reach into host memory: how a gather's rate falls with the distinct 2 MiB pages a batch touches.

Why. On the cloud VMs measured (virtual machines with pass-through GPUs, as most
cloud hosts are), zero-copy reads hold about 0.9x of the PCIe limit while a
batch's rows lie in a few hundred 2 MiB pages; past that every further page
costs a fixed, serialised time, whatever the row order inside the batch and
however the host memory was allocated. A batch's time is then about

    max(bytes / PCIe rate, pages * cost per page)

so a big table's rate depends on how many pages a batch touches, which
layouts and locality-aware batches (:mod:`hmgstore.graph.locality`) and
stored formats (:mod:`hmgstore.rows.formats`) lower.

:func:`measure` finds that curve for one machine: a host table in owned
(cudaHostAlloc) memory, batches of ids confined to ``K`` random pages for a
sweep of ``K``, each gathered by the kernel (ids on the GPU) and by the CPU
path (``index_select`` into pinned staging, then one copy), timed in the same
run as the pinned H2D limit. From it come the *knee* (the most pages a batch
may touch and still read at 0.8x of the best rate) and the *cost per page*
(the slope of a batch's time past the knee). :func:`calibrated` measures a
small sweep once per machine, in seconds, and caches it like the split
gather's cost model (``$HMGSTORE_CACHE_DIR/reach.json``), so that placement
decisions can read it; ``python benchmarks/research reach`` runs the full sweep
and writes its report.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from ..gather.cpu_share import cache_path as _split_cache_path
from ..memory import owned
from ..util.progress import tqdm
from ..util.timing import h2d_limit_gbps, median_seconds
from .tensor import HybridTensor

log = logging.getLogger(__name__)

PAGE_BYTES = 2 << 20
#: A rate at least this share of the best one is "before the knee".
KNEE_SHARE = 0.8
#: The quick calibration's sweep (pages per batch) and table.
QUICK_PAGES = (64, 256, 1024, 2048)
QUICK_TABLE_BYTES = 4 << 30


@dataclass
class Curve:
    """Rates against pages per batch for one row size, and what they imply.

    ``pages[i]``: distinct 2 MiB pages of batch ``i``'s ids; ``rows[i]``: its
    distinct rows; ``kernel_seconds``/``cpu_seconds``: median batch times of
    each path (``cpu_seconds`` empty when the CPU path was not timed).
    """

    row_bytes: int
    pages: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    kernel_seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)

    def gbps(self, path: str = "kernel") -> list[float]:
        times = self.kernel_seconds if path == "kernel" else self.cpu_seconds
        return [r * self.row_bytes / t / 1e9 for r, t in zip(self.rows, times)]

    def knee(self, path: str = "kernel") -> int:
        """The most pages a batch may touch and still read at :data:`KNEE_SHARE` of the best rate."""
        rates = self.gbps(path)
        if not rates:
            return 0
        best = max(rates)
        return max((p for p, r in zip(self.pages, rates) if r >= KNEE_SHARE * best), default=self.pages[0])

    def us_per_page(self, path: str = "kernel") -> float:
        """Microseconds a batch's time grows by per page past the knee (least squares over those points)."""
        times = self.kernel_seconds if path == "kernel" else self.cpu_seconds
        knee = self.knee(path)
        points = [(p, t) for p, t in zip(self.pages, times) if p >= knee]
        if len(points) < 2:
            return 0.0
        mp = sum(p for p, _ in points) / len(points)
        mt = sum(t for _, t in points) / len(points)
        var = sum((p - mp) ** 2 for p, _ in points)
        return sum((p - mp) * (t - mt) for p, t in points) / var * 1e6 if var else 0.0


@dataclass
class Reach:
    """One machine's reach: its PCIe limit and a :class:`Curve` per row size."""

    device: str
    limit_gbps: float | None  # None on a machine without a GPU
    table_bytes: int
    curves: dict = field(default_factory=dict)  # row bytes -> Curve

    def knee(self, row_bytes: int | None = None) -> int:
        """The knee of the row size nearest ``row_bytes`` (the smallest measured when None)."""
        return self._curve(row_bytes).knee()

    def curve(self, row_bytes: int | None = None) -> Curve:
        """The :class:`Curve` of the measured row size nearest ``row_bytes`` (the smallest when None)."""
        return self._curve(row_bytes)

    def _curve(self, row_bytes):
        sizes = sorted(self.curves)
        size = sizes[0] if row_bytes is None else min(sizes, key=lambda s: abs(s - row_bytes))
        return self.curves[size]

    def to_dict(self) -> dict:
        return {"device": self.device, "limit_gbps": self.limit_gbps, "table_bytes": self.table_bytes,
                "curves": {str(k): asdict(c) for k, c in self.curves.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> Reach:
        return cls(d["device"], d["limit_gbps"], d["table_bytes"],
                   {int(k): Curve(**c) for k, c in d["curves"].items()})


def confined_ids(table_rows: int, row_bytes: int, pages: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` distinct row ids (int64 CPU, in random order) from ``pages`` random 2 MiB pages of a table of
    ``table_rows`` rows; fewer only when those pages hold fewer rows."""
    per_page = max(1, PAGE_BYTES // row_bytes)
    total_pages = -(-table_rows // per_page)
    chosen = torch.randperm(total_pages, generator=generator)[:pages]
    available = torch.cat([torch.arange(p * per_page, min(table_rows, (p + 1) * per_page)) for p in chosen.tolist()]) \
        if pages * per_page <= 4 * count else None
    if available is not None:  # few rows to choose from: take a random subset of all of them
        return available[torch.randperm(len(available), generator=generator)[:count]]
    ids = torch.empty(0, dtype=torch.int64)
    while len(ids) < count:  # draws from many rows: repeats are rare, drop them and draw again
        draws = chosen[torch.randint(len(chosen), (2 * count,), generator=generator)] * per_page \
            + torch.randint(per_page, (2 * count,), generator=generator)
        ids = torch.unique(torch.cat([ids, draws[draws < table_rows]]))
    return ids[torch.randperm(len(ids), generator=generator)[:count]]


def measure(device, *, table_bytes: int = QUICK_TABLE_BYTES, row_bytes=(128, 512), pages=QUICK_PAGES,
            batch: int = 200_000, reps: int = 5, cpu: bool = True, progress: bool = True) -> Reach:
    """Measure the reach of ``device``: see the module docstring.

    ``table_bytes``: the host table (owned cudaHostAlloc memory on a GPU
    machine, filled with a pattern, not zeros); ``row_bytes``: row sizes
    (multiples of 4); ``pages``: pages per batch to sweep (those that fit the
    table); ``batch``: distinct ids per batch, at most half of the rows that
    the fewest pages hold (the same count at every point);
    ``cpu``: time the CPU path too. Every gather is checked against
    ``x[idx]``. On the CPU (``device="cpu"``) only the CPU path is timed
    (``index_select`` alone: there is nothing to copy to), which shows the
    CPU's own reach.
    """

    device = torch.device(device)
    gpu = device.type == "cuda"
    if gpu and not torch.cuda.is_available():
        raise RuntimeError(f"{device} was asked for, but torch sees no GPU; measure the CPU path with device='cpu'")
    host = owned.empty((table_bytes // 8,), torch.int64, "cuda" if gpu else "hugepage", device, zero=False)
    for a in tqdm(range(0, len(host), 1 << 27), desc="filling the probe table", disable=not progress, leave=False):
        piece = host[a:a + (1 << 27)]
        torch.arange(a, a + len(piece), out=piece)  # every word its own index: a misplaced row cannot pass
    reach = Reach(torch.cuda.get_device_name(device) if gpu else "cpu", h2d_limit_gbps(device) if gpu else None,
                  table_bytes)
    generator = torch.Generator().manual_seed(0)
    for rb in row_bytes:
        rows_total = table_bytes // rb
        source = host.view(torch.uint8)[:rows_total * rb].view(torch.int32).view(rows_total, rb // 4)
        table = HybridTensor.over_host_tier(source, device, torch.int32, progress=False) if gpu else None
        curve, staging = Curve(rb), None
        sweep = [p for p in pages if p * PAGE_BYTES <= table_bytes]
        # The same number of distinct rows at every point, so that only the pages they lie in change: at most
        # half of what the fewest pages hold.
        count = max(1, min(batch, min(sweep, default=1) * max(1, PAGE_BYTES // rb) // 2))
        for k in tqdm(sweep, desc=f"reach, {rb} B rows", disable=not progress, leave=False):
            sets = [confined_ids(rows_total, rb, k, count, generator) for _ in range(3)]
            n = min(len(s) for s in sets)
            curve.pages.append(k)
            curve.rows.append(n)
            out = torch.empty((n, rb // 4), dtype=torch.int32, device=device)
            if table is not None:  # gpu
                on_gpu = [s[:n].to(device) for s in sets]
                if not torch.equal(table.gather(on_gpu[0], out=out).cpu(), source[sets[0][:n]]):
                    raise RuntimeError(f"the probe gather of {k} pages read wrong rows")
                seconds, _ = median_seconds(lambda i: table.gather(on_gpu[i % 3], out=out), reps=reps,
                                            device=device)
                curve.kernel_seconds.append(seconds)
            if cpu:
                if gpu and (staging is None or len(staging) < n):
                    staging = torch.empty((n, rb // 4), dtype=torch.int32, pin_memory=True)

                def cpu_path(i, sets=sets, n=n, out=out, staging=staging):
                    if staging is None:
                        torch.index_select(source, 0, sets[i % 3][:n], out=out)
                    else:
                        torch.index_select(source, 0, sets[i % 3][:n], out=staging[:n])
                        out.copy_(staging[:n], non_blocking=True)

                seconds, _ = median_seconds(cpu_path, reps=max(2, reps // 2), wall=True, device=device)
                curve.cpu_seconds.append(seconds)
        reach.curves[rb] = curve
        if table is not None:
            table.close()
    return reach


def cache_path():
    """``$HMGSTORE_CACHE_DIR/reach.json`` (default ``~/.cache/hmgstore``), beside the split gather's cache."""
    return _split_cache_path().with_name("reach.json")


def _key(device) -> str:
    return f"{torch.cuda.get_device_name(device)}|cpus={os.cpu_count()}"


def calibrated(device, *, progress: bool = False) -> Reach:
    """This machine's reach: from the cache, else measured now with the quick sweep (a few seconds) and cached.

    A damaged or foreign cache entry is measured again. Raises RuntimeError
    without a GPU.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("the GPU's reach into host memory is calibrated on a GPU; none is here")
    key = _key(device)
    path = cache_path()
    try:
        return Reach.from_dict(json.loads(path.read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    start = time.perf_counter()
    reach = measure(device, progress=progress)
    log.info("hmgstore: the GPU's reach into host memory measured in %.1f s: knee %d pages at 128 B rows, "
             "%.2f us a page past it", time.perf_counter() - start, reach.knee(128), reach._curve(128).us_per_page())
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = reach.to_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as err:
        log.warning("hmgstore: could not cache the reach measurement in %s (%s)", path, err)
    return reach


#: The most batches :func:`batches_to_fuse` asks to gather together: past a few million ids a launch, little more to
#: gain for the memory it costs (``benchmarks/probes/probe_compress.py --rows-sweep``).
MAX_FUSE = 8


def batches_to_fuse(tables, device, reach: Reach | None = None) -> int:
    """How many batches to gather in one launch (``Pipeline(fuse="auto")``): 1 while every table's host tier fits
    in the GPU's reach (its knee), else about the host pages over the knee, at most :data:`MAX_FUSE`.

    ``tables``: the HybridTensors a loader gathers from; ``reach``: this
    machine's, default :func:`calibrated` (measured once, cached). 1 on the
    CPU.
    """
    device = torch.device(device)
    host = [t for t in tables if t.device == device and t.placement.has_host_tier]
    if device.type != "cuda" or not host:
        return 1
    reach = reach or calibrated(device)
    worst = 1
    for t in host:
        row = t.source[:1].nbytes
        pages = -(-t.source.nbytes // PAGE_BYTES)
        worst = max(worst, -(-pages // max(1, reach.knee(row))))
    return min(MAX_FUSE, worst)
