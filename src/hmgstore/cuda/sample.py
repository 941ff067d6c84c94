"""The neighbour-sampling kernels (``kernels/sample.cu``): their launch.

Pointers are passed as they are; a ``None`` tensor is a null pointer. The
hop's seeds and slot count may live in device memory (see sample.cu), so a
hop can be queued before the previous one's sizes are known.
"""
from __future__ import annotations

import numpy as np
import torch

from .runtime import launch

FILES = ("gather_job.cuh", "sample.cu")  # a chunked topology's tiers are laid out as a gather job's


def _p(tensor: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if tensor is None else tensor.data_ptr())


def window(topology, nodes, lohi, max_seeds: int, num_dst: int, disjoint: bool, seed_time, per_tree: bool, k: int,
           last: bool, win_lo, win_deg) -> None:
    """Each seed's time window (``hmg_sample_window``): ``win_lo`` / ``win_deg``, int64 [max_seeds].
    ``seed_time``: int64 device tensor, per seed, or per tree (``per_tree``: indexed by key // num_dst)."""
    launch(FILES, "hmg_sample_window", max_seeds,
           (_p(nodes), _p(lohi), np.int64(max_seeds), _p(topology.colptr), _p(topology.start), np.int64(num_dst),
            np.int32(disjoint), _p(seed_time), np.int32(per_tree),
            _p(topology.time_device if topology.edge_time is not None else None),
            _p(topology.time_device if topology.src_time is not None else None), _p(topology.gpu_row),
            np.uint64(topology.host_address), np.int64(topology.gpu_edges), np.int32(topology.index_bytes == 8),
            _p(topology.tiers), np.int64(topology.chunk), _p(topology.tail), np.int64(topology.tail_start),
            np.int64(k), np.int32(last), _p(win_lo), _p(win_deg)), win_lo.device)


def counts(nodes, lohi, max_seeds: int, colptr, k: int, replace: bool, num_dst: int, disjoint: bool, out,
           win_deg=None) -> None:
    """``out[i]``: neighbours seed ``i`` of ``nodes[lohi[0]:lohi[1]]`` gets (0 past the seeds); ``win_deg``:
    the seeds' time windows' sizes, when temporal."""
    launch(FILES, "hmg_sample_counts", max_seeds,
           (_p(nodes), _p(lohi), np.int64(max_seeds), _p(colptr), np.int64(k), np.int32(replace),
            np.int64(num_dst), np.int32(disjoint), _p(win_deg), _p(out)), out.device)


def floyd(nodes, lohi, max_seeds: int, colptr, counts, ends, num_dst: int, disjoint: bool, key, pos,
          index=None, win_deg=None) -> None:
    """Positions of the seeds that sample without replacement, into their slots of ``pos``.

    ``key``: a one-element int64 device tensor holding the hop's draw key; ``index``: int64 device tensor,
    the index each seed draws as (None: its own; see sample.cu)."""
    launch(FILES, "hmg_sample_floyd", max_seeds,
           (_p(nodes), _p(lohi), np.int64(max_seeds), _p(colptr), _p(counts), _p(ends), np.int64(num_dst),
            np.int32(disjoint), _p(key), _p(index), _p(win_deg), _p(pos)), pos.device)


def _weight_args(topology, rejection: tuple[int, int, int]) -> tuple:
    """The weights' tiers and the rejection arguments, as hmg_sample_weighted(_warp) take them after ``index``.
    ``rejection``: ``(ratio, trials per slot, extra trials)``, hmgstore/graph/weighted.py's constants."""
    ratio, per_slot, extra = rejection
    return (_p(topology.gpu_weight), np.uint64(topology.host_weight_address), np.int64(topology.gpu_edges),
            _p(topology.weight_tiers), np.int64(topology.chunk), _p(topology.weight_tail),
            np.int64(topology.tail_start), _p(topology.rejection_wmax), np.int64(ratio), np.int64(per_slot),
            np.int64(extra))


def weighted(topology, nodes, lohi, max_seeds: int, counts, ends, num_dst: int, disjoint: bool, key, pos, keys,
             replace: bool, rejection: tuple[int, int, int], index=None) -> None:
    """Positions drawn by weighted sampling (``hmg_sample_weighted``) into the seeds' slots of ``pos``;
    ``keys``: float64 scratch as long as ``pos`` (unused with replacement); ``rejection``: see
    :func:`_weight_args` (``topology.rejection_wmax`` says which lists qualify)."""
    launch(FILES, "hmg_sample_weighted", max_seeds,
           (_p(nodes), _p(lohi), np.int64(max_seeds), _p(topology.colptr), _p(topology.start), _p(counts), _p(ends),
            np.int64(num_dst), np.int32(disjoint), _p(key), _p(index), *_weight_args(topology, rejection),
            np.int32(replace), _p(pos), _p(keys)), pos.device)


#: Weighted sampling without replacement at fanouts up to :data:`WARP_FANOUT` runs one warp per seed
#: (``hmg_sample_weighted_warp``: coalesced reads of each list); False: one thread per seed, as above it.
WEIGHTED_WARP = True
WARP_FANOUT = 32


def weighted_warp(topology, nodes, lohi, max_seeds: int, counts, ends, num_dst: int, disjoint: bool, key, pos,
                  rejection: tuple[int, int, int], index=None) -> None:
    """:func:`weighted` without replacement, one warp per seed; every count at most :data:`WARP_FANOUT`."""
    launch(FILES, "hmg_sample_weighted_warp", max_seeds * 32,
           (_p(nodes), _p(lohi), np.int64(max_seeds), _p(topology.colptr), _p(topology.start), _p(counts), _p(ends),
            np.int64(num_dst), np.int32(disjoint), _p(key), _p(index), *_weight_args(topology, rejection), _p(pos)),
           pos.device)


def read(topology, nodes, lohi, max_seeds: int, counts, ends, max_slots: int, pos, replace: bool, key,
         num_dst: int, disjoint: bool, nbr, eid, seed_local, index=None, given: bool = False, win_lo=None,
         win_deg=None) -> None:
    """Every slot's neighbour key, edge id and seed's local id, read from the topology's tiers (``given``:
    the drawn positions are in ``pos`` already, from :func:`weighted`)."""
    launch(FILES, "hmg_sample_read", max_slots,
           (_p(nodes), _p(lohi), np.int64(max_seeds), _p(topology.colptr), _p(topology.start), _p(counts), _p(ends),
            np.int64(max_slots), _p(pos), _p(topology.gpu_row), np.uint64(topology.host_address),
            np.int64(topology.gpu_edges), np.int32(topology.index_bytes == 8), np.int32(replace),
            _p(key), np.int64(num_dst), np.int64(topology.num_src), np.int32(disjoint), _p(index),
            _p(topology.tiers), np.int64(topology.chunk), _p(topology.tail), np.int64(topology.tail_start),
            np.int32(given), _p(win_lo), _p(win_deg), _p(nbr), _p(eid), _p(seed_local)), nbr.device)
