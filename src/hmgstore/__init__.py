"""hmgstore — Hybrid-Memory Graph Store.

GPU gathers of feature rows from pinned host memory (zero-copy over PCIe),
other GPUs' memory (NVLink) and a GPU-resident hot-row tier, in one kernel
launch per batch, behind a small tensor-like API::

    table = hmgstore.HybridTensor(x, device="cuda:0", gpu_rows=hot_ids)
    y = table[idx]

The package, by layer (lowest first; a folder imports only its own layer and those below):

- ``cuda``: kernels and launches, the only place that imports CuPy (lazily);
- ``memory``: host memory, pinned for zero-copy reads, owned (cudaHostAlloc
  or huge pages) and shared by a node; ``util``: device, timing, progress;
- ``rows``: ids checked (``ids``), stored formats, hotness and GPU budgets
  (``hotness``), which row lives where (``placement``), per-tier counters
  (``stats``);
- ``gather``: one gather's plan and launch, the CPU's share, fused batches;
- ``table``: :class:`HybridTensor` and :func:`gather_many`, tables from files
  (:func:`load`), :class:`ShardedTensor` (several GPUs of one process);
- ``graph``: framework-free topology (CSC, tiers) and neighbour sampling;
- ``prefetch``: :class:`Pipeline` (the next batches on a side stream while
  the model trains), :class:`Producer` (the same in a process of its own)
  and :func:`host_bound` (the rate a loader's host reads allow);
- ``distributed``: one process per GPU (torchrun), several machines;
- ``data``: synthetic and OGB graphs; ``bench`` and ``cli``: commands.

Framework adapters live in ``hmgstore.plugins.pyg`` and ``hmgstore.plugins.dgl``.
Importing hmgstore never imports CuPy; CUDA tables do, on first use.
"""
import sys

from .cuda.deferred import raise_deferred
from .prefetch.host_bound import HostBound, host_bound
from .prefetch.pipeline import Pipeline
from .prefetch.producer import Producer
from .rows import hotness, placement, stats
from .rows.placement import Placement, Tier
from .table.files import load
from .table.interface import FeatureTable
from .table.sharded import ShardedTensor
from .table.tensor import HybridTensor, gather_many
from .util.device import resolve_device

# The rows modules the package re-exports are importable under its name too (``import hmgstore.hotness``,
# ``from hmgstore.hotness import order_by_score``), as the same module objects the attributes are.
for _module in (hotness, placement, stats):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module
del _module

__version__ = "0.1.0"
__all__ = ["FeatureTable", "HybridTensor", "ShardedTensor", "gather_many", "load", "raise_deferred", "Pipeline",
           "host_bound", "HostBound",
           "Producer", "hotness", "placement", "stats", "Placement", "Tier", "resolve_device", "__version__"]
