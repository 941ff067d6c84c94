"""Hotness by pre-sampling: how often each node's features and adjacency are touched in an epoch.

GNNLab's observation: the nodes a sampler touches concentrate, and the set is
stable from epoch to epoch, so counting them over one epoch of real sampling
predicts the next epochs far better than degree does on graphs that train on a
small share of their nodes (papers100M: 96% hits with a 5% cache, against 29%
by degree; research notes). :func:`presample` runs the sampler over the
training seeds and counts, per node type:

- ``features``: every node of a batch (each is gathered once per batch);
- ``topology``: every node whose adjacency list is read (a batch's nodes but
  those found by the last hop).

``hotness.order_by_score(counts)`` turns either into a ``hot_order``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rows import checks
from ..util.progress import tqdm
from .sampler import NeighborSampler


@dataclass
class Hotness:
    """Touch counts per node type (key None when homogeneous), int64 CPU tensors."""

    features: dict
    topology: dict
    batches: int


def presample(sampler: NeighborSampler, seeds, *, epochs: int = 1, batch_size: int = 1024, node_type=None,
              generator: torch.Generator | None = None, progress: bool = True) -> Hotness:
    """Count how often each node's features and adjacency are touched over ``epochs`` of batches.

    ``sampler``: a :class:`hmgstore.graph.NeighborSampler` (or anything with
    a ``.sampler`` that is one, such as the PyG adapter); ``seeds``: the
    training node ids (of ``node_type`` on heterogeneous graphs), shuffled
    into batches of ``batch_size`` each epoch with ``generator``. No seeds
    make no batches (``Hotness.batches == 0``, every count 0). Raises
    TypeError for another sampler or non-integer seeds, IndexError for seeds
    that are not nodes of ``node_type``, ValueError for an unknown
    ``node_type``, ``batch_size`` under 1 or negative ``epochs``.
    """
    core = getattr(sampler, "sampler", sampler)
    if not isinstance(core, NeighborSampler):
        raise TypeError(f"presample takes a hmgstore NeighborSampler (or its PyG adapter), "
                        f"got {type(sampler).__name__}")
    if node_type not in core.num_nodes:
        raise ValueError(f"node_type {node_type!r} is not a node type of the sampler's graph: {list(core.num_nodes)}")
    seeds = checks.id_list(torch.as_tensor(seeds).reshape(-1) if isinstance(seeds, torch.Tensor) else seeds,
                           "seeds", core.num_nodes[node_type])
    epochs = checks.count(epochs, "epochs")
    batch_size = checks.count(batch_size, "batch_size", at_least=1)
    device = core.device
    features = {nt: torch.zeros(n, dtype=torch.int64, device=device) for nt, n in core.num_nodes.items()}
    topology = {nt: torch.zeros(n, dtype=torch.int64, device=device) for nt, n in core.num_nodes.items()}
    batches = 0
    total = epochs * -(-len(seeds) // batch_size)
    with tqdm(total=total, desc="pre-sampling hotness", unit="batch", disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            order = seeds[torch.randperm(len(seeds), generator=generator)]
            for batch in order.split(batch_size) if len(order) else ():  # no seeds: no batch
                out = core.sample({node_type: batch})
                for nt, nodes in out.node.items():
                    ones = torch.ones_like(nodes)
                    features[nt].index_add_(0, nodes, ones)
                    read = len(nodes) - out.num_sampled_nodes[nt][-1]  # the last hop's nodes are not expanded
                    topology[nt].index_add_(0, nodes[:read], ones[:read])
                batches += 1
                bar.update()
    return Hotness({nt: c.cpu() for nt, c in features.items()}, {nt: c.cpu() for nt, c in topology.items()}, batches)


def hit_ratio(counts: torch.Tensor, cached: torch.Tensor) -> float:
    """Share of the touches ``counts`` [num_nodes] that fall on the ``cached`` node ids."""
    total = int(counts.sum())
    return float(counts[cached].sum()) / total if total else 0.0
