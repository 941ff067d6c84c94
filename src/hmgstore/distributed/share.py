"""Host tables held once per node: built by the node's first rank, mapped by the others.

The protocol, over the node's gloo group: the leader builds the table into a
new shared segment (:mod:`hmgstore.memory.shared`) and broadcasts its name;
the others map it; after a barrier the leader removes the name, so nothing is
left in /dev/shm however the processes end. The leader removes it also when
the broadcast or the barrier fails (a peer died, or looked in another
``HMGSTORE_SHM_DIR``); the others then raise.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..memory import owned, shared
from ..memory.pinned import as_host_tensor


def share_in_group(make, group, ranks: list[int], rank: int, progress: bool, stored=None, key=None) -> torch.Tensor:
    """:func:`share_on_node` over a known group of one node's ``ranks``; ``stored``: a
    :class:`~hmgstore.rows.formats.Format` the leader encodes the float32 rows in on their way in; ``key``: see
    :func:`share_on_node`."""
    if key is not None:  # every rank maps the leader's table: it must be the one each of them asked for
        keys: list[Any] = [None] * len(ranks)
        dist.all_gather_object(keys, key, group=group)
        if any(k != keys[0] for k in keys):
            asked = "; ".join(f"rank {r}: {k!r}" for r, k in zip(ranks, keys))
            raise ValueError(f"the ranks of one node asked for different shared tables ({asked}): each would map "
                             f"rank {ranks[0]}'s. Ranks of one node share a table only where they all ask for the "
                             "same one; load different ones with share=False")
    leader = rank == ranks[0]
    name: str | None = None
    table: torch.Tensor | None = None
    error: Exception | None = None
    meta: list[Any] = [None]  # filled by the broadcast
    if leader:
        try:
            source, _ = as_host_tensor(make() if callable(make) else make)
            shape, dtype = ((stored.stored_shape(source.shape), stored.stored_dtype()) if stored is not None
                            else (tuple(source.shape), source.dtype))
            name, table = shared.create_segment(shape, dtype)
            owned.copy_in(table, source, progress, "sharing host table" + (f" as {stored.name}" if stored else ""),
                          encode=stored.encode if stored is not None else None)
            meta[0] = ("ok", name, tuple(table.shape), table.dtype)
        except Exception as err:  # the others must hear of it, or they wait for the table forever
            meta[0], error = ("error", f"{type(err).__name__}: {err}"), err
            if name is not None:
                shared.unlink_segment(name)
                name = None
    try:
        dist.broadcast_object_list(meta, src=ranks[0], group=group)
    except BaseException:
        if name is not None:
            shared.unlink_segment(name)
        raise
    if meta[0][0] == "error":
        if error is not None:
            raise error
        raise RuntimeError(f"rank {ranks[0]} (this node's first) could not build the shared table: {meta[0][1]}")
    _, name, shape, dtype = meta[0]
    failure = None
    if not leader:
        try:
            table = shared.attach_segment(name, shape, dtype)
        except Exception as err:
            failure = err
    try:
        dist.barrier(group=group)  # everyone has mapped it (or failed to)
    finally:
        if leader:
            shared.unlink_segment(name)
    if failure is not None:
        raise failure
    assert table is not None  # made by the leader, mapped by the others
    return table
