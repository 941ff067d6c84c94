"""One process per GPU (torchrun): tables sharded over the GPUs of a node.

Built on torch.distributed; call ``init_process_group`` first (any backend:
hmgstore makes its own gloo groups for its few control messages).

- :func:`share_on_node` puts a host table in shared memory once per node: the
  node's first rank builds it, the others map the same pages (no per-process
  copy). Its name is removed as soon as every process has mapped it, so
  nothing is left behind however the processes end.
- :func:`shard` builds, collectively, the node's sharded table: each process
  allocates and fills its own shard (and a copy of the replicated hot rows)
  on its GPU, the shards' CUDA IPC handles are exchanged, and each process
  gets a :class:`~hmgstore.HybridTensor` view reading its own rows, its peers'
  shards over NVLink and the rest from the shared host table, in one launch.
  Across nodes each node holds the whole table (sharded over its own GPUs).
- Every process watches the other processes of its node. When one dies
  without closing its tables, gathers raise :class:`PeerLostError` at once,
  the default process group is aborted (so a pending NCCL collective fails
  instead of hanging), and after ``peer_exit_timeout`` seconds a process
  still running exits with status 1 after saying why.

On the CPU (gloo, no GPU) the same calls work: views gather from the shared
host table with torch, and the sharing, checks and watching are the same.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import socket
import sys
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import memory
from . import placement as placement_mod
from .memory import PinnedHost, as_host_tensor, row_layout
from .sharded import allocate, plan
from .tensor import HybridTensor, fill_rows, resolve_device

log = logging.getLogger(__name__)

#: How long hmgstore's control messages (set-up, hand-shakes) wait for a rank
#: that is alive but slow: the node leader may be filling a large table.
SETUP_TIMEOUT = datetime.timedelta(minutes=30)
#: How often each process looks at its node's peers.
WATCH_SECONDS = 0.25


class PeerLostError(RuntimeError):
    """A process of this node that shares a table with this one has exited."""


@dataclass
class _Node:
    """This process's view of the job: its node's ranks and hmgstore's control channel."""

    group: object  # gloo group of this node's ranks
    ranks: list[int]  # global ranks on this node, ascending
    rank: int
    pids: list[int]
    board: torch.Tensor  # int32 [len(ranks)] in node-shared memory: each rank's open tables
    open_tables: int = 0
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
        if self.lost is not None:
            raise PeerLostError(self.lost)


_node: _Node | None = None
_lock = threading.Lock()


def node() -> _Node:
    """This node's control state, made on first use (collective over the default group)."""
    global _node
    with _lock:
        if _node is None:
            _node = _make_node()
        return _node


def _make_node() -> _Node:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "hmgstore.distributed needs torch.distributed: call torch.distributed.init_process_group() first "
            "(torchrun sets its environment). For one process driving several GPUs use hmgstore.ShardedTensor")
    world = dist.get_world_size()
    everyone = dist.new_group(list(range(world)), backend="gloo", timeout=SETUP_TIMEOUT)
    me = (os.environ.get("HMGSTORE_NODE_ID") or socket.gethostname(), os.getpid())
    info = [None] * world
    dist.all_gather_object(info, me, group=everyone)
    names = list(dict.fromkeys(name for name, _ in info))
    groups = {name: [r for r in range(world) if info[r][0] == name] for name in names}
    mine = None
    for name in names:  # every rank creates every node's group, in the same order
        g = dist.new_group(groups[name], backend="gloo", timeout=SETUP_TIMEOUT)
        if name == me[0]:
            mine = g
    ranks, rank = groups[me[0]], dist.get_rank()
    board = _node_shared(lambda: torch.zeros(len(ranks), dtype=torch.int32), mine, ranks, rank, progress=False)
    state = _Node(mine, ranks, rank, [info[r][1] for r in ranks], board)
    state.watch = threading.Thread(target=_watch, args=(state,), name="hmgstore-peer-watch", daemon=True)
    state.watch.start()
    atexit.register(_stop_watch, state)
    return state


def _stop_watch(state: _Node) -> None:
    """Stop and join the watch before the interpreter goes: a daemon thread caught inside torch
    at shutdown ends the process with std::terminate."""
    state.stop.set()
    if state.watch is not None and state.watch is not threading.current_thread():
        state.watch.join(timeout=5)


def _opened(state: _Node, change: int) -> None:
    """Count this process's open tables, here and on the node's board (which peers watch)."""
    state.open_tables += change
    state.board[state.local_rank] = state.open_tables


def _watch(state: _Node) -> None:
    """Poll the node's peers; when one dies with tables open (a peer that closed its tables
    may leave), fail this process's gathers, then the process itself."""
    peers = [k for k in range(len(state.ranks)) if k != state.local_rank]
    board = state.board.numpy()  # plain loads: no torch call (and no GIL release inside torch) in this thread
    while state.lost is None:
        if state.stop.wait(WATCH_SECONDS):
            return
        for k in peers:
            if board[k] == 0 or memory.process_alive(state.pids[k]):
                continue
            state.lost = (f"rank {state.ranks[k]} (pid {state.pids[k]}) on this node exited without closing its "
                          "hmgstore tables (killed or crashed); its GPU shard can no longer be read. This "
                          "process cannot go on: restart the job (torchrun --max-restarts restarts it for you)")
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


def _node_shared(make, group, ranks: list[int], rank: int, progress: bool) -> torch.Tensor:
    """The body of :func:`share_on_node` for a known node group."""
    meta = [None]
    if rank == ranks[0]:
        try:
            source, _ = as_host_tensor(make() if callable(make) else make)
            name, shared = memory.create_segment(tuple(source.shape), source.dtype)
            try:
                memory.copy_in_chunks(shared, source, progress, "sharing host table")
            except BaseException:
                memory.unlink_segment(name)
                raise
            meta[0] = ("ok", name, tuple(source.shape), source.dtype)
        except Exception as err:  # the others must hear of it, or they wait for the table forever
            meta[0] = ("error", f"{type(err).__name__}: {err}")
            dist.broadcast_object_list(meta, src=ranks[0], group=group)
            raise
    dist.broadcast_object_list(meta, src=ranks[0], group=group)
    if meta[0][0] == "error":
        raise RuntimeError(f"rank {ranks[0]} (this node's first) could not build the shared table: {meta[0][1]}")
    _, name, shape, dtype = meta[0]
    try:
        if rank != ranks[0]:
            shared = memory.attach_segment(name, shape, dtype)
    finally:
        dist.barrier(group=group)  # everyone has mapped it (or failed to)
        if rank == ranks[0]:
            memory.unlink_segment(name)
    return shared


def share_on_node(make, *, progress: bool = True) -> torch.Tensor:
    """A host table in shared memory, built once per node and mapped by each of its processes.

    ``make``: a callable returning the table (torch CPU tensor, numpy array,
    memmap), called on the node's first rank only; or the table itself, used
    on that rank and ignored on the others. Collective: every rank calls it.
    Returns a CPU tensor over the shared pages (the same memory in every
    process of the node; writes are seen by all). The pages go when the last
    process drops its tensor or exits. Raises MemoryError when /dev/shm is
    too small (see :func:`hmgstore.memory.create_segment`), and RuntimeError
    on every rank if the first rank's ``make`` fails.
    """
    state = node()
    return _node_shared(make, state.group, state.ranks, state.rank, progress)


def _signature(source: torch.Tensor, p: placement_mod.Placement) -> tuple:
    crc = 0
    for rows in p.resident:
        crc = zlib.crc32(rows.numpy().tobytes(), crc)
    return tuple(source.shape), str(source.dtype), p.tiers, p.bounds, crc


class DistributedTensor:
    """This process's part of a table sharded over its node's GPUs; see :func:`shard`.

    ``table``: the :class:`~hmgstore.HybridTensor` view to gather with (pass
    it to PyG's or DGL's adapters); ``placement``: the node-wide placement,
    where shard ``s`` belongs to the node's ``s``-th rank. ``close()`` is
    collective over the node; it waits until no peer reads this shard.
    """

    def __init__(self, state: _Node, source: torch.Tensor, placement, view: HybridTensor, *,
                 buffer=None, opened=(), pinned=None, tiers=None):
        self._state, self._source, self.placement, self.table = state, source, placement, view
        self._buffer, self._opened, self._pinned, self._tiers = buffer, list(opened), pinned, tiers or {}
        self._closed = False

    @property
    def device(self) -> torch.device:
        return self.table.device

    def gather(self, index, **kwargs) -> torch.Tensor:
        return self.table.gather(index, **kwargs)

    __getitem__ = gather

    def check(self) -> None:
        """Raise :class:`PeerLostError` if a process sharing this table has died."""
        self._state.check()

    def close(self, timeout: float = 120.0) -> None:
        """Free this process's shard, close its peers' and unpin host memory (collective, idempotent).

        Waits (at most ``timeout`` seconds) until every process of the node
        has stopped gathering; skips the wait when a peer has died.
        """
        if self._closed:
            return
        self._closed = True
        state = self._state
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if state.lost is None:
            try:
                dist.monitored_barrier(group=state.group, timeout=datetime.timedelta(seconds=timeout))
            except Exception as err:  # a peer that is gone cannot read our shard any more
                log.warning("hmgstore: not every process of the node reached close() (%s); freeing anyway", err)
        from . import _cuda

        self.table.close()
        errors = []
        for ptr in self._opened:
            try:
                _cuda.ipc_close(ptr, self.device.index)
            except Exception as err:
                errors.append(err)
        self._opened.clear()
        self._tiers.clear()
        if self._buffer is not None:
            self._buffer.free()
            self._buffer = None
        if self._pinned is not None:
            self._pinned.release()
            self._pinned = None
        _opened(state, -1)
        if errors:
            raise RuntimeError(f"could not close {len(errors)} peer mapping(s): {errors[0]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        p = self.placement
        sizes = ", ".join(f"{t}={hi - lo}" for t, lo, hi in zip(p.tiers, p.bounds, p.bounds[1:]) if t != "host")
        return (f"DistributedTensor(rank={self._state.rank}, device={self.device}, shape={tuple(self._source.shape)}, "
                f"{sizes}, host={p.num_rows - p.resident_rows})")


def shard(source, *, gpu_budget, hot_order, replicate=0, device=None, max_sms: int | None = None,
          progress: bool = True, peer_exit_timeout: float | None = 30.0) -> DistributedTensor:
    """Shard ``source`` over the GPUs of this node, one process per GPU (collective).

    Every rank of the job calls it with the same table (best a
    :func:`share_on_node` tensor, so the node holds one copy), the same
    ``gpu_budget``/``hot_order``/``replicate`` (as for
    :class:`~hmgstore.ShardedTensor`) and its own ``device`` (default: the
    current GPU; set it with ``torch.cuda.set_device(local_rank)``). The
    node's ``s``-th rank owns shard ``s``. Ranks that disagree on the table
    or placement get a ValueError naming what differs. A pair of GPUs without
    peer access reads each other's rows from host memory, with a warning.
    ``peer_exit_timeout``: seconds this process may go on after a node peer
    died before hmgstore ends it (None: never).

    Returns a :class:`DistributedTensor`; gather with its ``.table``.
    """
    state = node()
    state.peer_exit_timeout = peer_exit_timeout
    state.check()
    device = resolve_device(device)
    source, read_only = as_host_tensor(source)
    p = plan(source, len(state.ranks), gpu_budget, hot_order, replicate)
    cuda = device.type == "cuda"
    if cuda:
        from . import _cuda

        _cuda.check_device(device)
    mine = (_signature(source, p), _cuda.pci_bus_id(device.index) if cuda else None, device.type)
    everyone = [None] * len(state.ranks)
    dist.all_gather_object(everyone, mine, group=state.group)
    for k, theirs in enumerate(everyone):
        if theirs[0] != mine[0] or theirs[2] != mine[2]:
            raise ValueError(
                f"rank {state.ranks[k]} builds a different table than rank {state.rank}: (shape, dtype, tiers, "
                f"bounds, checksum of resident rows, device type) {(*theirs[0], theirs[2])} vs "
                f"{(*mine[0], mine[2])}; pass every rank the same source, gpu_budget, hot_order and replicate")
    if not cuda:
        result = DistributedTensor(state, source, p, HybridTensor(source, "cpu"))
        result.table._owner = result  # gathers check the node's peers here too
        _opened(state, +1)
        return result
    return _shard_cuda(state, source, read_only, p, device, [bus for _, bus, _ in everyone], max_sms, progress)


def _local_ordinal(bus_id: str) -> int | None:
    from . import _cuda

    for k in range(torch.cuda.device_count()):
        if _cuda.pci_bus_id(k) == bus_id:
            return k
    return None


def _shard_cuda(state: _Node, source, read_only, p, device, buses, max_sms, progress) -> DistributedTensor:
    from . import _cuda

    me, index = state.local_rank, device.index
    row_bytes = row_layout(source)[0]
    tiers, opened, bases, buffer, pinned = {}, [], {}, None, None

    def undo():
        for ptr in opened:
            with contextlib.suppress(Exception):
                _cuda.ipc_close(ptr, index)
        if buffer is not None:
            buffer.free()
        if pinned is not None:
            pinned.release()

    try:  # this rank's own tiers; any failure is told to the others, who would wait for its handle
        pinned = PinnedHost(source, device, read_only, progress)
        rows = p.rows_of(f"shard{me}")
        buffer = _cuda.DeviceBuffer(len(rows) * row_bytes, index)
        fill_rows(pinned, rows, buffer.as_tensor((len(rows), *source.shape[1:]), source.dtype), device)
        if "replica" in p.tiers:
            tiers["replica"] = allocate(p, "replica", source, device)
            fill_rows(pinned, p.rows_of("replica"), tiers["replica"], device)
            bases["replica"] = (tiers["replica"].data_ptr(), row_bytes)
        payload = ("ok", buffer.ipc_handle())
    except Exception as err:
        payload = ("error", f"{type(err).__name__}: {err}")
    handles = [None] * len(state.ranks)
    dist.all_gather_object(handles, payload, group=state.group)
    failed = [(state.ranks[k], h[1]) for k, h in enumerate(handles) if h[0] == "error"]
    if failed:
        undo()
        raise RuntimeError("could not build the sharded table: " +
                           "; ".join(f"rank {r}: {why}" for r, why in failed))
    try:
        unreachable = []
        for s, ((_, handle), bus) in enumerate(zip(handles, buses)):
            tier = f"shard{s}"
            if s == me:
                bases[tier] = (buffer.ptr, row_bytes)
                continue
            why = _open_peer(handle, bus, device, opened, bases, tier, row_bytes)
            if why is not None:
                unreachable.append(tier)
                warnings.warn(f"hmgstore: rank {state.rank} reads the rows of rank {state.ranks[s]}'s shard from "
                              f"pinned host memory over PCIe: {why}", RuntimeWarning, stacklevel=3)
        if not p.has_host_tier and not unreachable:  # no row is read from the host
            pinned.release()
            pinned = None
        result = DistributedTensor(state, source, p, None, buffer=buffer, opened=opened, pinned=pinned, tiers=tiers)
        result.table = HybridTensor._view(source, device, p, bases, pinned=pinned, owner=result,
                                          unreachable=unreachable, max_sms=max_sms)
    except BaseException:
        undo()
        raise
    _opened(state, +1)
    dist.barrier(group=state.group)  # every shard is filled and mapped before anyone gathers
    return result


def _open_peer(handle: bytes, bus: str, device: torch.device, opened: list, bases: dict, tier: str,
               row_bytes: int) -> str | None:
    """Map a peer's shard into ``bases[tier]``; returns why it cannot be read, or None."""
    from . import _cuda

    peer = _local_ordinal(bus)
    if peer is None:
        return f"its GPU ({bus}) is not visible to this process (CUDA_VISIBLE_DEVICES)"
    if not _cuda.can_access_peer(device.index, peer):
        return f"{device} has no peer access to cuda:{peer}"
    try:
        ptr = _cuda.ipc_open(handle, device.index)
    except Exception as err:
        return f"opening its CUDA IPC handle failed ({err})"
    opened.append(ptr)
    bases[tier] = (ptr, row_bytes)
    return None
