"""Hotness by pre-sampling: how often each node's features and adjacency are touched in an epoch.

GNNLab's observation: the nodes a sampler touches concentrate, and the set is
stable from epoch to epoch, so counting them over one epoch of real sampling
predicts the next epochs far better than degree does on graphs that train on a
small share of their nodes (papers100M: 96% hits with a 5% cache, against 29%
by degree; research notes). :func:`presample` runs the sampler over the
training seeds and counts, per node type:

- ``features``: every node of a batch (each is gathered once per batch);
- ``topology``: every node whose adjacency list is read (a batch's nodes but
  those found by the last hop).

``hotness.order_by_score(counts)`` turns either into a ``hot_order``.

Without a sampler or seeds, :func:`expected_draws` predicts the same counts
from the topology alone: how often one hop draws each node as a neighbour.
It is the stores' default hotness (``from_data``), since in-degree, the
length of a node's own list, says nothing of how often others sample it
unless the graph is symmetric.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rows import checks
from ..rows.hotness import check_order, check_score
from ..util.device import resolve_device
from ..util.progress import tqdm
from .csc import CSC
from .sampler import NeighborSampler

#: The fanout :func:`expected_draws` assumes. The ranking barely depends on it: 10 and 15 give hit rates within
#: 0.005 of each other on four 2M-node graphs (benchmarks/results/default-hotness-cpu.md).
EXPECTED_FANOUT = 10
#: Destination nodes per step of :func:`expected_draws`: bounds its temporaries on billion-edge graphs.
_DRAWS_CHUNK = 1 << 22
_DRAWS_ONE = 1 << 24  # expected_draws' fixed-point unit


@dataclass
class Hotness:
    """Touch counts per node type (key None when homogeneous), int64 CPU tensors.

    Args:
        features: node type -> 1-D integer tensor [nodes of the type], each
            node's touches as a batch's node, every count >= 0.
        topology: the same keys and lengths: each node's adjacency reads.
        batches: the batches counted, an integer >= 0.

    Raises:
        TypeError: ``features`` or ``topology`` not a dict; an entry not a
            1-D integer tensor; ``batches`` not an integer.
        ValueError: the two dicts keyed differently; entries of one type of
            different lengths; a negative count or ``batches``.
    """

    features: dict
    topology: dict
    batches: int

    def __post_init__(self):
        self.batches = checks.count(self.batches, "batches")
        for name in ("features", "topology"):
            counts = getattr(self, name)
            if not isinstance(counts, dict):
                raise TypeError(f"Hotness.{name} is a dict node type -> counts, got {type(counts).__name__}")
            for nt, c in counts.items():
                if not isinstance(c, torch.Tensor) or c.dtype.is_floating_point or c.dtype.is_complex \
                        or c.dtype == torch.bool:
                    raise TypeError(f"Hotness.{name}[{nt!r}] is an integer tensor of counts, got "
                                    f"{getattr(c, 'dtype', type(c).__name__)}")
                if c.dim() != 1:
                    raise ValueError(f"Hotness.{name}[{nt!r}] is 1-D, one count per node; got {tuple(c.shape)}")
                if len(c) and int(c.min()) < 0:
                    raise ValueError(f"Hotness.{name}[{nt!r}] holds a negative count ({int(c.min())})")
        if set(self.features) != set(self.topology):
            raise ValueError(f"Hotness.features and .topology count other node types: {list(self.features)} and "
                             f"{list(self.topology)}")
        for nt, c in self.features.items():
            if len(c) != len(self.topology[nt]):
                raise ValueError(f"node type {nt!r}: {len(c)} feature counts and {len(self.topology[nt])} topology "
                                 "counts; one of each per node")


def presample(sampler: NeighborSampler, seeds, *, epochs: int = 1, batch_size: int = 1024, node_type=None,
              generator: torch.Generator | None = None, progress: bool = True) -> Hotness:
    """Count how often each node's features and adjacency are touched over ``epochs`` of batches.

    ``sampler``: a :class:`hmgstore.graph.NeighborSampler` (or anything with
    a ``.sampler`` that is one, such as the PyG adapter); ``seeds``: the
    training node ids (of ``node_type`` on heterogeneous graphs), shuffled
    into batches of ``batch_size`` each epoch with ``generator``. No seeds
    make no batches (``Hotness.batches == 0``, every count 0). Raises
    TypeError for another sampler, non-integer seeds and a ``generator``
    that is not a ``torch.Generator`` (or None), IndexError for seeds
    that are not nodes of ``node_type``, ValueError for seeds of two or more
    dimensions, an unknown ``node_type``, ``batch_size`` under 1, negative
    ``epochs`` or a temporal sampler (presample has no seed times to give it).
    """
    core = getattr(sampler, "sampler", sampler)
    if not isinstance(core, NeighborSampler):
        raise TypeError(f"presample takes a hmgstore NeighborSampler (or its PyG adapter), "
                        f"got {type(sampler).__name__}")
    if core.temporal:  # a batch needs its seeds' times, which presample has none of
        raise ValueError("presample takes no seed times, so it cannot run a temporal sampler (one built with "
                         "time_attr, or topologies with times); pre-sample with a sampler of the same graph and "
                         "num_neighbors built without time_attr, or rank nodes by expected_draws(csc)")
    if generator is not None and not isinstance(generator, torch.Generator):  # torch's own error names no argument
        raise TypeError(f"presample's generator is a torch.Generator or None, got {type(generator).__name__}")
    if node_type not in core.num_nodes:
        raise ValueError(f"node_type {node_type!r} is not a node type of the sampler's graph: {list(core.num_nodes)}")
    # One seed (a 0-d tensor) is a list of one; seeds of two or more dimensions are refused, not flattened.
    seeds = checks.id_list(seeds.reshape(1) if isinstance(seeds, torch.Tensor) and seeds.dim() == 0 else seeds,
                           "seeds", core.num_nodes[node_type])
    epochs = checks.count(epochs, "epochs")
    batch_size = checks.count(batch_size, "batch_size", at_least=1)
    device = core.device
    features = {nt: torch.zeros(n, dtype=torch.int64, device=device) for nt, n in core.num_nodes.items()}
    topology = {nt: torch.zeros(n, dtype=torch.int64, device=device) for nt, n in core.num_nodes.items()}
    batches = 0
    total = epochs * -(-len(seeds) // batch_size)
    with tqdm(total=total, desc="pre-sampling hotness", unit="batch", disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            order = seeds[torch.randperm(len(seeds), generator=generator)]
            for batch in order.split(batch_size) if len(order) else ():  # no seeds: no batch
                out = core.sample({node_type: batch})
                for nt, nodes in out.node.items():
                    ones = torch.ones_like(nodes)
                    features[nt].index_add_(0, nodes, ones)
                    read = len(nodes) - out.num_sampled_nodes[nt][-1]  # the last hop's nodes are not expanded
                    topology[nt].index_add_(0, nodes[:read], ones[:read])
                batches += 1
                bar.update()
    return Hotness({nt: c.cpu() for nt, c in features.items()}, {nt: c.cpu() for nt, c in topology.items()}, batches)


def hit_ratio(counts, cached) -> float:
    """Share of the touches ``counts`` that fall on the ``cached`` node ids.

    Args:
        counts: one count per node, 1-D, real (integer or float), finite and
            >= 0 (a :class:`Hotness` entry, or any score of touches).
        cached: node ids (1-D integers), each in ``[0, len(counts))`` and
            listed at most once.

    Returns:
        A float in ``[0, 1]``: the cached nodes' counts over all counts (0.0
        when every count is 0).

    Raises:
        TypeError: ``counts`` not real numbers; ``cached`` not integers.
        ValueError: ``counts`` not 1-D, NaN, infinite or negative;
            ``cached`` not 1-D or listing a node twice.
        IndexError: a cached id outside ``[0, len(counts))``.
    """
    counts = torch.as_tensor(counts) if not isinstance(counts, torch.Tensor) else counts
    if counts.dim() != 1:
        raise ValueError(f"counts is 1-D, one count per node; got shape {tuple(counts.shape)}")
    counts = check_score(counts, len(counts), "counts").double()  # float sums: float counts are never truncated
    if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
        raise ValueError("counts are touches: finite and 0 or more")
    cached = check_order(cached, len(counts), "cached", hint="pass each cached node id once")
    total = float(counts.sum())
    return min(float(counts.index_select(0, cached).sum()) / total, 1.0) if total else 0.0


def expected_draws(csc: CSC, fanout: int = EXPECTED_FANOUT, progress: bool = False, device=None) -> torch.Tensor:
    """How often one hop of uniform sampling with ``fanout``, run from every destination node once, draws each
    source node: ``sum over the lists holding u of min(1, fanout / len(list))``, float64 [num_src] (CPU).
    ``device``: where the sums are made (a GPU adds the 1.6 billion edges of a papers-shaped graph in a second or
    two, its CPU takes about a minute); the answer comes back to the CPU either way.

    A node is gathered when a batch samples it, and it is sampled from the lists it appears in, each of them
    giving it ``min(1, k / degree)`` of a draw; so this ranks rows as pre-sampling does, without seeds or a
    sampler (benchmarks/results/default-hotness-cpu.md: within 0.01 of a pre-sampled epoch's hit rate on
    directed power-law and community graphs, where in-degree ranks no better than chance; on a symmetric
    graph within 0.008 of degree). One pass over the edges in chunks of destinations. Raises TypeError for
    anything but a :class:`~hmgstore.graph.CSC` or a non-integer ``fanout``, ValueError for ``fanout`` under 1
    and IndexError for a neighbour id outside the source nodes (``row`` changed after the CSC was built).
    """
    if not isinstance(csc, CSC):
        raise TypeError(f"expected_draws takes a hmgstore.graph.CSC, got {type(csc).__name__}: build one with "
                        "hmgstore.graph.to_csc(edge_index, 'coo', size=(num_src, num_dst))")
    fanout = checks.count(fanout, "fanout", at_least=1)
    device = torch.device("cpu") if device is None else resolve_device(device)
    degree = csc.colptr.diff()
    fanout = min(fanout, max(int(degree.max()) if len(degree) else 1, 1))  # more than the longest list: every edge
    # each edge's chance to be drawn, in fixed point: integer sums are the same in any order, so a GPU's atomics
    # give the CPU's answer bit for bit and the ranking never changes between runs (2^24 steps: one node's sum
    # stays exact up to 2^39 edges into it)
    share = (fanout / degree.clamp(min=1).double()).clamp(max=1.0).mul(_DRAWS_ONE).round().long().to(device)
    counts = degree.to(device)
    draws = torch.zeros(csc.size[0], dtype=torch.int64, device=device)
    steps = range(0, len(degree), _DRAWS_CHUNK)
    with tqdm(total=len(steps), desc="ranking rows by expected draws", unit="chunk", disable=not progress,
              leave=False) as bar:
        for lo in steps:
            hi = min(lo + _DRAWS_CHUNK, len(degree))
            first, last = int(csc.colptr[lo]), int(csc.colptr[hi])
            weights = share[lo:hi].repeat_interleave(counts[lo:hi], output_size=last - first)
            ids = csc.row[first:last].to(device).long()
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(draws)):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise IndexError(f"the CSC's row holds neighbour id {bad}, outside [0, {len(draws)}): was row "
                                 "changed after the CSC was built? Build it again with to_csc")
            draws.index_add_(0, ids, weights)
            bar.update()
    return draws.cpu().double() / _DRAWS_ONE
