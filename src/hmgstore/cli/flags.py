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

Values are checked as they are parsed, by the argparse types below: a
value that cannot apply (``--reps 0``, ``--cache 1.5``, ``--table-gib nan``,
``--gpu-budget 2XB``, ``--device cuda`` without a GPU) ends the command at
once with argparse's message (exit code 2) naming the flag, the value and
what it takes, never after minutes of set-up or in a traceback.

``tests/test_flags.py`` checks every example and benchmark against it.
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

import torch

from ..graph.fanout import parse_fanout
from ..rows.hotness import parse_bytes

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
    parser.add_argument("--seed", type=seed, default=default, help=f"torch.manual_seed (default: {default})")


def positive(text: str) -> int:
    """An argparse type: a whole number above 0."""
    value = _whole(text)
    if value is None or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


def count(text: str) -> int:
    """An argparse type: a count written plainly or with K, M, B (or G): ``2M``, ``1.6B``, ``20000``."""
    m = re.fullmatch(r"([0-9.]+)([KMBG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (write 2M, 20M, 1.6B, ...)")
    try:
        return int(float(m.group(1)) * _SUFFIX[m.group(2)])
    except ValueError:  # "1.2.3"
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (write 2M, 20M, 1.6B, ...)") from None


def positive_count(text: str) -> int:
    """An argparse type: a :func:`count` above 0 (``"0.1"`` reads as 0 and is refused too)."""
    try:
        value = count(text)
    except argparse.ArgumentTypeError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a count above 0 (1, 20000, 2M, 1.6B, ...), got {text!r}")
    return value


def _whole(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def whole(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` (to ``high``, both included); ``why``, said when a value
    is refused: what the bounds are for."""
    span = f"at least {low}" if high is None else f"from {low} to {high}"

    def parse(text: str) -> int:
        value = _whole(text)
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a whole number {span}{why}, got {text!r}")
        return value

    parse.__name__ = f"whole number {span}"  # argparse names the type by it
    return parse


#: A count of things that may be none (workers, GPU indices, extra steps).
natural = whole(0)


def seed(text: str) -> int:
    """An argparse type: a seed every generator here takes (``torch.manual_seed``, hmgstore's synthetic and
    power-law graphs): a whole number in ``[0, 2**64)``."""
    value = _whole(text)
    if value is None or not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 2**64 - 1, got {text!r}")
    return value


def row_bytes(text: str) -> int:
    """An argparse type: bytes of a float32 row, a positive multiple of 4."""
    value = _whole(text)
    if value is None or value <= 0 or value % 4:
        raise argparse.ArgumentTypeError(f"must be a positive multiple of 4 (bytes of float32 rows), got {text!r}")
    return value


def _real(what: str, accepts: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a finite float for which ``accepts`` holds (nan and inf mean nothing to a size, a
    share or a rate)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and accepts(value)):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


share = _real("a share from 0 to 1", lambda value: 0 <= value <= 1)
positive_real = _real("a finite number above 0", lambda value: value > 0)
non_negative_real = _real("a finite number, 0 or more", lambda value: value >= 0)


def size(*words: str, at_least: int = 0) -> Callable[[str], str]:
    """An argparse type: a byte size as hmgstore reads one (``2GB``, ``512MiB``, ``1.5e9``; see
    :func:`hmgstore.rows.hotness.parse_bytes`) of at least ``at_least`` bytes, or one of ``words`` (any case).

    A size is kept as written: the library reads it where it is used, and the reports show it as typed. A word
    comes back in lower case, as the code that reads it compares it.
    """
    accepted = " or ".join([f"a size such as 2GB or 512MiB{' above 0' if at_least == 1 else ''}",
                            *(repr(w) for w in words)])

    def parse(text: str) -> str:
        if text.strip().lower() in words:
            return text.strip().lower()
        try:
            value = parse_bytes(text)
        except ValueError:
            value = -1
        if value < at_least:
            raise argparse.ArgumentTypeError(f"must be {accepted}, got {text!r}")
        return text

    parse.__name__ = "size"
    return parse


def replicate_problem(replicate: str, budget: str, flag: str = "--gpu-budget") -> str | None:
    """Why ``--replicate`` cannot fit in the GPU budget that ``flag`` gives (None: it fits): the replicated rows
    are part of each GPU's budget (:func:`hmgstore.distributed.shard`). Both are :func:`size` values."""
    if parse_bytes(replicate) <= parse_bytes(budget):
        return None
    return (f"--replicate {replicate} is more than {flag} {budget}: the replicated rows are part of each GPU's "
            f"budget; lower --replicate or raise {flag}")


def sm_cap(text: str) -> int | str | None:
    """An argparse type: a cap on a gather's SMs as :class:`hmgstore.Pipeline` takes it: a number of SMs (1 or
    more), ``auto`` or ``none`` (None: no cap)."""
    word = text.strip().lower()
    if word in ("auto", "none"):
        return None if word == "none" else "auto"
    value = _whole(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be a number of SMs (1 or more), 'auto' or 'none', got {text!r}")
    return value


def as_written(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type: the text as written, once ``check`` (another type here) accepts it; for a value passed
    on to another command line, as :mod:`hmgstore.bench.scale` passes its options to the example it runs."""

    def parse(text: str) -> str:
        check(text)
        return text

    parse.__name__ = check.__name__
    return parse


#: The fewest nodes of hmgstore.data.synthetic's graph with its default 16 classes: one per class.
SYNTHETIC_MIN_NODES = 16


def synthetic_nodes(text: str) -> int:
    """An argparse type: nodes of a synthetic graph (:func:`count`), at least :data:`SYNTHETIC_MIN_NODES`."""
    try:
        value = count(text)
    except argparse.ArgumentTypeError:
        value = 0
    if value < SYNTHETIC_MIN_NODES:
        raise argparse.ArgumentTypeError(f"must be at least {SYNTHETIC_MIN_NODES} nodes (the synthetic graph has "
                                         f"{SYNTHETIC_MIN_NODES} classes, a node each), got {text!r}")
    return value


def graph(*forms: str) -> Callable[[str], str]:
    """An argparse type: a graph written as one of ``forms``, kept as written once its counts are read.

    A form is words joined by ``:``; a lower-case word is written as is (``synthetic``, ``papers``), an
    upper-case one is a count (``NODES``, ``EDGES``: :func:`positive_count`; a synthetic graph's ``NODES``:
    :func:`synthetic_nodes`). ``graph("synthetic:NODES", "papers:NODES:EDGES")`` takes ``synthetic:2M`` and
    ``papers:111M:1.6B``.
    """
    accepted = " or ".join(forms)

    def parse(text: str) -> str:
        parts = text.split(":")
        for form in forms:
            words = form.split(":")
            if len(words) != len(parts) or any(w != p for w, p in zip(words, parts) if not w.isupper()):
                continue
            for word, part in zip(words, parts):
                if word.isupper():
                    read = synthetic_nodes if words[0] == "synthetic" and word == "NODES" else positive_count
                    try:
                        read(part)
                    except argparse.ArgumentTypeError as e:
                        raise argparse.ArgumentTypeError(f"{text!r}, {word}: {e}") from None
            return text
        raise argparse.ArgumentTypeError(f"must be {accepted}, got {text!r}")

    parse.__name__ = "graph"
    return parse


def device_name(text: str) -> torch.device:
    """An argparse type: ``cpu``, ``cuda`` or ``cuda:N``, as written (whether this machine has it is
    :func:`missing_device`'s question)."""
    try:
        value = torch.device(text)
    except (RuntimeError, ValueError):
        value = None
    if value is None or value.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    return value


def missing_device(value: torch.device) -> str | None:
    """Why device ``value`` is not on this machine, with the fix; None when it is."""
    if value.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return (f"{value}: torch sees no GPU here (torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
                "use cpu, or leave the flag out to take the GPU when there is one")
    gpus = torch.cuda.device_count()
    if value.index is not None and value.index >= gpus:
        return f"{value}: this machine has {gpus} GPU(s), cuda:0 to cuda:{gpus - 1}"
    return None


def device(text: str) -> torch.device:
    """An argparse type: a device this machine has, ``cpu``, ``cuda`` or ``cuda:N``."""
    value = device_name(text)
    missing = missing_device(value)
    if missing is not None:
        raise argparse.ArgumentTypeError(missing)
    return value
