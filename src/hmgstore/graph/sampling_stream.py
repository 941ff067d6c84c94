"""A GPU sampler's batch on a stream of its own, so that its read-back does not wait for the gathers.

Why. A loader queues a batch's sampling and then its feature gather on one
stream (the pipeline's side stream). The sampler's seed copy and kernels
queue there behind the previous batch's gather, which beside a training step
reads host memory at a few SMs for milliseconds, and its one read-back of the
batch's sizes (:meth:`hmgstore.graph.NeighborSampler.sample`) waits for all of
it: the loader's thread idles until the last batch's rows have landed. On a
stream of its own the sampler waits only for its own kernels, and the next
batch's sampling runs on the GPU beside the last batch's gather.

How. With :data:`OWN_STREAM` set, :func:`on_own_stream` runs a batch on the
device's sampling stream (one per device, made once, as the pipeline's side
stream is). Inputs already on the GPU (seeds made by earlier work of the
calling stream) make the sampling stream wait for the calling stream first;
CPU inputs, what PyG's and DGL's loaders pass, need no wait. The calling
stream then waits for the batch, and each output tensor is marked as used by
it (``record_stream``), so that the allocator does not hand its memory to the
sampling stream's next batch while the calling stream still reads it. The
outputs are the same tensors, with the same values, as on the calling stream.

Off by default until measured on a GPU beside a training step: set
``HMGSTORE_SAMPLER_STREAM=1`` in the environment (before hmgstore is imported;
a producer process inherits it), or :data:`OWN_STREAM` in this process.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch

#: Whether a GPU sampler runs its batches on the device's sampling stream (see the module's docstring).
OWN_STREAM = os.environ.get("HMGSTORE_SAMPLER_STREAM", "0") == "1"

_streams: dict[int, torch.cuda.Stream] = {}


def sampling_stream(device: torch.device) -> torch.cuda.Stream:
    """The one sampling stream of ``device``, made on first use and kept (a new stream each batch would strand
    the caching allocator's blocks on streams no longer used)."""
    if device.index not in _streams:
        _streams[device.index] = torch.cuda.Stream(device)
    return _streams[device.index]


def _cuda_tensors(obj) -> Iterator[torch.Tensor]:
    """The CUDA tensors in ``obj``: a tensor, or dicts, lists and tuples of them (a Sample's fields)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _cuda_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _cuda_tensors(value)


@contextlib.contextmanager
def on_own_stream(device: torch.device, *inputs) -> Iterator[Callable]:
    """Run the block on ``device``'s sampling stream (with :data:`OWN_STREAM`, on a GPU; else where it is).

    Yields ``hand_over(fields)``: called on the block's outputs (any of tensors, dicts, lists, tuples), it makes
    the calling stream wait for them and marks them used by it. ``inputs``: what the block reads; any on the GPU
    makes the sampling stream wait for the calling stream first.
    """
    if not OWN_STREAM or device.type != "cuda":
        yield lambda *fields: None
        return
    caller = torch.cuda.current_stream(device)
    stream = sampling_stream(device)
    if any(True for _ in _cuda_tensors(list(inputs))):
        stream.wait_stream(caller)

    def hand_over(*fields) -> None:
        caller.wait_stream(stream)
        for t in _cuda_tensors(list(fields)):
            t.record_stream(caller)

    with torch.cuda.stream(stream):
        yield hand_over
