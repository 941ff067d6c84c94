"""Several processes (torchrun): one process per GPU, tables shared and sharded over a node, graphs
partitioned over several machines.

Built on torch.distributed; call ``init_process_group`` first (any backend:
hmgstore makes its own gloo groups for its few control messages).

One node, which holds the whole table:

- :func:`share_on_node` (:mod:`.node`, protocol in :mod:`.share`) puts a host table in shared memory
  once per node: the node's first rank builds it, the others map the same
  pages (no per-process copy). Nothing is left in /dev/shm however the
  processes end.
- :func:`shard` (:mod:`.shard`) builds, collectively, the node's sharded
  table; each process gets a :class:`~hmgstore.HybridTensor` view reading
  its own rows, its peers' shards over NVLink and the rest from the host.
- :func:`sharded_topology` (:mod:`.shard`) does the same for a graph's
  adjacency lists, in chunks, for each rank's GPU sampler.
- :mod:`.node` finds the processes of this node; :mod:`.watch` watches them
  and raises :class:`PeerLostError` in gathers when one dies with tables
  open.

Several machines (the job's nodes), each holding its partition of the graph:

- :class:`PartitionBook` (:mod:`.partition_book`) says which machine owns each node
  and at which row of its partition (range, hash or a given assignment).
- :func:`partition` (:mod:`.parts`; command ``python -m
  hmgstore.cli.partition``) writes one part per machine: the book, the part's
  feature rows, the in-edges of its nodes; :func:`load_partition` reads one;
  :func:`part_of` makes one in memory.
- :class:`ClusterTensor` (:mod:`.cluster`) gathers any node's rows on every
  rank: this machine's from its local table, the others' through
  ``all_to_all_single`` with one counterpart rank per machine
  (:mod:`.exchange`); :func:`gather_many` fuses several attributes. Gathers
  are collective, like DDP's forward.
- :class:`DistributedNeighborSampler` (:mod:`.sampling`) samples
  neighbours of any node: each owner samples its nodes' in-edges for the
  ranks that ask (collective, like gathers), the same draws as the
  single-machine sampler; or over a topology replicated on every machine.

On the CPU (gloo, no GPU) the same calls work: views gather from the shared
host table with torch, cluster exchanges go over gloo, and the sharing,
checks and watching are the same.
"""
from .cluster import EXCHANGE_TIMEOUT, Cluster, ClusterTensor, gather_many, this_cluster
from .node import SETUP_TIMEOUT, share_on_node, this_node
from .partition_book import PartitionBook
from .parts import Partition, load_partition, part_of, partition
from .sampling import DistributedNeighborSampler
from .shard import DistributedTensor, shard, sharded_topology
from .watch import WATCH_SECONDS, PeerLostError

__all__ = ["share_on_node", "shard", "sharded_topology", "DistributedTensor", "PeerLostError", "this_node",
           "SETUP_TIMEOUT", "WATCH_SECONDS", "PartitionBook", "partition", "part_of", "load_partition", "Partition",
           "ClusterTensor", "gather_many", "this_cluster", "Cluster", "EXCHANGE_TIMEOUT", "DistributedNeighborSampler"]
