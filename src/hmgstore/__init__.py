"""hmgstore — Hybrid-Memory Graph Store.

GPU gathers of feature rows from pinned host memory (zero-copy over PCIe),
other GPUs' memory (NVLink) and a GPU-resident hot-row tier, in one kernel
launch per batch, behind a small tensor-like API::

    table = hmgstore.HybridTensor(x, device="cuda:0", gpu_rows=hot_ids)
    y = table[idx]

The package, by layer:

- ``tensor`` (HybridTensor, gather_many), ``index`` (the range check),
  ``files`` (:func:`load`: tables read from files into owned memory),
  ``placement`` (which row lives where), ``sharded`` (ShardedTensor: several
  GPUs of one process): the table and its one gather;
- ``cuda``: the CUDA layer, the only place that imports CuPy;
- ``memory``: host memory, pinned for zero-copy reads, owned (cudaHostAlloc or huge pages) and shared by a node;
- ``graph``: framework-free topology (CSC, tiers) and neighbour sampling;
- ``pipeline``: sampling and gathering the next batches on a side stream while the model trains;
  ``producer`` (with ``ring``): the same in a process of its own, outside the training thread's GIL;
- ``stats``: per-tier counters;
- ``distributed``: one process per GPU (torchrun) on one node;
- ``data``: synthetic and OGB graphs; ``bench``: ``python -m hmgstore.bench``.

Framework adapters live in ``hmgstore.plugins.pyg`` and ``hmgstore.plugins.dgl``.
Importing hmgstore never imports CuPy; CUDA tables do, on first use.
"""
from .cuda.deferred import raise_deferred
from .prefetch.pipeline import Pipeline
from .prefetch.producer import Producer
from .rows import placement, stats
from .rows.placement import Placement, Tier
from .table.files import load
from .table.sharded import ShardedTensor
from .table.tensor import HybridTensor, gather_many
from .util.device import resolve_device

__version__ = "0.1.0"
__all__ = ["HybridTensor", "ShardedTensor", "gather_many", "load", "raise_deferred", "Pipeline", "Producer", "placement", "stats", "Placement", "Tier",
           "resolve_device", "__version__"]
