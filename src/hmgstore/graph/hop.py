"""One hop of neighbour sampling, and the draws behind it: the part of :mod:`.sampler` that the
distributed sampler (:mod:`hmgstore.distributed.sampling`) runs on its own part of a graph.

Every node of a hop gets up to ``k`` of its in-neighbours: without
replacement by Floyd's algorithm, with replacement by ``k`` independent
draws, every neighbour for ``k = -1``; on a topology with edge weights, as
:mod:`.weighted` says. A draw is a counter-based hash of the
hop's 64-bit key, the seed's index and the slot (splitmix64's finaliser), the
same function as ``draw`` in ``kernels/sample.cu``, so the CPU and a GPU draw
the same neighbours.
"""
from __future__ import annotations

import numpy as np
import torch

from ..cuda import sample as kernels
from ..rows import checks
from ..util.host_memory import check_room
from . import temporal, weighted
from .draws import _draw_mixed, _seed_hash, _signed, draw
from .seeds import MAX_REPLACE_FANOUT
from .topology import Topology

__all__ = ["draw", "sample_hop", "slot_counts"]

def slot_counts(degree: torch.Tensor, k: int, replace: bool) -> torch.Tensor:
    """Neighbours to sample per seed: every one for ``k < 0``, ``k`` (when the degree is not 0)
    with replacement, else ``min(k, degree)``."""
    if k < 0:
        return degree.clone()
    if replace:
        return torch.where(degree > 0, k, 0)
    return degree.clamp(max=k)


#: Slots a seed past which :func:`_floyd_cpu` tests membership seed by seed in a set (linear in the slots) rather
#: than against every earlier slot of every seed at once (quadratic: a fanout of 100000 over a list of 200000 took
#: 34 s a seed on a 2-core CPU).
FLOYD_SET_WIDTH = 1024


def _floyd_cpu(key: int, index: torch.Tensor, count: torch.Tensor, degree: torch.Tensor) -> torch.Tensor:
    """Floyd's algorithm for many seeds at once: ``[seeds, max count]`` positions, -1 past each count."""
    width = int(count.max()) if len(count) else 0
    chosen = torch.full((len(count), width), -1, dtype=torch.int64)
    h = _seed_hash(key, index)  # once, not once per slot: half of this loop's passes
    if width > FLOYD_SET_WIDTH:
        return _floyd_by_seed(h, count, degree, chosen)
    for t in range(width):
        active = count > t
        j = degree - count + t
        r = _draw_mixed(h, t, torch.where(active, j + 1, 1))
        taken = (chosen[:, :t] == r[:, None]).any(1)
        chosen[:, t] = torch.where(active, torch.where(taken, j, r), -1)
    return chosen


def _floyd_by_seed(h: torch.Tensor, count: torch.Tensor, degree: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """:func:`_floyd_cpu`'s positions for wide fanouts, the same ones: a slot's draw depends on its seed and slot
    alone, so each seed's draws are made at once and only the test "drawn before?" runs in order, in a set."""
    for s, c in enumerate(count.tolist()):
        if c <= 0:
            continue
        t = torch.arange(c)
        last = (int(degree[s]) - c + t).tolist()  # slot t draws from [0, last[t]]; a repeat takes last[t]
        taken: set[int] = set()
        for k, (r, j) in enumerate(zip(_draw_mixed(h[s], t, torch.tensor(last) + 1).tolist(), last)):
            last[k] = j if r in taken else r
            taken.add(last[k])
        chosen[s, :c] = torch.tensor(last)
    return chosen


def sample_hop(topology: Topology, seeds, k: int, replace: bool, key, index=None, seed_time=None,
               strategy: str = "uniform"):
    """Sample one hop: every seed gets up to ``k`` of its in-neighbours (see the module docstring).

    Args:
        topology: a :class:`~hmgstore.graph.Topology`, not closed.
        seeds: 1-D integer ids (tensor on any device, numpy array, list;
            repeats allowed) of destination nodes, each in ``[0, num_dst)``.
        k: neighbours per seed, an integer >= -1: without replacement a seed
            gets ``min(k, degree)`` (so a huge ``k`` costs no more than the
            largest degree), with replacement ``k`` draws when its degree is
            not 0 (the output then holds ``k`` per such seed), ``-1`` every
            neighbour once, whatever ``replace``.
        replace: a bool, sample with replacement.
        key: the hop's draw key, an integer of at least ``-2**63`` (larger
            ones read as their low 64 bits), or a one-element integer tensor.
        index: None, or 1-D integer ids [S], the index each seed draws as
            (default: its position in ``seeds``): an owner machine samples a
            requester's seeds as they sit in the requester's frontier, so
            that the draws equal the requester's own over the whole graph.
        seed_time: for a temporal topology (required there, refused
            elsewhere), 1-D integer [S], each seed's subgraph's time, sampled
            with ``strategy`` (``"uniform"`` or ``"last"``, :mod:`.temporal`;
            only ``"uniform"`` without times).

    Returns:
        ``(neighbours, edge ids, counts)``, int64 on the topology's device:
        ``neighbours`` [M] (source ids) and ``edge ids`` [M] (CSC
        positions), seed by seed, and ``counts`` [S] (neighbours per seed; M
        is their sum).

    Raises:
        TypeError: ``topology`` not a Topology; ``k``, ``key`` or ids not
            integers (floats and bools included); ``replace`` not a bool.
        ValueError: ``k`` under -1, or with ``replace`` over
            :data:`~hmgstore.graph.seeds.MAX_REPLACE_FANOUT`; ``key`` under ``-2**63``; ids not 1-D;
            ``index`` or ``seed_time`` not one per seed (``seed_time`` 1-D,
            each time within int64: a uint64 past 2**63 is refused, never
            wrapped); ``seed_time`` missing for a temporal topology or given
            for another; an unknown ``strategy``, or ``"last"`` without times.
        IndexError: a seed outside ``[0, num_dst)``.
        MemoryError: on the CPU, a hop with replacement needing more host memory than is available.
        RuntimeError: the topology is closed.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"sample_hop samples a hmgstore.graph.Topology, got {type(topology).__name__}")
    topology.check()
    k = checks.count(k, "k", at_least=-1)
    if not isinstance(replace, (bool, np.bool_)):
        raise TypeError(f"replace is a bool, got {replace!r}")
    if isinstance(key, torch.Tensor):
        if key.numel() != 1 or key.dtype.is_floating_point or key.dtype.is_complex or key.dtype == torch.bool:
            raise TypeError(f"key is an integer or a one-element integer tensor, got {key.dtype} {tuple(key.shape)}")
        key = key.reshape(1).to(topology.device, torch.int64) if topology.device.type == "cuda" else int(key)
    else:
        key = checks.count(key, "key", at_least=-2**63)
    if strategy not in temporal.STRATEGIES:
        raise ValueError(f"strategy is one of {temporal.STRATEGIES}, got {strategy!r}")
    if not topology.temporal and (seed_time is not None or strategy != "uniform"):
        raise ValueError("seed_time and strategy='last' apply to a temporal topology only; this one has no times")
    device = topology.device
    seeds = checks.id_list(seeds, "seeds", topology.num_dst).to(device)
    if index is not None:
        index = checks.integers(index, "index")
        if len(index) != len(seeds):
            raise ValueError(f"index holds {len(index)} ids for {len(seeds)} seeds: one per seed")
        index = index.to(device, torch.int64)
    if seed_time is not None:
        seed_time = temporal.integer_times(seed_time, "seed_time")  # a uint64 past 2**63 refused, not wrapped
        if seed_time.dim() != 1:
            raise ValueError(f"seed_time is 1-D, one time per seed; got shape {tuple(seed_time.shape)}")
        if len(seed_time) != len(seeds):
            raise ValueError(f"seed_time holds {len(seed_time)} times for {len(seeds)} seeds: one per seed")
        seed_time = seed_time.to(device, torch.int64)
    if replace and k > MAX_REPLACE_FANOUT:  # k rows a seed: the output could not be allocated
        raise ValueError(f"k is {k}: with replace=True every seed draws that many neighbours, which cannot be "
                         f"allocated; pass k <= {MAX_REPLACE_FANOUT}, or replace=False (at most a seed's in-degree)")
    if k > 0 and not replace:  # min(k, degree) per seed: slots beyond the largest degree would all go unused
        k = min(k, int(topology.degree(seeds).max()) if len(seeds) else 0)
    return _sample_hop(topology, seeds, k, replace, key, index, seed_time, strategy)


def _sample_hop(topology: Topology, seeds: torch.Tensor, k: int, replace: bool, key: int | torch.Tensor, index=None,
                seed_time: torch.Tensor | None = None, strategy: str = "uniform"):
    """:func:`sample_hop` with its arguments already checked (by the sampler that calls it): ``seeds`` int64
    on the topology's device, in range."""
    if topology.temporal and seed_time is None:
        raise ValueError("this topology is temporal: give each seed's time (seed_time)")
    replace = replace and k >= 0  # k < 0 takes every neighbour, with or without replacement (as PyG and DGL do)
    if topology.device.type == "cuda":
        key_t = key if isinstance(key, torch.Tensor) else torch.tensor([_signed(key)], device=topology.device)
        return _sample_hop_cuda(topology, seeds, k, replace, key_t, index, seed_time, strategy)
    # Gathers by index_select, not x[i]: torch's advanced indexing reads 1-D int64 tensors ~10x slower on a CPU
    # (700k ids: 20-38 ms against 1.6 ms, 2-core VM), and it was most of this hop's time.
    key = int(key)
    drawn_as = torch.arange(len(seeds)) if index is None else index
    if topology.weighted:
        return weighted.sample_hop_weighted(topology, seeds, k, replace, key, drawn_as)
    first = topology.colptr.index_select(0, seeds)
    if seed_time is not None and topology.temporal:
        offset, degree = temporal.time_window(topology, seeds, seed_time, k, strategy)
        first = first + offset
    else:
        degree = topology.degree(seeds)
    counts = slot_counts(degree, k, replace)
    topology.count(seeds, counts)
    if k >= 0:
        return _sample_hop_slots(topology, first, k, replace, key, drawn_as, degree, counts)
    offsets = counts.cumsum(0) - counts
    num_slots = int(counts.sum())
    seg = torch.repeat_interleave(torch.arange(len(seeds)), counts, output_size=num_slots)
    pos = torch.arange(num_slots) - offsets.index_select(0, seg)  # every neighbour (k < 0), in order
    eid = first.index_select(0, seg) + pos
    return topology.row.index_select(0, eid).long(), eid, counts


def _sample_hop_slots(topology: Topology, first: torch.Tensor, k: int, replace: bool, key: int,
                      drawn_as: torch.Tensor, degree: torch.Tensor, counts: torch.Tensor):
    """:func:`sample_hop` on the CPU for ``k >= 0``: every seed's ``k`` slots as one ``[S, k]`` matrix, the
    used ones (``t < counts``) taken seed by seed at the end, the same draws and order as slot by slot.
    ``first``: each seed's first CSC position (of its time window, when temporal); ``degree``: its list's
    (window's) length.

    No per-slot segment ids, no slot-sized ``nonzero``: 2-3x fewer passes over the hop's slots, most of
    which wait for both threads of a loaded 2-core machine (fanout 15,10,5, batch 1024, synthetic 200K).
    """
    # [S, k] int64 matrices (draws, positions, their hashes) and a bool mask: a replace fanout of millions asks
    # for terabytes, which Linux would grant and then kill the process for as they fill.
    check_room(len(first) * k * 33, f"a hop of {len(first)} seeds with a fanout of {k} on the CPU",
               "lower the fanout (with replace=True every seed draws k neighbours) or the batch size")
    slot = torch.arange(k)
    used = slot < counts[:, None]
    if replace:  # k draws per seed with neighbours (a seed with none uses no slot: any n >= 1 does)
        pos = _draw_mixed(_seed_hash(key, drawn_as)[:, None], slot, degree.clamp(min=1)[:, None])
    else:
        pos = slot.expand(len(first), k)  # seeds that take every neighbour
        floyd = (counts < degree).nonzero().view(-1)
        if len(floyd):
            chosen = _floyd_cpu(key, drawn_as.index_select(0, floyd), counts.index_select(0, floyd),
                                degree.index_select(0, floyd))  # [F, <= k]; -1 only past each count
            pos = pos.clone()
            pos[:, :chosen.shape[1]].index_copy_(0, floyd, chosen)
    eid = (first[:, None] + pos).masked_select(used)
    return topology.row.index_select(0, eid).long(), eid, counts


def _queue_hop(topology: Topology, nodes: torch.Tensor, lohi: torch.Tensor, max_seeds: int, k: int, replace: bool,
               key: torch.Tensor, num_dst: int, disjoint: bool, max_slots: int | None = None, index=None,
               seed_time=None, per_tree: bool = False, strategy: str = "uniform"):
    """Queue one hop's kernels for the seeds ``nodes[lohi[0]:lohi[1]]`` (bounds on the device, at most
    ``max_seeds``): ``(neighbour keys, edge ids, seeds' local ids, counts, ends)``, the first three over
    ``max_slots`` slots (default ``max_seeds * k``) of which ``ends[-1]`` are used. ``index``: see
    :func:`sample_hop`. ``seed_time``: a temporal topology's seed times (int64 on the device), per seed, or
    per tree (``per_tree``: a disjoint batch's seeds, indexed by key // num_dst)."""
    device = nodes.device
    replace = replace and k >= 0  # k < 0 takes every neighbour, with or without replacement (as PyG and DGL do)
    win_lo = win_deg = None
    if topology.temporal:
        win_lo, win_deg = (torch.empty(max_seeds, dtype=torch.int64, device=device) for _ in range(2))
        kernels.window(topology, nodes, lohi, max_seeds, num_dst, disjoint, seed_time, per_tree, k,
                       strategy == "last", win_lo, win_deg)
    counts = torch.empty(max_seeds, dtype=torch.int64, device=device)
    kernels.counts(nodes, lohi, max_seeds, topology.colptr, k, replace, num_dst, disjoint, counts, win_deg)
    ends = counts.cumsum(0)
    slots = max_seeds * k if max_slots is None else max_slots
    pos, nbr, eid, seed_local = (torch.empty(slots, dtype=torch.int64, device=device) for _ in range(4))
    rejection = (weighted.REJECT_RATIO, weighted.TRIALS_PER_SLOT, weighted.TRIALS_EXTRA)  # as the CPU reads them
    if topology.weighted and not replace and 0 <= k <= kernels.WARP_FANOUT and kernels.WEIGHTED_WARP:
        kernels.weighted_warp(topology, nodes, lohi, max_seeds, counts, ends, num_dst, disjoint, key, pos, rejection,
                              index)
    elif topology.weighted:
        keys = None if replace else torch.empty(slots, dtype=torch.float64, device=device)
        kernels.weighted(topology, nodes, lohi, max_seeds, counts, ends, num_dst, disjoint, key, pos, keys, replace,
                         rejection, index)
    elif not replace:
        kernels.floyd(nodes, lohi, max_seeds, topology.colptr, counts, ends, num_dst, disjoint, key, pos, index,
                      win_deg)
    kernels.read(topology, nodes, lohi, max_seeds, counts, ends, slots, pos, replace, key, num_dst, disjoint, nbr, eid,
                 seed_local, index, given=topology.weighted, win_lo=win_lo, win_deg=win_deg)
    return nbr, eid, seed_local, counts, ends


def _sample_hop_cuda(topology: Topology, seeds: torch.Tensor, k: int, replace: bool, key: torch.Tensor,
                     index=None, seed_time=None, strategy: str = "uniform"):
    """:func:`sample_hop` on a GPU: the hop's size is read back (one synchronisation) to size the output."""
    lohi = torch.tensor([0, len(seeds)], device=seeds.device)
    if k < 0:  # every neighbour: at most the degrees' sum (a time window only shortens a list)
        counts = torch.empty_like(seeds)
        kernels.counts(seeds, lohi, len(seeds), topology.colptr, k, replace, 1, False, counts)
        slots = int(counts.sum()) if len(seeds) else 0
    else:
        slots = len(seeds) * k
    nbr, eid, _, counts, ends = _queue_hop(topology, seeds, lohi, len(seeds), k, replace, key, 1, False, slots,
                                           index, seed_time, False, strategy)
    used = int(ends[-1]) if len(seeds) else 0  # the hop's one synchronisation: output sizes
    topology.count(seeds, counts)
    return nbr[:used], eid[:used], counts
