"""One collective gather of rows held by several machines: three ``all_to_all_single`` rounds.

Each rank talks to its counterparts only: one rank per machine, the one
with its own local rank (:class:`Exchange`; a group's ranks are its
"slots", in group-rank order). For each distinct id tensor of the call
(a *batch*), the ids are sorted by owner: those of other machines by slot,
this machine's last. Then:

1. header, ``int64 [slots, 2]``: the call's signature (which tables, which
   batch each reads) and the length of the id payload for that slot;
2. ids: per slot, the count asked of each batch, then those batches' rows
   within the owner's partition;
3. rows: each owner gathers what it was asked with one
   :func:`hmgstore.gather_many` over its local tables, and sends back per
   id one byte row holding the batch's tables' rows side by side (any
   dtype, bit-exact). This machine's own ids are gathered from the local
   tables while that round is in flight, then the received rows are copied
   to their positions.

Every round waits at most the group's timeout; a failure marks the cluster
broken (the rounds are out of step) and raises PeerLostError.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..rows.ids import as_tensor, check_range
from ..table.tensor import gather_many as gather_local
from .watch import PeerLostError


@dataclass
class Exchange:
    """This rank's group of counterparts on one backend (gloo for CPU tables, NCCL for CUDA tables)."""

    group: object
    slot_of_machine: list[int]  # position of each machine's counterpart in the group
    ranks: list[int]  # global rank at each slot

    @property
    def slots(self) -> int:
        return len(self.ranks)

    def slot_table(self, device: torch.device) -> torch.Tensor:
        """``slot_of_machine`` as an int64 tensor on ``device`` (made once per device)."""
        tables = self.__dict__.setdefault("_tables", {})
        if device not in tables:
            tables[device] = torch.tensor(self.slot_of_machine, device=device)
        return tables[device]


@dataclass
class _Batch:
    """One distinct id tensor of a call, sorted by owner."""

    shape: tuple[int, ...]
    order: torch.Tensor  # positions in the batch: other machines' ids by slot, then this machine's
    rows: torch.Tensor  # int64 row of each id within its owner's partition, in ``order``
    counts: torch.Tensor  # int64 [slots + 1]: ids per slot (this machine's slot: 0), then this machine's


def _batch(index, book, exchange: Exchange, machine: int, device: torch.device) -> _Batch:
    ids, shape = as_tensor(index, book.num_nodes)
    ids = ids.reshape(-1)
    check_range(ids, book.num_nodes)  # before anything is sent
    ids = ids.to(device, torch.int64)
    owner = book.owner_unchecked(ids)
    slot = exchange.slot_table(device)[owner]
    slot.masked_fill_(owner == machine, exchange.slots)  # gathered here, never sent
    order = torch.argsort(slot, stable=True)
    return _Batch(shape, order, book.local_unchecked(ids, owner)[order],
                  torch.bincount(slot, minlength=exchange.slots + 1))


def _as_bytes(rows: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """A contiguous ``[n, *row_shape]`` tensor seen as ``[n, row_bytes]`` uint8 (the same memory)."""
    return rows.reshape(-1).view(torch.uint8).view(-1, row_bytes) if row_bytes else rows.new_empty(
        (len(rows), 0), dtype=torch.uint8)


def _copy_rows(dst: torch.Tensor, positions: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[positions] = src`` for ``[n, row_bytes]`` uint8 views, copying whole words where the rows allow.

    ``index_copy_`` moves bytes one by one: 1.4 s for 50k rows of 4 KiB on the CPU dev box, against 0.17 s
    as int32 words (and 5x at 128 B rows).
    """
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if dst.shape[1] % size == 0:
            try:
                dst.view(dtype).index_copy_(0, positions, src.view(dtype))
                return
            except RuntimeError:  # a column slice whose offset or step is not a whole number of words
                continue
    dst.index_copy_(0, positions, src)


#: A first-round signature no call has (a CRC-32 is never negative): the rank's ids were refused.
REFUSED = -1


class PeerRefusedError(ValueError):
    """A counterpart's ids were refused in this call: every rank raises in its first round, in step."""


class Gather:
    """One call of :func:`hmgstore.distributed.gather_many`, validated; :meth:`run` does the rounds."""

    def __init__(self, cluster, exchange: Exchange, book, device: torch.device, requests):
        self.cluster, self.exchange, self.device = cluster, exchange, device
        self.tables = [table for table, _ in requests]
        batches: dict[int, _Batch] = {}
        self.batch_of = []
        self.refusal: Exception | None = None  # ids refused here: the call's first round still says so
        for _, index in requests:  # one batch per distinct id object: features and labels of a batch share it
            if id(index) not in batches:
                try:
                    batches[id(index)] = _batch(index, book, exchange, cluster.machine, device)
                except (TypeError, ValueError, IndexError) as err:
                    self.refusal = err
                    break
            self.batch_of.append(list(batches).index(id(index)))
        self.batches = list(batches.values())
        self.row_bytes = [t.row_shape.numel() * t.dtype.itemsize for t in self.tables]
        self.width = [sum(rb for rb, b in zip(self.row_bytes, self.batch_of) if b == k)
                      for k in range(len(self.batches))]
        call = repr(([t.serial for t in self.tables], self.batch_of)).encode()
        self.signature = zlib.crc32(call)

    def run(self) -> list[torch.Tensor]:
        if self.refusal is not None:
            if self.exchange.slots > 1:  # the counterparts are in this call's first round: answer it, refusing
                header = torch.full((self.exchange.slots, 2), REFUSED, dtype=torch.int64, device=self.device)
                self._all_to_all(torch.empty_like(header), header)
            raise self.refusal
        outs = [torch.empty((self.batches[b].order.numel(), *t.row_shape), dtype=t.dtype, device=self.device)
                for t, b in zip(self.tables, self.batch_of)]
        if self.exchange.slots == 1:  # one machine: every id is this machine's
            self._gather_own(outs, [0] * len(self.batches))
        else:
            try:
                self._exchange(outs)
            except PeerRefusedError:  # every rank raised in the first round: in step
                raise
            except BaseException as err:  # whatever stopped this rank midway, its counterparts are out of step
                if self.cluster.broken is None:
                    self.cluster.broken = f"a gather stopped midway on rank {self.cluster.rank} ({err!r})"
                raise
        return [out.view(*self.batches[b].shape, *t.row_shape) for out, t, b in zip(outs, self.tables, self.batch_of)]

    def _exchange(self, outs) -> None:
        want = self._headers()
        asked, received = self._exchange_ids(want)
        answer, answer_bytes = self._answer(asked, received)
        sizes = [sum(c * w for c, w in zip(want[s], self.width)) for s in range(self.exchange.slots)]
        rows = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
        work = self._all_to_all(rows, answer, sizes, answer_bytes, wait=False)
        self._gather_own(outs, [sum(w[j] for w in want) for j in range(len(self.batches))])  # while rows travel
        self._wait(work)
        self._place(outs, rows, sizes, want)

    # ---- rounds 1 and 2: what each counterpart wants ---------------------------------------------------------
    def _headers(self) -> list[list[int]]:
        """Round 1. Returns ``want[slot][batch]``: how many ids this rank asks of each counterpart."""
        slots, k = self.exchange.slots, len(self.batches)
        self.want = torch.stack([b.counts[:slots] for b in self.batches], 1)  # [slots, batches]
        header = torch.stack([torch.full((slots,), self.signature, device=self.device), self.want.sum(1) + k], 1)
        theirs = torch.empty_like(header)
        self._all_to_all(theirs, header)
        values = torch.cat([theirs.view(-1), self.want.view(-1)]).tolist()  # the round's one read-back
        me = self.exchange.slot_of_machine[self.cluster.machine]
        refused = [self.exchange.ranks[s] for s in range(slots) if s != me and values[2 * s] == REFUSED]
        if refused:  # every rank raises in this call: the rounds stay in step
            raise PeerRefusedError(f"rank {refused[0]} refused its ids in this gather (out of range, or not "
                                   "integers: its own error says which); every rank's call raises with it, and the "
                                   "next call may go on")
        for s in range(slots):
            if s != me and values[2 * s] != self.signature:
                other, rank = self.exchange.ranks[s], self.cluster.rank
                self.cluster.broken = f"rank {other} gathered other tables than rank {rank}"
                raise ValueError(f"rank {other} called gather_many with other tables, or in another order, than "
                                 f"rank {rank} (or it was sampling); every rank gathers the same tables in the "
                                 "same order, the same number of times, with ids shared alike (tables given one "
                                 "id tensor on one rank get one on every rank)")
        self.payload = [values[2 * s + 1] for s in range(slots)]
        return [values[2 * slots + s * k: 2 * slots + (s + 1) * k] for s in range(slots)]

    def _exchange_ids(self, want: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Round 2. Returns ``asked[slot][batch]`` and, per batch, the rows asked of this machine (by slot)."""
        slots, k = self.exchange.slots, len(self.batches)
        by_slot = [torch.split(b.rows[:sum(w[j] for w in want)], [w[j] for w in want])
                   for j, b in enumerate(self.batches)]
        sent = torch.cat([piece for s in range(slots) for piece in (self.want[s], *(p[s] for p in by_slot))])
        got = torch.empty(sum(self.payload), dtype=torch.int64, device=self.device)
        self._all_to_all(got, sent, self.payload, [k + sum(w) for w in want])
        per_slot = torch.split(got, self.payload)
        if k == 1:
            asked = [[n - 1] for n in self.payload]
        else:
            flat = torch.cat([p[:k] for p in per_slot]).tolist()
            asked = [flat[s * k:(s + 1) * k] for s in range(slots)]
        pieces = [torch.split(p[k:], a) for p, a in zip(per_slot, asked)]
        return asked, [torch.cat([pieces[s][j] for s in range(slots)]) for j in range(k)]

    # ---- round 3: rows ---------------------------------------------------------------------------------------
    def _answer(self, asked, received) -> tuple[torch.Tensor, list[int]]:
        """Rows asked of this machine, one fused local gather, as bytes by slot; and the bytes per slot."""
        got = gather_local([(t.local, received[b]) for t, b in zip(self.tables, self.batch_of)])
        packed = []
        for j in range(len(received)):
            parts = [_as_bytes(g, rb) for g, rb, b in zip(got, self.row_bytes, self.batch_of) if b == j]
            packed.append(torch.split(parts[0] if len(parts) == 1 else torch.cat(parts, 1), [a[j] for a in asked]))
        slots = self.exchange.slots
        answer = torch.cat([packed[j][s].reshape(-1) for s in range(slots) for j in range(len(received))])
        return answer, [sum(a * w for a, w in zip(asked[s], self.width)) for s in range(slots)]

    def _gather_own(self, outs, remote: list[int]) -> None:
        """This machine's ids, from the local tables (one fused gather), to their positions."""
        own = [(b.order[n:], b.rows[n:]) for b, n in zip(self.batches, remote)]
        got = gather_local([(t.local, own[b][1]) for t, b in zip(self.tables, self.batch_of)])
        for out, g, rb, b in zip(outs, got, self.row_bytes, self.batch_of):
            _copy_rows(_as_bytes(out, rb), own[b][0], _as_bytes(g, rb))

    def _place(self, outs, rows: torch.Tensor, sizes: list[int], want) -> None:
        """Copy the received byte rows to their positions in ``outs``."""
        per_slot = [torch.split(chunk, [c * w for c, w in zip(want[s], self.width)])
                    for s, chunk in enumerate(torch.split(rows, sizes))]
        for j, batch in enumerate(self.batches):
            blocks = [per_slot[s][j].view(-1, self.width[j]) for s in range(self.exchange.slots)
                      if want[s][j] and self.width[j]]
            if not blocks:
                continue
            block = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
            positions = batch.order[:len(block)]
            column = 0
            for out, rb, b in zip(outs, self.row_bytes, self.batch_of):
                if b == j:
                    _copy_rows(_as_bytes(out, rb), positions, block[:, column:column + rb])
                    column += rb

    # ---- the collective itself -------------------------------------------------------------------------------
    def _all_to_all(self, out, inp, out_sizes=None, in_sizes=None, *, wait: bool = True):
        return all_to_all(self.cluster, self.exchange, out, inp, out_sizes, in_sizes, wait=wait)

    def _wait(self, work) -> None:
        finish(self.cluster, self.exchange, work)


def all_to_all(cluster, exchange: Exchange, out, inp, out_sizes=None, in_sizes=None, *, wait: bool = True,
               what: str = "an exchange"):
    """One ``all_to_all_single`` round over ``exchange``'s group (gathers' and sampling's): its work handle,
    already waited for unless ``wait=False``. A failure marks ``cluster`` broken (the rounds are out of step
    for good) and raises PeerLostError, naming the ranks that are gone."""
    try:
        work = dist.all_to_all_single(out, inp, out_sizes, in_sizes, group=exchange.group, async_op=True)
    except Exception as err:
        raise lost(cluster, exchange, err, what) from err
    if wait:
        finish(cluster, exchange, work, what)
    return work


def finish(cluster, exchange: Exchange, work, what: str = "an exchange") -> None:
    """Wait for a round of :func:`all_to_all`; raises as it does."""
    try:
        work.wait()
    except Exception as err:
        raise lost(cluster, exchange, err, what) from err


def lost(cluster, exchange: Exchange, err: Exception, what: str) -> PeerLostError:
    """The PeerLostError for a failed round, ``cluster`` marked broken."""
    if cluster.node.lost is not None:  # the node's watch knows who, and has aborted the groups
        cluster.broken = cluster.node.lost
        return PeerLostError(cluster.node.lost)
    why = f"{what} of rank {cluster.rank} with ranks {exchange.ranks} failed ({err}); {cluster.gone()}"
    cluster.broken = why
    return PeerLostError(f"{why}. The exchanges among machines are out of step: restart the job")
