"""Fused gathers: the gathers of several batches recorded, then run as one kernel job per table.

Why. On the cloud VMs measured a zero-copy gather pays a fixed, serialised cost
for every distinct 2 MiB host page it touches (:mod:`hmgstore.table.host_pages`), and a
mini-batch of a big table touches nearly every page of it whatever its
order. The cost is paid per launch: the same pages read by one launch of
more rows cost no more, so a big table reads several times faster per row in
launches of millions of ids (``benchmarks/probes/probe_compress.py
--rows-sweep``). So a pipeline that makes the next few batches
ahead anyway gathers their rows together.

How. Inside ``with fused(device):`` on one thread, a gather from CUDA tables
(:func:`hmgstore.gather_many`, ``table[idx]``, the PyG and DGL stores) checks
its ids as usual and returns its output at once, *not yet written*: a view
into one buffer per table that the window grows as batches come. Leaving the
block runs every table's recorded gathers as one job (their ids one after
the other, grouped by host page together), all tables in one launch, on the
current stream. Nothing may read those outputs before the block ends; they
are ready on the stream current at its end (:class:`hmgstore.Pipeline` with
``fuse=k`` does this for ``k`` batches at a time and hands them over with
an event). Gathers that give ``out=``, a ``stream``, or read CPU tables run
at once, as outside a window. A table with a fixed CPU share
(``split=0.5``, :mod:`hmgstore.gather.cpu_share`) splits the window's whole
job as it runs, as any gather of GPU ids; ``split="auto"`` does not split
there (its cost model is for CPU ids).
"""
from __future__ import annotations

import contextlib
import threading

import torch

from ..rows.ids import check_pending, prepare_many
from ..util.device import resolve_device
from . import plan

_local = threading.local()


class _Chunk:
    """One output buffer of a table in a window, and the ids recorded into it, in order."""

    def __init__(self, table, rows: int):
        self.table = table
        self.buffer = torch.empty((rows, *table.row_shape), dtype=table.dtype, device=table.device)
        self.used = 0
        self.ids: list[torch.Tensor] = []


class Window:
    """Gathers recorded on this thread for one device (see the module docstring).

    ``batches``: how many batches the window expects, to size each table's
    first buffer (a bigger one is started when a batch does not fit).
    """

    def __init__(self, device: torch.device, batches: int = 4):
        self.device, self.batches = device, max(1, batches)
        self._chunks: dict[int, list[_Chunk]] = {}
        self._deferred: list = []  # GPU ids not checked yet: the kernel checks them at the flush

    def record(self, requests, check: str) -> list[torch.Tensor]:
        """Check ``requests`` (``(table, index)`` pairs of one device) and return their outputs, not yet written."""
        indices, pending = prepare_many([(index, table.num_rows) for table, index in requests], self.device, check)
        if check == "sync":
            check_pending(pending)
        results = []
        for (table, _), index in zip(requests, indices):
            n = len(index.ids)
            chunks = self._chunks.setdefault(id(table), [])
            if not chunks or chunks[-1].used + n > len(chunks[-1].buffer):
                chunks.append(_Chunk(table, max(n, n * self.batches)))
            chunk = chunks[-1]
            out = chunk.buffer[chunk.used:chunk.used + n]
            chunk.used += n
            chunk.ids.append(index.ids.to(torch.int64))
            results.append(out.view((*index.shape, *table.row_shape)))
        return results

    def flush(self, stream=None) -> None:
        """Run every recorded gather: one job per buffer, one launch for all, on ``stream`` (default: current)."""
        chunks = [c for cs in self._chunks.values() for c in cs if c.used]
        self._chunks = {}
        if not chunks:
            return
        with contextlib.ExitStack() as held:
            for table in {id(c.table): c.table for c in chunks}.values():
                held.enter_context(table.reading())
            requests = [(c.table, torch.cat(c.ids) if len(c.ids) > 1 else c.ids[0]) for c in chunks]
            plan.run(requests, [c.buffer[:c.used] for c in chunks], self.device, stream, "deferred")


def current(device: torch.device) -> Window | None:
    """The window open on this thread for ``device``, if any."""
    window = getattr(_local, "window", None)
    return window if window is not None and window.device == device else None


@contextlib.contextmanager
def fused(device=None, batches: int = 4):
    """Record the gathers of this thread on ``device`` (default: the current GPU) and run them together at the
    end of the block (see the module docstring). Nested blocks join the outer one. Without a GPU the block
    changes nothing."""
    device = resolve_device(device)
    if device.type != "cuda" or getattr(_local, "window", None) is not None:
        yield getattr(_local, "window", None)
        return
    window = Window(device, batches)
    _local.window = window
    try:
        yield window
    finally:
        _local.window = None
    window.flush()  # not on an error: outputs of a failed block are thrown away with it
