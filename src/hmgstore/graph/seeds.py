"""A batch's seeds, checked where a sampler takes them: per node type, one 1-D list of node ids."""
from __future__ import annotations

import torch

from ..rows.ids import normalize_many


def check_seeds(seeds: dict, num_nodes: dict, device: torch.device) -> dict:
    """``seeds`` (node type -> ids) as int64 [S] tensors on ``device``, every id in ``[0, num_nodes[type])``.

    Ids as a table takes them (a tensor on any device, a numpy array, a list, a range), but 1-D only: a
    sampler grows one subgraph per seed and counts the batch's seeds as ``len(ids)``, so a ``[2, 3]`` tensor
    would be sampled as 6 seeds of a batch of 2 (PyG's loaders, too, read ``batch_size`` seeds off its front).

    Raises:
        KeyError: a node type missing from ``num_nodes``.
        TypeError: ids that are not integers.
        ValueError: ids that are not 1-D (a single id included).
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
    return {nt: index.ids.long() for nt, index in zip(seeds, checked)}
