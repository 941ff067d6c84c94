"""How one pass of :class:`hmgstore.Pipeline` makes its batches: on a side CUDA stream, capped, fused, in a thread.

A pass's batches travel as *items*: ``(batch or DONE, its event on the side stream, an error raised making it,
the futures of its split gathers' CPU parts)``; the futures' events, on the copy stream, are the batch's too.
The first items of a pass are made in the consumer's thread (:meth:`Maker.warm_up`), the rest by
:func:`produce` in a background thread, up to the queue's size ahead. An item is never dropped: one made after
the consumer stopped the pass is kept in a spill list, so that the pipeline can hand a one-shot loader's
batches made ahead to its next pass.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator

import torch

from ..cuda.gather import capped_gathers
from ..gather.finish_scope import deferred_finishes
from ..gather.fusion import fused
from ..util.device import kept_stream

#: The end of a pass, as an item's batch (not None: a loader may yield None as a batch).
DONE = object()


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every :class:`hmgstore.Pipeline` on ``device`` makes its batches on, epoch after epoch.

    torch's caching allocator reuses a freed block only for allocations on the stream that made it, so a new
    stream for each pipeline (a user's loop builds one an epoch) would leave every earlier epoch's blocks
    unusable, the memory reserved growing each epoch (``benchmarks/results/soak-gpu-h100.md``). Two pipelines
    iterated at once on one GPU (a training and a validation loader) therefore make their batches one after
    the other on that stream.
    """
    return kept_stream(device, "side")


def ends(item: tuple) -> bool:
    """Whether ``item`` is the last of its pass: the end, or an error."""
    return item[0] is DONE or item[2] is not None


class Maker:
    """Makes one pass's batches on the side stream of ``device`` (None: on the CPU, no streams)."""

    batches: Iterator  # the loader's iterator for this pass, set once the pass's settings are decided

    def __init__(self, device: torch.device | None, max_sms: int | None, fuse: int, overlap: bool):
        self.device, self.max_sms, self.fuse, self.overlap = device, max_sms, fuse, overlap
        self.cuda = device is not None
        self.side = side_stream(device) if device is not None else None

    def finishes(self) -> contextlib.AbstractContextManager[list]:
        """The block a batch is made in, collecting its split gathers' futures (none without overlap)."""
        return deferred_finishes() if self.overlap else contextlib.nullcontext([])

    def one(self) -> tuple:
        """The next batch made on the side stream, with its event; DONE at the end."""
        with torch.cuda.stream(self.side) if self.cuda else contextlib.nullcontext(), \
                capped_gathers(self.max_sms), self.finishes() as futures:
            batch = next(self.batches, DONE)
            event = None
            if self.cuda and batch is not DONE:
                event = torch.cuda.Event()
                event.record(self.side)
        return batch, event, None, futures

    def group(self) -> list:
        """The next ``fuse`` batches, their gathers run together at the end (one event for all); an error
        ends the group after the batches made before it, which are delivered first."""
        items, error = [], None
        # the window's gathers run as it closes, inside the scope (opened first, closed last)
        with torch.cuda.stream(self.side), capped_gathers(self.max_sms), self.finishes() as futures, \
                fused(self.device, self.fuse):
            try:
                for _ in range(self.fuse):
                    batch = next(self.batches, DONE)
                    items.append(batch)
                    if batch is DONE:
                        break
            except BaseException as err:  # noqa: BLE001 - raised where the batch would have been
                error = err
        event = torch.cuda.Event()
        event.record(self.side)
        made = [(b, None if b is DONE else event, None, futures) for b in items]  # a group's rows: together
        return made + ([(None, None, error, [])] if error is not None else [])

    def next_items(self) -> list:
        """The next item, or the next group's items when batches are fused."""
        return self.group() if self.cuda and self.fuse > 1 else [self.one()]

    def warm_up(self, count: int) -> list:
        """The first ``count`` items, made in the calling thread (an error or the end stops early)."""
        first: list = []
        try:
            for _ in range(count):
                first.append(self.one())
                if first[-1][0] is DONE:
                    break
        except BaseException as err:  # noqa: BLE001 - raised where the batch would have been
            first.append((None, None, err, []))
        return first


def _hand_over(ready: queue.Queue, item: tuple, stop: threading.Event) -> bool:
    """Put ``item`` into ``ready``, waiting for room; False, without putting it, once ``stop`` is set."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def produce(maker: Maker, ready: queue.Queue, stop: threading.Event, spill: list) -> None:
    """The background thread: the pass's items into ``ready`` until the end, an error or ``stop``; the items
    made but not handed over when ``stop`` came go to ``spill``, in order."""
    try:
        if maker.cuda:
            torch.cuda.set_device(maker.device)
        while not stop.is_set():
            items = maker.next_items()
            for n, item in enumerate(items):
                if not _hand_over(ready, item, stop):
                    spill.extend(items[n:])
                    return
                if ends(item):
                    return
    except BaseException as err:  # noqa: BLE001 - re-raised in the consumer's thread
        item = (None, None, err, [])
        if not _hand_over(ready, item, stop):
            spill.append(item)


def left_over(first: list, ready: queue.Queue, spill: list) -> list:
    """The items of a stopped pass that its consumer never took, in order: those made in its thread, those
    queued, those made after the stop. Call it once the background thread has ended."""
    queued = []
    while True:
        try:
            queued.append(ready.get_nowait())
        except queue.Empty:
            return first + queued + spill
