"""Several processes (torchrun): one process per GPU, tables shared and sharded over a node.

Built on torch.distributed; call ``init_process_group`` first (any backend:
hmgstore makes its own gloo groups for its few control messages).

- :func:`share_on_node` (:mod:`.share`) puts a host table in shared memory
  once per node: the node's first rank builds it, the others map the same
  pages (no per-process copy). Nothing is left in /dev/shm however the
  processes end.
- :func:`shard` (:mod:`.shard`) builds, collectively, the node's sharded
  table; each process gets a :class:`~hmgstore.HybridTensor` view reading
  its own rows, its peers' shards over NVLink and the rest from the host.
- :mod:`.node` finds the processes of this node; :mod:`.watch` watches them
  and raises :class:`PeerLostError` in gathers when one dies with tables
  open.

On the CPU (gloo, no GPU) the same calls work: views gather from the shared
host table with torch, and the sharing, checks and watching are the same.
Everything here is about one node; each node holds the whole table.
"""
from .node import SETUP_TIMEOUT, this_node
from .share import share_on_node
from .shard import DistributedTensor, shard
from .watch import WATCH_SECONDS, PeerLostError

__all__ = ["share_on_node", "shard", "DistributedTensor", "PeerLostError", "this_node", "SETUP_TIMEOUT",
           "WATCH_SECONDS"]
