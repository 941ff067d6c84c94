"""One pass over an :class:`hmgstore.Producer`: its iterator, and the message of a pass cut short."""
from __future__ import annotations

from collections.abc import Generator

CLOSED = ("this hmgstore.Producer was closed while a pass over it was under way (close(), or leaving its with "
          "block, from an error handler or another thread); start a new Producer to go on")


class Pass:
    """One pass's iterator: the generator of :meth:`~hmgstore.Producer._iterate`, which, once a new pass of the same
    Producer ended it (one pass at a time), raises RuntimeError instead of stopping as if its epoch were over."""

    def __init__(self, batches: Generator):
        self._batches, self._ended_by_next_pass = batches, False

    def __iter__(self) -> Pass:
        return self

    def __next__(self):
        if self._ended_by_next_pass:
            raise RuntimeError("this pass over an hmgstore.Producer was ended by a later pass of the same Producer "
                               "(one pass at a time: zip(p, p) or a validation pass inside the training loop ends "
                               "the first); use a Producer per loop, or finish one pass before starting another")
        return next(self._batches)

    def close(self) -> None:
        self._ended_by_next_pass = True
        self._batches.close()
