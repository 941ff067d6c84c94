"""A ring of batch buffers shared by two processes: what :class:`hmgstore.Producer` hands batches over in.

A batch (a PyG ``Data``/``HeteroData``, a dict, list or tuple of tensors, or
a tensor) is split into its *skeleton*, pickled, with each tensor on the
ring's device replaced by a :class:`Ref`, and its tensors' bytes, copied one
after another (256-byte aligned) into one slot: a flat uint8 buffer on the
device, allocated once and shared with the other process (CUDA IPC on a GPU,
shared memory on the CPU). The trainer rebuilds the batch from the skeleton
and views into the slot: no allocation, no copy, no IPC handle opened per
batch. A slot too small for a batch is replaced by a bigger one, sent along
with that batch.

On a GPU each slot has two interprocess CUDA events: *filled*, recorded by
the producer after its copies into the slot, waited for on the trainer's
stream; and *freed*, recorded by the trainer once it is done with the batch
(its next batch is taken), waited for on the producer's stream before the
slot is written again. Neither process waits on the host for the other's GPU
work. Tensors that are not on the ring's device (CPU tensors in a GPU batch)
travel inside the pickled skeleton.
"""
from __future__ import annotations

import collections
import copy
import math
import pickle
from dataclasses import dataclass

import torch

#: Alignment of each tensor in a slot (bytes): any dtype's view is aligned, and rows start on cache lines.
ALIGN = 256
#: A new slot holds this much more than the batch that needed it, so that slightly bigger batches fit later.
GROWTH = 1.25


@dataclass(frozen=True)
class Ref:
    """Where a tensor of a batch lies in its slot."""

    offset: int
    dtype: torch.dtype
    shape: tuple

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def swap(obj, fn):
    """``obj`` with ``fn`` applied to each tensor or :class:`Ref` in it (dicts and OrderedDicts, lists, tuples,
    named tuples and torch's named results such as ``torch.max``'s, PyG Data/HeteroData, whose shallow copy's
    stores are changed: never the loader's own object, which it may hand out again); anything else (a
    ``torch.Size`` too) is kept as it is."""
    if isinstance(obj, (torch.Tensor, Ref)):
        return fn(obj)
    if isinstance(obj, torch.Size):  # a tuple of ints: kept as the shape it is
        return obj
    if isinstance(obj, dict):
        items = {k: swap(v, fn) for k, v in obj.items()}
        return collections.OrderedDict(items) if isinstance(obj, collections.OrderedDict) else items
    if isinstance(obj, list):
        return [swap(v, fn) for v in obj]
    if isinstance(obj, tuple):
        items = [swap(v, fn) for v in obj]
        if hasattr(obj, "_fields"):  # a named tuple
            return type(obj)(*items)
        return type(obj)(items) if type(obj).__module__ == "torch.return_types" else tuple(items)  # torch.max's
    if hasattr(obj, "stores"):  # torch_geometric Data / HeteroData
        obj = copy.copy(obj)  # its own stores (PyG copies them), the tensors shared
        for store in obj.stores:
            for key, value in list(store.items()):
                store[key] = swap(value, fn)
    return obj


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def new_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A slot of at least ``nbytes``, shareable with another process."""
    size = max(_aligned(int(nbytes * GROWTH)), 1 << 20)
    if device.type == "cuda":
        return torch.empty(size, dtype=torch.uint8, device=device)
    return torch.empty(size, dtype=torch.uint8).share_memory_()


def pack(batch, buffer: torch.Tensor | None, device: torch.device) -> tuple[bytes, torch.Tensor | None]:
    """Copy ``batch``'s tensors on ``device`` into ``buffer`` (queued on the current stream) and pickle the rest.

    Returns ``(skeleton, grown)``: ``grown`` is a new, bigger buffer that now holds the batch (the caller sends
    it along and keeps it as the slot), or None where ``buffer`` was big enough. ``batch`` itself is left as it
    was."""
    tensors: list[torch.Tensor] = []
    refs: list[Ref] = []
    end = 0

    def place(t):
        nonlocal end
        if isinstance(t, Ref) or t.device != device:
            return t
        if t.is_sparse or t.layout != torch.strided:
            raise TypeError(f"a batch for hmgstore.Producer holds a {t.layout} tensor; only dense (strided) tensors "
                            "can be shared through its ring: make it dense in the loader, or use hmgstore.Pipeline")
        ref = Ref(end, t.dtype, tuple(t.shape))
        tensors.append(t)
        refs.append(ref)
        end = _aligned(end + ref.nbytes)
        return ref

    skeleton = swap(batch, place)
    grown = None
    if buffer is None or buffer.numel() < end:
        grown = buffer = new_buffer(end, device)
    for t, ref in zip(tensors, refs):
        if ref.nbytes:
            view_of(buffer, ref).copy_(t, non_blocking=True)
    return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), grown


def view_of(buffer: torch.Tensor, ref: Ref) -> torch.Tensor:
    """The tensor ``ref`` names, as a view into ``buffer``."""
    return buffer[ref.offset:ref.offset + ref.nbytes].view(ref.dtype).view(ref.shape)


def unpack(skeleton: bytes, buffer: torch.Tensor):
    """The batch: the skeleton with each ref replaced by its view into ``buffer``."""
    return swap(pickle.loads(skeleton), lambda r: view_of(buffer, r) if isinstance(r, Ref) else r)
