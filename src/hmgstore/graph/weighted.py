"""Edge-weighted neighbour sampling, as PyG defines it, on the CPU (the GPU runs the same algorithm in
``hmg_sample_weighted`` and ``hmg_sample_weighted_warp``, ``kernels/sample.cu``).

PyG's weighted sampler (pyg-lib) gives a node with ``deg`` in-edges of
weights ``w`` and a fanout ``k``:

- every in-edge when ``k < 0``, or when ``deg <= k`` without replacement
  (edges of weight 0 included: the fanout, not the weights, decides);
- without replacement otherwise, ``c = k`` edges drawn one after another,
  each with probability proportional to its weight among those not drawn yet
  (successive sampling), in draw order. Edges of weight 0 are taken only when
  fewer than ``c`` edges have a positive weight (PyG takes them there too, in
  an order it leaves open). All-equal weights give uniform sampling without
  replacement. Two ways to draw it, chosen per node:

  * *rejection*, for a node with ``deg > REJECT_RATIO * c`` whose weights are
    balanced (skew ``deg * wmax / sum(w) <= MAX_SKEW``, ``wmax`` its largest
    weight; :func:`rejection_wmax` decides once per topology). Trial ``t =
    0, 1, ...`` draws a position ``p`` uniform in ``[0, deg)`` and a ``u``
    uniform in ``[0, 1)``, and is accepted when ``u * wmax < w_p`` (float64 on
    both devices, so both accept the same trials). An accepted position not
    taken yet becomes the next slot, until ``c`` slots are taken. Given that a
    trial is accepted and new, it picks each position not taken with
    probability proportional to its weight: successive sampling exactly (up to
    the 2^-53 step of ``u``), reading about ``c * skew`` weights (at most
    ``8c`` on average) instead of all ``deg``. A node that has no ``c`` slots
    after :func:`rejection_trials` trials is scanned instead (below), from the
    start. Each trial is new and accepted with probability at least
    ``1 / MAX_SKEW - 1 / REJECT_RATIO = 1/8``, so that happens with
    probability below 1e-63 (the binomial tail at c = 1, the worst fanout);
    the scan being exact too, the slots differ from successive sampling by
    less than that in total variation;
  * *the scan*, for every other node: Efraimidis and Spirakis's keys: each
    edge gets ``-log(u) / w`` (``u`` uniform in (0, 1], so the key is
    exponential with rate ``w``) and the ``c`` smallest keys win, in key
    order, the order successive sampling draws them in. Edges of weight 0
    rank after every other edge, in random order among themselves.

  The two give the same distribution, not the same sample;
- with replacement, ``k`` independent draws, each edge with probability
  ``w / sum(w)`` (an inverse-CDF search); a node whose weights are all 0
  draws uniformly.

The uniforms come from :mod:`.draws` with the seed's hash and a counter: the
edge's position ``p`` for the scan's keys, the slot ``t`` with replacement,
``REJECT_COUNTER + 2t`` (position) and ``REJECT_COUNTER + 2t + 1`` (``u``) for
rejection trial ``t`` (above any position, so no draw is used twice). The CPU
and a GPU draw the same uniforms, so they take the same slots; the scan's keys
may differ in their last bits (log rounds differently on the two devices).
"""
from __future__ import annotations

import torch

from ..util.host_memory import check_room
from ..util.progress import tqdm
from .draws import _draw_mixed, _seed_hash, unit_closed_open, unit_open

#: The key of an edge of weight 0 is ZERO_KEY * (1 + u): above any key of a positive float32 weight
#: (-log(2^-53) / 2^-149 is about 2.6e46), random among weight-0 edges.
ZERO_KEY = 1e200
#: Rejection replaces the scan only where ``deg > REJECT_RATIO * c``. Each trial is then new and accepted with
#: probability at least 1/MAX_SKEW - 1/REJECT_RATIO = 1/8, so rejection reads at most 8c weights on average
#: (random single reads; about c * skew when the slots taken hold little of the weight, 2c for uniform random
#: weights) where the scan reads deg > 8c (coalesced); on the hubs it is for (deg ~1e5, c ~10) ~1000x fewer.
#: At least 2 * MAX_SKEW: a balanced list then has over 2c positive weights, and the 1/8 above holds.
REJECT_RATIO = 8
#: Largest ``deg * wmax / sum(w)`` (the largest weight over the mean: the trials a slot takes while few are
#: taken) for rejection: uniform random weights give about 2, all-equal ones 1; above it most trials are
#: rejected and the scan costs about as little.
MAX_SKEW = 4.0
#: Trial t of rejection draws counters REJECT_COUNTER + 2t and + 2t + 1 (REJECT_COUNTER in kernels/sample.cu):
#: above the seed's other counters, positions (the scan; lists under 2^40 edges) and slots (with replacement).
REJECT_COUNTER = 1 << 40
#: At most TRIALS_PER_SLOT * c + TRIALS_EXTRA trials a node (then the scan): a failure probability below 1e-63.
TRIALS_PER_SLOT, TRIALS_EXTRA = 64, 1024
assert REJECT_RATIO >= 2 * MAX_SKEW
#: Edges per pass of :func:`rejection_wmax` (bounds its temporaries on graphs of billions of edges).
_WMAX_STEP = 1 << 24


def rejection_trials(counts: torch.Tensor) -> torch.Tensor:
    """Trials allowed before rejection gives up for a node (then the scan): int64 like ``counts``."""
    return counts * TRIALS_PER_SLOT + TRIALS_EXTRA


def rejection_wmax(weight: torch.Tensor, colptr: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """Each destination's largest weight where its list may be sampled by rejection, else 0 (the scan).

    ``weight``: float32 [E] >= 0 in CSC order; ``colptr``: int64 [num_dst + 1]; both on the CPU. A node
    qualifies when its largest weight is positive and ``deg * wmax <= MAX_SKEW * sum(w)`` (the sum in
    float64). Returns float32 [num_dst] on the CPU; runs over at most ``_WMAX_STEP`` edges at a time.
    """
    num_dst = len(colptr) - 1
    wmax = torch.zeros(num_dst, dtype=torch.float32)
    total = torch.zeros(num_dst, dtype=torch.float64)
    lo = 0
    with tqdm(total=num_dst, unit="node", unit_scale=True, desc="weighted sampling: largest weights",
              leave=False, disable=not progress or len(weight) < _WMAX_STEP) as bar:
        while lo < num_dst:  # nodes [lo, hi): about _WMAX_STEP edges, at least one node
            hi = int(torch.searchsorted(colptr, colptr[lo] + _WMAX_STEP, right=True)) - 1
            hi = min(num_dst, max(hi, lo + 1))
            degree = colptr[lo + 1:hi + 1] - colptr[lo:hi]
            seg = torch.repeat_interleave(torch.arange(hi - lo), degree, output_size=int(colptr[hi] - colptr[lo]))
            w = weight[int(colptr[lo]):int(colptr[hi])]
            wmax[lo:hi].scatter_reduce_(0, seg, w, "amax")  # weights >= 0: the zeros it starts from are no max
            total[lo:hi].index_add_(0, seg, w.double())
            bar.update(hi - lo)
            lo = hi
    degree = colptr.diff()
    balanced = (wmax > 0) & (degree * wmax.double() <= MAX_SKEW * total)
    return torch.where(balanced, wmax, 0.0)


def exponential_keys(weight: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Efraimidis-Spirakis keys, smallest first: ``-log(u) / w``, and weight-0 edges last in random order.

    ``weight``: float [N] >= 0; ``u``: float64 [N] in (0, 1]. Returns float64 [N].
    """
    w = weight.double()
    return torch.where(w > 0, -torch.log(u) / w.clamp(min=torch.finfo(torch.float64).tiny), ZERO_KEY * (1 + u))


def weighted_positions(weight: torch.Tensor, first: torch.Tensor, degree: torch.Tensor, counts: torch.Tensor,
                       key: int, drawn_as: torch.Tensor, replace: bool, wmax: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """The positions (in each node's list) that weighted sampling draws, for nodes that draw at all.

    ``weight``: float32 [E] in CSC order (CPU); ``first``, ``degree``,
    ``counts``, ``drawn_as``: int64 [F], each node's first CSC position,
    in-degree (>= 1), slots to fill (``1 <= counts < degree`` without
    replacement) and draw index; ``key``: the hop's draw key; ``wmax``:
    float32 [F], the nodes' :func:`rejection_wmax` (None: every node scanned).
    Returns int64 [sum(counts)]: node after node, each node's positions in
    draw order.
    """
    h = _seed_hash(key, drawn_as)
    if replace:
        return _with_replacement(weight, first, degree, counts, h)
    node_of_slot = torch.repeat_interleave(torch.arange(len(degree)), counts, output_size=int(counts.sum()))
    out = torch.empty(len(node_of_slot), dtype=torch.int64)
    scan = torch.ones(len(degree), dtype=torch.bool)
    if wmax is not None and len(hubs := ((degree > REJECT_RATIO * counts) & (wmax > 0)).nonzero().view(-1)):
        found, done = rejection_positions(weight, first.index_select(0, hubs), degree.index_select(0, hubs),
                                          counts.index_select(0, hubs), wmax.index_select(0, hubs),
                                          h.index_select(0, hubs))
        scan.index_fill_(0, hubs.masked_select(done), False)
        found = found[done]
        out.index_copy_(0, (~scan).index_select(0, node_of_slot).nonzero().view(-1), found.masked_select(found >= 0))
    scanned = scan.nonzero().view(-1)
    if len(scanned):
        keys = _scan_positions(weight, first.index_select(0, scanned), degree.index_select(0, scanned),
                               counts.index_select(0, scanned), h.index_select(0, scanned))
        out.index_copy_(0, scan.index_select(0, node_of_slot).nonzero().view(-1), keys)
    return out


def _lists(weight: torch.Tensor, first: torch.Tensor, degree: torch.Tensor):
    """Every edge of the nodes' lists, node after node: ``(node, position in its list, weight, list starts)``."""
    total = int(degree.sum())
    seg = torch.repeat_interleave(torch.arange(len(degree)), degree, output_size=total)
    start = degree.cumsum(0) - degree
    p = torch.arange(total) - start.index_select(0, seg)
    return seg, p, weight.index_select(0, first.index_select(0, seg) + p), start


def _scan_positions(weight: torch.Tensor, first: torch.Tensor, degree: torch.Tensor, counts: torch.Tensor,
                    h: torch.Tensor) -> torch.Tensor:
    """:func:`weighted_positions` without replacement by the scan (the ``counts`` smallest keys); ``h``: the
    nodes' seed hashes."""
    seg, p, w, start = _lists(weight, first, degree)
    keys = exponential_keys(w, unit_open(h.index_select(0, seg), p))
    order = torch.argsort(keys)
    order = order.index_select(0, torch.argsort(seg.index_select(0, order), stable=True))  # node, then key
    rank = torch.arange(len(seg)) - start.index_select(0, seg)  # seg is sorted, so rank within the node
    keep = rank < counts.index_select(0, seg)
    return p.index_select(0, order).masked_select(keep)


def rejection_positions(weight: torch.Tensor, first: torch.Tensor, degree: torch.Tensor, counts: torch.Tensor,
                        wmax: torch.Tensor, h: torch.Tensor, trials: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling (module docstring) for nodes that qualify, in rounds of trials for the unfinished.

    ``weight``: float32 [E] in CSC order; ``first``, ``degree``, ``counts``: int64 [H]; ``wmax``: float32 [H]
    > 0; ``h``: int64 [H], the nodes' seed hashes; ``trials``: trials per node a round (None: 4 a slot, at
    least 32). Returns ``(slots, done)``: int64 [H, max count], each node's positions in draw order and -1
    past its count, and bool [H], whether the node found its count within :func:`rejection_trials` (where
    not, its row is to be ignored). Every round size gives the same slots: the first distinct accepted
    positions in trial order.
    """
    num, width = len(counts), int(counts.max())
    slots = torch.full((num, width), -1, dtype=torch.int64)
    filled = torch.zeros(num, dtype=torch.int64)
    bound = rejection_trials(counts)
    wmax = wmax.double()
    trials = trials or max(32, 4 * width)  # ~2c trials fill c slots for uniform random weights: mostly one round
    active = torch.arange(num)
    t0 = 0
    while len(active):
        a_h, a_bound = h.index_select(0, active)[:, None], bound.index_select(0, active)
        t = t0 + torch.arange(trials)
        counter = REJECT_COUNTER + 2 * t
        p = _draw_mixed(a_h, counter, degree.index_select(0, active)[:, None])
        u = unit_closed_open(a_h, counter + 1)
        w = weight.index_select(0, (first.index_select(0, active)[:, None] + p).view(-1)).view(p.shape).double()
        accepted = (u * wmax.index_select(0, active)[:, None] < w) & (t < a_bound[:, None])
        a_counts = counts.index_select(0, active)
        new, n = _first_distinct(torch.cat([slots.index_select(0, active), torch.where(accepted, p, -1)], 1),
                                 a_counts, width)
        slots.index_copy_(0, active, new)
        filled.index_copy_(0, active, n)
        t0 += trials
        active = active.masked_select((n < a_counts) & (t0 < a_bound))
    return slots, filled == counts


def _first_distinct(candidates: torch.Tensor, counts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the first ``counts`` distinct values >= 0 of ``candidates``, in column order.

    ``candidates``: int64 [N, W], -1 for none; ``counts``: int64 [N] <= ``width``. Returns int64 [N, width]
    (-1 past what was found) and how many were found, int64 [N].
    """
    col = torch.arange(candidates.shape[1])
    values = torch.where(candidates >= 0, candidates, -1 - col)  # a "none" equals no other entry
    ordered, order = torch.sort(values, dim=1, stable=True)  # equal values in column order: the first one first
    repeat = torch.cat([torch.zeros_like(ordered[:, :1], dtype=torch.bool), ordered[:, 1:] == ordered[:, :-1]], 1)
    keep = (candidates >= 0) & ~torch.zeros_like(repeat).scatter_(1, order, repeat)
    rank = keep.long().cumsum(1) - 1
    keep &= rank < counts[:, None]
    out = torch.full((len(candidates), width + 1), -1, dtype=torch.int64)  # the last column takes what is dropped
    out.scatter_(1, torch.where(keep, rank, width), torch.where(keep, candidates, -1))
    return out[:, :width], keep.sum(1)


def _with_replacement(weight: torch.Tensor, first: torch.Tensor, degree: torch.Tensor, counts: torch.Tensor,
                      h: torch.Tensor) -> torch.Tensor:
    """:func:`weighted_positions` with replacement: each slot searches its node's running sum of weights."""
    seg, _, w, start = _lists(weight, first, degree)
    # each list over its own largest weight: the running sum below spans the whole hop, and a light list beside a
    # heavy one would else round to a total of 0 (drawn as if unweighted, zero weights included) or lose its
    # proportions; scaled, every list with a positive weight sums to at least 1
    w = w.double()
    peak = torch.zeros(len(degree), dtype=torch.float64).scatter_reduce_(0, seg, w, "amax")
    w = w / torch.where(peak > 0, peak, 1.0).index_select(0, seg)
    num_slots = int(counts.sum())
    slot_seg = torch.repeat_interleave(torch.arange(len(degree)), counts, output_size=num_slots)
    t = torch.arange(num_slots) - (counts.cumsum(0) - counts).index_select(0, slot_seg)
    cum = w.cumsum(0)
    last = start + degree - 1
    before = cum.index_select(0, start) - w.index_select(0, start)  # the running sum up to each node's list
    total = cum.index_select(0, last) - before
    hs, lo, hi = h.index_select(0, slot_seg), start.index_select(0, slot_seg), last.index_select(0, slot_seg)
    target = before.index_select(0, slot_seg) + unit_closed_open(hs, t) * total.index_select(0, slot_seg)
    at = torch.minimum(torch.maximum(torch.searchsorted(cum, target, right=True), lo), hi)
    uniform = _draw_mixed(hs, t, degree.index_select(0, slot_seg))  # nodes whose weights are all 0
    return torch.where(total.index_select(0, slot_seg) > 0, at - lo, uniform)


def sample_hop_weighted(topology, seeds: torch.Tensor, k: int, replace: bool, key: int, drawn_as: torch.Tensor):
    """:func:`hmgstore.graph.hop.sample_hop` on the CPU for a weighted topology: ``(neighbours, edge ids,
    counts)``, as there (``k < 0``: every neighbour)."""
    degree = topology.degree(seeds)
    if k < 0:
        counts = degree.clone()
    else:
        counts = torch.where(degree > 0, k, 0) if replace else degree.clamp(max=k)
    topology.count(seeds, counts)
    num_slots = int(counts.sum())
    if replace:  # ~10 slot-sized int64 and float64 arrays below; without replacement the slots are edges
        check_room(num_slots * 80, f"a weighted hop of {len(seeds)} seeds with a fanout of {k} on the CPU",
                   "lower the fanout (with replace=True every seed draws k neighbours) or the batch size")
    seg = torch.repeat_interleave(torch.arange(len(seeds)), counts, output_size=num_slots)
    pos = torch.arange(num_slots) - (counts.cumsum(0) - counts).index_select(0, seg)  # every neighbour, in order
    first = topology.colptr.index_select(0, seeds)
    drawing = ((degree > 0) if replace else (counts < degree)) & (k >= 0)
    chosen = drawing.nonzero().view(-1)
    if len(chosen):
        drawn = weighted_positions(topology.weight, first.index_select(0, chosen), degree.index_select(0, chosen),
                                   counts.index_select(0, chosen), key, drawn_as.index_select(0, chosen), replace,
                                   topology.rejection_wmax.index_select(0, seeds.index_select(0, chosen)))
        pos.index_copy_(0, drawing.index_select(0, seg).nonzero().view(-1), drawn)
    eid = first.index_select(0, seg) + pos
    return topology.row.index_select(0, eid).long(), eid, counts
