"""Induced subgraphs: every edge of the graph between a batch's sampled nodes (PyG's
``subgraph_type="induced"``).

Sampling finds the nodes; the edges are then all in-edges of each sampled
node whose source was sampled too, whatever hop found either end. They are
read with :func:`~hmgstore.graph.hop.sample_hop` taking every neighbour
(``k = -1``), so the topology's tiers serve them as they serve sampling, on
the CPU or a GPU, and filtered by a lookup in the sorted sampled ids.
"""
from __future__ import annotations

import torch

from .hop import _sample_hop
from .topology import Topology


def local_ids(nodes: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Position of each candidate in ``nodes`` (its first, for an id listed more than once), -1 where absent.
    Same device, int64."""
    if len(nodes) == 0:
        return torch.full_like(candidates, -1)
    ordered, order = torch.sort(nodes, stable=True)  # a repeated id's first position sorts first
    at = torch.searchsorted(ordered, candidates).clamp_(max=len(nodes) - 1)
    return torch.where(ordered[at] == candidates, order[at], -1)


def induced_edges(topology: Topology, src_nodes: torch.Tensor, dst_nodes: torch.Tensor):
    """Every edge of ``topology`` from a node of ``src_nodes`` to a node of ``dst_nodes``.

    ``src_nodes`` / ``dst_nodes``: int64 global ids of the edge type's
    source / destination type, on the topology's device. Returns
    ``(row, col, edge)``, int64 on that device: local ids into
    ``src_nodes`` and ``dst_nodes``, and the CSC position of each edge,
    destination by destination in ``dst_nodes`` order, in CSC order within
    one. An id listed twice (a batch's seeds may repeat, PyG keeps them)
    gets its in-edges at each of its positions as a destination, as PyG's
    induced subgraph gives them (each copy is a seed with a label and a
    loss, and needs its neighbours), and is the first of its positions as
    a source.
    """
    nbr, eid, counts = _sample_hop(topology, dst_nodes, -1, False, 0)  # k = -1: every in-edge, position by position
    col = torch.arange(len(dst_nodes), device=dst_nodes.device).repeat_interleave(counts, output_size=len(nbr))
    row = local_ids(src_nodes, nbr)
    keep = row >= 0
    return row[keep], col[keep], eid[keep]
