"""The producer process of :class:`hmgstore.Producer`: it builds the loader, then makes passes as the trainer asks.

Messages to the trainer are ``(kind, pass number or None, ...)``: ``ready`` (the loader's length, whether it is
one-shot, the filled events' IPC handles), ``batch``, ``done`` and ``error`` (an exception crossing processes:
pickled where it can be, always with its traceback text). Commands from the trainer: ``events`` (its freed
events' IPC handles), ``epoch`` (start pass N, of which the trainer has already handed out some batches: those
of a stopped pass over a one-shot loader that it kept), ``free`` (a slot), ``stop`` (the pass), ``close``.
"""
from __future__ import annotations

import pickle
import queue
import signal
import time
import traceback
from collections import deque

import torch

from . import shared_ring as ring
from .pipeline import Pipeline, is_one_shot

#: Seconds between liveness checks while one process waits for the other.
POLL = 0.2
#: The end of an epoch in the server (a loader may yield None as a batch).
_END = object()


class RemoteTraceback(Exception):
    """The producer process's traceback, attached as ``__cause__`` of an exception it raised."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\nin the hmgstore producer process:\n" + self.text


def pack_error(err: BaseException) -> tuple:
    """``(pickled exception or None, traceback text)`` for sending ``err`` to the other process."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    try:
        blob = pickle.dumps(err)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - an exception that cannot cross processes becomes a RuntimeError
        blob = None
    return blob, text


def raise_error(blob, text: str):
    err = pickle.loads(blob) if blob is not None else RuntimeError(text.strip().splitlines()[-1])
    raise err from RemoteTraceback(text)


def serve(make_loader, device, slots, seed, options, commands, results) -> None:
    """The producer process: build the loader, then make passes as the trainer asks. ``options``: the
    pipeline's ``(max_sms, fuse, overlap_reads)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the trainer, which ends this process
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if seed is not None:
            torch.manual_seed(seed)
        loader = make_loader()
        try:
            length = len(loader)
        except Exception:  # noqa: BLE001 - no usable len() (TypeError, or a __len__ that raises): none is needed
            length = None
        server = _Server(loader, device, slots, options, commands, results)
        results.put(("ready", None, length, is_one_shot(loader), [e.ipc_handle() for e in server.filled]))
    except BaseException as err:  # noqa: BLE001 - reported to the trainer
        results.put(("error", None, *pack_error(err)))
        return
    server.run()


class _Stopped(Exception):
    """The trainer stopped the pass, closed the producer, or died."""


class _Server:
    """The producer's side of the ring."""

    def __init__(self, loader, device, slots, options, commands, results):
        self.loader, self.device, self.commands, self.results = loader, device, commands, results
        self.max_sms, self.fuse, self.overlap_reads = options
        # depth 1: the ring's slots are the depth the trainer sees. The ring's device, never None: a CPU ring on a
        # machine with a GPU would otherwise get a pipeline on the GPU's streams, and CUDA in this process. One
        # Pipeline for every pass: it tells a one-shot loader's used-up second pass from an empty epoch, and
        # resumes that loader's pass left early with the batches it had made ahead.
        self.source = Pipeline(loader, depth=1, device=device, max_sms=self.max_sms, fuse=self.fuse,
                               overlap_reads=self.overlap_reads)
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
        elif kind != "epoch":
            raise ValueError(f"hmgstore producer: unknown command {kind!r}")

    def run(self) -> None:
        """Every message for the trainer carries the number of the pass it belongs to (None: none), so that
        nothing of a stopped or failed pass is taken for part of a later one."""
        while not self.closed:
            number = None
            try:
                cmd = self.command()
                if cmd[0] == "epoch":
                    number = cmd[1]
                    try:
                        stats = self.epoch(number, cmd[2])
                    except _Stopped:
                        stats = None
                    if not self.closed:
                        self.results.put(("done", number, stats))
                elif cmd[0] != "stop":  # a stop that came after its pass had ended: nothing to stop
                    self.handle(cmd)
            except _Stopped:
                pass
            except BaseException as err:  # noqa: BLE001 - reported to the trainer, at the batch it happened
                self.results.put(("error", number, *pack_error(err)))
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.buffers = self.filled = self.freed = None  # events destroyed, slots freed, before the context ends
        if self.cuda:
            torch.cuda.ipc_collect()

    def epoch(self, number: int, delivered: int) -> dict:
        """Pass ``number`` of the loader through the ring, of which the trainer has already handed out
        ``delivered`` batches; the pass's counts."""
        busy = waited = 0.0
        batches = 0
        it = self.source.epoch(delivered)
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
                batch = next(it, _END)
                if batch is _END:  # not None: a loader may yield None as a batch
                    break
                slot = self.free[0]  # taken once the batch is in it: a batch that cannot be packed keeps no slot
                skeleton, grown = ring.pack(batch, self.buffers[slot], self.device)
                self.free.popleft()
                del batch
                if grown is not None:
                    self.buffers[slot] = grown
                if self.cuda:
                    self.filled[slot].record(torch.cuda.current_stream(self.device))
                self.results.put(("batch", number, slot, skeleton, grown))
                busy += time.perf_counter() - start
                batches += 1
        finally:
            it.close()
        return {"batches": batches, "busy_s": busy, "waited_s": waited}
