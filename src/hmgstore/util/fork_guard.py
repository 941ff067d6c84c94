"""A forked child never runs the destructors of CUDA objects its parent left in reference cycles.

Why. A forked child (a DataLoader worker) cannot use its parent's CUDA
context. Objects in reference cycles that the parent had not collected yet are
copied into it, and a collection there would run their destructors: freeing a
CUDA tensor marked used by another stream (``record_stream``: the pipeline's
outputs, the sampler's) calls into CUDA, which throws inside a destructor and
aborts the worker ("CUDA error: initialization error").

How. Where the parent has started CUDA, the collector is off from the first
fork hook to run (``before`` hooks run last-registered first, so this one,
registered when hmgstore is imported, runs before torch's and the standard
library's) until the child has frozen what it inherited (``gc.freeze``: never
collected there; ``after_in_child`` hooks run in registration order, so the
other modules' hooks, which allocate, run with the collector off). The parent
turns it back on once no thread of it is forking. What the child makes itself
is collected as usual; the inherited garbage is the parent's to free.
"""
from __future__ import annotations

import gc
import os
import threading

import torch

_lock = threading.Lock()
_forking = 0  # forks under way in this process's threads
_cuda = False  # whether the parent had started CUDA when the forks under way began
_collecting = False  # whether the collector was on then


def _before() -> None:
    global _forking, _cuda, _collecting
    with _lock:
        if _forking == 0:
            _cuda, _collecting = torch.cuda.is_initialized(), gc.isenabled()
            if _cuda:
                gc.disable()
        _forking += 1


def _after_in_parent() -> None:
    global _forking
    with _lock:
        _forking -= 1
        if _forking == 0 and _cuda and _collecting:
            gc.enable()


def _after_in_child() -> None:
    global _lock, _forking
    _lock, _forking = threading.Lock(), 0  # another thread may have held it at the fork
    if _cuda:
        gc.freeze()
        if _collecting:
            gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
