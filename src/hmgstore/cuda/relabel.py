"""The relabelling hash-table kernels (``kernels/relabel.cu``): their launch.

``n`` may be a one-element device tensor (the count lives on the GPU) or
None (``max_n`` is exact); likewise ``base`` for the nodes known before.
"""
from __future__ import annotations

import numpy as np
import torch

from .runtime import launch

FILES = ("relabel.cu",)


def _p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())


def insert(keys, n, max_n: int, table_key, table_first, table_value, slot_of) -> None:
    launch(FILES, "hmg_hash_insert", max_n, (_p(keys), _p(n), np.int64(max_n), _p(table_key), _p(table_first),
                                             _p(table_value), np.int64(len(table_key) - 1), _p(slot_of)), keys.device)


def first(slot_of, n, max_n: int, table_first, table_value, is_first) -> None:
    launch(FILES, "hmg_hash_first", max_n, (_p(slot_of), _p(n), np.int64(max_n), _p(table_first), _p(table_value),
                                            _p(is_first)), slot_of.device)


def assign(keys, slot_of, n, max_n: int, is_first, rank, table_value, base, nodes, own_position: bool) -> None:
    launch(FILES, "hmg_hash_assign", max_n, (_p(keys), _p(slot_of), _p(n), np.int64(max_n), _p(is_first), _p(rank),
                                             _p(table_value), _p(base), _p(nodes), np.int32(own_position)),
           keys.device)


def lookup(slot_of, n, max_n: int, table_value, local) -> None:
    launch(FILES, "hmg_hash_lookup", max_n, (_p(slot_of), _p(n), np.int64(max_n), _p(table_value), _p(local)),
           slot_of.device)
