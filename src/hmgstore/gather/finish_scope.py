"""Where a split gather's CPU part may finish later: a block of one thread that collects the parts' futures.

Why. A split gather (:mod:`hmgstore.gather.cpu_share`) waits, before it
returns, for the CPU to read its share of the rows; in
:class:`hmgstore.Pipeline` that wait (``benchmarks/results/strong-step-h100.md``)
sits on the loader thread's path before it samples the next batch. A gather inside
``with deferred_finishes() as futures:`` returns without waiting, and the
block's list gets one ``concurrent.futures.Future`` per CPU part, whose
result is a ``torch.cuda.Event`` recorded once that part's rows are in the
output (:func:`hmgstore.gather.cpu_share.finish_later`: the reader thread,
after the reads, queues the copies and the scatter on the copy stream and
records the event there).

What it assumes. The outputs of such gathers are not written until their
events: nothing may read them (on any stream, in the loader itself) before
the reading stream has waited for every event of the block. That is why only
the code that hands the batch over (the pipeline's consumer) opens a block,
and why the block belongs to one thread: other threads' gathers, and
anything in :func:`inline`, finish before returning, as outside a block.

This module knows nothing of CUDA or tables: it only keeps the block.
"""
from __future__ import annotations

import contextlib
import threading

_scope = threading.local()  # .futures: the innermost block's list on this thread; None outside (or inline)


@contextlib.contextmanager
def _collecting(futures: list | None):
    outer = getattr(_scope, "futures", None)
    _scope.futures = futures
    try:
        yield futures
    finally:
        _scope.futures = outer


@contextlib.contextmanager
def deferred_finishes():
    """Within this block, this thread's split gathers finish later; yields the list of their futures, in order.

    Each future's result is a ``torch.cuda.Event`` (recorded on
    :func:`hmgstore.gather.cpu_share.copy_stream`); ``result()`` raises what
    went wrong reading or moving that part's rows. Before anything reads a
    gather's output, the reading stream must ``wait_event`` every event (a
    stream that waits only for the gather's own stream sees those rows
    unwritten). A nested block collects its own; the outer one's list is
    back when it ends.
    """
    with _collecting([]) as futures:
        yield futures


@contextlib.contextmanager
def inline():
    """Within this block, this thread's gathers finish before returning, even inside :func:`deferred_finishes`
    (the split's cost model times whole gathers with it)."""
    with _collecting(None):
        yield


def deferring() -> bool:
    """Whether this thread's split gathers finish later (inside :func:`deferred_finishes`, not :func:`inline`)."""
    return getattr(_scope, "futures", None) is not None


def current() -> list:
    """This thread's innermost :func:`deferred_finishes` list, for a finish queued now to add its future to.
    Raises RuntimeError outside such a block: nobody would wait for the work, and its output would be read
    unwritten."""
    futures = getattr(_scope, "futures", None)
    if futures is None:
        raise RuntimeError("hmgstore: a split gather's finish was deferred outside deferred_finishes(); "
                           "check finish_scope.deferring() first")
    return futures
