"""The peer watch: every process watches the others of its node.

When a peer dies without closing its tables (killed, crashed), its GPU shard
can no longer be read: this process's gathers raise :class:`PeerLostError`
at once, the default process group is aborted (so a pending NCCL collective
fails instead of hanging), and after ``peer_exit_timeout`` seconds a process
still running exits with status 1 after saying why. A peer that closed its
tables may leave at any time, as may one that exits normally with only CPU
tables open (:func:`_leaving`); a killed one, or one that leaves a GPU shard
or an NCCL-exchanged table open, counts as lost.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time

import torch.distributed as dist

from ..memory.shared import process_alive

log = logging.getLogger(__name__)

#: How often each process looks at its node's peers.
WATCH_SECONDS = 0.25


class PeerLostError(RuntimeError):
    """A process this one shares tables or exchanges with has exited (or an exchange with it failed).

    Raised, never taken: by gathers of a :class:`~hmgstore.distributed.DistributedTensor` (and its ``check()``)
    once a process of this node died with tables open; by :class:`~hmgstore.distributed.ClusterTensor` gathers,
    :func:`~hmgstore.distributed.gather_many` and :class:`~hmgstore.distributed.DistributedNeighborSampler`
    when a counterpart on another machine is gone, did not answer within
    :data:`~hmgstore.distributed.EXCHANGE_TIMEOUT`, or an earlier exchange failed (every later one raises at
    once). The message names the ranks. A RuntimeError: the job cannot go on; restart it (``torchrun
    --max-restarts``).
    """


def start(state) -> None:
    """Watch the peers of ``state`` (a :class:`hmgstore.distributed.node.Node`) on a daemon thread."""
    state.watch = threading.Thread(target=_watch, args=(state,), name="hmgstore-peer-watch", daemon=True)
    state.watch.start()
    atexit.register(stop, state)
    atexit.register(_leaving, state)  # runs before stop (atexit runs last registered first)


def _leaving(state) -> None:
    """At a normal exit (not a kill: no exit hook runs then), a process with no GPU tables open tells its peers it
    left on purpose: its board entry goes to 0, so they do not end 30 s later. What its CPU tables served stays:
    node-shared pages outlive it, and an exchange with it fails at once over gloo (PeerLostError). A GPU shard or
    an NCCL-exchanged table open at exit still counts as lost: its memory is gone and NCCL would wait for it."""
    if state.gpu_tables == 0:
        with contextlib.suppress(Exception):  # at interpreter exit the board may already be unmapped
            state.board[state.local_rank] = 0


def stop(state) -> None:
    """Stop and join the watch. Called at exit too: a daemon thread caught inside torch at
    shutdown ends the process with std::terminate."""
    state.stop.set()
    if state.watch is not None and state.watch is not threading.current_thread():
        state.watch.join(timeout=5)


def _watch(state) -> None:
    """Poll the node's peers; when one dies with tables open, fail this process's gathers,
    then the process itself."""
    peers = [k for k in range(len(state.ranks)) if k != state.local_rank]
    board = state.board.numpy()  # plain loads: no torch call (and no GIL release inside torch) in this thread
    while state.lost is None:
        if state.stop.wait(WATCH_SECONDS):
            return
        for k in peers:
            if board[k] == 0 or process_alive(state.pids[k]):
                continue
            state.lost = (f"rank {state.ranks[k]} (pid {state.pids[k]}) on this node exited without closing its "
                          "hmgstore tables (killed, crashed, or ended without calling close() on them); what it "
                          "served (its GPU shard, its side of the exchanges) is gone. This process cannot go on: "
                          "restart the job (torchrun --max-restarts restarts it for you), and have every rank close "
                          "its tables before it exits")
            state.lost_at = time.monotonic()
            break
    if state.open_tables == 0:
        log.warning("hmgstore: %s", state.lost)
        return
    print(f"hmgstore: ERROR: {state.lost}", file=sys.stderr, flush=True)
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None and dist.is_initialized():
        with contextlib.suppress(Exception):  # unblocks a collective waiting for the dead rank
            abort()
    if state.peer_exit_timeout is None:
        return
    deadline = state.lost_at + state.peer_exit_timeout
    while time.monotonic() < deadline:
        if state.open_tables == 0 or state.stop.wait(WATCH_SECONDS):
            return
    print(f"hmgstore: exiting after waiting {state.peer_exit_timeout:g} s for this process to stop on its own "
          f"(peer_exit_timeout): {state.lost}", file=sys.stderr, flush=True)
    os._exit(1)
