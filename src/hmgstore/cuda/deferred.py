"""Deferred id checks: the gather kernel records the first bad id of a launch, the host reads it later.

With ``check="deferred"`` (see :mod:`hmgstore.rows.ids`) nothing waits for the
check: each launch gets a zeroed error record (:func:`error_record`, words
laid out as :data:`hmgstore.cuda.gather.LAYOUT` says), the kernel writes the
first bad id into it, and :func:`deferred` queues its copy into a pinned slot
on the gather's stream. The next gather on that GPU looks at the records of
finished launches without waiting; :func:`raise_deferred` waits for all of
them. Either raises IndexError with the bad id's value and position.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import torch

from .gather import E_WORDS, LAYOUT

_SLOTS = 256  # error records per GPU that may be in flight at once


@dataclass
class _Record:
    event: torch.cuda.Event  # recorded after the record's copy to pinned memory
    slot: int
    device_buffer: torch.Tensor  # kept alive until the copy has run
    requests: list  # per launched job: (num_rows, what the job gathered from)


class _DeviceChecks:
    """One GPU's launches whose ids the kernel checked, and the pinned slots their records land in."""

    def __init__(self):
        self.host = torch.zeros((_SLOTS, E_WORDS), dtype=torch.int64).pin_memory()
        self.free = list(range(_SLOTS))
        self.records: collections.deque[_Record] = collections.deque()
        self.lock = threading.Lock()

    def take_done(self, wait: bool) -> list[tuple[_Record, list[int]]]:
        """Remove the records whose launch has finished (all of them, waiting, when ``wait``)."""
        done = []
        with self.lock:
            keep: collections.deque[_Record] = collections.deque()
            for record in self.records:
                if wait:
                    record.event.synchronize()
                if wait or record.event.query():
                    done.append((record, self.host[record.slot].tolist()))
                    self.free.append(record.slot)
                else:
                    keep.append(record)
            self.records = keep
        return done


_checks: dict[int, _DeviceChecks] = {}
_checks_lock = threading.Lock()


def _device_checks(device: torch.device) -> _DeviceChecks:
    with _checks_lock:
        if device.index not in _checks:
            _checks[device.index] = _DeviceChecks()
        return _checks[device.index]


def error_record(device: torch.device) -> torch.Tensor:
    """A zeroed error record for one launch on the current stream of ``device``."""
    return torch.zeros(E_WORDS, dtype=torch.int64, device=device)


def deferred(device: torch.device, stream, record: torch.Tensor, requests: list) -> None:
    """Queue the copy of a launch's error record to pinned memory on ``stream``; read it later.

    ``requests``: per launched job, ``(num_rows, description)`` for the message.
    """
    checks = _device_checks(device)
    while True:
        with checks.lock:
            slot = checks.free.pop() if checks.free else None
        if slot is not None:
            break
        _raise_done(checks, wait=True)  # every slot in flight: wait for the oldest launches
    with torch.cuda.stream(stream):
        checks.host[slot].copy_(record, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    with checks.lock:
        checks.records.append(_Record(event, slot, record, requests))


def _raise_done(checks: _DeviceChecks, wait: bool) -> None:
    for record, words in checks.take_done(wait):
        flag, job, position, value = (words[LAYOUT[k]] for k in ("E_FLAG", "E_JOB", "E_POSITION", "E_VALUE"))
        if flag:
            num_rows, what = record.requests[job]
            raise IndexError(
                f"index {value} at position {position} of an earlier gather from {what} is out of range for "
                f"{num_rows} rows (valid ids are 0..{num_rows - 1}). It was checked on the GPU without waiting "
                "(check='deferred'), so it is reported now; that gather's result holds 0xFF bytes (NaN) in its "
                "place and must be thrown away. Pass check='sync' to raise at the gather itself")


def raise_deferred(device=None, wait: bool = True) -> None:
    """Raise IndexError for a bad GPU id found by an earlier gather's kernel (``check="deferred"``).

    ``device``: a CUDA device, or None for every GPU with launches in
    flight. ``wait``: wait for those launches first (a synchronisation);
    with ``wait=False`` only finished launches are looked at.
    """
    with _checks_lock:
        targets = [c for i, c in _checks.items() if device is None or i == torch.device(device).index]
    for checks in targets:
        _raise_done(checks, wait)
