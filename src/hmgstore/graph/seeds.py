"""A sampler's inputs, checked where it takes them: a batch's seeds (per node type, one 1-D list of node ids)
and the fanouts that sampling with replacement can size."""
from __future__ import annotations

import torch

from ..rows.ids import normalize_many


def check_seeds(seeds: dict, num_nodes: dict, device: torch.device, disjoint: bool = False) -> dict:
    """``seeds`` (node type -> ids) as int64 [S] tensors on ``device``, every id in ``[0, num_nodes[type])``.

    Ids as a table takes them (a tensor on any device, a numpy array, a list, a range), but 1-D only: a
    sampler grows one subgraph per seed and counts the batch's seeds as ``len(ids)``, so a ``[2, 3]`` tensor
    would be sampled as 6 seeds of a batch of 2 (PyG's loaders, too, read ``batch_size`` seeds off its front).

    With ``disjoint``, a node of tree ``s`` has the key ``s * num_nodes[type] + id`` (int64): a batch whose
    seed count times the largest node count passes 2**63 is refused, its keys would wrap.

    Raises:
        KeyError: a node type missing from ``num_nodes``.
        TypeError: ids that are not integers.
        ValueError: ids that are not 1-D (a single id included); a disjoint batch too large for its keys.
        IndexError: an id out of range.
    """
    unknown = [nt for nt in seeds if nt not in num_nodes]
    if unknown:
        raise KeyError(f"no node type {unknown[0]!r}; the graph has {list(num_nodes)}")
    checked = normalize_many([(ids, num_nodes[nt]) for nt, ids in seeds.items()], device)
    for nt, index in zip(seeds, checked):
        if len(index.shape) != 1:
            whose = "seeds" if nt is None else f"seeds of {nt!r}"
            raise ValueError(f"{whose} must be a 1-D list of node ids, one subgraph each; got shape "
                             f"{tuple(index.shape)}: pass ids.reshape(-1) to sample every id, or [id] for one seed")
    trees, most = max((i.ids.numel() for i in checked), default=0), max(num_nodes.values(), default=0)
    if disjoint and trees * most > 2**63:  # the largest key, trees * most - 1, must stay within int64
        raise ValueError(f"a disjoint batch of {trees} seeds over node types of up to {most} nodes needs node keys "
                         f"(seed index * node count + id) past int64's range; sample smaller batches (at most "
                         f"{2**63 // max(most, 1)} seeds)")
    return {nt: index.ids.long() for nt, index in zip(seeds, checked)}


#: With replacement a hop's output holds seeds x k rows (8 bytes each, in several tensors): past 2**31 - 1 draws
#: per node, one seed alone asks for 16 GB or more.
MAX_REPLACE_FANOUT = 2**31 - 1


def check_replace_fanout(num_neighbors: dict) -> None:
    """Raise ValueError for a fanout over :data:`MAX_REPLACE_FANOUT` in ``num_neighbors`` (edge type -> list of
    ints, key None when homogeneous), which sampling with ``replace=True`` cannot allocate."""
    for et, fanout in num_neighbors.items():
        for hop, k in enumerate(fanout):
            if k > MAX_REPLACE_FANOUT:
                of = f" of {et!r}" if et is not None else ""
                raise ValueError(
                    f"num_neighbors{of}[{hop}] is {k}: with replace=True every node draws that many neighbours, "
                    f"so a batch's output ({k} rows per seed) cannot be allocated; pass a fanout of at most "
                    f"{MAX_REPLACE_FANOUT}, or replace=False (which takes at most a node's in-degree)")
