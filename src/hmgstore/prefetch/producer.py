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
through :class:`hmgstore.Pipeline` (``max_sms``, ``fuse`` and ``overlap_reads`` are the
pipeline's; its own depth is 1) and copies each batch into a ring of ``depth + 1`` shared
buffers (:mod:`hmgstore.prefetch.shared_ring`), ordered by CUDA events, with no host
synchronisation between the processes in the steady state.

Passes follow :class:`hmgstore.Pipeline`'s rules: each is an epoch of an
iterable loader, while a one-shot loader (a generator) is read once across
passes, a pass left early resumed by the next, which yields first the
batches the producer had already made (those in the ring included).

As for :class:`hmgstore.Pipeline`, a batch must be new memory (refilled tensors overwrite the batches made ahead);
the same object yielded again (a cached list of batches, one full-graph batch) is fine. One pass at a time: a new
pass ends the one under way, whose iterator then raises RuntimeError.

A batch's tensors are views into its ring slot: they stay valid until the
next batch is taken (clone what must live longer), and never past
``close()``: drop the last batch before closing, or the producer's exit warns
that shared CUDA tensors were not released. ``sm_percent`` caps the
producer's share of the GPU's SMs under CUDA MPS (the producer's
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) and ``mps_priority`` sets its MPS
client priority (``CUDA_MPS_CLIENT_PRIORITY``: 0 normal, 1 below normal);
without an MPS daemon neither has an effect.

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
import logging
import os
import queue
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from ..rows import checks
from ..util.device import resolve_device
from ..util.environ import environ
from . import shared_ring as ring
from .pipeline import check_fuse, check_max_sms, check_overlap_reads
from .producer_pass import CLOSED, Pass
from .producer_process import POLL, RemoteTraceback, raise_error, serve  # noqa: F401 - RemoteTraceback: users catch it

log = logging.getLogger(__name__)


def remove_ipc_files(pid: int) -> None:
    """Remove the files the CUDA driver leaves in /dev/shm for a process that shared CUDA IPC handles.

    Every process that exports an IPC event or
    memory handle leaves ``/dev/shm/cuda.shm.<device>.<pid in hex>.<n>`` behind when it exits, torch's own
    tensor sharing included. Called for the producer once it has exited, and for the trainer at its exit,
    when no process can open its handles any more (``benchmarks/probes/probe_ipc_shm.py``)."""
    for path in glob.glob(f"/dev/shm/cuda.shm.*.{pid:x}.*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def mps_running() -> bool:
    """Whether a CUDA MPS control daemon serves this process: its control pipe exists in
    ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), where the CUDA driver looks for it."""
    return os.path.exists(os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps", "control"))


def warn_without_mps(sm_percent: int | None) -> None:
    """Warn a CUDA producer started with no MPS daemon: the two processes' kernels take turns on the GPU
    (the producer slower than ``Pipeline``'s thread, ``docs/pipeline.md``), and ``sm_percent`` has no effect."""
    if not mps_running():
        log.warning("hmgstore.Producer: no CUDA MPS daemon (no control pipe in $CUDA_MPS_PIPE_DIRECTORY or "
                    "/tmp/nvidia-mps): the producer's and the trainer's kernels take turns on the GPU, which makes "
                    "the process form slower than hmgstore.Pipeline's thread%s. Start one "
                    "with `nvidia-cuda-mps-control -d` (as the GPU's user), or use hmgstore.Pipeline",
                    f"; sm_percent={sm_percent} has no effect without it" if sm_percent else "")


def start_error(make_loader, err: Exception) -> Exception:
    """The error to raise for a producer process that ``err`` kept from starting: a TypeError with the pickling
    advice where ``make_loader`` itself cannot be pickled (spawn sends it pickled), else a RuntimeError naming
    ``err`` (a failed process start, a script that starts processes outside ``if __name__ == "__main__":``)."""
    try:
        ForkingPickler.dumps(make_loader)
    except Exception as why:  # noqa: BLE001 - pickling fails in many types (PicklingError, TypeError, ...)
        return TypeError(f"make_loader could not be pickled to send it to the producer process "
                         f"({type(why).__name__}: {why}). It must be picklable: a module-level function, or "
                         "functools.partial of one (not a lambda or a closure)")
    return RuntimeError(f"the hmgstore producer process could not be started: {type(err).__name__}: {err}")


def died_without_a_word(code: int | None, starting: bool) -> str:
    """Why a producer process that exited with ``code`` before sending a message probably did: a signal (a
    negative code), or a Python error before it could report one (while ``starting``: in unpickling
    ``make_loader``, whose module a new interpreter must be able to import)."""
    if code is not None and code > 0 and starting:
        why = ("an error in Python before it could report one, most often make_loader failing to unpickle there "
               "(its module must be importable by a new interpreter, not defined in a notebook or __main__)")
    elif code is not None and code < 0:
        why = f"killed by signal {-code}: out of memory (the OOM killer), or a crash in native code"
    else:
        why = "killed, out of memory, or a crash in native code"
    return (f"the hmgstore producer process died (exit code {code}) without a word: {why}; its own output (stderr) "
            "says more")


_cleanup_registered = False


def _at_exit_cleanup() -> None:
    global _cleanup_registered
    if not _cleanup_registered:
        _cleanup_registered = True
        atexit.register(remove_ipc_files, os.getpid())


class Producer:
    """Iterate ``make_loader()``'s batches, made in a producer process and shared through a ring of buffers.

    Args:
        make_loader: a picklable callable returning the loader, called once in the producer process: any
            iterable of batches, iterated once per pass, or a one-shot iterator (a generator), read once across
            passes as :class:`hmgstore.Pipeline` reads it.
        depth: batches made ahead of the trainer (the ring has ``depth + 1`` slots).
        device: the CUDA device both processes use (default: the current GPU; the CPU without one).
        seed: seeds torch in the producer before ``make_loader()`` (the same batches, run to run).
        max_sms: passed to the producer's :class:`hmgstore.Pipeline`; ``"auto"`` (the default, as there) caps
            gathers that read host memory, which out of process matters more: on the papers-shaped graph under MPS
            the epoch ran at 0.80-0.82x the step alone capped at 12 SMs, 0.72x uncapped
            (``benchmarks/results/producer-mps-papers-h200.md``).
        fuse: passed to the producer's :class:`hmgstore.Pipeline`.
        overlap_reads: passed to the producer's :class:`hmgstore.Pipeline` (default False; ``"auto"``: on for
            a PyG loader without a transform; a batch is packed into the ring once its CPU reads have landed).
        sm_percent: the producer's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (1-100; only under an MPS daemon).
        mps_priority: the producer's ``CUDA_MPS_CLIENT_PRIORITY``, 0 (normal) or 1 (below normal); None: the
            trainer's environment decides, as for any child process. A client can only lower its own priority,
            so the producer's kernels go first where the trainer runs at 1 and the producer at 0.

    The constructor checks every argument and starts nothing (:meth:`start`, or the first pass, does).

    Raises:
        TypeError: ``make_loader`` not callable; ``depth``, ``seed``, ``sm_percent`` or ``mps_priority`` not an
            integer (floats and bools included).
        ValueError: ``depth`` under 1; ``sm_percent`` outside 1-100; ``mps_priority`` not 0 or 1; ``max_sms``,
            ``fuse`` or ``overlap_reads`` not as :class:`hmgstore.Pipeline` takes them (ValueError for every kind
            there).
    """

    process: BaseProcess | None
    # Set by start() and None once closed; used only while the process runs, hence Any rather than Optional.
    _commands: Any  # the spawn context's Queue of commands to the producer
    _results: Any  # and of its messages back
    _buffers: Any  # list: each ring slot's buffers (None until the producer sends them)
    _filled: Any  # list[torch.cuda.Event]: the producer's, one a slot (on a GPU)
    _freed: Any  # list[torch.cuda.Event]: the trainer's, one a slot (on a GPU)
    _held: int | None  # the slot of the batch last handed out
    _open: Pass | None  # the pass's iterator left open
    _carried: list  # a one-shot loader's batches a stopped pass had in the ring: ("batch", slot, skeleton) or error
    _one_shot: bool  # whether the loader is one-shot (the producer says so once it has built it)
    _pass: int
    _length: int | None

    def __init__(self, make_loader: Callable, *, depth: int = 2, device=None, seed: int | None = None,
                 max_sms: int | str | None = "auto", fuse: int | str = 1, sm_percent: int | None = None,
                 overlap_reads: bool | str = False, mps_priority: int | None = None):
        if not callable(make_loader):
            raise TypeError(f"make_loader is a picklable callable that returns the loader, got "
                            f"{type(make_loader).__name__}")
        depth = checks.count(depth, "depth", at_least=1)
        seed = None if seed is None else checks.count(seed, "seed", at_least=-2**63)
        max_sms, fuse = check_max_sms(max_sms), check_fuse(fuse)
        check_overlap_reads(overlap_reads)
        if sm_percent is not None and checks.count(sm_percent, "sm_percent") not in range(1, 101):
            raise ValueError(f"sm_percent is a share of the GPU's SMs, 1 to 100; got {sm_percent}")
        if mps_priority is not None and checks.count(mps_priority, "mps_priority") not in (0, 1):
            raise ValueError(f"mps_priority is an MPS client priority, 0 (normal) or 1 (below normal); got "
                             f"{mps_priority}")
        if device is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = resolve_device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.make_loader, self.depth, self.seed = make_loader, depth, seed
        self.max_sms, self.fuse, self.sm_percent, self.overlap_reads = max_sms, fuse, sm_percent, overlap_reads
        self.mps_priority = mps_priority
        self.process = None
        self.stats: dict = {}  # the producer's counts for the last full pass (batches, busy_s, waited_s)
        self.waited = 0.0  # seconds the trainer waited for batches (last pass)

    # the process -------------------------------------------------------------------------------------------
    def start(self) -> Producer:
        """Start the producer process and build its loader (also done by the first pass).

        Raises:
            TypeError: ``make_loader`` cannot be pickled to send it to the process (a lambda, a closure).
            RuntimeError: the process could not be started (the error it met is named, and chained), or it
                died before it could report.
            Exception: what ``make_loader()`` raised in the producer process, with its traceback as the cause.
        """
        if self.process is not None:
            return self
        if self.cuda:
            warn_without_mps(self.sm_percent)
        ctx = torch.multiprocessing.get_context("spawn")
        self._commands, self._results = ctx.Queue(), ctx.Queue()
        self._buffers, self._held, self._pass, self._open = [None] * (self.depth + 1), None, 0, None
        self._carried = []
        env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.sm_percent)} if self.sm_percent else {}
        if self.mps_priority is not None:
            env["CUDA_MPS_CLIENT_PRIORITY"] = str(self.mps_priority)
        try:
            self.process = ctx.Process(target=serve, name="hmgstore-producer", daemon=True, args=(
                self.make_loader, self.device, self.depth + 1, self.seed, (self.max_sms, self.fuse, self.overlap_reads),
                self._commands, self._results))
            with environ(env):  # the spawned process copies the environment at start
                self.process.start()
        except Exception as err:
            self.process = None
            self.close()
            raise start_error(self.make_loader, err) from err
        kind, _, *rest = self._get(starting=True)
        if kind == "error":
            self.close()
            raise_error(*rest)
        self._length, self._one_shot, handles = rest
        if self.cuda:
            _at_exit_cleanup()
            with torch.cuda.device(self.device):  # the trainer's events live on the ring's device
                self._filled = [torch.cuda.Event.from_ipc_handle(self.device, h) for h in handles]
                self._freed = [torch.cuda.Event(interprocess=True) for _ in handles]
                self._commands.put(("events", [e.ipc_handle() for e in self._freed]))
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _get(self, starting: bool = False):
        """The producer's next message; raises if it died without one (``starting``: before its first) or was
        closed."""
        while True:
            if self._results is None:
                raise RuntimeError(CLOSED)
            try:
                return self._results.get(timeout=POLL)
            except queue.Empty:
                process = self.process
                if process is not None and not process.is_alive():
                    code = process.exitcode
                    self.close()
                    raise RuntimeError(died_without_a_word(code, starting)) from None

    def close(self) -> None:
        """End the producer process and free the ring on both sides (idempotent)."""
        process, self.process = self.process, None
        self._buffers = self._filled = self._freed = self._held = None
        if process is not None and process.is_alive():
            self._commands.put(("close",))
            deadline = time.monotonic() + 10
            while process.is_alive() and time.monotonic() < deadline:
                try:  # what it sent last is read, so that it can flush its queue and exit
                    self._results.get(timeout=0.1)
                except queue.Empty:
                    pass
                except Exception:  # noqa: BLE001 - a message dropped unread, torn as its sender exits, is no error
                    pass
            process.join(timeout=1)
        if process is not None and process.is_alive():
            process.terminate()
            process.join(timeout=5)
        if process is not None and self.cuda and not process.is_alive() and process.pid is not None:
            remove_ipc_files(process.pid)
        for q in (getattr(self, "_commands", None), getattr(self, "_results", None)):
            if q is not None:
                q.close()
                q.cancel_join_thread()
        self._commands = self._results = None  # their semaphores (/dev/shm/sem.mp-*) go with them

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, half of the world may be gone
            pass

    def __len__(self) -> int:
        if (length := self.start()._length) is None:
            raise TypeError("the producer's loader has no len()")
        return length

    # a pass ------------------------------------------------------------------------------------------------
    def _free(self, slot: int) -> None:
        if self.cuda:
            self._freed[slot].record(torch.cuda.current_stream(self.device))
        self._commands.put(("free", slot))

    def _release(self) -> None:
        """Give the producer back the slot of the batch last handed out: the trainer has moved on (it takes
        another batch or starts a pass), so the work it queued on that batch is behind the freed event."""
        if self._held is not None and self.process is not None:
            self._free(self._held)
        self._held = None

    def _message(self, number: int):
        """The next message of pass ``number``; batches of earlier passes are given back, their other messages
        dropped."""
        while True:
            kind, of, *rest = self._get()
            if of == number or (kind == "error" and of is None):
                return kind, rest
            if kind == "batch":
                slot, _, grown = rest
                if grown is not None:
                    self._buffers[slot] = grown
                self._free(slot)

    def __iter__(self) -> Iterator:
        self.start()
        if self._open is not None:  # one pass at a time: an earlier iterator left open is stopped first
            self._open.close()
        self._release()
        self._pass += 1
        carried, self._carried = self._carried, []
        self._open = iterator = Pass(self._iterate(self._pass, deque(carried)))
        return iterator

    def _hand_out(self, slot: int, skeleton, grown):
        """The batch in ``slot``, once the trainer's stream waits for the producer's writes into it."""
        if self._buffers is None:
            raise RuntimeError(CLOSED)
        self._release()
        if grown is not None:
            self._buffers[slot] = grown
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self._filled[slot])
        self._held = slot
        return ring.unpack(skeleton, self._buffers[slot])

    def _iterate(self, number: int, carried: deque) -> Generator:
        """Pass ``number``: first what a stopped pass over a one-shot loader had in the ring (``carried``), then
        the producer's pass, which it asks for at once (unless ``carried`` ends in an error, which ends this
        pass as it would have ended that one)."""
        running = not (carried and carried[-1][0] == "error")
        if running:
            self._commands.put(("epoch", number, sum(kind == "batch" for kind, _ in carried)))
        self.waited = 0.0
        try:
            while carried:
                kind, rest = carried.popleft()
                if kind == "error":
                    raise_error(*rest)
                yield self._hand_out(*rest)
            while running:
                start = time.perf_counter()
                kind, rest = self._message(number)
                self.waited += time.perf_counter() - start
                if kind == "error":
                    running = False
                    raise_error(*rest)
                if kind == "done":
                    running, self.stats = False, rest[0]
                    return
                yield self._hand_out(*rest)
        finally:
            self._open = None
            kept: list[tuple] = self._stop(number) if running and self.process is not None else []
            if self._one_shot and self.process is not None:  # nothing made is lost: the next pass yields it first
                self._carried = list(carried) + kept

    def _stop(self, number: int) -> list:
        """Stop pass ``number`` (the trainer left it early). The batches already sent, and an error that ended
        the pass, are kept for the next pass over a one-shot loader (each batch keeps its slot until then), and
        given back otherwise."""
        self._commands.put(("stop",))
        kept: list[tuple] = []
        while True:
            kind, rest = self._message(number)
            if kind == "done":
                return kept
            if kind == "error":
                return kept + [(kind, rest)]
            slot, skeleton, grown = rest
            if grown is not None:
                self._buffers[slot] = grown
            if self._one_shot:
                kept.append(("batch", (slot, skeleton, None)))
            else:
                self._free(slot)

