"""Producer: batches sampled and gathered in another process, outside the training thread's GIL.

``hmgstore.Pipeline`` makes the next batches in a thread of the training
process, so its Python work (sampling, the gather's host side) takes the GIL
from the training loop. ``Producer`` runs the same work in a process of its
own::

    def make_loader():                 # picklable: a module-level function or functools.partial
        store = from_data(...)         # built in the producer process
        return NeighborLoader(store, ..., neighbor_sampler=HybridNeighborSampler(...))

    with hmgstore.Producer(make_loader, seed=0) as batches:
        for epoch in range(epochs):
            for batch in batches:      # the same batches, in the same order, as make_loader() gives
                ...

The producer process (``torch.multiprocessing``, spawned) calls
``make_loader()`` once, then, for each pass the trainer starts, iterates it
through :class:`hmgstore.Pipeline` (``depth``, ``max_sms`` and ``fuse`` are
the pipeline's) and copies each batch into a ring of ``depth + 1`` shared
buffers (:mod:`hmgstore.ring`), ordered by CUDA events, with no host
synchronisation between the processes in the steady state.

A batch's tensors are views into its ring slot: they stay valid until the
next batch is taken (clone what must live longer), and never past
``close()``: drop the last batch before closing, or the producer's exit warns
that shared CUDA tensors were not released. ``sm_percent`` caps the
producer's share of the GPU's SMs under CUDA MPS (the producer's
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; without an MPS daemon it has no
effect).

An exception raised while making a batch is raised in the training loop, at
that batch, with the producer's traceback as its cause. A producer that dies
raises there too, naming its exit code; a trainer that dies or stops makes
the producer exit within a second of its next wait; ``close()`` (or leaving
the ``with`` block) ends the process and frees the ring on both sides. On a
machine without a GPU the ring lives in shared memory and the same API works.
"""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pickle
import queue
import time
import traceback
from collections import deque
from typing import Callable, Iterator

import torch

from . import ring
from .device import resolve_device

#: Seconds between liveness checks while one process waits for the other.
POLL = 0.2


def remove_ipc_files(pid: int) -> None:
    """Remove the files the CUDA driver leaves in /dev/shm for a process that shared CUDA IPC handles.

    Measured (benchmarks/probe_ipc_shm.py, H200, driver 580): every process that exports an IPC event or
    memory handle leaves ``/dev/shm/cuda.shm.<device>.<pid in hex>.<n>`` behind when it exits, torch's own
    tensor sharing included. Called for the producer once it has exited, and for the trainer at its exit,
    when no process can open its handles any more."""
    for path in glob.glob(f"/dev/shm/cuda.shm.*.{pid:x}.*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


_cleanup_registered = False


def _at_exit_cleanup() -> None:
    global _cleanup_registered
    if not _cleanup_registered:
        _cleanup_registered = True
        atexit.register(remove_ipc_files, os.getpid())


class RemoteTraceback(Exception):
    """The producer process's traceback, attached as ``__cause__`` of an exception it raised."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\nin the hmgstore producer process:\n" + self.text


def _error(err: BaseException) -> tuple:
    """``(pickled exception or None, traceback text)`` for sending ``err`` to the other process."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        blob = pickle.dumps(err)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - an exception that cannot cross processes becomes a RuntimeError
        blob = None
    return blob, text


def _raise(blob, text: str):
    err = pickle.loads(blob) if blob is not None else RuntimeError(text.strip().splitlines()[-1])
    raise err from RemoteTraceback(text)


class Producer:
    """Iterate ``make_loader()``'s batches, made in a producer process and shared through a ring of buffers.

    Args:
        make_loader: a picklable callable returning the loader (any iterable of batches that can be iterated
            once per pass), called once in the producer process.
        depth: batches made ahead of the trainer (the ring has ``depth + 1`` slots).
        device: the CUDA device both processes use (default: the current GPU; the CPU without one).
        seed: seeds torch in the producer before ``make_loader()`` (the same batches, run to run).
        max_sms, fuse: passed to the producer's :class:`hmgstore.Pipeline`.
        sm_percent: the producer's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (1-100; only under an MPS daemon).
    """

    def __init__(self, make_loader: Callable, *, depth: int = 2, device=None, seed: int | None = None,
                 max_sms: int | str | None = "auto", fuse: int = 1, sm_percent: int | None = None):
        if depth < 1:
            raise ValueError(f"depth is the number of batches made ahead, at least 1; got {depth}")
        if sm_percent is not None and not 1 <= sm_percent <= 100:
            raise ValueError(f"sm_percent is a share of the GPU's SMs, 1 to 100; got {sm_percent}")
        try:
            pickle.dumps(make_loader)
        except Exception as err:
            raise TypeError(f"make_loader must be picklable to reach the producer process (a module-level "
                            f"function or functools.partial of one, not a lambda or a closure): {err}") from err
        if device is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = resolve_device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.make_loader, self.depth, self.seed = make_loader, depth, seed
        self.max_sms, self.fuse, self.sm_percent = max_sms, fuse, sm_percent
        self.process = None
        self.stats: dict = {}  # the producer's counts for the last full pass (batches, busy_s, waited_s)
        self.waited = 0.0  # seconds the trainer waited for batches (last pass)

    # the process -------------------------------------------------------------------------------------------
    def start(self) -> "Producer":
        """Start the producer process and build its loader (also done by the first pass)."""
        if self.process is not None:
            return self
        ctx = torch.multiprocessing.get_context("spawn")
        self._commands, self._results = ctx.Queue(), ctx.Queue()
        env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.sm_percent)} if self.sm_percent else {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the spawned process copies the environment at start
        try:
            self.process = ctx.Process(target=_serve, name="hmgstore-producer", daemon=True, args=(
                self.make_loader, self.device, self.depth + 1, self.seed, self.max_sms, self.fuse,
                self._commands, self._results))
            self.process.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        self._buffers = [None] * (self.depth + 1)
        kind, *rest = self._get()
        if kind == "error":
            self.close()
            _raise(*rest)
        self._length, handles = rest
        if self.cuda:
            _at_exit_cleanup()
            self._filled = [torch.cuda.Event.from_ipc_handle(self.device, h) for h in handles]
            self._freed = [torch.cuda.Event(interprocess=True) for _ in handles]
            self._commands.put(("events", [e.ipc_handle() for e in self._freed]))
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _get(self):
        """The producer's next message; raises if it died without one."""
        while True:
            try:
                return self._results.get(timeout=POLL)
            except queue.Empty:
                if not self.process.is_alive():
                    code = self.process.exitcode
                    if self.cuda:
                        remove_ipc_files(self.process.pid)
                    self.process = None
                    raise RuntimeError(f"the hmgstore producer process died (exit code {code}) without a word: "
                                       "killed, out of memory, or a crash in native code; its own output (stderr) "
                                       "says more") from None

    def close(self) -> None:
        """End the producer process and free the ring on both sides (idempotent)."""
        process, self.process = self.process, None
        self._buffers = self._filled = self._freed = None
        if process is None:
            return
        if process.is_alive():
            self._commands.put(("close",))
            deadline = time.monotonic() + 10
            while process.is_alive() and time.monotonic() < deadline:
                try:  # what it sent last is read, so that it can flush its queue and exit
                    self._results.get(timeout=0.1)
                except queue.Empty:
                    pass
            process.join(timeout=1)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
        if self.cuda and not process.is_alive():
            remove_ipc_files(process.pid)
        for q in (self._commands, self._results):
            q.close()
            q.cancel_join_thread()
        self._commands = self._results = None  # their semaphores (/dev/shm/sem.mp-*) go with them

    def __enter__(self) -> "Producer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, half of the world may be gone
            pass

    def __len__(self) -> int:
        self.start()
        if self._length is None:
            raise TypeError("the producer's loader has no len()")
        return self._length

    # a pass ------------------------------------------------------------------------------------------------
    def _free(self, slot: int) -> None:
        if self.cuda:
            self._freed[slot].record(torch.cuda.current_stream(self.device))
        self._commands.put(("free", slot))

    def __iter__(self) -> Iterator:
        self.start()
        self._commands.put(("epoch",))
        held, finished, self.waited = None, False, 0.0
        try:
            while True:
                start = time.perf_counter()
                kind, *rest = self._get()
                self.waited += time.perf_counter() - start
                if kind == "error":
                    finished = True
                    _raise(*rest)
                if kind == "done":
                    finished, self.stats = True, rest[0]
                    return
                slot, skeleton, grown = rest
                if held is not None:
                    self._free(held)
                    held = None
                if grown is not None:
                    self._buffers[slot] = grown
                if self.cuda:
                    torch.cuda.current_stream(self.device).wait_event(self._filled[slot])
                held = slot
                yield ring.unpack(skeleton, self._buffers[slot])
        finally:
            if held is not None and self.process is not None:
                self._free(held)
            if not finished and self.process is not None:
                self._stop()

    def _stop(self) -> None:
        """Stop the producer's pass (the trainer left it early), freeing the batches already sent."""
        self._commands.put(("stop",))
        while True:
            kind, *rest = self._get()
            if kind in ("done", "error"):
                return
            if kind == "batch":
                slot, _, grown = rest
                if grown is not None:
                    self._buffers[slot] = grown
                self._free(slot)


def _serve(make_loader, device, slots, seed, max_sms, fuse, commands, results) -> None:
    """The producer process: build the loader, then make passes as the trainer asks."""
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if seed is not None:
            torch.manual_seed(seed)
        loader = make_loader()
        try:
            length = len(loader)
        except TypeError:
            length = None
        server = _Server(loader, device, slots, max_sms, fuse, commands, results)
        results.put(("ready", length, [e.ipc_handle() for e in server.filled]))
    except BaseException as err:  # noqa: BLE001 - reported to the trainer
        results.put(("error", *_error(err)))
        return
    server.run()


class _Stopped(Exception):
    """The trainer stopped the pass, closed the producer, or died."""


class _Server:
    """The producer's side of the ring."""

    def __init__(self, loader, device, slots, max_sms, fuse, commands, results):
        self.loader, self.device, self.commands, self.results = loader, device, commands, results
        self.max_sms, self.fuse = max_sms, fuse
        self.cuda = device.type == "cuda"
        self.buffers = [None] * slots
        self.filled = [torch.cuda.Event(interprocess=True) for _ in range(slots)] if self.cuda else []
        self.freed = None  # the trainer's events, opened when it sends them
        self.free = deque(range(slots))
        self.closed = False

    def command(self, block: bool = True):
        """The trainer's next command (None if none waits and ``block`` is False); raises _Stopped when the
        trainer is gone."""
        from multiprocessing import parent_process

        while True:
            try:
                return self.commands.get(timeout=POLL) if block else self.commands.get_nowait()
            except queue.Empty:
                parent = parent_process()
                if parent is not None and not parent.is_alive():
                    self.results.cancel_join_thread()  # nobody reads what is left: exit without flushing it
                    self.closed = True
                    raise _Stopped from None
                if not block:
                    return None

    def handle(self, cmd) -> None:
        kind = cmd[0]
        if kind == "events":
            self.freed = [torch.cuda.Event.from_ipc_handle(self.device, h) for h in cmd[1]]
        elif kind == "free":
            self.free.append(cmd[1])
            if self.cuda:  # this process's later writes into the slot wait for the trainer's work on it
                torch.cuda.current_stream(self.device).wait_event(self.freed[cmd[1]])
        elif kind == "close":
            self.closed = True
            raise _Stopped
        elif kind == "stop":
            raise _Stopped

    def run(self) -> None:
        while not self.closed:
            try:
                cmd = self.command()
                if cmd[0] == "epoch":
                    try:
                        stats = self.epoch()
                    except _Stopped:
                        stats = None
                    if not self.closed:
                        self.results.put(("done", stats))
                elif cmd[0] != "stop":  # a stop that came after its pass had ended: nothing to stop
                    self.handle(cmd)
            except _Stopped:
                pass
            except BaseException as err:  # noqa: BLE001 - reported to the trainer, at the batch it happened
                self.results.put(("error", *_error(err)))
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.buffers = self.filled = self.freed = None  # events destroyed, slots freed, before the context ends
        if self.cuda:
            torch.cuda.ipc_collect()

    def epoch(self) -> dict:
        """One pass of the loader through the ring; the pass's counts."""
        from .pipeline import Pipeline

        busy = waited = 0.0
        batches = 0
        source = Pipeline(self.loader, depth=1, device=self.device if self.cuda else None, max_sms=self.max_sms,
                          fuse=self.fuse)
        it = iter(source)
        try:
            while True:
                start = time.perf_counter()
                while True:  # commands that came meanwhile: frees, or a stop
                    cmd = self.command(block=not self.free)
                    if cmd is None:
                        break
                    self.handle(cmd)
                waited += time.perf_counter() - start
                start = time.perf_counter()
                batch = next(it, None)
                if batch is None:
                    break
                slot = self.free.popleft()
                skeleton, grown = ring.pack(batch, self.buffers[slot], self.device)
                del batch
                if grown is not None:
                    self.buffers[slot] = grown
                if self.cuda:
                    self.filled[slot].record(torch.cuda.current_stream(self.device))
                self.results.put(("batch", slot, skeleton, grown))
                busy += time.perf_counter() - start
                batches += 1
        finally:
            it.close()
        return {"batches": batches, "busy_s": busy, "waited_s": waited}
