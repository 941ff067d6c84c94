"""A start gate for timing several GPUs at once from one Python thread.

Queueing work on k GPUs one after the other staggers their start by the
host time it takes to issue each GPU's share (for a hmgstore gather, a few
hundred microseconds: as long as a whole 128 B-row batch runs), so the GPUs
would overlap only partly. Instead each GPU's stream first runs a one-thread
kernel that spins on a flag in pinned host memory; all work is queued
behind it; then one host write opens every gate at once.

The gate gives up after ``timeout_s`` and records that it did: if something
in the issue path waits for the GPU (a device-to-host read, an implicit
synchronisation), the host would otherwise wait for a gate that only the
host can open. :meth:`StartGate.timed_out` tells the caller to discard that
measurement. Uses CuPy through :mod:`hmgstore.cuda` (GPU only).

Why a gate, measured: benchmarks/NOTES.md ("Start gate").
"""
from __future__ import annotations

import numpy as np
import torch

from .. import cuda


class StartGate:
    """Holds streams of several GPUs until :meth:`open`.

    ``devices``: the CUDA devices whose streams it may hold. Use:
    ``gate.close()``, ``gate.hold(stream)`` for each stream (before queueing
    its work), ``gate.open()``, wait for the GPUs, then ``gate.timed_out()``.
    """

    def __init__(self, devices, timeout_s: float = 5.0):
        self._cp = cuda.cupy()
        self.timeout_ns = int(timeout_s * 1e9)
        self.devices = [torch.device(d) for d in devices]
        # Pinned memory from cudaHostAlloc is mapped into every GPU at the same address (UVA).
        self._flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        self._timed_out = torch.zeros(len(self.devices), dtype=torch.int32).pin_memory()
        for t in (self._flag, self._timed_out):
            attrs = self._cp.cuda.runtime.pointerGetAttributes(t.data_ptr())
            if attrs.devicePointer != t.data_ptr():
                raise RuntimeError("pinned host memory is not mapped at its host address; the start gate needs UVA")
        self._slot = {d: i for i, d in enumerate(self.devices)}

    def _kernel(self, index: int):
        return cuda.module(index, ("bench_gate.cu",)).get_function("hmg_bench_gate")

    def prepare(self) -> None:
        """Compile the gate for every device now, so that a compiler error shows before any timing."""
        for d in self.devices:
            self._kernel(d.index)

    def close(self) -> None:
        """Arm the gate for the next round. Call only when no gate kernel is running."""
        self._flag[0] = 0
        self._timed_out.zero_()

    def hold(self, stream: torch.cuda.Stream) -> None:
        """Queue the gate on ``stream``: what is queued after it waits for :meth:`open`."""
        index = stream.device.index
        slot = self._slot[torch.device("cuda", index)]
        kernel = self._kernel(index)
        with self._cp.cuda.Device(index):
            kernel((1,), (1,), (np.uint64(self._flag.data_ptr()), np.uint64(self.timeout_ns),
                                np.uint64(self._timed_out.data_ptr() + 4 * slot)),
                   stream=cuda.cupy_stream(stream))

    def open(self) -> None:
        self._flag[0] = 1

    def timed_out(self) -> bool:
        """Whether any gate of the last round gave up (read after the GPUs are synchronised)."""
        return bool(self._timed_out.any())
