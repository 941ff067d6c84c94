"""The draws behind neighbour sampling: a counter-based hash, the same on the CPU and a GPU.

A draw is a function of the hop's 64-bit key, the seed's index and a counter
(the slot, or for weighted sampling the neighbour's position): splitmix64's
finaliser, as ``mix64`` / ``draw`` / ``unit_open`` in ``kernels/sample.cu``.
Because nothing depends on thread scheduling, the CPU computes the same
draws with torch as a GPU does with its kernels.
"""
from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that has it."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _M1, _M2, _SEED_STEP = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                                    0x94D049BB133111EB, 0xD1B54A32D192ED03))


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 values."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic), as mix64 in sample.cu."""
    z = z + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _M1
    z = (z ^ _shift_right(z, 27)) * _M2
    return z ^ _shift_right(z, 31)


def draw(key: int, seed_index: torch.Tensor, t, n: torch.Tensor) -> torch.Tensor:
    """A uniform int64 in ``[0, n)`` for slot ``t`` of seed ``seed_index``: ``draw`` in sample.cu.

    ``key``: the hop's 64-bit key (a Python int); ``seed_index``, ``t``, ``n``:
    int64 tensors (or ints) of one shape, ``n >= 1``.
    """
    return _draw_mixed(_seed_hash(key, seed_index), t, n)


def _seed_hash(key: int, seed_index: torch.Tensor) -> torch.Tensor:
    """The part of :func:`draw` that depends on the seed alone: computed once for all of a seed's slots."""
    return _mix64(seed_index * _SEED_STEP ^ _signed(key))


def _draw_mixed(h: torch.Tensor, t, n: torch.Tensor) -> torch.Tensor:
    return _shift_right(_mix64(h + t), 1) % n


_UNIT = 2.0 ** -53


def unit_open(h: torch.Tensor, t) -> torch.Tensor:
    """A float64 uniform in (0, 1] from the seed hash ``h`` and counter ``t``: ``unit_open`` in sample.cu."""
    return (_shift_right(_mix64(h + t), 11) + 1).double() * _UNIT


def unit_closed_open(h: torch.Tensor, t) -> torch.Tensor:
    """A float64 uniform in [0, 1): ``unit_closed_open`` in sample.cu."""
    return _shift_right(_mix64(h + t), 11).double() * _UNIT
