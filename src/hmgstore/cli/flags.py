"""The command-line vocabulary shared by the examples and ``python -m hmgstore.bench``.

One name and one meaning per flag, defined here once:

- ``--batch-size N``: seed nodes (examples, ``bench sample/train/hotness``) or
  ids (``bench gather/peer/remote``) per batch;
- ``--fanout 15,10,5``: neighbours per hop from the seeds outwards (PyG's
  order; the DGL example reverses it for DGL's per-layer list);
  :data:`DEFAULT_FANOUT` everywhere;
- ``--max-batches N``: an example stops each epoch after N batches;
  ``--batches N``: timed batches per variant of a benchmark;
- ``--no-progress``: no progress bars (set-up and loops);
- ``--seed N``: what ``torch.manual_seed`` gets.

``tests/test_flags.py`` checks every example and benchmark against it.
"""
from __future__ import annotations

import argparse
import re

from ..graph.fanout import parse_fanout

#: Neighbours per hop, from the seeds outwards, wherever a fanout has a default.
DEFAULT_FANOUT = "15,10,5"


def _fanout(text: str) -> list[int]:
    try:
        return parse_fanout(text)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_fanout(parser: argparse.ArgumentParser, default: str = DEFAULT_FANOUT) -> None:
    """``--fanout``: a checked list of ints (see :func:`hmgstore.graph.parse_fanout`)."""
    parser.add_argument("--fanout", type=_fanout, default=_fanout(default), metavar="K1,K2,...",
                        help=f"neighbours sampled per hop, from the seeds outwards; -1 for all (default: {default})")


def add_batch_size(parser: argparse.ArgumentParser, default: int, what: str = "seed nodes") -> None:
    """``--batch-size`` (``--batch`` is kept as an alias, for commands written before)."""
    parser.add_argument("--batch-size", "--batch", dest="batch_size", type=positive, default=default,
                        help=f"{what} per batch (default: {default})")


def add_max_batches(parser: argparse.ArgumentParser) -> None:
    """``--max-batches`` (``--max-steps`` kept as an alias): an example's epochs stop after N batches."""
    parser.add_argument("--max-batches", "--max-steps", dest="max_batches", type=positive, default=None,
                        help="stop each epoch after this many batches (default: the whole epoch)")


def add_no_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_seed(parser: argparse.ArgumentParser, default: int = 0) -> None:
    parser.add_argument("--seed", type=int, default=default, help=f"torch.manual_seed (default: {default})")


def positive(text: str) -> int:
    """An argparse type: a whole number above 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


def count(text: str) -> int:
    """An argparse type: a count written plainly or with K, M, B (or G): ``2M``, ``1.6B``, ``20000``."""
    m = re.fullmatch(r"([0-9.]+)([KMBG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (write 2M, 20M, 1.6B, ...)")
    return int(float(m.group(1)) * _SUFFIX[m.group(2)])
