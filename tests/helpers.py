"""Helpers shared by tests (importable as ``helpers``: pytest puts tests/ on sys.path)."""
from __future__ import annotations

import torch


def random_table(num_rows: int, row_shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A table of random, non-zero-heavy values of any dtype (never all zeros)."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_rows, *row_shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2**31), min(info.max, 2**31 - 1), shape, generator=g, dtype=torch.int64).to(dtype)
