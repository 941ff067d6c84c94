"""LABOR (layer-neighbour) sampling, LABOR-0 of Balin and Catalyurek (NeurIPS 2023), DGL's ``LaborSampler``.

Uniform sampling lets every seed draw its ``k`` neighbours on its own, so
two seeds that share neighbours rarely pick the same ones. LABOR draws one
uniform ``r_t`` per source node ``t`` for the whole hop (of the whole
batch), and a seed ``s`` with ``d_s`` in-edges takes neighbour ``t`` when
``r_t <= k / d_s``: each edge is still taken with probability
``min(1, k / d_s)``, a seed gets ``k`` neighbours on average (all of them
when ``d_s <= k``), but seeds that share a neighbour take it together, so a
hop finds fewer distinct nodes and the batch reads fewer feature rows.
The number per seed varies (binomial-like); ``k = -1`` takes every
neighbour.

``r_t`` is a hash of the hop's key and ``t`` (:mod:`.draws`), so the CPU
and a GPU take the same edges. The hop reads every in-edge of its seeds
(as any LABOR sampler must, to see each ``r_t``) through
:func:`~hmgstore.graph.hop.sample_hop` with ``k = -1``, from whatever tiers
hold the topology, then keeps the edges that pass, with torch on the
sampler's device.
"""
from __future__ import annotations

import torch

from .draws import _seed_hash, _signed, unit_closed_open
from .hop import _sample_hop
from .topology import Topology


def node_variates(key: int, nodes: torch.Tensor) -> torch.Tensor:
    """``r_t`` for source nodes ``nodes`` (int64, any device): float64 uniform in [0, 1), one per node id."""
    return unit_closed_open(_seed_hash(_signed(key), nodes), 0)


def sample_hop_labor(topology: Topology, seeds: torch.Tensor, k: int, key: int):
    """One LABOR hop: ``(neighbours, edge ids, counts)`` as :func:`~hmgstore.graph.hop.sample_hop` returns
    them. ``seeds``: int64 [S] destination ids on the topology's device; ``key``: the hop's draw key (int)."""
    nbr, eid, degree = _sample_hop(topology, seeds, -1, False, key)
    if k < 0 or len(nbr) == 0:
        return nbr, eid, degree
    seg = torch.repeat_interleave(torch.arange(len(seeds), device=seeds.device), degree, output_size=len(nbr))
    r = node_variates(key, nbr)
    keep = r * degree.index_select(0, seg).double() <= k  # r_t <= k / d_s, every neighbour when d_s <= k
    counts = torch.zeros_like(degree).index_add_(0, seg, keep.long())
    return nbr[keep], eid[keep], counts
