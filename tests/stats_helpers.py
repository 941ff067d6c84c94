"""Exact sampling distributions of tiny neighbourhoods, and a chi-square check of draws against them.

Weighted sampling without replacement, as PyG defines it, draws ``k`` of a
node's edges one after another, each with probability proportional to its
weight among those left (edges of weight 0 only once no positive weight is
left, uniformly). :func:`successive_set_probabilities` enumerates every
ordered draw of a tiny neighbourhood and sums them per set.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

import torch


def successive_set_probabilities(weights: list[float], k: int) -> dict[tuple, float]:
    """Sorted position tuple -> probability that successive weighted sampling of ``k`` picks that set."""
    probs: dict[tuple, float] = {}
    for seq in itertools.permutations(range(len(weights)), k):
        p, left = 1.0, set(range(len(weights)))
        for i in seq:
            positive = sum(weights[j] for j in left)
            p *= weights[i] / positive if positive > 0 else 1.0 / len(left)
            left.discard(i)
        if p > 0:
            key = tuple(sorted(seq))
            probs[key] = probs.get(key, 0.0) + p
    return probs


def chi2_critical(dof: int, alpha: float = 1e-4) -> float:
    """The chi-square quantile ``1 - alpha`` (Wilson-Hilferty; within a percent for dof >= 2)."""
    z = {1e-3: 3.0902, 1e-4: 3.7190, 1e-6: 4.7534}[alpha]
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * math.sqrt(c)) ** 3


def chi2_statistic(observed: Counter, expected: dict[tuple, float], n: int) -> tuple[float, int]:
    """``(statistic, degrees of freedom)`` of ``observed`` counts (of ``n`` draws) against ``expected``
    probabilities; a draw outside the support makes the statistic infinite."""
    if any(key not in expected for key in observed):
        return math.inf, max(1, len(expected) - 1)
    stat = sum((observed.get(key, 0) - n * p) ** 2 / (n * p) for key, p in expected.items())
    return stat, max(1, len(expected) - 1)


def sets_of(positions: torch.Tensor, counts: torch.Tensor) -> Counter:
    """Counter of each seed's sampled positions as a sorted tuple (``positions`` seed by seed)."""
    out: Counter = Counter()
    at = 0
    for c in counts.tolist():
        out[tuple(sorted(positions[at:at + c].tolist()))] += 1
        at += c
    return out


def passes(observed: Counter, expected: dict[tuple, float], n: int, alpha: float = 1e-4) -> bool:
    stat, dof = chi2_statistic(observed, expected, n)
    return stat < chi2_critical(dof, alpha)
