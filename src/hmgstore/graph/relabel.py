"""Relabelling: a batch's node keys -> local ids, new keys numbered in the order first met.

Both kinds give the same ids; the sampler picks one (``dedup``):

- :class:`SortedNodeSet` keeps the known keys sorted and looks candidates up
  with ``searchsorted``; new keys are found with ``unique`` and ranked by
  first position. torch only: any device.
- :class:`HashNodeSet` keeps a hash table on the GPU (``kernels/relabel.cu``):
  insert, mark first positions, scan, assign, look up; one host read per call
  for the number of new keys.
- :class:`DenseNodeSet` (the CPU's ``"sort"`` where keys are node ids, not
  disjoint, and the node type is not huge): a map of every node of the type
  to its local id, looked up and written with gathers and scatters, no sort.
  It took the CPU sampler's relabelling from ~60% of its time to a few
  percent (synthetic 200K nodes, fanout 15,10,5, batch 1024; 2-core VM).
"""
from __future__ import annotations

import threading

import torch

from ..cuda import relabel

_NO_POSITION = 2**63 - 1


class SortedNodeSet:
    """The nodes of one type in a batch, in order, and their keys kept sorted for lookups.

    ``keys``: int64 node keys (node ids; ``seed * num_nodes + node`` in
    disjoint mode) on one device. The initial keys (the seeds) are taken as
    they are, repeats included, so that a batch starts with its seeds.
    """

    def __init__(self, keys: torch.Tensor):
        self.parts = [keys]
        self.count = len(keys)
        unique, inverse = torch.unique(keys, return_inverse=True)
        first = torch.full((len(unique),), len(keys), dtype=torch.int64, device=keys.device)
        first.scatter_reduce_(0, inverse, torch.arange(len(keys), device=keys.device), "amin")
        self._sorted, self._local = unique, first

    @property
    def keys(self) -> torch.Tensor:
        if len(self.parts) > 1:
            self.parts = [torch.cat(self.parts)]
        return self.parts[0]

    def add(self, candidates: torch.Tensor) -> torch.Tensor:
        """Local ids of ``candidates``; keys not seen before are appended, in first-seen order."""
        local = torch.full_like(candidates, -1)
        if len(self._sorted):
            at = torch.searchsorted(self._sorted, candidates).clamp_(max=len(self._sorted) - 1)
            found = self._sorted[at] == candidates
            local = torch.where(found, self._local[at], local)
        else:
            found = torch.zeros_like(candidates, dtype=torch.bool)
        fresh = (~found).nonzero().view(-1)
        if len(fresh):
            new_keys, inverse = torch.unique(candidates[fresh], return_inverse=True)
            first = torch.full((len(new_keys),), len(fresh), dtype=torch.int64, device=candidates.device)
            first.scatter_reduce_(0, inverse, torch.arange(len(fresh), device=candidates.device), "amin")
            order = torch.argsort(first)  # new keys by first appearance
            rank = torch.empty_like(order)
            rank[order] = torch.arange(len(order), device=order.device)
            local[fresh] = self.count + rank[inverse]
            self.parts.append(new_keys[order])
            merged_keys = torch.cat([self._sorted, new_keys])
            merged_local = torch.cat([self._local, self.count + rank])
            self._sorted, by = torch.sort(merged_keys)
            self._local = merged_local[by]
            self.count += len(new_keys)
        return local


class HashNodeSet:
    """The nodes of one type in a batch, with a hash table from key to local id (GPU only).

    ``keys``: the seeds' int64 keys on a GPU, taken as they are (repeats
    included); ``capacity``: nodes the set should hold without growing. The
    node keys live in one device buffer, ``count`` (host) and ``device_count``
    (a one-element device tensor) say how many are in use. :meth:`add` reads
    the new count back; :meth:`add_queued` leaves it on the device, for a
    sampler that queues its hops and reads every size back once at the end
    (it must then have sized ``capacity`` for the whole batch).
    """

    def __init__(self, keys: torch.Tensor, capacity: int):
        self.device = keys.device
        self.count = len(keys)
        self._nodes = torch.empty(max(capacity, len(keys), 1), dtype=torch.int64, device=self.device)
        self._nodes[:len(keys)] = keys
        self.device_count = torch.full((1,), len(keys), dtype=torch.int64, device=self.device)
        self._make_table(len(self._nodes))
        self._index_own_positions(keys)

    def _make_table(self, keys: int) -> None:
        size = 1 << max(10, (2 * keys - 1).bit_length())  # load factor <= 1/2
        self._key = torch.full((size,), -1, dtype=torch.int64, device=self.device)
        self._first = torch.full((size,), _NO_POSITION, dtype=torch.int64, device=self.device)
        self._value = torch.full((size,), -1, dtype=torch.int64, device=self.device)

    def _index_own_positions(self, keys: torch.Tensor) -> None:
        """Insert ``keys`` with the local id of each its first position (the seeds; a regrown table)."""
        n = len(keys)
        slot, is_first = torch.empty_like(keys), torch.empty_like(keys)
        relabel.insert(keys, None, n, self._key, self._first, self._value, slot)
        relabel.first(slot, None, n, self._first, self._value, is_first)
        relabel.assign(keys, slot, None, n, is_first, is_first, self._value, None, self._nodes, own_position=True)

    @property
    def keys(self) -> torch.Tensor:
        """The keys of the nodes so far, in local-id order (``count`` of them: see :meth:`add_queued`)."""
        return self._nodes[:self.count]

    @property
    def buffer(self) -> torch.Tensor:
        """The whole key buffer: local ids ``0 .. device_count`` hold keys, the rest is not written yet."""
        return self._nodes

    def add_queued(self, candidates: torch.Tensor, n: torch.Tensor | None, max_n: int) -> torch.Tensor:
        """Local ids of ``candidates[:n]`` (``n`` a one-element device tensor, at most ``max_n``), new keys
        appended; nothing is read back: ``device_count`` grows on the device, ``count`` does not change."""
        local = torch.empty_like(candidates)
        if max_n == 0:
            return local
        slot, is_first = torch.empty_like(candidates), torch.empty_like(candidates)
        relabel.insert(candidates, n, max_n, self._key, self._first, self._value, slot)
        relabel.first(slot, n, max_n, self._first, self._value, is_first)
        rank = is_first.cumsum(0)
        relabel.assign(candidates, slot, n, max_n, is_first, rank, self._value, self.device_count, self._nodes,
                       own_position=False)
        relabel.lookup(slot, n, max_n, self._value, local)
        self.device_count += rank[-1:]
        return local

    def add(self, candidates: torch.Tensor) -> torch.Tensor:
        """Local ids of ``candidates``; keys not seen before are appended, in first-seen order."""
        n = len(candidates)
        if self.count + n > len(self._nodes):  # grow: a larger buffer and table
            keys = self.keys
            self._nodes = torch.empty(2 * (self.count + n), dtype=torch.int64, device=self.device)
            self._nodes[:self.count] = keys
            self._make_table(len(self._nodes))
            self._index_own_positions(keys)
        local = self.add_queued(candidates, None, n)
        self.count = int(self.device_count)  # the call's one synchronisation
        return local


_ABSENT = 2**31 - 1  # a DenseMaps entry of a node not in the batch (local ids are int32)
#: Node types of more nodes than this relabel by sorting on the CPU: a dense map costs 4 bytes per node and
#: sampling thread (256 MiB here).
DENSE_MAX_NODES = 1 << 26


class DenseMaps:
    """Spare maps of one node type for :class:`DenseNodeSet`: int32 ``[num_nodes]``, every entry ``_ABSENT``.

    One map per batch in flight (threads sampling at once take their own);
    a map goes back clean, or not at all. Sent to another process empty.
    """

    def __init__(self, num_nodes: int):
        self.num_nodes, self._lock = num_nodes, threading.Lock()
        self._free: list[torch.Tensor] = []

    def take(self) -> torch.Tensor:
        with self._lock:
            if self._free:
                return self._free.pop()
        return torch.full((self.num_nodes,), _ABSENT, dtype=torch.int32)

    def give(self, table: torch.Tensor) -> None:
        with self._lock:
            self._free.append(table)

    def __getstate__(self):
        return {"num_nodes": self.num_nodes}

    def __setstate__(self, state):
        self.__init__(state["num_nodes"])


class DenseNodeSet:
    """:class:`SortedNodeSet`'s numbering from a dense map ``node id -> local id`` (CPU, keys are node ids).

    ``keys``: the seeds' int64 node ids, taken as they are (repeats
    included: a repeated seed's id maps to its first position). ``maps``: the
    node type's :class:`DenseMaps`. Call :meth:`release` when the batch is
    done, and only then (an error in between drops the map instead).
    """

    def __init__(self, keys: torch.Tensor, maps: DenseMaps):
        self.parts, self.count, self._maps = [keys], len(keys), maps
        self._map = maps.take()
        self._map.scatter_reduce_(0, keys, torch.arange(len(keys), dtype=torch.int32), "amin")

    @property
    def keys(self) -> torch.Tensor:  # as SortedNodeSet's: the parts joined once
        if len(self.parts) > 1:
            self.parts = [torch.cat(self.parts)]
        return self.parts[0]

    def add(self, candidates: torch.Tensor) -> torch.Tensor:
        """Local ids (int64) of ``candidates``; keys not seen before are appended, in first-seen order."""
        local = self._map.index_select(0, candidates)  # index_select, not [ ]: ~10x faster on a CPU
        fresh = (local == _ABSENT).nonzero().view(-1)
        if len(fresh):
            new = candidates.index_select(0, fresh)
            order = torch.arange(len(new), dtype=torch.int32)
            self._map.scatter_reduce_(0, new, order, "amin")  # each new key: its first position among them
            firsts = new.masked_select(self._map.index_select(0, new) == order)  # one per key, first-seen order
            self._map.index_copy_(0, firsts, torch.arange(self.count, self.count + len(firsts), dtype=torch.int32))
            local.index_copy_(0, fresh, self._map.index_select(0, new))
            self.parts.append(firsts)
            self.count += len(firsts)
        return local.long()

    def release(self) -> None:
        """Clear this batch's entries and hand the map back for the next batch."""
        if self._map is not None:
            self._map.index_fill_(0, self.keys, _ABSENT)
            self._maps.give(self._map)
            self._map = None  # type: ignore[assignment]  # released: the set is done, add() is not called again


def node_set(keys: torch.Tensor, dedup: str, capacity: int, dense: DenseMaps | None = None):
    """A node set of the kind ``dedup`` names (``"sort"`` or ``"hash"``) over the seeds' ``keys``; a CPU
    ``"sort"`` set given ``dense`` maps is a :class:`DenseNodeSet` (the same ids)."""
    if dedup == "hash":
        return HashNodeSet(keys, capacity)
    return DenseNodeSet(keys, dense) if dense is not None else SortedNodeSet(keys)
