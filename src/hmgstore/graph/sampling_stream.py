"""A GPU sampler's batch on a stream of its own, so that its read-back does not wait for the gathers.

Why. A loader queues a batch's sampling and then its feature gather on one
stream (the pipeline's side stream). The sampler's seed copy and kernels
queue there behind the previous batch's gather, which beside a training step
reads host memory at a few SMs for milliseconds, and its one read-back of the
batch's sizes (:meth:`hmgstore.graph.NeighborSampler.sample`) waits for all of
it: the loader's thread idles until the last batch's rows have landed. On a
stream of its own the sampler waits only for its own kernels, and the next
batch's sampling runs on the GPU beside the last batch's gather.

How. A sampler reads :data:`OWN_STREAM` once, when it is built (a flag
flipped later would leave its captured CUDA graphs' buffers on the other
stream), into a :class:`StreamUse`; each batch runs in :meth:`StreamUse.batch`
on the device's sampling stream (one per device, made once, as the pipeline's
side stream is). The sampling stream waits for the calling stream before the
sampler's first batch (its tiers were built on it) and before any batch whose
inputs are on the GPU (seeds the caller made); a topology's counters, zeroed
on the stream that resets them, are synchronised there;
CPU inputs, what PyG's and DGL's loaders pass, need no wait. GPU inputs are
marked used by the sampling stream, and the calling stream waits for the batch
however it ends (an error too), so no memory is reused under a pending read.
Each output tensor is marked used by the calling stream (``record_stream``), so
that the allocator does not hand its memory to the sampling stream's next batch
while the calling stream still reads it. The outputs are the same tensors,
with the same values, as on the calling stream.

Off by default, as measured beside a training step (one H200, papers-shaped
graph, ``benchmarks/results/loader-levers-papers-h200.md``): the loader alone
runs 9-20% faster and the GPU idles 0.3 ms a batch instead of 2.7, but the
step's kernels slow by as much as more of the loader's run beside them, and the
epoch moves -10% to +3%. To use it, set ``HMGSTORE_SAMPLER_STREAM=1`` in the
environment (before hmgstore is imported; a producer process inherits it), or
:data:`OWN_STREAM` in this process.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch

from ..cuda.settings import choice
from ..util.device import kept_stream

#: Whether GPU samplers built from now on run their batches on the device's sampling stream (see the module).
OWN_STREAM = choice("HMGSTORE_SAMPLER_STREAM", ("0", "1"), "0") == "1"

def _gpu_tensors(fields) -> Iterator[torch.Tensor]:
    """The CUDA tensors among ``fields``, each a tensor or a mapping of them (a Sample's fields; seeds and
    times by node type); values of other kinds (lists, numpy arrays) are never on a GPU."""
    for field in fields:
        for value in field.values() if isinstance(field, Mapping) else (field,):
            if isinstance(value, torch.Tensor) and value.is_cuda:
                yield value


class StreamUse:
    """How one sampler uses its device's sampling stream: whether at all (:data:`OWN_STREAM` when it was
    built, on a GPU) and whether the stream must first wait for the calling stream (see the module)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.own = OWN_STREAM and device.type == "cuda"
        self._caught_up = False

    @contextlib.contextmanager
    def batch(self, *inputs) -> Iterator[Callable]:
        """Run the block on the sampling stream (where :attr:`own`; else where it is). Yields
        ``hand_over(sample)``, to call on the block's output (a dataclass whose fields are tensors, or mappings
        of them): it marks them used by the calling stream and returns ``sample``. ``inputs``: what the block
        reads (tensors, or mappings of them)."""
        if not self.own:
            yield lambda sample: sample
            return
        caller = torch.cuda.current_stream(self.device)
        stream = kept_stream(self.device, "sampling")
        read = list(_gpu_tensors(inputs))
        if read or not self._caught_up:
            stream.wait_stream(caller)
            self._caught_up = True
        for t in read:
            t.record_stream(stream)

        def hand_over(sample):
            for t in _gpu_tensors(vars(sample).values()):
                t.record_stream(caller)
            return sample

        try:
            with torch.cuda.stream(stream):
                yield hand_over
        finally:
            caller.wait_stream(stream)
