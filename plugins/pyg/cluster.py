"""PyG over a graph partitioned over machines: a feature store, a sampler and a loader per rank.

Each rank builds, from its machine's part (:func:`hmgstore.distributed.load_partition`)::

    tables = {name: ClusterTensor(t, part.book) for name, t in part.features.items()}
    loader = cluster_loader(ClusterFeatureStore(tables), ClusterNeighborSampler(part, [15, 10]),
                            my_seeds, batch_size=1024, shuffle=True)

and iterates it like any ``NeighborLoader``: batches are PyG ``Data`` with
``x``, ``y``, ``edge_index``, ``n_id``, ``batch_size``, per-hop counts.
Sampling (:class:`hmgstore.distributed.DistributedNeighborSampler`) and
feature gathers (:func:`hmgstore.distributed.gather_many`) are
**collective**: every rank of the job must draw the same number of batches,
or the ranks that draw more wait for the others forever (until
``EXCHANGE_TIMEOUT``). :func:`cluster_loader` makes sure of it: it agrees
with the other ranks on the number of batches (the largest) and pads a
rank's epoch with empty batches (``batch_size == 0``, no nodes); a training
loop still runs forward and backward on them (a zero loss), so that DDP's
all-reduce stays in step too. Loaders sample in the main process only
(``num_workers=0``): collectives cannot run in DataLoader workers.

Node attributes only (no edge features, no ``e_id``: edge ids are not known
across machines), homogeneous graphs.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist
from torch_geometric.data import FeatureStore, TensorAttr
from torch_geometric.loader import NodeLoader
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput

from hmgstore.distributed import (
    ClusterTensor,
    DistributedNeighborSampler,
    gather_many,
    this_cluster,
)
from hmgstore.rows import checks

from .graph_store import CSCGraphStore, check_loaders
from .updates import IndexAttr


class ClusterFeatureStore(FeatureStore):
    """A PyG ``FeatureStore`` of :class:`~hmgstore.distributed.ClusterTensor` s (homogeneous graphs).

    ``tables``: attribute name -> ClusterTensor, built in the same order on
    every rank. ``multi_get_tensor`` answers every attribute of a batch with
    one collective :func:`~hmgstore.distributed.gather_many` (rows of the
    global ids in ``index``, on the tables' device). Read-only: ``put_tensor``
    raises ValueError; a whole-table read (``index=None``) raises ValueError
    (no machine holds the whole table).
    """

    def __init__(self, tables: dict[str, ClusterTensor]):
        super().__init__(tensor_attr_cls=IndexAttr)  # numpy indices too
        check_loaders()
        if not tables or not all(isinstance(t, ClusterTensor) for t in tables.values()):
            raise TypeError("ClusterFeatureStore takes {attr_name: ClusterTensor}, at least one")
        self._tables = dict(tables)

    def _lookup(self, attr: TensorAttr) -> ClusterTensor:
        if attr.group_name is not None or attr.attr_name not in self._tables:
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}); the store holds "
                           f"{[(None, name) for name in self._tables]}")
        return self._tables[attr.attr_name]

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise ValueError("a ClusterFeatureStore is read-only: build it from ClusterTensors")

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[torch.Tensor]:
        requests = []
        for attr in attrs:
            if attr.index is None:
                raise ValueError(f"cannot read the whole of {attr.attr_name!r}: no machine holds it; ask for ids")
            requests.append((self._lookup(attr), attr.index))
        return gather_many(requests)

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise ValueError("a ClusterFeatureStore is read-only")

    def _get_tensor_size(self, attr: TensorAttr):
        table = self._tables.get(attr.attr_name) if attr.group_name is None else None
        return None if table is None else tuple(table.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [self._tensor_attr_cls(None, name) for name in self._tables]

    def __repr__(self) -> str:
        return f"ClusterFeatureStore({', '.join(f'{k}: {tuple(t.shape)}' for k, t in self._tables.items())})"


class ClusterNeighborSampler(BaseSampler):
    """PyG's ``BaseSampler`` over :class:`hmgstore.distributed.DistributedNeighborSampler`.

    Outputs ``SamplerOutput`` (``node`` seeds first, ``row``/``col`` local
    ids, per-hop counts; ``edge`` None: batches carry no ``e_id``).

    Args:
        topology: this machine's ``Partition`` (collective sampling) or the whole graph's
            :class:`hmgstore.graph.CSC` (replicated, local).
        num_neighbors: neighbours per hop, e.g. ``[15, 10]`` (-1: all).
        replace: sample with replacement (a bool).
        generator: None or a CPU ``torch.Generator`` keying the draws.
        device: where the topology is held and sampled (None: the CPU).

    Raises:
        TypeError: a ``topology`` that is neither a Partition nor a CSC; ``num_neighbors`` not a list of whole
            numbers; a non-bool ``replace``; a ``generator`` that is not a ``torch.Generator``.
        ValueError: a fanout under -1; a part the book or the other ranks do not bear out (partitioned).
        RuntimeError: a CUDA ``device`` where torch sees none; ``sample_from_nodes`` in a DataLoader worker
            (collectives need the main process: ``num_workers=0``).
        IndexError: ``sample_from_nodes`` seeds outside ``[0, num_nodes)``, before anything is sent.
        NotImplementedError: ``sample_from_nodes`` with seed times (temporal sampling); ``sample_from_edges``.
    """

    def __init__(self, topology, num_neighbors, *, replace: bool = False, generator: torch.Generator | None = None,
                 device=None):
        if not isinstance(replace, (bool, np.bool_)):
            raise TypeError(f"replace is True or False, got {replace!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator is a torch.Generator or None, got {type(generator).__name__}")
        self.sampler = DistributedNeighborSampler(topology, num_neighbors, replace=bool(replace),
                                                  generator=generator, device=device)

    @property
    def edge_permutation(self):
        return None

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs) -> SamplerOutput:
        if index.time is not None:
            raise NotImplementedError("ClusterNeighborSampler does not do temporal sampling (input_time was given): "
                                      "on one machine, HybridNeighborSampler(data, ..., time_attr=...) does")
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("ClusterNeighborSampler samples collectively, in the loader's main process: pass "
                               "num_workers=0")
        out = self.sampler.sample(index.node)
        return SamplerOutput(node=out.node[None], row=out.row[None], col=out.col[None], edge=None, batch=None,
                             num_sampled_nodes=out.num_sampled_nodes[None],
                             num_sampled_edges=out.num_sampled_edges[None], metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("ClusterNeighborSampler samples around nodes only (NeighborLoader): for "
                                  "LinkNeighborLoader use HybridNeighborSampler on one machine")

    def close(self) -> None:
        """Free the topology's GPU memory, if any (see :meth:`DistributedNeighborSampler.close`)."""
        self.sampler.close()

    def __repr__(self) -> str:
        return f"ClusterNeighborSampler({self.sampler!r})"


class EqualBatches(torch.utils.data.Sampler):
    """Batches of positions ``[0, n)``, ``num_batches`` of them: the last ones empty when ``n`` runs out.

    Args:
        n: positions to cover, an integer >= 0.
        batch_size: positions per batch, an integer >= 1.
        num_batches: batches per epoch, an integer of at least ``ceil(n / batch_size)`` (fewer would drop
            positions without a word; more pad the epoch with empty batches).
        shuffle: a new order each epoch (:meth:`set_epoch`), from ``seed``.
        seed: an integer.

    Raises:
        TypeError: a count, ``seed`` or :meth:`set_epoch`'s ``epoch`` that is not an integer (floats, bools).
        ValueError: a negative ``n`` or ``num_batches``, a ``batch_size`` under 1, or ``num_batches`` too few
            to hold ``n`` positions.
    """

    def __init__(self, n: int, batch_size: int, num_batches: int, *, shuffle: bool = False, seed: int = 0):
        n = checks.count(n, "n")
        batch_size = checks.count(batch_size, "batch_size", at_least=1)
        num_batches = checks.count(num_batches, "num_batches")
        if num_batches * batch_size < n:
            raise ValueError(f"num_batches={num_batches} of {batch_size} hold {num_batches * batch_size} of the {n} "
                             f"positions; pass at least {math.ceil(n / batch_size)}")
        seed = checks.count(seed, "seed", at_least=-(2**63))
        self.n, self.batch_size, self.num_batches, self.shuffle, self.seed = n, batch_size, num_batches, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = checks.count(epoch, "epoch", at_least=-(2**63))

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        order = (torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
                 if self.shuffle else torch.arange(self.n))
        for b in range(self.num_batches):
            yield order[b * self.batch_size:(b + 1) * self.batch_size].tolist()


def cluster_loader(feature_store: ClusterFeatureStore, sampler: ClusterNeighborSampler, input_nodes,
                   batch_size: int, *, shuffle: bool = False, seed: int = 0, **kwargs) -> NodeLoader:
    """A stock PyG ``NodeLoader`` over this rank's ``input_nodes`` that draws as many batches as every other rank's.

    Collective once (an all-reduce of the batch count over every rank).
    ``input_nodes``: int64 global ids of this rank's seeds (any count, even
    0). Each rank gets ``max over ranks of ceil(len / batch_size)`` batches
    per epoch, its last ones empty when it has fewer seeds. ``shuffle``:
    reshuffle each epoch (``loader.batch_sampler.set_epoch(epoch)``) from
    ``seed``. Other ``kwargs`` go to ``NodeLoader`` (``num_workers`` must
    stay 0). Raises ValueError for a ``batch_size`` under 1 or ``num_workers``, TypeError for non-integer
    ``batch_size`` or ids and for a keyword neither this function nor ``NodeLoader`` takes (naming
    ``cluster_loader`` and the closest one), before the collective.
    """
    # NodeLoader passes the keywords it does not name on to torch's DataLoader; those filled in here are not the
    # caller's to give
    filled = ("data", "node_sampler", "input_nodes", "batch_sampler", "filter_per_worker", "dataset")
    checks.keywords("cluster_loader", kwargs, checks.takes(NodeLoader, torch.utils.data.DataLoader, without=filled),
                    checks.takes(cluster_loader))
    if kwargs.get("num_workers", 0):
        raise ValueError("cluster loaders sample and gather collectively, in the main process: num_workers=0")
    batch_size = checks.count(batch_size, "batch_size", at_least=1)  # before the collective: every rank raises
    input_nodes = checks.id_list(torch.as_tensor(input_nodes).reshape(-1), "input_nodes", 2**62)  # no float ids
    count = torch.tensor([math.ceil(len(input_nodes) / batch_size)])
    dist.all_reduce(count, dist.ReduceOp.MAX, group=this_cluster().control)
    batches = EqualBatches(len(input_nodes), batch_size, int(count), shuffle=shuffle, seed=seed)
    return NodeLoader((feature_store, CSCGraphStore()), sampler, input_nodes=input_nodes, batch_sampler=batches,
                      filter_per_worker=False, **kwargs)
