"""Neighbour sampling over a graph partitioned over machines: :class:`DistributedNeighborSampler`.

Each machine holds the in-edges of its own nodes (a :class:`Partition`'s
``colptr``/``row``, sources as global ids). A hop is collective among
counterparts (one rank per machine, the one with this rank's local rank;
the groups of :mod:`.cluster`), like a gather, in three
``all_to_all_single`` rounds over gloo, the exchange fused per hop as a
gather's is per batch:

1. header, ``int64 [slots, 2]``: the call's signature (hop, fanout) and how
   many seeds this rank asks of each owner;
2. requests: per owner, this rank's draw key for the hop, then the seeds'
   rows within the owner's partition, then their positions in this rank's
   frontier;
3. answers: the owner samples each requester's seeds from its local CSC
   with that requester's key and positions, and sends back, per seed, its
   count and ``k`` neighbour slots (global ids; the slots past the count
   are padding), so that every size is known before the round and the
   count and the neighbours travel together. Ids are int32 while the
   graph's ids fit.

A machine's own seeds are never sent: it samples them from its part while
the answers travel. A hop that takes every neighbour (fanout ``-1``), whose
answer has no bound, or more than :data:`PADDED_FANOUT_MAX`, where padding
would cost more than a round, sends the counts and the neighbours in two
rounds (four in all).

Draws are those of :mod:`hmgstore.graph.sampler` (Floyd's algorithm keyed
by hop key, seed position and slot), so with the same generator a batch is
*the same* as :class:`hmgstore.graph.NeighborSampler` draws over the whole
graph's CSC (built by :func:`hmgstore.graph.to_csc`, the order
:func:`partition` keeps): uniform without replacement, ``min(k, degree)``
neighbours per seed. The requester relabels with
:class:`hmgstore.graph.relabel.SortedNodeSet` and returns the same
:class:`hmgstore.graph.Sample` (seeds first, hop by hop); ``edge`` is None:
a global edge id is not known across machines.

Every rank of the job calls :meth:`DistributedNeighborSampler.sample` the
same number of times with the same fanouts (each its own seeds, empty
batches included); a rank that samples while a counterpart gathers gets a
ValueError. Owners sample their part on the CPU, or, with ``device`` a GPU,
with the GPU sampler's kernels (:func:`hmgstore.graph.sample_hop`, each
requester's seeds drawn as they sit in its frontier; the exchange and the
requester's relabelling stay on the CPU, over gloo); a topology replicated on every machine
(``DistributedNeighborSampler(csc, ...)``) samples locally, on any device,
with no collective at all.
"""
from __future__ import annotations

import zlib
from typing import Any

import torch
import torch.distributed as dist

from ..graph.csc import CSC
from ..graph.fanout import check_fanout
from ..graph.hop import _floyd_cpu, _sample_hop, draw, slot_counts
from ..graph.relabel import SortedNodeSet
from ..graph.sampler import NeighborSampler, Sample
from ..graph.topology import Topology
from ..rows import checks
from ..rows.hotness import parse_budget
from ..rows.ids import check_range, normalize_many
from ..util.device import resolve_device
from .cluster import this_cluster
from .exchange import all_to_all, finish
from .parts import Partition


def sample_rows(colptr: torch.Tensor, row: torch.Tensor, local: torch.Tensor, position: torch.Tensor, k: int,
                replace: bool, key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One requester's seeds sampled from a local CSC: ``(neighbours, counts)``.

    :func:`hmgstore.graph.sample_hop`'s CPU path, with the draws keyed by
    the requester's ``key`` and the seeds' ``position`` in its frontier (not
    their position here), so the result equals what the requester would
    draw from the whole graph. ``colptr``/``row``: int64 CPU CSC (row: global
    source ids); ``local``, ``position``: int64 [S]. Returns int64
    ``neighbours`` [sum(counts)] seed after seed and ``counts`` [S].
    """
    degree = colptr[local + 1] - colptr[local]
    counts = slot_counts(degree, k, replace)
    num_slots = int(counts.sum())
    seg = torch.repeat_interleave(torch.arange(len(local)), counts, output_size=num_slots)
    t = torch.arange(num_slots) - (counts.cumsum(0) - counts)[seg]
    if replace:
        pos = draw(key, position[seg], t, degree[seg])
    else:
        pos = t
        partial = counts < degree
        if bool(partial.any()):
            chosen = _floyd_cpu(key, position[partial], counts[partial], degree[partial])
            pos = pos.clone()
            pos[partial[seg]] = chosen[chosen >= 0]
    return row[colptr[local][seg] + pos].long(), counts  # int64 whatever the part's row (int32 from a CSC)


def in_frontier_order(values: torch.Tensor, counts: torch.Tensor, order: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """Segments ``values`` (``counts`` each, seeds in ``order``) back in frontier order: ``(values, counts)``."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order))
    starts = counts.cumsum(0) - counts
    c, s = counts[inverse], starts[inverse]
    seg = torch.repeat_interleave(torch.arange(len(c)), c, output_size=len(values))
    t = torch.arange(len(values)) - (c.cumsum(0) - c)[seg]
    return values[s[seg] + t], c


_EMPTY = (torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))
#: The largest fanout whose answers travel padded to ``k`` slots a seed, in one round with their counts. A padded
#: answer costs 4 (k + 1) bytes a seed whatever the seed's degree, against 8 (count + 1) sent exactly: the same
#: at k = 15 on a graph of average degree 10, 1.5x at 25, 5x at 100. Above it, and for
#: fanout -1, the counts go first and size the neighbours' round: four rounds a hop.
PADDED_FANOUT_MAX = 32


def pack_answer(neighbours: torch.Tensor, counts: torch.Tensor, k: int, wide: bool) -> torch.Tensor:
    """One requester's answer as ``[S, 1 + k]`` flattened: per seed its count, then its neighbours and -1
    padding; int32 unless ``wide`` (ids of 2^31 and above). ``neighbours``: seed after seed, ``counts`` [S],
    each at most ``k``."""
    out = torch.full((len(counts), k + 1), -1, dtype=torch.int64 if wide else torch.int32)
    out[:, 0] = counts
    seg = torch.repeat_interleave(torch.arange(len(counts)), counts, output_size=len(neighbours))
    t = torch.arange(len(neighbours)) - (counts.cumsum(0) - counts)[seg]
    out[seg, 1 + t] = neighbours.to(out.dtype)
    return out.reshape(-1)


def unpack_answers(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pack_answer`'s answers, one after another, back to ``(neighbours, counts)``, int64."""
    rows = packed.view(-1, k + 1)
    counts = rows[:, 0].long()
    return rows[:, 1:][torch.arange(k)[None, :] < counts[:, None]].long(), counts


def _check_part(part: Partition) -> None:
    """Refuse a part whose topology the book does not bear out (ValueError): every neighbour a node of the
    book, ``colptr`` one offset per node of the part plus one, ending at the number of neighbours."""
    rows = part.book.sizes[part.machine] if 0 <= part.machine < part.book.num_machines else -1
    if len(part.colptr) != rows + 1 or (len(part.colptr) and int(part.colptr[-1]) != len(part.row)):
        raise ValueError(f"part {part.machine}'s colptr has {len(part.colptr)} offsets ending at "
                         f"{int(part.colptr[-1]) if len(part.colptr) else None}; its book gives it {rows} nodes and "
                         f"its row holds {len(part.row)} neighbours")
    try:
        check_range(part.row, part.book.num_nodes)
    except IndexError as err:
        raise ValueError(f"part {part.machine}'s row names a neighbour outside the book ({err}); the book has "
                         f"{part.book.num_nodes} nodes: reload the part with load_partition") from None


class DistributedNeighborSampler:
    """Multi-hop uniform neighbour sampling of a homogeneous graph spread over the job's machines.

    Args:
        topology: this machine's :class:`Partition` (from
            :func:`load_partition`): partitioned topology, sampled
            collectively (see the module docstring). Or the whole graph's
            :class:`hmgstore.graph.CSC`, replicated on every machine: sampled
            locally by :class:`hmgstore.graph.NeighborSampler` (no collective).
        num_neighbors: neighbours per hop, e.g. ``[15, 10]`` (``-1``: all).
        replace: sample with replacement.
        generator: CPU ``torch.Generator`` keying the draws (default torch's
            global one, so ``torch.manual_seed`` fixes the batches).
        device: where the topology is held and sampled: the replicated one,
            or, partitioned, this machine's part, which its owner samples for
            every requester (a GPU: the part's lists held in its memory up to
            ``gpu_budget`` bytes, all of them by default, the rest read
            zero-copy from the host). Batches come back on the CPU when
            partitioned.
        gpu_budget: partitioned, on a GPU: see ``device``; bytes (int or ``"4GB"``). Refused elsewhere (a
            replicated topology, a CPU device), where it cannot apply.

    Raises:
        TypeError: for a ``topology`` that is neither a :class:`Partition` nor a CSC, ``num_neighbors`` that is
            not a list of whole numbers, a ``replace`` that is not a bool, a ``generator`` that is not a
            ``torch.Generator``; in :meth:`sample`, for seeds that are not integers.
        ValueError: for a fanout below -1, a generator on another device than the CPU, a ``gpu_budget`` where it
            cannot apply or that is not a byte count, a device that is neither cpu nor cuda, a part whose
            topology its book does not bear out; on every rank, naming them, when ranks disagree on the book,
            fanouts or ``replace``, or hold another machine's part.
        IndexError: in :meth:`sample`, for a seed outside ``[0, num_nodes)``, before anything is sent.
        RuntimeError: partitioned, without ``init_process_group``.
        PeerLostError: in :meth:`sample`, partitioned, as :func:`gather_many` says.
    """

    def __init__(self, topology, num_neighbors, *, replace: bool = False, generator: torch.Generator | None = None,
                 device=None, gpu_budget=None):
        self.num_neighbors = check_fanout(num_neighbors)
        checks.boolean(replace, "replace")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator is a torch.Generator or None, got {type(generator).__name__}")
        if generator is not None and generator.device.type != "cpu":
            raise ValueError(f"generator keys the draws on the CPU: pass a CPU torch.Generator, got one on "
                             f"{generator.device}")
        if device is not None:
            device = resolve_device(device)
        if gpu_budget is not None:
            parse_budget(gpu_budget)  # a typo is told as such, whatever the device
            if not isinstance(topology, Partition) or device is None or device.type != "cuda":
                kind = "partitioned" if isinstance(topology, Partition) else "replicated"
                raise ValueError("gpu_budget applies only to a partitioned topology sampled on a GPU (device='cuda'); "
                                 f"here the topology is {kind} on {device or 'cpu'}: leave gpu_budget out")
        self.replace, self.generator = bool(replace), generator
        self._owned = None  # partitioned, on a GPU: the part's topology, which this machine samples for every requester
        if isinstance(topology, CSC):
            self.partitioned = False
            self.num_nodes = topology.size[1]
            self._local = NeighborSampler({None: Topology(topology, device or "cpu", progress=False)},
                                          {None: self.num_nodes}, self.num_neighbors, replace=replace,
                                          generator=generator)
            self.device = self._local.device
            return
        if not isinstance(topology, Partition):
            raise TypeError(f"topology is a Partition (partitioned) or a CSC (replicated), "
                            f"got {type(topology).__name__}")
        self.partitioned, self.device = True, torch.device("cpu")
        self.book, self.colptr, self.row = topology.book, topology.colptr, topology.row
        self.num_nodes = self.book.num_nodes
        _check_part(topology)  # a Partition made by hand, or changed since load_partition checked it
        if device is not None and device.type == "cuda":
            part = CSC(self.row, self.colptr, None, (self.num_nodes, len(self.colptr) - 1))
            self._owned = Topology(part, device, gpu_budget=2**62 if gpu_budget is None else gpu_budget,
                                   progress=False)
        self._cluster = cluster = this_cluster()
        # Every rank checks every other before any exchange group is made, so that all raise alike, naming the
        # ranks, rather than some waiting for the others inside new_group.
        mine = {"book": self.book.signature(), "run": self.book.run, "fanouts": self.num_neighbors, "replace": replace,
                "part": topology.machine, "machine": cluster.machine, "rows": len(self.colptr) - 1}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine, group=cluster.control)
        problems = []
        if self.book.num_machines != cluster.num_machines:
            problems.append(f"the partition book spreads the nodes over {self.book.num_machines} machines, the job "
                            f"runs on {cluster.num_machines}")
        for rank, theirs in enumerate(everyone):
            for key in ("book", "run", "fanouts", "replace"):
                if theirs[key] != everyone[0][key]:
                    problems.append(f"rank {rank} has a different {key} than rank 0: "
                                    f"{theirs[key]} vs {everyone[0][key]}")
            if theirs["part"] != theirs["machine"]:
                problems.append(f"rank {rank} runs on machine {theirs['machine']} but was given part {theirs['part']}")
            elif theirs["book"] == everyone[0]["book"] and theirs["rows"] != self.book.sizes[theirs["machine"]]:
                problems.append(f"rank {rank}'s part has {theirs['rows']} nodes, the book gives its machine "
                                f"{self.book.sizes[theirs['machine']]}")
        if problems:
            raise ValueError("cannot build the DistributedNeighborSampler: " + "; ".join(problems) + ". Every rank "
                             "loads its own machine's part of the same partitioning (load_partition)")
        self._exchange = cluster.exchange("gloo")

    def sample(self, seeds) -> Sample:
        """The subgraphs around ``seeds`` (global ids: integer tensor, list, numpy array; may be empty).

        Collective when partitioned. Returns a :class:`hmgstore.graph.Sample`
        keyed by None, int64 tensors on the sampler's device: ``node``
        (seeds first, then each hop's new nodes), ``row``/``col`` (local ids
        of each edge's neighbour and seed), per-hop counts; ``edge`` the CSC
        positions (replicated) or None (partitioned).

        Raises:
            TypeError: for seeds that are not integers (floats are never truncated).
            IndexError: for a seed outside ``[0, num_nodes)``, before anything is sent.
            PeerLostError: partitioned, as :func:`gather_many` says.
        """
        if not self.partitioned:
            return self._local.sample({None: seeds})
        (checked,) = normalize_many([(seeds, self.num_nodes)], self.device)
        self._cluster.check()
        try:
            return self._sample(checked.ids.long().reshape(-1))
        except BaseException as err:  # whatever stopped this rank midway, its counterparts are out of step
            if self._cluster.broken is None:
                self._cluster.broken = f"a sampling call stopped midway on rank {self._cluster.rank} ({err!r})"
            raise

    def _sample(self, seeds: torch.Tensor) -> Sample:
        keys = torch.randint(0, 2**62, (len(self.num_neighbors),), generator=self.generator).tolist()
        nodes = SortedNodeSet(seeds)
        lo, hi = 0, len(seeds)
        num_nodes_hop, num_edges_hop, rows, cols = [len(seeds)], [], [], []
        for hop, (k, key) in enumerate(zip(self.num_neighbors, keys)):
            before = nodes.count
            if k == 0:  # the same on every rank: no exchange
                num_edges_hop.append(0)
            else:
                nbr, counts = self._hop(nodes.keys[lo:hi], hop, k, key)
                rows.append(nodes.add(nbr))
                cols.append(torch.arange(lo, hi).repeat_interleave(counts, output_size=len(nbr)))
                num_edges_hop.append(len(nbr))
            lo, hi = before, nodes.count
            num_nodes_hop.append(nodes.count - before)
        empty = torch.empty(0, dtype=torch.int64)
        return Sample({None: nodes.keys}, {None: torch.cat(rows) if rows else empty},
                      {None: torch.cat(cols) if cols else empty}, {None: None}, None, {None: num_nodes_hop},
                      {None: num_edges_hop})

    # ---- one hop: three rounds among counterparts ------------------------------------------------------------
    def _hop(self, frontier: torch.Tensor, hop: int, k: int, key: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Neighbours and counts of ``frontier``'s seeds, in frontier order (collective)."""
        ex, book, machine = self._exchange, self.book, self._cluster.machine
        owner = book.owner_unchecked(frontier)
        slot = ex.slot_table(self.device)[owner].masked_fill(owner == machine, ex.slots)  # own seeds: never sent
        order = torch.argsort(slot, stable=True)  # other machines' seeds by slot, then this machine's
        local = book.local_unchecked(frontier, owner)[order]
        per_slot = torch.bincount(slot, minlength=ex.slots + 1)
        signature = zlib.crc32(repr(("sample", hop, k, self.replace)).encode())
        # [signature, count] per counterpart: the shape of a gather's header, so that a rank sampling while its
        # counterpart gathers (same gloo group) is told so, instead of gloo aborting on a size mismatch.
        header = torch.stack([torch.full((ex.slots,), signature), per_slot[:ex.slots]], 1)
        theirs = torch.empty_like(header)
        self._all_to_all(theirs, header)
        for s, (sig, _) in enumerate(theirs.tolist()):
            if sig != signature:
                self._cluster.broken = f"rank {ex.ranks[s]} was not sampling hop {hop} with the others"
                raise ValueError(f"rank {ex.ranks[s]} did not sample hop {hop} (fanout {k}) with rank "
                                 f"{self._cluster.rank}: every rank samples, and gathers, the same number of "
                                 "times with the same fanouts")
        sent_counts, asked = per_slot[:ex.slots].tolist(), theirs[:, 1].tolist()
        remote = sum(sent_counts)
        key_of = torch.tensor([key])  # each block: the requester's draw key, its seeds' rows, their positions
        sent = torch.cat([key_of.new_empty(0), *(torch.cat([key_of, r, p]) for r, p, n in zip(
            local[:remote].split(sent_counts), order[:remote].split(sent_counts), sent_counts) if n)])
        got = torch.empty(sum(2 * a + 1 for a in asked if a), dtype=torch.int64)
        self._all_to_all(got, sent, [2 * a + 1 if a else 0 for a in asked],
                         [2 * n + 1 if n else 0 for n in sent_counts])
        answers = [self._answer(block[1:a + 1], block[a + 1:], k, int(block[0])) if a else None
                   for block, a in zip(got.split([2 * a + 1 if a else 0 for a in asked]), asked)]
        padded = 0 <= k <= PADDED_FANOUT_MAX  # else every neighbour, or nearly: counts size the neighbours' round
        if not padded:
            counts = torch.empty(remote, dtype=torch.int64)
            self._all_to_all(counts, torch.cat([c for _, c in filter(None, answers)] or [counts[:0]]), sent_counts,
                             asked)
            receive = [int(c.sum()) for c in counts.split(sent_counts)]
            nbr = torch.empty(sum(receive), dtype=torch.int64)
            work = self._all_to_all(nbr, torch.cat([n for n, _ in filter(None, answers)] or [nbr[:0]]), receive,
                                    [len(a[0]) if a else 0 for a in answers], wait=False)
        else:  # each seed's count and k slots: sizes known to both sides, one round
            wide = self.num_nodes >= 2**31
            packed = torch.cat([pack_answer(*a, k, wide) for a in answers if a is not None] or
                               [pack_answer(*_EMPTY, k, wide)])
            got_answers = packed.new_empty(remote * (k + 1))
            work = self._all_to_all(got_answers, packed, [n * (k + 1) for n in sent_counts],
                                    [a * (k + 1) for a in asked], wait=False)
        own = len(frontier) - remote  # this machine's seeds, sampled while the answers travel
        own_nbr, own_counts = self._answer(local[remote:], order[remote:], k, key) if own else _EMPTY
        self._wait(work)
        if padded:
            nbr, counts = unpack_answers(got_answers, k)
        return in_frontier_order(torch.cat([nbr, own_nbr]), torch.cat([counts, own_counts]), order)

    def _answer(self, local: torch.Tensor, position: torch.Tensor, k: int, key: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One requester's seeds (rows of this machine's part, and their positions in its frontier) sampled
        with its key: ``(neighbours, counts)`` on the CPU."""
        if self._owned is None:
            return sample_rows(self.colptr, self.row, local, position, k, self.replace, key)
        where = self._owned.device
        nbr, _, counts = _sample_hop(self._owned, local.to(where), k, self.replace, key, index=position.to(where))
        return nbr.cpu(), counts.cpu()

    def close(self) -> None:
        """Free the topology's GPU memory, if any (idempotent)."""
        if not self.partitioned:
            self._local.close()
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def _all_to_all(self, out, inp, out_sizes=None, in_sizes=None, *, wait: bool = True):
        return all_to_all(self._cluster, self._exchange, out, inp, out_sizes, in_sizes, wait=wait,
                          what="a sampling exchange")

    def _wait(self, work) -> None:
        finish(self._cluster, self._exchange, work, "a sampling exchange")

    def __repr__(self) -> str:
        where = (f"partitioned, machine {self._cluster.machine} of {self._cluster.num_machines}"
                 + (f", its part sampled on {self._owned.device}" if self._owned is not None else "")
                 if self.partitioned else f"replicated, {self.device}")
        return f"DistributedNeighborSampler({where}, num_nodes={self.num_nodes}, num_neighbors={self.num_neighbors})"
