"""Fanouts: how many neighbours each hop samples, checked once for every sampler and command line.

A fanout is a list of whole numbers, one per hop from the seeds outwards
(PyG's order: ``[15, 10, 5]`` samples 15 neighbours of each seed, then 10 of
each of those, then 5); ``-1`` takes every neighbour. Anything else (a
negative number other than -1, a fraction, a bool) is refused rather than
read as "all" or truncated, since either would train on a different graph
than the one asked for without a word.
"""
from __future__ import annotations

import numbers
from collections.abc import KeysView, Set

import torch


def check_fanout(values, what: str = "num_neighbors") -> list[int]:
    """``values`` as a list of ints after checking each one.

    ``values``: an iterable of ints (Python, numpy or 0-d integer tensors).
    Returns a new list of Python ints. Raises TypeError for a non-list, a
    set (it keeps no order: the hops' would be the hash's) or a value that
    is not a whole number (``1.5``, ``True``),
    ValueError for a negative value other than -1; both name ``what``, the
    position and the value.
    """
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what} must be a list of neighbours per hop such as [15, 10, 5], got {values!r}")
    check_ordered(values, what)
    checked = []
    for hop, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
                and value.dtype != torch.bool:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{what}[{hop}] is {value!r}: a fanout is a whole number of neighbours per hop "
                            "(-1 for all of them)")
        value = int(value)
        if value < -1:
            raise ValueError(f"{what}[{hop}] is {value}: a fanout is 0 or more neighbours per hop, or -1 for all "
                             "of them")
        checked.append(value)
    return checked


def check_ordered(values, what: str = "num_neighbors"):
    """``values`` as given, after refusing a set (``set``, ``frozenset`` or another unordered
    :class:`collections.abc.Set`; a dict's keys keep their order and pass) with a TypeError naming ``what``:
    read in hash order, its hops' fanouts would be swapped without a word. Adapters call it before they read an
    iterable into a list."""
    if isinstance(values, Set) and not isinstance(values, KeysView):
        raise TypeError(f"{what} is a {type(values).__name__}, which keeps no order: the hops' fanouts go from the "
                        f"seeds outwards, so pass a list such as [15, 10, 5]")
    return values


def parse_fanout(text: str) -> list[int]:
    """A command line's fanout, ``"15,10,5"`` (from the seeds outwards), as checked ints.

    Raises ValueError (which argparse reports as a usage error) for text
    that is not comma-separated whole numbers, or holds a negative number
    other than -1.
    """
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a fanout: write neighbours per hop from the seeds outwards, "
                         "comma-separated whole numbers such as 15,10,5 (-1 for all)") from None
    return check_fanout(values, "fanout")
