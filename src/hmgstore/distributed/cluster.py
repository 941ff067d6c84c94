"""Several machines: each holds its partition's rows, every rank gathers any node's rows.

The machines are the job's nodes as :func:`~hmgstore.distributed.this_node`
sees them (``$HMGSTORE_NODE_ID`` simulates several on one host), numbered in
the order of their lowest global rank; each must run as many ranks as the
others. :func:`this_cluster` finds them, once per process group.

A :class:`ClusterTensor` is one attribute of a partitioned graph (see
:mod:`.partition`): this machine's rows (a :class:`~hmgstore.HybridTensor`,
or the node's sharded view of them) and the :class:`PartitionBook` that says
who holds the rest. Gathers are collective, like DDP's forward: every rank
of the job calls :meth:`ClusterTensor.gather` or :func:`gather_many` the
same number of times, with the same tables in the same order (each its own
ids). Each rank has one counterpart per machine, the rank there with the
same local rank; one gather is three ``all_to_all_single`` rounds among
counterparts, over hmgstore's own groups (gloo for CPU tables, NCCL for
CUDA tables; gloo supports uneven ``all_to_all_single`` on CPU tensors):

1. a header per counterpart: which tables this call gathers, how many ids;
2. the ids, as rows within the owner's partition, grouped by owner;
3. the owners' rows, gathered from their local tables in one
   :func:`hmgstore.gather_many` for all attributes, sent back as bytes (any
   dtype, bit-exact). This machine's own rows are gathered locally while
   they travel.

Faults. An exchange waits at most :data:`EXCHANGE_TIMEOUT` for a
counterpart. When one dies or stops answering, the ranks talking to it get
:class:`PeerLostError` (naming the ranks of this host that are gone), their
node peers get it from the node's watch, and every later gather raises at
once: the exchanges are out of step for good; restart the job. Ranks that
build a table from different books, dtypes, row shapes or row counts all
get a ValueError naming the ranks.
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..memory.shared import process_alive
from ..rows.ids import rows_only
from ..table.tensor import HybridTensor
from .exchange import Exchange, Gather
from .node import SETUP_TIMEOUT, Node, _default_group, this_node
from .partition_book import PartitionBook
from .shard import DistributedTensor
from .watch import PeerLostError

#: How long one exchange waits for a counterpart before it fails: torch's own default for gloo groups, so
#: that a rank working alone for a while (a checkpoint, validation on rank 0) does not break the exchanges.
#: A dead counterpart is noticed at once on gloo (its connection closes). Read when hmgstore makes its
#: exchange groups (at the first ClusterTensor or sampler of a process group); set it before then to change it.
EXCHANGE_TIMEOUT = datetime.timedelta(minutes=30)


@dataclass
class Cluster:
    """The job's machines as this process sees them; made by :func:`this_cluster`, not by hand.

    Raises:
        PeerLostError: from :meth:`check` once an exchange failed or a peer of this node died.
        ValueError: from :meth:`exchange` for a backend other than ``"gloo"`` and ``"nccl"``.
    """

    world: object  # the default process group this was made for
    node: Node  # this process's node (a machine), whose watch tells of dead peers
    control: object  # gloo group of every rank: the checks at construction
    machines: list[list[int]]  # global ranks of each machine, ascending; machines by lowest rank
    rank: int
    processes: list[tuple[str, int]]  # (hostname, pid) of every rank: to name the ranks that are gone
    exchanges: dict[str, Exchange] = field(default_factory=dict)
    broken: str | None = None  # why the exchanges are out of step, once they are
    tables: int = 0  # ClusterTensors built so far: each gets the next serial number

    @property
    def num_machines(self) -> int:
        return len(self.machines)

    @property
    def machine(self) -> int:
        return next(m for m, ranks in enumerate(self.machines) if self.rank in ranks)

    @property
    def local_rank(self) -> int:
        return self.machines[self.machine].index(self.rank)

    def check(self) -> None:
        """Raise :class:`PeerLostError` once an exchange failed, or once a peer of this node died."""
        self.node.check()
        if self.broken is not None:
            raise PeerLostError(f"hmgstore's exchanges among machines failed earlier: {self.broken}")

    def exchange(self, backend: str) -> Exchange:
        """This rank's counterpart group on ``backend`` ("gloo" or "nccl"), made on first use (collective).
        Raises ValueError for another backend, on this rank, before any group is made."""
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"an exchange runs over 'gloo' or 'nccl', got {backend!r}")
        if backend not in self.exchanges:
            mine = None
            for local in range(len(self.machines[0])):  # every rank makes every group, in the same order
                ranks = [m[local] for m in self.machines]
                group = dist.new_group(ranks, backend=backend, timeout=EXCHANGE_TIMEOUT)
                if local == self.local_rank:
                    mine = group, ranks
            assert mine is not None  # this rank's local index is among the machines' columns
            group, ranks = mine
            slots = [dist.get_group_rank(group, r) for r in ranks]
            by_slot = [r for _, r in sorted(zip(slots, ranks))]
            self.exchanges[backend] = Exchange(group, slots, by_slot)
        return self.exchanges[backend]

    def gone(self) -> str:
        """The ranks of this host whose process has exited, for error messages.

        A killed process closes its connections before it shows as exited, so a failed exchange may be seen
        first: look again for up to a second before saying that every rank still runs.
        """
        host = socket.gethostname()
        for _ in range(20):
            dead = [f"rank {r} (pid {pid})" for r, (name, pid) in enumerate(self.processes)
                    if name == host and r != self.rank and not process_alive(pid)]
            if dead:
                break
            time.sleep(0.05)
        return ("ranks of this host no longer running: " + ", ".join(dead)) if dead else \
            "every rank of this host still runs (one on another host may have died, or stopped calling gather)"


_cluster: Cluster | None = None
_lock = threading.Lock()


def this_cluster() -> Cluster:
    """The job's machines, found on first use for the current process group (collective over it).

    Raises ValueError on every rank when machines run different numbers of
    ranks, RuntimeError without ``init_process_group``.
    """
    global _cluster
    node = this_node()
    with _lock:
        if _cluster is not None and _cluster.world is not _default_group():
            _cluster = None
        if _cluster is None:
            _cluster = _make_cluster(node)
        return _cluster


def _make_cluster(node) -> Cluster:
    world = dist.get_world_size()
    control = dist.new_group(list(range(world)), backend="gloo", timeout=SETUP_TIMEOUT)
    info: list[Any] = [None] * world
    dist.all_gather_object(info, (node.ranks, socket.gethostname(), os.getpid()), group=control)
    machines = group_machines([i[0] for i in info])
    return Cluster(_default_group(), node, control, machines, dist.get_rank(), [(i[1], i[2]) for i in info])


def group_machines(node_ranks: list[list[int]]) -> list[list[int]]:
    """The machines, from each rank's list of the ranks of its node: numbered by their lowest rank.

    Raises ValueError, naming every machine's ranks, when they run different numbers of ranks.
    """
    machines = sorted((list(ranks) for ranks in {tuple(r) for r in node_ranks}), key=min)
    if len({len(m) for m in machines}) > 1:
        raise ValueError("every machine must run the same number of ranks (each rank exchanges rows with the rank "
                         "of its local rank on every other machine); here: " +
                         "; ".join(f"machine {k}: ranks {m}" for k, m in enumerate(machines)))
    return machines


class ClusterTensor:
    """One node attribute of a graph partitioned over the job's machines (built collectively).

    ``local``: this machine's partition rows, ``[book.sizes[machine],
    *row_shape]``, in the partition's order (increasing global id): a
    :class:`~hmgstore.HybridTensor` (e.g. from :func:`load_partition`) or a
    :class:`DistributedTensor` (the node's sharded view of them). ``book``:
    the :class:`PartitionBook` the job was partitioned with. Every rank of
    the job builds its ClusterTensors in the same order; ranks that disagree
    on the book, dtype, row shape or device type, or whose row count is not
    their partition's, all get a ValueError naming them. The local table
    stays the caller's: close it after this one.

    Gathers return rows of this attribute for global node ids, on
    ``local``'s device, bit-exact as ``full_table[ids]`` (see the module
    docstring: collective).

    Raises:
        TypeError: for a ``local`` that is neither a :class:`~hmgstore.HybridTensor` nor a
            :class:`DistributedTensor`, a ``book`` that is not a :class:`PartitionBook` (on this rank, before any
            collective); in a gather, for ids that are not integers and for ``t[i, j]`` (rows only).
        ValueError: on every rank, naming the ranks, when ranks disagree on the book, dtype, row shape or device
            type, when a rank's row count is not its partition's, or when the book's machines are not the job's.
        IndexError: in a gather, for an id outside ``[0, num_nodes)`` (value and position), before anything is
            sent.
        RuntimeError: without ``init_process_group``; in a gather, once this table or its local table is closed.
        PeerLostError: in a gather, as :func:`gather_many` says.
    """

    def __init__(self, local, book: PartitionBook):
        table = local.table if isinstance(local, DistributedTensor) else local
        if not isinstance(table, HybridTensor):
            raise TypeError(f"local must be a HybridTensor or a DistributedTensor, got {type(local).__name__}")
        if not isinstance(book, PartitionBook):
            raise TypeError(f"book must be a PartitionBook, got {type(book).__name__}")
        cluster = this_cluster()
        cluster.check()
        self._cluster, self._local, self.book, self.serial = cluster, table, book, cluster.tables
        cluster.tables += 1
        mine = {"book": book.signature(), "run": book.run, "dtype": str(table.dtype),
                "row shape": tuple(table.row_shape), "device type": table.device.type, "serial": self.serial,
                "rows": table.num_rows, "part": getattr(table, "_partition_machine", None)}  # set by load_partition
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine, group=cluster.control)
        _check_agreement(everyone, cluster, book)
        if table.device.type == "cuda" and not dist.is_nccl_available():
            raise RuntimeError("CUDA tables exchange rows over NCCL, which this torch build lacks")
        self._exchange = cluster.exchange("nccl" if table.device.type == "cuda" else "gloo")
        self._closed = False
        cluster.node.opened(+1, gpu=table.device.type == "cuda")  # peers watch while it has tables open

    @property
    def local(self) -> HybridTensor:
        """This machine's rows (partition order)."""
        return self._local

    @property
    def exchange(self):
        """The counterpart group this table's gathers send ids and rows through (an ``Exchange``)."""
        return self._exchange

    @property
    def device(self) -> torch.device:
        return self._local.device

    @property
    def dtype(self) -> torch.dtype:
        return self._local.dtype

    @property
    def row_shape(self) -> torch.Size:
        return self._local.row_shape

    @property
    def shape(self) -> torch.Size:
        """``[num_nodes, *row_shape]``: the whole table's shape."""
        return torch.Size((self.book.num_nodes, *self.row_shape))

    @property
    def num_rows(self) -> int:
        return self.book.num_nodes

    def __len__(self) -> int:
        return self.book.num_nodes

    @property
    def machine(self) -> int:
        return self._cluster.machine

    def gather(self, ids) -> torch.Tensor:
        """Rows of global node ids ``ids``; :func:`gather_many` for one table (collective)."""
        return gather_many([(self, ids)])[0]

    @staticmethod
    def gather_batch(requests, *, outs=None, stream=None) -> list[torch.Tensor]:
        """:func:`gather_many` (one exchange, collective): :class:`hmgstore.FeatureTable`'s batch hook. The rows
        come back as new tensors on the tables' device: ``outs`` and ``stream`` are not used."""
        return gather_many(requests)

    def __getitem__(self, ids) -> torch.Tensor:
        """``table[ids]``: :meth:`gather` (collective); one index only, as for :class:`~hmgstore.HybridTensor`
        (``t[3, 1]`` raises TypeError saying how to index, on this rank, before any exchange)."""
        return self.gather(rows_only(ids))

    def close(self) -> None:
        """Stop gathering from this table (not collective, idempotent; the local table stays open)."""
        if not self._closed:
            self._closed = True
            self._cluster.node.opened(-1, gpu=self.device.type == "cuda")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"ClusterTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}, "
                f"machine={self.machine} of {self._cluster.num_machines}, local_rows={self._local.num_rows}"
                f"{', closed' if self._closed else ''})")


def _check_agreement(everyone: list[dict], cluster: Cluster, book: PartitionBook) -> None:
    """Raise ValueError, on every rank alike, naming the ranks whose table does not fit the others'."""
    problems = []
    if book.num_machines != cluster.num_machines:
        problems.append(f"the partition book spreads the nodes over {book.num_machines} machines, the job runs on "
                        f"{cluster.num_machines} ({cluster.machines}; $HMGSTORE_NODE_ID or hostnames tell them apart)")
    for key in ("book", "run", "dtype", "row shape", "device type", "serial"):
        for rank, theirs in enumerate(everyone):
            if theirs[key] != everyone[0][key]:
                problems.append(f"rank {rank} has a different {key} than rank 0: {theirs[key]} vs {everyone[0][key]}")
    if not problems:
        for machine, ranks in enumerate(cluster.machines):
            for rank in ranks:
                if everyone[rank]["part"] not in (None, machine):
                    problems.append(f"rank {rank} runs on machine {machine} but its table holds part "
                                    f"{everyone[rank]['part']} (load_partition(out_dir, {machine}) on that machine)")
                elif everyone[rank]["rows"] != book.sizes[machine]:
                    problems.append(f"rank {rank} (machine {machine}) holds {everyone[rank]['rows']} local rows, its "
                                    f"partition has {book.sizes[machine]}")
    if problems:
        raise ValueError("cannot build the ClusterTensor: " + "; ".join(problems) +
                         ". Every rank builds its tables in the same order, from the same book, each from its "
                         "machine's partition (hmgstore.distributed.load_partition)")


def gather_many(requests) -> list[torch.Tensor]:
    """``[table[ids] for table, ids in requests]`` for :class:`ClusterTensor` s, in one exchange (collective).

    ``ids``: global node ids, an integer tensor (CPU or the tables' device,
    any shape), numpy array or list; duplicates and empty batches are fine.
    Every rank calls this the same number of times with the same tables in
    the same order (each with its own ids). All tables share one book and
    device. Returns ``[*ids.shape, *row_shape]`` tensors on that device,
    equal bit for bit to ``full_table[ids]``. Raises IndexError (value and
    position) for ids outside ``[0, num_nodes)`` before anything is sent,
    ValueError when counterparts gather other tables, and
    :class:`PeerLostError` when a counterpart is gone or did not answer
    within :data:`EXCHANGE_TIMEOUT`. A rank whose ids are refused still
    takes the call's first round, saying so: every counterpart raises
    ValueError naming it in the same call, so the rounds stay in step and
    all may go on. Call it from one thread per process.
    """
    requests = list(requests)
    if not requests:
        return []
    first = requests[0][0]
    for table, _ in requests:
        if not isinstance(table, ClusterTensor):
            raise TypeError(f"gather_many takes (ClusterTensor, ids) pairs, got {type(table).__name__}")
        if table._closed or table.local.closed:
            raise RuntimeError(f"cannot gather from a closed {'ClusterTensor' if table._closed else 'local table'}")
        if table.book != first.book or table.device != first.device or table._cluster is not first._cluster:
            raise ValueError("the tables of one gather_many must share a partition book, a device and a process group")
    first._cluster.check()
    return Gather(first._cluster, first._exchange, first.book, first.device, requests).run()
