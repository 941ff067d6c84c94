"""A batch of :class:`~hmgstore.graph.sampler.NeighborSampler` captured in a CUDA graph, and replayed."""
from __future__ import annotations

import gc

import torch


def _sizes(keys: dict, state) -> torch.Tensor:
    """Every hop's node bounds per type and used slots per edge type, as one device tensor."""
    sets, starts, queued, _ = state
    used = [q[3] for per_hop in queued.values() for q in per_hop if q is not None]
    return torch.cat([starts[nt] for nt in keys] + used)


class CapturedBatch:
    """One seed count's queued batch, captured in a CUDA graph and replayed with new seeds and keys.

    The graph's inputs are static buffers (the seeds' keys, the draw keys
    and, for a temporal sampler, the trees' times); :meth:`run` copies a
    batch's values in, replays, reads the sizes back and copies the outputs
    out of the graph's memory, which the next replay reuses.
    """

    def __init__(self, sampler, keys: dict, draws: torch.Tensor, tree_time: torch.Tensor | None = None):
        device = sampler.device
        self.sampler = sampler
        self.seeds = {nt: torch.empty_like(k) for nt, k in keys.items()}
        self.draws = torch.empty(len(draws), dtype=torch.int64, device=device)
        self.draws_host = torch.empty(len(draws), dtype=torch.int64, pin_memory=True)
        for nt, k in keys.items():  # valid inputs during capture, so the capture itself is a valid batch
            self.seeds[nt].copy_(k)
        self.draws.copy_(draws)
        self.times = None if tree_time is None else tree_time.clone()  # one per tree: as many as the seeds
        torch.cuda.current_stream(device).synchronize()
        self.graph = torch.cuda.CUDAGraph()
        collecting = gc.isenabled()
        gc.disable()  # a finalizer run during capture (one that waits for the GPU) would break the capture
        try:
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.state = sampler._queue_batch(self.seeds, self.draws, self.times)
                self.sizes = _sizes(self.seeds, self.state)
        finally:
            if collecting:
                gc.enable()

    def run(self, keys: dict, draws: torch.Tensor, tree_time: torch.Tensor | None = None):
        for nt, k in keys.items():
            self.seeds[nt].copy_(k)
        if self.times is not None and tree_time is not None:
            self.times.copy_(tree_time)
        elif (tree_time is None) != (self.times is None):
            raise ValueError("a captured batch replays with seed times exactly when it was captured with them")
        self.draws_host.copy_(draws)
        self.draws.copy_(self.draws_host, non_blocking=True)
        self.graph.replay()
        return self.sampler._finish_queued(self.state, self.sizes.tolist(), copy=True)
