"""How many of this process's cores other processes leave idle: :class:`CpuLoad`, read from ``/proc``.

The split gather (:mod:`hmgstore.gather.cpu_share`) reads part of a batch with torch's
threads; while CPU sampler workers in other processes are the training
loop's bottleneck, those cores are theirs. ``cpu_load`` is the process's one
instance, sampled at most every ``CpuLoad.PERIOD``.
"""
from __future__ import annotations

import os
import threading
import time


class CpuLoad:
    """How many of this process's cores other processes left idle, over the last ``PERIOD`` or more.

    From the busy time of each allowed core (``/proc/stat``) less this
    process's own (``/proc/self/stat``). Where those files cannot be read
    (not Linux) or do not list the allowed cores, every core counts as idle;
    cgroup CPU quotas are not looked at. ``read_stat``/``read_self``/
    ``clock`` stand in for the files and the clock in tests.
    """

    PERIOD = 0.25

    def __init__(self, read_stat=None, read_self=None, clock=time.monotonic, cpus=None):
        self._given_cpus = cpus
        self._cpus = self._allowed()
        self._read_stat, self._read_self, self._clock = read_stat or _read_file("/proc/stat"), \
            read_self or _read_file("/proc/self/stat"), clock
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = None  # (time, busy ticks of the cores, own ticks)
        self._idle = float(len(self._cpus))
        self._lock = threading.Lock()

    def _allowed(self) -> list[int]:
        """The cores this process may run on (read again at every sample: a rank may be pinned later)."""
        if self._given_cpus is not None:
            return sorted(self._given_cpus)
        return sorted(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1))

    def _sample(self):
        wanted = {f"cpu{c}" for c in self._cpus}
        busy, seen = 0, 0
        for line in self._read_stat().splitlines():
            fields = line.split()
            if fields and fields[0] in wanted:  # user nice system idle iowait irq softirq steal
                ticks = [int(v) for v in fields[1:9]]
                busy += sum(ticks) - ticks[3] - ticks[4]
                seen += 1
        if seen < len(wanted):  # cores renumbered (a container's /proc) or missing: no figure to trust
            raise ValueError(f"/proc/stat lists {seen} of the {len(wanted)} allowed cores")
        own = self._read_self().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return busy, int(own[11]) + int(own[12])  # utime, stime

    def idle(self) -> float:
        """Cores left idle by other processes (0 to the number of allowed cores)."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self.PERIOD:
                return self._idle
            cpus = self._allowed()
            if cpus != self._cpus:  # the affinity changed: start over
                self._cpus, self._last, self._idle = cpus, None, float(len(cpus))
            try:
                busy, own = self._sample()
            except (OSError, ValueError, IndexError):
                return self._idle
            if self._last is not None:
                others = max(0, (busy - self._last[1]) - (own - self._last[2])) / self._tick / (now - self._last[0])
                self._idle = max(0.0, len(self._cpus) - others)
            self._last = (now, busy, own)
            return self._idle

    def room_for(self, threads: int) -> bool:
        """Whether the idle cores hold this process's main thread and ``threads`` more, counting at most half
        the allowed cores for the threads (torch's default is one thread per core, which could never fit
        beside the main thread)."""
        return self.idle() >= 1 + min(threads, max(1, len(self._cpus) // 2))


def _read_file(path: str):
    def read() -> str:
        with open(path) as f:
            return f.read()
    return read


cpu_load = CpuLoad()
if hasattr(os, "register_at_fork"):  # a lock held by another thread at fork stays held in the child
    os.register_at_fork(after_in_child=lambda: setattr(cpu_load, "_lock", threading.Lock()))
