"""Edge-weighted neighbour sampling, as PyG defines it, on the CPU (the GPU runs the same algorithm in
``hmg_sample_weighted``, ``kernels/sample.cu``).

PyG's weighted sampler (pyg-lib) gives a node with ``deg`` in-edges of
weights ``w`` and a fanout ``k``:

- every in-edge when ``k < 0``, or when ``deg <= k`` without replacement
  (edges of weight 0 included: the fanout, not the weights, decides);
- without replacement otherwise, ``k`` edges drawn one after another, each
  with probability proportional to its weight among those not drawn yet
  (successive sampling). We draw it as Efraimidis and Spirakis do: each edge
  gets the key ``-log(u) / w`` (``u`` uniform in (0, 1], so the key is
  exponential with rate ``w``) and the ``k`` smallest keys win, in key
  order, which is the order successive sampling draws them in. Edges of
  weight 0 rank after every other edge, in random order among themselves, so
  they are taken only when fewer than ``k`` edges have a positive weight
  (PyG takes them there too, in an order it leaves open). All-equal weights
  give uniform sampling without replacement;
- with replacement, ``k`` independent draws, each edge with probability
  ``w / sum(w)`` (an inverse-CDF search); a node whose weights are all 0
  draws uniformly.

The uniforms come from :mod:`.draws`: counter ``p`` (the edge's position in
its list) without replacement, counter ``t`` (the slot) with it, so the
CPU and a GPU rank the same edges from the same key.
"""
from __future__ import annotations

import torch

from .draws import _draw_mixed, _seed_hash, unit_closed_open, unit_open

#: The key of an edge of weight 0 is ZERO_KEY * (1 + u): above any key of a positive float32 weight
#: (-log(2^-53) / 2^-149 is about 2.6e46), random among weight-0 edges.
ZERO_KEY = 1e200


def exponential_keys(weight: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Efraimidis-Spirakis keys, smallest first: ``-log(u) / w``, and weight-0 edges last in random order.

    ``weight``: float [N] >= 0; ``u``: float64 [N] in (0, 1]. Returns float64 [N].
    """
    w = weight.double()
    return torch.where(w > 0, -torch.log(u) / w.clamp(min=torch.finfo(torch.float64).tiny), ZERO_KEY * (1 + u))


def weighted_positions(weight: torch.Tensor, first: torch.Tensor, degree: torch.Tensor, counts: torch.Tensor,
                       key: int, drawn_as: torch.Tensor, replace: bool) -> torch.Tensor:
    """The positions (in each node's list) that weighted sampling draws, for nodes that draw at all.

    ``weight``: float32 [E] in CSC order (CPU); ``first``, ``degree``,
    ``counts``, ``drawn_as``: int64 [F], each node's first CSC position,
    in-degree (>= 1), slots to fill (``counts <= degree`` without
    replacement) and draw index; ``key``: the hop's draw key. Returns int64
    [sum(counts)]: node after node, each node's positions in draw order.
    """
    num = len(degree)
    total = int(degree.sum())
    seg = torch.repeat_interleave(torch.arange(num), degree, output_size=total)
    start = degree.cumsum(0) - degree
    p = torch.arange(total) - start.index_select(0, seg)
    w = weight.index_select(0, first.index_select(0, seg) + p)
    h = _seed_hash(key, drawn_as)
    if not replace:
        keys = exponential_keys(w, unit_open(h.index_select(0, seg), p))
        order = torch.argsort(keys)
        order = order.index_select(0, torch.argsort(seg.index_select(0, order), stable=True))  # node, then key
        rank = torch.arange(total) - start.index_select(0, seg)  # seg is sorted, so rank within the node
        keep = rank < counts.index_select(0, seg)
        return p.index_select(0, order).masked_select(keep)
    return _with_replacement(w.double(), seg, start, degree, counts, h)


def _with_replacement(w: torch.Tensor, seg: torch.Tensor, start: torch.Tensor, degree: torch.Tensor,
                      counts: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """:func:`weighted_positions` with replacement: each slot searches its node's running sum of weights."""
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
    seg = torch.repeat_interleave(torch.arange(len(seeds)), counts, output_size=num_slots)
    pos = torch.arange(num_slots) - (counts.cumsum(0) - counts).index_select(0, seg)  # every neighbour, in order
    first = topology.colptr.index_select(0, seeds)
    drawing = ((degree > 0) if replace else (counts < degree)) & (k >= 0)
    chosen = drawing.nonzero().view(-1)
    if len(chosen):
        drawn = weighted_positions(topology.weight, first.index_select(0, chosen), degree.index_select(0, chosen),
                                   counts.index_select(0, chosen), key, drawn_as.index_select(0, chosen), replace)
        pos.index_copy_(0, drawing.index_select(0, seg).nonzero().view(-1), drawn)
    eid = first.index_select(0, seg) + pos
    return topology.row.index_select(0, eid).long(), eid, counts
