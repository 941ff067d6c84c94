"""hmgstore — Hybrid-Memory Graph Store.

GPU gathers of feature rows from pinned host memory (zero-copy over PCIe) and
a GPU-resident hot-row tier, in one kernel launch per batch, behind a small
tensor-like API::

    table = hmgstore.HybridTensor(x, device="cuda:0", gpu_rows=hot_ids)
    y = table[idx]

Framework adapters live in ``hmgstore.plugins.pyg`` and ``hmgstore.plugins.dgl``.
Importing hmgstore never imports CuPy; CUDA tables do, on first use.
"""
from . import placement
from .sharded import ShardedTensor
from .tensor import HybridTensor, gather_many

__version__ = "0.1.0"
__all__ = ["HybridTensor", "ShardedTensor", "gather_many", "placement", "__version__"]
