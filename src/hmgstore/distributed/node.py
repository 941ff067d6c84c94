"""The processes of this node: who they are, and hmgstore's control channel among them.

:func:`this_node` finds, once per process group, which ranks of the job run on the
same host as this one (by hostname, or ``$HMGSTORE_NODE_ID`` where one host
simulates several), makes a gloo group for them (hmgstore's few control
messages never go through NCCL), and a small board in node-shared memory
where each rank says how many tables it has open, for the peer watch
(:mod:`.watch`), and :func:`share_on_node` over that group (:mod:`.share` holds the protocol).
After ``destroy_process_group()`` and a new ``init_process_group()``, the next call starts afresh.
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from . import watch
from .share import share_in_group

#: How long hmgstore's control messages (set-up, hand-shakes) wait for a rank
#: that is alive but slow: the node leader may be filling a large table.
SETUP_TIMEOUT = datetime.timedelta(minutes=30)


@dataclass
class Node:
    """This process's view of its node: its ranks, the control group and the peer watch's state."""

    world: object  # the default process group this was made for
    group: dist.ProcessGroup  # gloo group of this node's ranks
    ranks: list[int]  # global ranks on this node, ascending
    rank: int
    pids: list[int]
    board: torch.Tensor  # int32 [len(ranks)] in node-shared memory: each rank's open tables
    open_tables: int = 0
    gpu_tables: int = 0  # of them, those whose GPU memory or NCCL exchanges the node's peers depend on
    lost: str | None = None
    lost_at: float = 0.0
    peer_exit_timeout: float | None = 30.0
    watch: threading.Thread | None = field(default=None, repr=False)
    stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def local_rank(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def leader(self) -> int:
        return self.ranks[0]

    def check(self) -> None:
        """Raise :class:`~hmgstore.distributed.PeerLostError` once a peer died with tables open."""
        if self.lost is not None:
            raise watch.PeerLostError(self.lost)

    def opened(self, change: int, gpu: bool = False) -> None:
        """Count this process's open tables (``gpu``: one its peers depend on while it lives: a GPU shard they map,
        a table exchanged over NCCL), here and on the node's board (which peers watch)."""
        self.open_tables += change
        self.gpu_tables += change if gpu else 0
        self.board[self.local_rank] = self.open_tables


_node: Node | None = None
_lock = threading.Lock()


def _default_group():
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def this_node() -> Node:
    """This node's state for the current process group, made on first use (collective over it).

    Takes no arguments. Returns the :class:`Node`: the ranks on this host (by hostname, or
    ``$HMGSTORE_NODE_ID``), their gloo group and the peer watch's state.

    Raises:
        RuntimeError: without ``torch.distributed.init_process_group`` (saying to call it first).
    """
    global _node
    with _lock:
        if _node is not None and _node.world is not _default_group():  # a new process group: start afresh
            watch.stop(_node)
            _node = None
        if _node is None:
            _node = _make_node()
            watch.start(_node)
        return _node


def _make_node() -> Node:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "hmgstore.distributed needs torch.distributed: call torch.distributed.init_process_group() first "
            "(torchrun sets its environment). For one process driving several GPUs use hmgstore.ShardedTensor")
    world = dist.get_world_size()
    everyone = dist.new_group(list(range(world)), backend="gloo", timeout=SETUP_TIMEOUT)
    me = (os.environ.get("HMGSTORE_NODE_ID") or socket.gethostname(), os.getpid())
    info: list[Any] = [None] * world
    dist.all_gather_object(info, me, group=everyone)
    names = list(dict.fromkeys(name for name, _ in info))
    groups = {name: [r for r in range(world) if info[r][0] == name] for name in names}
    mine = None
    for name in names:  # every rank creates every node's group, in the same order
        g = dist.new_group(groups[name], backend="gloo", timeout=SETUP_TIMEOUT)
        if name == me[0]:
            mine = g
    assert mine is not None  # this rank's node is among the names
    ranks, rank = groups[me[0]], dist.get_rank()
    board = share_in_group(lambda: torch.zeros(len(ranks), dtype=torch.int32), mine, ranks, rank, progress=False)
    return Node(_default_group(), mine, ranks, rank, [info[r][1] for r in ranks], board)


def share_on_node(make, *, progress: bool = True, key=None) -> torch.Tensor:
    """A host table in shared memory, built once per node and mapped by each of its processes.

    ``make``: a callable returning the table (torch CPU tensor, numpy array,
    memmap), called on the node's first rank only; or the table itself, used
    on that rank and ignored on the others. Collective: every rank calls it.
    Returns a CPU tensor over the shared pages (the same memory in every
    process of the node; writes are seen by all). The pages go when the last
    process drops its tensor or exits. Raises MemoryError when /dev/shm is
    too small (see :func:`hmgstore.memory.create_segment`), and RuntimeError
    on every rank if the first rank's ``make`` fails. ``key``: what this rank
    means by the table (any picklable value, e.g. the file it reads): when
    given, the node's ranks compare theirs first and all raise ValueError
    if they differ, since every rank gets the first rank's table.
    """
    state = this_node()
    return share_in_group(make, state.group, state.ranks, state.rank, progress, key=key)
