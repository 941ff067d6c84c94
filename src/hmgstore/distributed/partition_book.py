"""Which machine holds which node: :class:`PartitionBook`.

A graph spread over ``M`` machines gives each node one owner. The owner
holds the node's rows in its partition, in increasing global id order, so
node ``v``'s row there is the number of nodes below ``v`` with the same
owner. A book answers, for any batch of global ids, ``owner(ids)`` and
``local(ids)``. Three kinds:

- ``range``: contiguous, near-equal id ranges (``num_nodes * m // M`` is
  where machine ``m`` starts); owner and row are arithmetic, nothing is
  stored per node. Good when ids already follow locality (a METIS-renumbered
  graph) or when nothing is known.
- ``hash``: a fixed 32-bit integer hash of the id, modulo ``M``: the same on
  every process and device, and spreads any id order evenly. The owner is
  computed; the row within the partition is stored (int32 per node).
- ``assignment``: any machine-per-node array, e.g. METIS output. Stores the
  assignment (int16, or int32 beyond 32767 machines) and the row (int32, or
  int64 for a partition of 2^31 nodes or more).

Every method takes ids on any device; per-node tensors are copied to a
device on first use there and kept (an assignment book of 100M nodes costs
600 MB on each GPU that asks).
"""
from __future__ import annotations

import os
import zlib
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from ..rows import checks
from ..rows.ids import check_range
from ..table.files import load_torch_file

KINDS = ("range", "hash", "assignment")
_FORMAT = 1  # version of what save() writes
_INT32_MAX = 2**31 - 1


def hash_ids(ids: torch.Tensor) -> torch.Tensor:
    """A fixed 32-bit hash of int64 ``ids`` (any device), as int64 in ``[0, 2^32)``.

    The two halves of the id are folded, then mixed with the well-known
    ``x = ((x >> 16) ^ x) * 0x45d9f3b`` rounds. The multiplier is below 2^31,
    so every product of a 32-bit value fits in int64: no overflow, the same
    result on every process, device and torch version.
    """
    mask = 0xFFFFFFFF
    x = (ids ^ (ids >> 32)) & mask
    x = (((x >> 16) ^ x) * 0x45D9F3B) & mask
    x = (((x >> 16) ^ x) * 0x45D9F3B) & mask
    return (x >> 16) ^ x


def _smallest(limit: int, *dtypes: torch.dtype) -> torch.dtype:
    return next(d for d in dtypes if torch.iinfo(d).max >= limit)


def _rows_within(owner: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Each node's row within its owner's partition (nodes in id order), in the smallest dtype that fits."""
    n = owner.numel()
    order = torch.argsort(owner, stable=True)
    starts = torch.cumsum(sizes, 0) - sizes
    local = torch.empty(n, dtype=_smallest(int(sizes.max()) if n else 0, torch.int32, torch.int64))
    local[order] = (torch.arange(n) - starts.repeat_interleave(sizes)).to(local.dtype)
    return local


class PartitionBook:
    """Global node id -> (machine, row in that machine's partition); see the module docstring.

    Build with :meth:`range`, :meth:`hash`, :meth:`from_assignment` or
    :meth:`load`. All methods that take ``ids`` accept a 1-D (or any shape)
    integer tensor on any device.

    Raises:
        TypeError: for counts (``num_nodes``, ``num_machines``, ``machine``) that are not integers (floats are
            never truncated, bools refused), an assignment or ids that are not integers.
        ValueError: for a negative ``num_nodes``, ``num_machines`` under 1, a ``machine`` outside the book, an
            assignment that is not 1-D, of another length than ``num_nodes`` or naming a machine outside
            ``[0, num_machines)``; from :meth:`load`, naming the file, for one that is not a book or is damaged.
        IndexError: for an id outside ``[0, num_nodes)`` (value and position).
        FileNotFoundError: from :meth:`load`, for a missing file.
    """

    def __init__(self, kind: str, num_nodes: int, num_machines: int, *, assignment: torch.Tensor | None = None,
                 local: torch.Tensor | None = None, sizes: tuple[int, ...]):
        # Use the constructors: they validate. kind "range" needs neither tensor, "hash" local only.
        self.kind, self.num_nodes, self.num_machines, self.sizes = kind, num_nodes, num_machines, sizes
        # "starts" is always a tensor; "assignment" and "local" are None where the kind has none.
        self._host: dict[str, Any] = {"assignment": assignment, "local": local,
                      "starts": torch.tensor((0, *np.cumsum(sizes).tolist()), dtype=torch.int64)}
        self._on_device: dict[torch.device, dict] = {torch.device("cpu"): self._host}
        self._signature: tuple | None = None
        # The partition() run that wrote this book (None for books built in memory): parts of two runs over
        # the same node count have equal books, so only the run tells their rows apart (ClusterTensor checks).
        self.run: str | None = None

    # ---- constructors ----------------------------------------------------------------------------------------
    @classmethod
    def range(cls, num_nodes: int, num_machines: int) -> PartitionBook:
        """Machine ``m`` owns ids ``[num_nodes * m // M, num_nodes * (m + 1) // M)``."""
        num_nodes, num_machines = _check_counts(num_nodes, num_machines)
        bounds = [num_nodes * m // num_machines for m in range(num_machines + 1)]
        return cls("range", num_nodes, num_machines, sizes=tuple(b - a for a, b in pairwise(bounds)))

    @classmethod
    def hash(cls, num_nodes: int, num_machines: int) -> PartitionBook:
        """Machine of node ``v``: ``hash_ids(v) % num_machines`` (see :func:`hash_ids`)."""
        num_nodes, num_machines = _check_counts(num_nodes, num_machines)
        owner = hash_ids(torch.arange(num_nodes)) % num_machines
        sizes = torch.bincount(owner, minlength=num_machines)
        return cls("hash", num_nodes, num_machines, local=_rows_within(owner, sizes), sizes=tuple(sizes.tolist()))

    @classmethod
    def from_assignment(cls, assignment, num_machines: int | None = None,
                        num_nodes: int | None = None) -> PartitionBook:
        """Node ``v`` lives on machine ``assignment[v]``.

        ``assignment``: 1-D integer tensor, numpy array or list, one machine
        per node (METIS's output). ``num_machines``: default ``max + 1``;
        ``num_nodes``: when given, the assignment's length must equal it.
        Raises TypeError for non-integer input, ValueError for a wrong
        length, shape or a machine outside ``[0, num_machines)`` (naming the
        first such node).
        """
        a = torch.as_tensor(np.asarray(assignment) if not isinstance(assignment, torch.Tensor) else assignment)
        if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype == torch.bool:
            raise TypeError(f"an assignment holds integer machine numbers, got dtype {a.dtype}")
        if a.dim() != 1:
            raise ValueError(f"an assignment is 1-D, one machine per node; got shape {tuple(a.shape)}")
        if num_nodes is not None and a.numel() != _integer(num_nodes, "num_nodes"):
            raise ValueError(f"the assignment has {a.numel()} entries for a graph of {num_nodes} nodes")
        a = a.cpu().to(torch.int64)
        if num_machines is None:
            num_machines = int(a.max()) + 1 if a.numel() else 1
        _, num_machines = _check_counts(a.numel(), num_machines)
        bad = ((a < 0) | (a >= num_machines)).nonzero()
        if bad.numel():
            v = int(bad[0, 0])
            raise ValueError(f"node {v} is assigned to machine {int(a[v])}, outside [0, {num_machines}) "
                             f"({bad.numel()} such nodes)")
        sizes = torch.bincount(a, minlength=num_machines)
        stored = a.to(_smallest(num_machines - 1, torch.int16, torch.int32))
        return cls("assignment", a.numel(), num_machines, assignment=stored, local=_rows_within(a, sizes),
                   sizes=tuple(sizes.tolist()))

    # ---- lookups ---------------------------------------------------------------------------------------------
    def owner(self, ids) -> torch.Tensor:
        """int64 machine of each id, same shape and device as ``ids``."""
        ids = self._checked(ids)
        return self.owner_unchecked(ids.reshape(-1)).view(ids.shape)

    def local(self, ids) -> torch.Tensor:
        """int64 row of each id within its owner's partition, same shape and device as ``ids``."""
        ids = self._checked(ids)
        flat = ids.reshape(-1)
        return self.local_unchecked(flat, self.owner_unchecked(flat)).view(ids.shape)

    def nodes_of(self, machine: int) -> torch.Tensor:
        """int64 [sizes[machine]] global ids owned by ``machine``, increasing (the partition's row order).
        Raises TypeError for a machine that is not an integer, ValueError for one outside the book."""
        machine = _integer(machine, "machine")
        if not 0 <= machine < self.num_machines:
            raise ValueError(f"machine {machine} is outside [0, {self.num_machines})")
        starts = self._host["starts"]
        if self.kind == "range":
            return torch.arange(int(starts[machine]), int(starts[machine + 1]))
        owner = self.owner_unchecked(torch.arange(self.num_nodes))
        return (owner == machine).nonzero().view(-1)

    # Unchecked: ids int64, 1-D, in range. What ClusterTensor calls per batch.
    def owner_unchecked(self, ids: torch.Tensor) -> torch.Tensor:
        if self.kind == "range":
            return torch.bucketize(ids, self._tensors(ids.device)["starts"][1:-1], right=True)
        if self.kind == "hash":
            return hash_ids(ids) % self.num_machines
        return self._tensors(ids.device)["assignment"][ids].long()

    def local_unchecked(self, ids: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
        t = self._tensors(ids.device)
        if self.kind == "range":
            return ids - t["starts"][owner]
        return t["local"][ids].long()

    def _tensors(self, device: torch.device) -> dict:
        if device not in self._on_device:
            self._on_device[device] = {k: None if v is None else v.to(device) for k, v in self._host.items()}
        return self._on_device[device]

    def _checked(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"node ids must be integers, got dtype {ids.dtype}")
        ids = ids.long()
        check_range(ids.reshape(-1), self.num_nodes)
        return ids

    # ---- agreement, files ------------------------------------------------------------------------------------
    def signature(self) -> tuple:
        """``(kind, num_nodes, num_machines, crc32 of the assignment)``: equal books, equal signatures (the
        :attr:`run` that wrote a loaded book is not part of it: the same assignment is the same book)."""
        if self._signature is None:
            a = self._host["assignment"]
            crc = zlib.crc32(a.numpy().tobytes()) if a is not None else 0
            self._signature = (self.kind, self.num_nodes, self.num_machines, crc)
        return self._signature

    def __eq__(self, other) -> bool:
        return isinstance(other, PartitionBook) and self.signature() == other.signature()

    __hash__ = None  # type: ignore[assignment]  # unhashable: mutable caches inside; compare with signature()

    def save(self, path, run: str | None = None) -> None:
        """Write the book to ``path`` (a torch file: what defines it; rows within partitions are recomputed),
        with ``run`` (the writing :func:`~hmgstore.distributed.partition` run's id; default: the book's own).

        Written to a temporary file beside ``path``, flushed to disk, then renamed over it: ``path`` holds
        the old book or the new one, never part of either, whatever happens during the write.
        """
        path = checks.path(path, "the book's file", "PartitionBook.save")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            torch.save({"format": _FORMAT, "kind": self.kind, "num_nodes": self.num_nodes,
                        "num_machines": self.num_machines, "assignment": self._host["assignment"],
                        "run": self.run if run is None else run}, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path) -> PartitionBook:
        """The book :meth:`save` wrote to ``path``. Raises FileNotFoundError; ValueError naming the file for
        one cut short, damaged, not a book, or whose counts and assignment disagree."""
        path = checks.path(path, "the book's file", "PartitionBook.load")
        if not path.is_file():
            raise FileNotFoundError(f"no partition book at {path}")
        state = load_torch_file(path, "a partition book")
        if (not isinstance(state, dict) or state.get("format") != _FORMAT or state.get("kind") not in KINDS
                or "num_nodes" not in state or "num_machines" not in state):
            raise ValueError(f"{path} is not a partition book written by PartitionBook.save (format {_FORMAT})")
        if state["kind"] == "assignment" and not isinstance(state.get("assignment"), torch.Tensor):
            raise ValueError(f"{path} is an assignment book without its assignment tensor (found "
                             f"{type(state.get('assignment')).__name__})")
        try:
            if state["kind"] == "assignment":
                book = cls.from_assignment(state["assignment"], state["num_machines"], state["num_nodes"])
            else:
                book = getattr(cls, state["kind"])(state["num_nodes"], state["num_machines"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path} does not hold a valid {state['kind']} book: {err}") from err
        if not isinstance(state.get("run"), (str, type(None))):
            raise ValueError(f"{path} is damaged: its run id is a {type(state['run']).__name__}, not a string")
        book.run = state.get("run")  # books written before runs were recorded: None
        return book

    def __repr__(self) -> str:
        return (f"PartitionBook({self.kind}, num_nodes={self.num_nodes}, num_machines={self.num_machines}, "
                f"sizes={list(self.sizes)})")


def _integer(value, name: str) -> int:
    """``value`` as an int; TypeError for anything that is not an integer (10.7 is refused, not truncated)."""
    return checks.count(value, name, at_least=-(2**63))


def _check_counts(num_nodes, num_machines) -> tuple[int, int]:
    return checks.count(num_nodes, "num_nodes"), checks.count(num_machines, "num_machines", at_least=1)
