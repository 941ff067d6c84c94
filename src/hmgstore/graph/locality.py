"""Locality: host rows laid out so that rows used together share pages, and batches that use few pages.

Why. On the cloud VMs measured (virtual machines with pass-through GPUs, as most
cloud hosts are) a zero-copy gather keeps about 0.9x of the PCIe limit only
while a batch's rows lie in a few hundred distinct 2 MiB host pages; each
further page costs about half a microsecond, serialised
(``python benchmarks/research reach``). A mini-batch of random seeds touches
rows all over a big table, whatever the order inside the batch. Two levers
cut the pages a batch touches:

- a *layout* (:class:`hmgstore.HybridTensor`'s ``layout=``): the host tier
  keeps rows in an order where a node's neighbours sit near it, so the rows
  of one seed's neighbourhood share pages. Orders offered here:
  :func:`community_order` (label propagation, built in, torch only),
  :func:`metis_order` (METIS through ``pymetis``, ``pip install pymetis``)
  and :func:`coaccess_order` (nodes in the order an epoch of real sampling
  first touches them);
- *locality-aware batches* (:class:`LocalityBatchSampler`): each batch takes
  its seeds from a window of a few *parts* (contiguous runs of the layout),
  drawn at random every epoch, so its neighbourhoods stay in few pages
  (BGL's proximity-aware ordering, MariusGNN's partition buffers). Random
  order stays the default: batches of a few parts are less random, which
  may cost accuracy (measured in docs/big-tables.md).

:func:`pages_touched` counts the distinct host pages of a batch's rows under
a layout: the figure both levers are judged by.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler

from ..rows import checks
from ..util.progress import tqdm
from .csc import CSC, to_csc
from .sampler import NeighborSampler

#: Bytes of host memory the GPU translates at once (the unit of :func:`pages_touched`).
PAGE_BYTES = 2 << 20


def _undirected(csc: CSC) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` of every edge in both directions (int64 CPU), self loops dropped."""
    dst, src = csc.col(), csc.row.long()
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return torch.cat([src, dst]), torch.cat([dst, src])


def label_propagation(csc: CSC, rounds: int = 8, generator: torch.Generator | None = None,
                      progress: bool = True, device=None) -> torch.Tensor:
    """A community label per node (int64 [N], CPU): label propagation over the undirected graph.

    Each round, a random half of the nodes takes the label most frequent
    among its neighbours (ties broken at random); the other half keeps its
    own, which stops the two-colour oscillation of synchronous updates.
    ``csc``: a square graph's :class:`~hmgstore.graph.CSC`; ``device``: where
    to compute (a GPU sorts the ``2E`` keys of a round far faster; default
    the CPU); ``generator``: a CPU generator for the tie-breaks and the
    halves. Cost: a sort of ``2E`` keys per round; memory about ``48 * E``
    bytes. Raises ValueError for a graph that is not square and for
    negative ``rounds``, TypeError for ``rounds`` that is not an integer.
    """
    rounds = checks.count(rounds, "rounds")  # -1 would silently run no round
    if csc.size[0] != csc.size[1]:
        raise ValueError(f"label propagation needs a square graph, got {csc.size[0]} -> {csc.size[1]} nodes")
    n = csc.size[1]
    device = torch.device(device or "cpu")
    src, dst = (t.to(device) for t in _undirected(csc))
    labels = torch.arange(n, device=device)
    for _ in tqdm(range(rounds), desc="label propagation", disable=not progress, leave=False):
        if not len(src):
            break
        key = dst * n + labels[src]
        pairs, counts = torch.unique(key, return_counts=True)
        node, label = pairs // n, pairs % n
        noise = torch.rand(len(counts), generator=generator, dtype=torch.float64).to(device)
        score = counts.double() + noise * 0.5
        best = torch.full((n,), -1.0, dtype=torch.float64, device=device).scatter_reduce(0, node, score, "amax")
        winner = score == best[node]
        moving = (torch.rand(n, generator=generator) < 0.5).to(device)
        take = winner & moving[node]
        changed = labels.clone()
        changed[node[take]] = label[take]
        if torch.equal(changed, labels):
            break
        labels = changed
    return labels.cpu()


def community_order(csc: CSC, rounds: int = 8, generator: torch.Generator | None = None,
                    progress: bool = True, device=None) -> torch.Tensor:
    """A layout (old ids in host order, int64 [N]) that keeps each community of :func:`label_propagation`
    together, communities largest first; inside one, nodes by in-degree, highest first. ``device``: where
    label propagation runs (see there)."""
    labels = label_propagation(csc, rounds, generator, progress, device)
    size = torch.bincount(labels, minlength=len(labels))
    degree = csc.colptr.diff()
    # Largest community first, then by label, then by in-degree (highest first), then by id: one stable sort
    # per key, the least significant first.
    order = torch.argsort(-degree, stable=True)
    order = order[torch.argsort(labels[order], stable=True)]
    return order[torch.argsort(-size[labels[order]], stable=True)]


def metis_order(csc: CSC, num_parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layout, part)``: METIS's ``num_parts``-way partition of the undirected graph, as a layout keeping each
    part together (parts in order, nodes by id inside one) and the part of each node (int64 [N]).

    Needs ``pymetis`` (``pip install pymetis``, or ``pip install 'hmgstore[locality]'``): ImportError
    otherwise. METIS holds the whole graph in memory (about ``16 * E`` bytes) and takes minutes past
    tens of millions of edges. Raises ValueError for ``num_parts`` under 1 and for a CSC that is not square
    (one node type's edges: as many sources as destinations), TypeError for a ``num_parts`` that is not an
    integer and a ``csc`` that is not a CSC.
    """
    num_parts = checks.count(num_parts, "num_parts", at_least=1)
    if not isinstance(csc, CSC):
        raise TypeError(f"csc is a hmgstore.graph.CSC (to_csc makes one), got {type(csc).__name__}")
    if csc.size[0] != csc.size[1]:
        raise ValueError(f"metis_order partitions the nodes of one type: its CSC must be square, got {csc.size[0]} "
                         f"sources and {csc.size[1]} destinations (a bipartite edge type has no such layout)")
    try:
        import pymetis
    except ImportError:
        raise ImportError("metis_order needs pymetis: pip install pymetis (or hmgstore[locality]); "
                          "community_order needs nothing beyond torch") from None

    n = csc.size[1]
    if num_parts == 1:
        return torch.arange(n), torch.zeros(n, dtype=torch.int64)
    src, dst = _undirected(csc)
    both = to_csc(torch.stack([src, dst]), "coo", (n, n))
    _, parts = pymetis.part_graph(num_parts, adjacency=pymetis.CSRAdjacency(both.colptr.numpy(), both.row.numpy()))
    part = torch.as_tensor(parts, dtype=torch.int64)
    return torch.argsort(part, stable=True), part


def coaccess_order(sampler, seeds: torch.Tensor, batch_size: int = 1024, *, batches=None,
                   progress: bool = True) -> torch.Tensor:
    """A layout with nodes in the order an epoch of sampling first touches them (untouched nodes last, by id).

    ``sampler``: a homogeneous :class:`~hmgstore.graph.NeighborSampler`;
    ``seeds``: training nodes (int64); ``batches``: the epoch's batches of
    positions into ``seeds`` (e.g. a :class:`LocalityBatchSampler`), default
    ``seeds`` in their own order in runs of ``batch_size``. Rows that the
    same batches read then sit together: the layout pays off for batches
    made the same way (locality-aware ones), not for a fresh random order.
    Raises TypeError for another sampler or non-integer seeds or positions,
    IndexError for seeds that are not nodes and for positions outside
    ``[0, len(seeds))`` (a negative one included: never wrapped to the end),
    ValueError for ``batch_size`` under 1.
    """
    if not isinstance(sampler, NeighborSampler) or sampler.hetero:
        raise TypeError("coaccess_order takes a homogeneous hmgstore.graph.NeighborSampler")
    n = sampler.num_nodes[None]
    seeds = checks.id_list(seeds, "seeds", n)
    batch_size = checks.count(batch_size, "batch_size", at_least=1)
    if batches is None:
        batches = [torch.arange(a, min(a + batch_size, len(seeds))) for a in range(0, len(seeds), batch_size)]
    first = torch.full((n,), math.inf, dtype=torch.float64, device=sampler.device)
    for b, positions in enumerate(tqdm(batches, desc="co-access order", disable=not progress, leave=False)):
        positions = checks.id_list(positions, f"batches[{b}]", len(seeds))  # no bool mask, no wrapped -1
        nodes = sampler.sample({None: seeds[positions].to(sampler.device)}).node[None]
        first[nodes] = torch.clamp(first[nodes], max=float(b))  # the first batch that touched each node
    return torch.argsort(first.cpu(), stable=True)


def parts_of(layout: torch.Tensor, part_rows: int) -> torch.Tensor:
    """The part of each node (int64 [N]): runs of ``part_rows`` consecutive rows of ``layout``.

    ``layout``: a permutation of ``range(N)`` (:func:`hmgstore.rows.checks.permutation`).
    Raises ValueError for a layout that repeats or leaves out a node and
    for ``part_rows`` under 1, TypeError for non-integers, IndexError for
    ids out of range."""
    part_rows = checks.count(part_rows, "part_rows", at_least=1)
    layout = checks.permutation(layout, len(layout), "layout")  # every node once: no part left unwritten
    return checks.inverse(layout) // part_rows


def rows_per_page(row_bytes: int) -> int:
    """Rows of ``row_bytes`` bytes in one :data:`PAGE_BYTES` host page (at least 1; rows of 0 bytes count as 1).

    Raises TypeError for a ``row_bytes`` that is not an integer, ValueError for a negative one.
    """
    row_bytes = checks.count(row_bytes, "row_bytes")  # a float would make page numbers floats
    return max(1, PAGE_BYTES // max(1, row_bytes))


def pages_touched(ids: torch.Tensor, row_bytes: int, layout: torch.Tensor | None = None) -> int:
    """Distinct 2 MiB host pages that rows ``ids`` (old ids) occupy in a table of ``row_bytes`` rows kept in
    ``layout`` order (None: id order).

    ``ids``: integer ids (any 1-D integer tensor, array or list);
    ``layout``: a permutation of the table's rows. Raises as
    :func:`hmgstore.rows.checks.permutation` and
    :func:`hmgstore.rows.checks.id_list` do: never reads a position the
    layout does not give; and as :func:`rows_per_page` for ``row_bytes``."""
    per_page = rows_per_page(row_bytes)
    if layout is not None:
        layout = checks.permutation(layout, len(layout), "layout")  # every row once: no position left unwritten
        ids = checks.inverse(layout)[checks.id_list(ids, "ids", len(layout))]
    else:
        ids = checks.id_list(ids, "ids", 2**62)  # no table to bound them: non-negative integers
    return int(torch.unique(ids // per_page).numel())


class LocalityBatchSampler(Sampler):
    """Batches of positions into ``input_nodes`` whose seeds come from a window of ``window`` parts.

    Every epoch the parts are shuffled; the parts holding seeds are taken
    ``window`` at a time and their seeds shuffled together; the epoch, window
    after window, is cut into batches of ``batch_size`` (a batch at a
    window's end takes the rest from the next; ``drop_last`` drops a short
    last batch), so every epoch has the same number of batches as random
    order would. Pass it to a PyG loader as
    ``batch_sampler=`` (with no ``batch_size``/``shuffle`` there):
    ``NeighborLoader(data, fanout, input_nodes=train, batch_sampler=LocalityBatchSampler(train, part, 1024))``.

    ``input_nodes``: int64 node ids (or a bool mask, one entry per node);
    ``node_part``: 1-D integers [N], the part of every node
    (:func:`parts_of`, or METIS's parts); ``generator``: a
    ``torch.Generator`` for the shuffles (default: torch's global one).
    Raises ValueError for a window or batch size under 1, for parts that do
    not cover the input nodes (a negative id included), ids or a
    ``node_part`` that are not 1-D (named by their shape: never flattened)
    and a mask of another length than ``node_part``; TypeError for float
    ids, float or bool parts (never truncated: 0.2 and 0.7 are not one
    part), sizes that are not integers and a ``generator`` that is not a
    ``torch.Generator``.
    """

    def __init__(self, input_nodes, node_part, batch_size: int, window: int = 8, *,
                 generator: torch.Generator | None = None, drop_last: bool = False):
        # Part labels are grouped, never addressed, but a float label truncated would merge parts silently.
        node_part = checks.integers(node_part, "node_part").to(torch.int64)
        nodes = torch.as_tensor(input_nodes)
        if nodes.dtype == torch.bool:
            if nodes.shape != node_part.shape:  # a short mask would silently leave out the nodes past its end
                raise ValueError(f"input_nodes is a bool mask of shape {tuple(nodes.shape)}; a mask has one entry "
                                 f"per node, as node_part does: ({len(node_part)},)")
            nodes = nodes.nonzero().flatten()
        batch_size = checks.count(batch_size, "batch_size", at_least=1)
        window = checks.count(window, "window", at_least=1)
        if generator is not None and not isinstance(generator, torch.Generator):  # else refused by randperm, later
            raise TypeError(f"generator is a torch.Generator or None, got {type(generator).__name__}")
        try:  # float ids are never truncated, ids of two or more dimensions never flattened; one id is a list of one
            nodes = checks.id_list(nodes.reshape(1) if nodes.dim() == 0 else nodes, "input_nodes", len(node_part))
        except IndexError as err:
            raise ValueError(f"node_part has {len(node_part)} entries, one per node: an input node has none "
                             f"({err})") from None
        part = node_part[nodes]
        self._order = torch.argsort(part, stable=True)  # positions, grouped by part
        self._bounds = torch.cat([torch.zeros(1, dtype=torch.int64),
                                  torch.unique_consecutive(part[self._order], return_counts=True)[1].cumsum(0)])
        self.batch_size, self.window, self.generator, self.drop_last = batch_size, window, generator, drop_last

    @property
    def num_parts(self) -> int:
        """Parts that hold input nodes."""
        return len(self._bounds) - 1

    def epoch(self) -> torch.Tensor:
        """One epoch's positions, window after window (each window's seeds shuffled together)."""
        shuffled = torch.randperm(self.num_parts, generator=self.generator)
        windows = []
        for w in range(0, self.num_parts, self.window):
            chosen = shuffled[w:w + self.window].tolist()
            positions = torch.cat([self._order[self._bounds[p]:self._bounds[p + 1]] for p in chosen])
            windows.append(positions[torch.randperm(len(positions), generator=self.generator)])
        return torch.cat(windows) if windows else self._order[:0]

    def __iter__(self):
        positions = self.epoch()
        for a in range(0, len(positions), self.batch_size):  # a batch at a window's end spans two windows
            batch = positions[a:a + self.batch_size]
            if len(batch) == self.batch_size or not self.drop_last:
                yield batch.tolist()

    def __len__(self) -> int:
        total = int(self._bounds[-1])
        return total // self.batch_size if self.drop_last else -(-total // self.batch_size)
