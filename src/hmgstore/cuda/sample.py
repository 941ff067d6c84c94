"""The neighbour-sampling kernels (``kernels/sample.cu``): their launch.

The arithmetic around them (degrees, counts, offsets, relabelling) is torch,
shared with the CPU path in :mod:`hmgstore.graph.sampler`.
"""
from __future__ import annotations

import numpy as np
import torch

from .runtime import cupy, cupy_stream, module

SOURCE = "sample.cu"
#: Threads per block; both kernels are memory-latency bound, with one row or one seed per thread.
BLOCK = 256


def _grid(device_index: int, work: int) -> int:
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    return int(max(1, min(-(-work // BLOCK), sms * 8)))


def _ptr(tensor: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if tensor is None else tensor.data_ptr())


def sample_hop(seeds: torch.Tensor, colptr: torch.Tensor, start: torch.Tensor | None, counts: torch.Tensor,
               offsets: torch.Tensor, num_slots: int, gpu_row: torch.Tensor | None, host_row_address: int,
               gpu_edges: int, wide: bool, replace: bool, key: int, stream: torch.cuda.Stream):
    """One hop on the GPU: ``(positions, neighbours, edge ids)``, each int64 ``[num_slots]``.

    ``seeds``: int64 [S] node ids on the device; ``colptr``: int64 [N+1];
    ``start``: int64 [N] or None (see sample.cu); ``counts``/``offsets``:
    int64 [S], slots per seed and their exclusive scan; ``gpu_row``: the GPU
    tier of neighbour ids (int32 if not ``wide``, else int64) or None;
    ``host_row_address``: the pinned host tier's address (0: none);
    ``gpu_edges``: positions held by the GPU tier. ``key``: 64-bit draw key.
    Runs on ``stream``; tensors it allocates belong to it.
    """
    device = seeds.device
    pos = torch.empty(num_slots, dtype=torch.int64, device=device)
    nbr = torch.empty(num_slots, dtype=torch.int64, device=device)
    eid = torch.empty(num_slots, dtype=torch.int64, device=device)
    if num_slots == 0:
        return pos, nbr, eid
    mod = module(device.index, (SOURCE,))
    key = np.uint64(key & (2**64 - 1))
    cp = cupy()
    with cp.cuda.Device(device.index):
        s = cupy_stream(stream)
        num_seeds = len(seeds)
        if not replace:
            mod.get_function("hmg_sample_floyd")(
                (_grid(device.index, num_seeds),), (BLOCK,),
                (_ptr(seeds), _ptr(colptr), _ptr(counts), _ptr(offsets), _ptr(pos), np.int64(num_seeds), key),
                stream=s)
        mod.get_function("hmg_sample_read")(
            (_grid(device.index, num_slots),), (BLOCK,),
            (_ptr(seeds), _ptr(colptr), _ptr(start), _ptr(counts), _ptr(offsets), np.int64(num_seeds), _ptr(pos),
             np.int64(num_slots), _ptr(gpu_row), np.uint64(host_row_address), np.int64(gpu_edges),
             np.int32(wide), np.int32(replace), key, _ptr(nbr), _ptr(eid)),
            stream=s)
    return pos, nbr, eid
