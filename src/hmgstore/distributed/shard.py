"""Tables sharded over the GPUs of a node, one process per GPU: :func:`shard`.

Collective: each process allocates and fills its own shard (and a copy of
the replicated hot rows) on its GPU, the shards' handles are exchanged over
the node's gloo group (cuMemCreate memory, its descriptor passed over a Unix
socket; :mod:`hmgstore.cuda.vmm`), and each process gets a
:class:`~hmgstore.HybridTensor` view reading its own rows, its peers' shards
over NVLink and the rest from the host table, in one launch. Across nodes
each node holds the whole table, sharded over its own GPUs.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import warnings
import zlib
from typing import Any, cast

import torch
import torch.distributed as dist

from ..cuda import check_device, peer
from ..gather.plan import fill_rows
from ..graph import Topology
from ..graph.csc import CSC
from ..memory.pinned import PinnedHost, as_host_tensor, row_layout
from ..rows import checks, formats
from ..rows.hotness import parse_bytes
from ..rows.ids import rows_only
from ..rows.placement import Placement, host_only, sharded
from ..table.interface import gather_each
from ..table.sharded import allocate_tier
from ..table.tensor import HybridTensor
from ..util.device import resolve_device
from .node import Node, this_node
from .share import share_in_group

log = logging.getLogger(__name__)

#: Rows of the source whose bytes go into the checksum ranks compare.
CHECKSUM_ROWS = 64


def _signature(source: torch.Tensor, p: Placement) -> tuple:
    """What every rank of a node must agree on: the table's shape and dtype, the placement, and a
    checksum of the placement's resident rows and of the bytes of rows spread through the table."""
    placed = 0
    for rows in p.resident:
        placed = zlib.crc32(rows.numpy().tobytes(), placed)
    n = source.shape[0]
    k = min(n, CHECKSUM_ROWS)  # rows spread evenly, in int64 (float32 spacing rounds past 2**24 rows)
    sample = source[torch.arange(k) * (n - 1) // max(1, k - 1)] if n else source[:0]
    data = zlib.crc32(sample.contiguous().view(torch.uint8).numpy().tobytes())
    return tuple(source.shape), str(source.dtype), p.names, p.bounds, placed, data


class DistributedTensor:
    """This process's part of a table sharded over its node's GPUs; made by :func:`shard`, not by hand.

    ``table``: the :class:`~hmgstore.HybridTensor` view to gather with (pass
    it to PyG's or DGL's adapters); ``placement``: the node-wide placement,
    where shard ``s`` belongs to the node's ``s``-th rank. ``close()`` is
    collective over the node; it waits until no peer reads this shard.
    Gathers (``t[ids]``, :meth:`gather`) take what :meth:`HybridTensor.gather <hmgstore.HybridTensor.gather>`
    takes and return ``[*ids.shape, *row_shape]`` rows on ``device``.

    Raises:
        TypeError: in a gather, for ids that are not integers (floats, bools) and for ``t[i, j]`` (one index
            only: rows); in :meth:`close`, for a ``timeout`` that is not a number.
        ValueError: in :meth:`close`, for a negative or non-finite ``timeout``.
        IndexError: in a gather, for an id outside ``[0, num_rows)`` (its value and position).
        RuntimeError: in a gather after :meth:`close`.
        PeerLostError: in a gather (and :meth:`check`) once a process of the node sharing the table has died.
    """

    table: HybridTensor  # the view this rank gathers through (set by the builder when made without one)

    def __init__(self, state: Node, source: torch.Tensor, placement, view: HybridTensor | None, *,
                 buffer=None, opened=(), pinned=None, tiers=None):
        self._state, self._source, self.placement = state, source, placement
        self.table = view  # type: ignore[assignment]  # None only until the builder sets it
        self._buffer, self._opened, self._pinned, self._tiers = buffer, list(opened), pinned, tiers or {}
        self._closed = False

    @property
    def device(self) -> torch.device:
        return self.table.device

    @property
    def shape(self) -> torch.Size:
        return self.table.shape

    @property
    def row_shape(self) -> torch.Size:
        return self.table.row_shape

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def dense(self) -> torch.Tensor:
        """The whole table as a CPU tensor: the node's host table itself (every row is there)."""
        return self._source

    @property
    def source(self) -> torch.Tensor:
        """The node's host table, every row of it (what :meth:`dense` hands out)."""
        return self._source

    def __len__(self) -> int:
        return self.table.num_rows

    def gather(self, index, **kwargs) -> torch.Tensor:
        """Rows ``index``, as :meth:`HybridTensor.gather` takes its keywords (another raises TypeError naming
        this method)."""
        checks.keywords("DistributedTensor.gather", kwargs, checks.takes(HybridTensor.gather, without=("index",)),
                        ("index",))
        return self.table.gather(index, **kwargs)

    gather_batch = staticmethod(gather_each)  # one request at a time (hmgstore.FeatureTable's batch hook)

    def __getitem__(self, index) -> torch.Tensor:
        """``table[index]``: rows ``index``; one index only, as for :class:`~hmgstore.HybridTensor`
        (``t[3, 1]`` raises TypeError saying how to index)."""
        return self.table.gather(rows_only(index))

    def check(self) -> None:
        """Raise :class:`PeerLostError` if a process sharing this table has died."""
        self._state.check()

    def close(self, timeout: float = 120.0) -> None:
        """Free this process's shard, close its peers' and unpin host memory (collective, idempotent).

        Waits (at most ``timeout`` seconds) until every process of the node
        has stopped gathering; skips the wait when a peer has died. Raises TypeError for a ``timeout`` that is not
        a number, ValueError for a negative or non-finite one (before anything is freed).
        """
        timeout = cast(float, checks.seconds(timeout, "timeout"))  # None refused: allow_none is off
        if self._closed:
            return
        self._closed = True
        state, gpu = self._state, self._buffer is not None  # a GPU shard, which peers map
        self.table.close()  # refuses new gathers, waits for those in flight and for the device
        if state.lost is None:
            try:
                dist.monitored_barrier(group=state.group, timeout=datetime.timedelta(seconds=timeout))
            except Exception as err:  # a peer that is gone cannot read our shard any more
                log.warning("hmgstore: not every process of the node reached close() (%s); freeing anyway", err)

        errors = []
        for mapping in self._opened:
            try:
                mapping.close()
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
        state.opened(-1, gpu)
        if errors:
            raise RuntimeError(f"could not close {len(errors)} peer mapping(s): {errors[0]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        p = self.placement
        sizes = ", ".join(f"{t.name}={t.size}" for t in p.tiers if t.name != "host")
        return (f"DistributedTensor(rank={self._state.rank}, device={self.device}, shape={tuple(self._source.shape)}, "
                f"{sizes}, host={p.num_rows - p.resident_rows})")


def shard(source, *, gpu_budget, hot_order, replicate=0, device=None, max_sms: int | None = None,
          compress=None, progress: bool = True, peer_exit_timeout: float | None = 30.0) -> DistributedTensor:
    """Shard ``source`` over the GPUs of this node, one process per GPU (collective).

    Every rank of the job calls it with the same table (best a
    :func:`share_on_node` tensor, so the node holds one copy), the same
    ``gpu_budget``/``hot_order``/``replicate`` (as for
    :class:`~hmgstore.ShardedTensor`) and its own ``device`` (default: the
    current GPU; set it with ``torch.cuda.set_device(local_rank)``). The
    node's ``s``-th rank owns shard ``s``. A pair of GPUs without
    peer access reads each other's rows from host memory, with a warning. A
    rank that cannot build its own shard (GPU memory) makes every rank raise
    RuntimeError naming it.

    Args:
        source: ``[N, *row_shape]`` torch CPU tensor, numpy array or memmap, the same on every rank of the node.
        gpu_budget: bytes each GPU gives to the table (int or ``"20GB"``), the replica included.
        hot_order: 1-D row ids hottest first, each in ``[0, N)`` at most once (it may list only some rows).
        replicate: bytes (int or string) of the hottest rows copied on every GPU; at most ``gpu_budget``.
        device: this rank's device, ``"cuda:k"`` or ``"cpu"`` (gathers then read the shared host table).
        max_sms: an integer >= 1 or None, as for :class:`~hmgstore.HybridTensor` (checked on the CPU too).
        compress: ``"int8"``, ``"float8"``, ``"bfloat16"`` or ``"float16"`` (:mod:`hmgstore.rows.formats`):
            the node's first rank encodes the float32 ``source`` once into node-shared memory, and every tier
            (shards, replica, host) keeps rows in that format, decoded by the gather; ``gpu_budget`` and
            ``replicate`` then count stored bytes (int8 holds about 3.6x the rows of float32).
        progress: progress bars while pinning and filling.
        peer_exit_timeout: seconds (a finite number >= 0) this process may go on after a node peer died before
            hmgstore ends it; None: never.

    Returns:
        A :class:`DistributedTensor`; gather with its ``.table``.

    Raises:
        RuntimeError: without ``torch.distributed.init_process_group``; for a CUDA device where torch sees no GPU.
        TypeError: for a source that is not a CPU table (a CUDA or sparse tensor, another kind), float or bool
            ``hot_order`` ids, a ``peer_exit_timeout`` that is not a number or None.
        ValueError: when ranks of the node disagree on the table, its placement or the device type (naming
            them); for a missing ``gpu_budget`` or ``hot_order``, a budget or ``replicate`` that is not a byte
            count, ``replicate`` above ``gpu_budget``, a repeated ``hot_order`` id, an unknown ``compress`` or
            one of a table that is not float32, a bad ``max_sms`` (0, negative, a float, a bool, a string),
            a negative or non-finite ``peer_exit_timeout``, more than 8 ranks on the node, a device that is
            neither cpu nor cuda.
        IndexError: for a ``hot_order`` id outside ``[0, N)``.
    """
    max_sms = cast("int | None", checks.sm_cap(max_sms))  # before any collective: the CPU path has no kernel
    peer_exit_timeout = checks.seconds(peer_exit_timeout, "peer_exit_timeout", allow_none=True)
    state = this_node()
    state.peer_exit_timeout = peer_exit_timeout
    state.check()
    device = resolve_device(device)
    source, read_only = as_host_tensor(source)
    fmt, shape = formats.get(compress), tuple(source.shape)
    if fmt is not None:  # the node's rows encoded once, by its first rank, into node-shared memory
        if source.dtype != torch.float32:
            raise ValueError(f"compress={compress!r} encodes float32 rows; this table is {source.dtype}")
        source = share_in_group(source, state.group, state.ranks, state.rank, progress, stored=fmt)
        read_only = False
    p = sharded(source.shape[0], hot_order, row_layout(source)[0], len(state.ranks), gpu_budget,
                replicate)
    cuda = device.type == "cuda"
    if cuda:
        check_device(device)
    everyone = _same_on_every_rank(state, (_signature(source, p), peer.pci_bus_id(device.index) if cuda else None,
                                           device.type))
    if not cuda:
        result = DistributedTensor(state, source, p, None)
        # Gathers check the node's peers here too.
        result.table = HybridTensor.from_tiers(source, "cpu", host_only(p.num_rows), (), owner=result,
                                               stored=fmt, shape=shape, read_only=read_only)
        state.opened(+1)
        return result
    return _shard_cuda(state, source, read_only, p, device, [bus for _, bus, _ in everyone], max_sms, progress,
                       fmt, shape)


def _same_on_every_rank(state: Node, mine: tuple) -> list:
    """Every rank's ``(signature, PCI bus, device type)`` (collective), after checking that all describe one table
    on one kind of device: ValueError naming the rank that differs."""
    everyone: list[Any] = [None] * len(state.ranks)
    dist.all_gather_object(everyone, mine, group=state.group)
    for k, theirs in enumerate(everyone):
        if theirs[0] != mine[0] or theirs[2] != mine[2]:
            raise ValueError(
                f"rank {state.ranks[k]} builds a different table than rank {state.rank}: (shape, dtype, tiers, "
                f"bounds, checksum of resident rows, checksum of sampled rows' data, device type) "
                f"{(*theirs[0], theirs[2])} vs {(*mine[0], mine[2])}; pass every rank the same source "
                "(hmgstore.distributed.share_on_node builds it once per node), gpu_budget, hot_order and replicate")
    return everyone


def _shard_cuda(state: Node, source, read_only, p, device, buses, max_sms, progress, fmt, shape) -> DistributedTensor:
    me, index = state.local_rank, device.index
    row_bytes = row_layout(source)[0]
    tiers: dict[str, torch.Tensor] = {}
    opened: list[peer.PeerMapping] = []
    readable: list = []
    buffer: peer.DeviceBuffer | None = None
    pinned: PinnedHost | None = None

    def undo():
        for mapping in opened:
            with contextlib.suppress(Exception):
                mapping.close()
        if buffer is not None:
            buffer.free()
        if pinned is not None:
            pinned.release()

    try:  # this rank's own tiers; any failure is told to the others, who would wait for its handle
        pinned = PinnedHost(source, device, read_only, progress)
        rows = p.rows_of(f"shard{me}")
        buffer = peer.DeviceBuffer(len(rows) * row_bytes, index)
        fill_rows(pinned, rows, buffer.as_tensor((len(rows), *source.shape[1:]), source.dtype), device)
        if "replica" in p.names:
            tiers["replica"] = allocate_tier(p, "replica", source, device)
            fill_rows(pinned, p.rows_of("replica"), tiers["replica"], device)
            readable.append(p.tier("replica").bind(tiers["replica"].data_ptr(), row_bytes, fmt))
        payload: tuple[str, tuple | str] = ("ok", buffer.handle())
    except Exception as err:
        payload = ("error", f"{type(err).__name__}: {err}")
    handles: list[Any] = [None] * len(state.ranks)
    dist.all_gather_object(handles, payload, group=state.group)
    failed = [(state.ranks[k], h[1]) for k, h in enumerate(handles) if h[0] == "error"]
    if failed:
        undo()
        raise RuntimeError("could not build the sharded table: " +
                           "; ".join(f"rank {r}: {why}" for r, why in failed))
    assert buffer is not None and pinned is not None  # every rank, this one too, built its tiers
    try:
        unreachable = []
        for s, ((_, handle), bus) in enumerate(zip(handles, buses)):
            tier = p.tier(f"shard{s}")
            if s == me:
                readable.append(tier.bind(buffer.ptr, row_bytes, fmt, own=True))
                continue
            why = _open_peer(handle, bus, device, opened, readable, tier, row_bytes, fmt)
            if why is not None:
                unreachable.append(tier.name)
                warnings.warn(f"hmgstore: rank {state.rank} reads the rows of rank {state.ranks[s]}'s shard from "
                              f"pinned host memory over PCIe: {why}", RuntimeWarning, stacklevel=3)
        if not p.has_host_tier and not unreachable:  # no row is read from the host
            pinned.release()
            pinned = None
        result = DistributedTensor(state, source, p, None, buffer=buffer, opened=opened, pinned=pinned, tiers=tiers)
        result.table = HybridTensor.from_tiers(source, device, p, readable, owner=result, pinned=pinned,
                                               unreachable=unreachable, max_sms=max_sms, stored=fmt, shape=shape,
                                               read_only=read_only)
    except BaseException:
        undo()
        raise
    state.opened(+1, gpu=True)
    dist.barrier(group=state.group)  # every shard is filled and mapped before anyone gathers
    buffer.stop_sharing()  # every peer has mapped it
    return result


def _open_peer(handle: tuple, bus: str, device: torch.device, opened: list, readable: list, tier,
               row_bytes: int, fmt=None) -> str | None:
    """Map a peer's shard and add ``tier`` bound to it to ``readable``; returns why it cannot be read, or None."""
    ordinal = peer.local_ordinal(bus)
    if ordinal is None:
        return f"its GPU ({bus}) is not visible to this process (CUDA_VISIBLE_DEVICES)"
    if not peer.can_access_peer(device.index, ordinal):
        return f"{device} has no peer access to cuda:{ordinal}"
    try:
        mapping = peer.open_handle(handle, device.index)
    except Exception as err:
        return f"mapping its GPU memory ({handle[0]}) failed ({err})"
    opened.append(mapping)
    readable.append(tier.bind(mapping.ptr, row_bytes, fmt))
    return None


def sharded_topology(csc, device=None, *, gpu_budget, hot_order=None, replicate=0, progress: bool = True,
                     weight=None, src_time=None, edge_time=None):
    """A :class:`~hmgstore.graph.Topology` whose adjacency lists are sharded over this node's GPUs (collective).

    Every rank of the node calls it with the same ``csc`` (best its arrays
    from :func:`share_on_node`), budgets and ``hot_order`` (destination ids,
    hottest first; default: by degree). When the whole topology fits in
    ``gpu_budget`` bytes it is simply held on each GPU. Otherwise its
    neighbour ids are cut into chunks of :data:`~hmgstore.graph.topology.CHUNK_IDS`,
    and the chunks are sharded as :func:`shard` shards a table: the hottest
    ``replicate`` bytes of them on every GPU, each GPU's shard of the next
    hottest (read by the others over NVLink), the rest read zero-copy from
    host memory. ``close()`` on the topology (or its sampler) is collective. ``weight``: edge weights for
    weighted sampling (see :class:`~hmgstore.graph.Topology`), chunked and sharded alike; ``src_time`` /
    ``edge_time``: times for temporal sampling, held whole on each GPU. On the CPU nothing is sharded (sampling
    reads host memory) and no process group is needed; the arguments are checked alike. Chunks that are sharded
    raise what :func:`shard` raises (no process group, ranks that disagree).

    Raises:
        TypeError: for a ``csc`` that is not a :class:`hmgstore.graph.CSC`, float or bool ``hot_order`` ids.
        ValueError: for a ``gpu_budget`` or ``replicate`` that is not a byte count (negative, unreadable, a
            bool), a repeated ``hot_order`` id, a ``hot_order`` that is not 1-D, weights that do not fit the graph.
        IndexError: for a ``hot_order`` id outside ``[0, num_dst)``.
        RuntimeError: for a CUDA device where torch sees no GPU.
    """
    if not isinstance(csc, CSC):
        raise TypeError(f"sharded_topology takes a hmgstore.graph.CSC (hmgstore.graph.to_csc builds one), got "
                        f"{type(csc).__name__}")
    parse_bytes(replicate)  # here: only a GPU whose topology does not fit would read it

    def place(chunks, chunk_order, budget, where, bars):
        # min: the weights' chunks are placed with their share of the budget, which may be below `replicate`
        return shard(chunks, gpu_budget=budget, hot_order=chunk_order, replicate=min(replicate, budget), device=where,
                     progress=bars)

    return Topology(csc, device, gpu_budget=gpu_budget, hot_order=hot_order, progress=progress, place_chunks=place,
                    weight=weight, src_time=src_time, edge_time=edge_time)
