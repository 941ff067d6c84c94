"""The relabelling hash-table kernels (``kernels/relabel.cu``): their launch."""
from __future__ import annotations

import numpy as np
import torch

from .runtime import cupy, cupy_stream, module

SOURCE = "relabel.cu"
BLOCK = 256


def _launch(name: str, n: int, args: tuple, device: torch.device) -> None:
    if n == 0:
        return
    sms = torch.cuda.get_device_properties(device.index).multi_processor_count
    grid = int(max(1, min(-(-n // BLOCK), sms * 8)))
    with cupy().cuda.Device(device.index):
        module(device.index, (SOURCE,)).get_function(name)(
            (grid,), (BLOCK,), args, stream=cupy_stream(torch.cuda.current_stream(device)))


def _p(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def insert(keys: torch.Tensor, table_key, table_first, table_value, slot_of) -> None:
    n, mask = len(keys), len(table_key) - 1
    _launch("hmg_hash_insert", n, (_p(keys), np.int64(n), _p(table_key), _p(table_first), _p(table_value),
                                   np.int64(mask), _p(slot_of)), keys.device)


def first(slot_of, table_first, table_value, is_first) -> None:
    n = len(slot_of)
    _launch("hmg_hash_first", n, (_p(slot_of), np.int64(n), _p(table_first), _p(table_value), _p(is_first)),
            slot_of.device)


def assign(keys, slot_of, is_first, rank, table_value, base: int, new_keys, own_position: bool) -> None:
    n = len(keys)
    _launch("hmg_hash_assign", n, (_p(keys), _p(slot_of), np.int64(n), _p(is_first), _p(rank), _p(table_value),
                                   np.int64(base), _p(new_keys), np.int32(own_position)), keys.device)


def lookup(slot_of, table_value, local) -> None:
    n = len(slot_of)
    _launch("hmg_hash_lookup", n, (_p(slot_of), np.int64(n), _p(table_value), _p(local)), slot_of.device)
