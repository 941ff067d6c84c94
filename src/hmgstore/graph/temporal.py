"""Temporal neighbour sampling, as PyG defines it: no neighbour from the future of its subgraph's seed.

Every subgraph (temporal sampling is disjoint: one tree per seed) carries
its seed's time ``T``. A node of that tree samples only among its
in-edges whose time is ``<= T``: the source node's time (node-level
``time_attr``) or the edge's own (edge-level). Each node's in-edges are
kept sorted by that time (:func:`sort_by_time`), so those edges are a
prefix of its list, found by binary search: its *window*. With
``strategy="uniform"`` the node samples its window as uniform sampling
samples a whole list; with ``"last"`` the window is cut to its last ``k``
edges (the most recent), which are then all taken, in list order (``k <
0``: the whole window). Both as pyg-lib's CPU sampler.

A window is ``(offset, size)`` per seed, relative to the node's first CSC
position: :func:`time_window` computes it with torch on the CPU,
``hmg_sample_window`` (``kernels/sample.cu``) on a GPU, and the hop's
sampling then runs over the windows instead of the whole lists.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ..rows import checks
from .csc import CSC, unshared

STRATEGIES = ("uniform", "last")


def integer_times(times, what: str) -> torch.Tensor:
    """``times`` as a tensor of an integer dtype whose every value int64 holds (cast later, never wrapped: a
    uint64 time past 2**63 would turn negative and sort before every other). Raises TypeError for floats,
    complex numbers and bools, ValueError for a value past int64's range, naming ``what``."""
    try:
        given = torch.as_tensor(times)
    except (ValueError, OverflowError) as err:  # a Python int past 2**63, a ragged list
        raise (ValueError(f"{what} holds a time outside int64's range: store times as int64") if "Overflow" in str(err)
               else ValueError(f"{what} is not a list of times: {err}")) from None
    if given.dtype.is_floating_point or given.dtype.is_complex or given.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer times (int64, e.g. seconds since an epoch), as PyG's sampler "
                        f"requires; got dtype {given.dtype}")
    if checks.past_int64(given):
        raise ValueError(f"{what} holds a time of 2**63 or more, past int64's range (PyG's samplers take int64 "
                         "times): store them as int64")
    return given


def check_times(times, length: int, what: str) -> torch.Tensor:
    """``times`` as an int64 CPU tensor of ``length`` values, never sharing the caller's memory (int64 CPU
    times are copied, once: a sampler holds them, and the caller's later edits must not reach it). Raises
    TypeError for non-integer times (PyG's samplers take int64 times too) and ValueError for a wrong length,
    naming ``what``."""
    given = integer_times(times, what)
    times = given.detach().to("cpu", torch.int64).reshape(-1)
    if times.numel() != length:
        raise ValueError(f"{what} must hold {length} times, one per {'edge' if 'edge' in what else 'node'}; "
                         f"got {times.numel()}")
    return unshared(times, given)


def sort_by_time(csc: CSC, node_time=None, edge_time=None) -> CSC:
    """``csc`` with each node's in-edges sorted by time (stably): the source's ``node_time`` (int64
    [num_src]) or the edge's ``edge_time`` (int64 [E], in the order the edges were given); ``perm``
    still maps CSC positions to the given edge ids."""
    if (node_time is None) == (edge_time is None):
        raise ValueError("sort by node times or by edge times: give exactly one of node_time and edge_time")
    if node_time is not None:
        t = check_times(node_time, csc.size[0], "node_time").index_select(0, csc.row)
    else:
        t = check_times(edge_time, csc.num_edges, "edge_time")
        t = t if csc.perm is None else t.index_select(0, csc.perm)
    order = torch.argsort(t, stable=True)
    order = order.index_select(0, torch.argsort(csc.col().index_select(0, order), stable=True))
    perm = order if csc.perm is None else csc.perm.index_select(0, order)
    return CSC.trusted(csc.row.index_select(0, order), csc.colptr, perm, csc.size)  # the same edges, reordered


def check_sorted(csc_times: torch.Tensor, csc: CSC) -> None:
    """Raise ValueError unless ``csc_times`` (one per CSC position) never decrease within a node's list."""
    col = csc.col()
    if bool(((csc_times[1:] < csc_times[:-1]) & (col[1:] == col[:-1])).any()):
        raise ValueError("temporal sampling needs each node's in-edges sorted by time: build the CSC with "
                         "hmgstore.graph.temporal.sort_by_time(csc, node_time=... or edge_time=...)")


def time_window(topology, seeds: torch.Tensor, seed_time: torch.Tensor, k: int, strategy: str):
    """``(offset, size)``: each seed's in-edges no later than its time, as a window of its list (see the
    module docstring). ``seeds``: int64 [S] node ids; ``seed_time``: int64 [S]; CPU tensors."""
    first = topology.colptr.index_select(0, seeds)
    lo, hi = first.clone(), topology.colptr.index_select(0, seeds + 1)
    last = max(topology.num_edges - 1, 0)
    while True:  # upper bound: the first position whose time is later than the seed's
        active = lo < hi
        if not bool(active.any()):
            break
        mid = (lo + hi) // 2
        later = topology.time_at(mid.clamp(max=last)) > seed_time
        lo = torch.where(active & ~later, mid + 1, lo)
        hi = torch.where(active & later, mid, hi)
    end = lo
    start = torch.maximum(first, end - k) if strategy == "last" and k >= 0 else first
    return start - first, end - start


def tree_times(seeds: dict, seed_time: dict | None, temporal: bool, device) -> torch.Tensor | None:
    """A batch's time per tree (per seed: temporal sampling is disjoint), int64 on ``device``; None when the
    sampler is not ``temporal``. ``seeds``: node type -> ids; ``seed_time``: node type -> times. Raises
    ValueError for times without a temporal graph, seeds of several node types, missing times, times that are
    not 1-D or a count that differs from the seeds'; KeyError for times of a node type the seeds lack;
    TypeError for non-integer times."""
    if not temporal:
        if seed_time:
            raise ValueError("seed times were given, but no edge type has times: build the topologies with "
                             "src_time or edge_time for temporal sampling")
        return None
    typed = [nt for nt, ids in seeds.items() if len(ids)]
    if len(typed) > 1:
        raise ValueError(f"temporal sampling takes seeds of one node type per batch, got {typed}")
    if seed_time is not None and not isinstance(seed_time, Mapping):
        raise TypeError(f"seed_time is a dict of node type -> times, got a {type(seed_time).__name__}: pass "
                        "{None: times} for a graph of one node type")
    if not seed_time or typed and typed[0] not in seed_time:
        raise ValueError("temporal sampling needs each seed's time: pass seed_time={node type: times}")
    stray = [nt for nt in seed_time if nt not in seeds]  # a misspelt type's times would be dropped unseen
    if stray:
        raise KeyError(f"seed_time names node types {stray} that the seeds do not ({list(seeds)}): key the times "
                       "by the seeds' node type")
    if not typed:  # a batch of no seeds has no times
        return torch.empty(0, dtype=torch.int64, device=device)
    times = integer_times(seed_time[typed[0]], "seed_time")
    if times.dim() != 1:  # one time per seed: a [S, 1] column or a 0-d time would pass a count check
        raise ValueError(f"seed_time[{typed[0]!r}] is 1-D, one time per seed; got shape {tuple(times.shape)}")
    if times.numel() != len(seeds[typed[0]]):
        raise ValueError(f"seed_time holds {times.numel()} times for {len(seeds[typed[0]])} seeds")
    return times.reshape(-1).to(device, torch.int64)
