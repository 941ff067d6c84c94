"""Topology in tiers: one edge type's CSC held for a sampler on one device.

``colptr`` (int64, so more than 2^31 edges work) lives on the device. The
neighbour ids (``row``) are held like a feature table: the adjacency lists of
hot destination nodes packed in GPU memory, and the whole ``row`` array in
pinned host memory, read zero-copy by the sampling kernel. Neighbour ids are
int32 whenever the source node count allows, which halves the bytes read over
PCIe. On the CPU everything stays where it is and the sampler reads it with
torch.

Which lists are hot: ``hot_order`` (destination ids, hottest first: e.g. from
pre-sampling), by default the nodes with the most neighbours; lists are taken
in that order while they fit in ``gpu_budget`` bytes.

Chunked (``place_chunks``): when the whole ``row`` does not fit in
``gpu_budget``, it is cut into chunks of :data:`CHUNK_IDS` ids, and the
chunks are placed like a feature table, hottest first; a chunk is as hot as
the hottest list it holds part of. :func:`hmgstore.distributed.sharded_topology`
places them over the node's GPUs (one process per GPU): the hottest bytes on
every GPU, each GPU's shard of the next hottest, read by the others over
NVLink, and the rest read zero-copy from the node's one host copy.

Edge weights (``weight``, for weighted sampling) are float32 and held beside
the neighbour ids in the same tiers: the hot lists' weights packed in GPU
memory in the same order, the whole array pinned in host memory, or chunks
placed like the ids' chunks. The GPU budget covers both (4 more bytes an
edge). Beside them, per destination, the float32 largest weight of a list that
weighted sampling may draw by rejection (:func:`.weighted.rejection_wmax`),
held whole on the sampling device like ``colptr``, outside the budget.

Times (temporal sampling, :mod:`.temporal`), int64, are held whole on the
sampling device: per edge (``edge_time``, CSC order) or per source node
(``src_time``); each node's list must be sorted by them.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import cuda
from ..cuda.gather import tier_words
from ..cuda.runtime import synchronize
from ..memory.pinned import CHUNK_BYTES, PinnedHost
from ..rows import checks, hotness
from ..rows.stats import TierCounter
from ..util.device import resolve_device
from ..util.progress import tqdm
from .csc import CSC, edge_weight_in_csc_order
from .temporal import check_sorted, check_times
from .weighted import rejection_wmax

#: Neighbour ids per chunk of a sharded topology: 128 bytes of int32 ids (a GraphSAGE fanout's reads of one
#: list mostly fall in one or two chunks).
CHUNK_IDS = 32


def held_ids(row: torch.Tensor, num_src: int, narrow: bool = True, progress: bool = False) -> torch.Tensor:
    """A private copy of ``row`` for a topology to hold: int32 when ``narrow`` and every id fits, else as given.

    Every id is checked to lie in ``[0, num_src)`` while it is copied (the copy reads each one anyway): a CSC
    keeps its caller's ``row`` without a copy (:func:`~hmgstore.graph.csc.to_csc`), so an id edited after the
    CSC was checked would otherwise reach the sampler, and the cast to int32 would wrap ``2**32 + 2`` to ``2``
    in silence. Always a copy, so that the caller's later edits are never seen: int64 ids become an int32 copy
    on the common path anyway; ids kept at their width cost one array of their size, once per build. ``row``:
    1-D integer tensor [E]; the result is on the CPU. Runs in chunks, under a progress bar for large arrays.
    Raises IndexError naming the first id out of range and its position.
    """
    out = torch.empty(row.shape, dtype=torch.int32 if narrow and num_src < 2**31 else row.dtype)
    step = max(1, CHUNK_BYTES // 8)
    with tqdm(total=row.numel(), unit="edge", unit_scale=True, desc="copying neighbour ids",
              leave=False, disable=not progress or row.numel() * 8 < CHUNK_BYTES) as bar:
        for lo in range(0, row.numel(), step):
            hi = min(row.numel(), lo + step)
            part = row[lo:hi]
            low, high = (int(v) for v in torch.aminmax(part))
            if low < 0 or high >= num_src:
                at = int(((part < 0) | (part >= num_src)).nonzero()[0, 0])
                raise IndexError(f"row holds source id {int(part[at])} at position {lo + at}, outside [0, {num_src}) "
                                 "(num_src): the CSC's row was edited after the CSC was built (a CSC keeps the "
                                 "caller's row without a copy), or the CSC was built unchecked; rebuild the CSC "
                                 "from the ids meant, then the topology")
            out[lo:hi].copy_(part)
            bar.update(hi - lo)
    return out


class Topology:
    """One edge type's CSC (:class:`~hmgstore.graph.CSC`) held for sampling on ``device``.

    Args:
        csc: the edge type's CSC (host tensors; ``row`` int32 or int64).
        device: where sampling runs (``"cuda"``, ``"cpu"``; None: the current
            GPU, or the CPU).
        gpu_budget: bytes of GPU memory for hot adjacency lists (int or
            ``"2GB"``; None or 0: every list read from pinned host memory; a
            budget that holds every list keeps the whole topology on the GPU;
            ``"auto"``: the lesser of every list and half the GPU's free
            memory, :func:`hmgstore.rows.hotness.resolve_budget`). Read on every
            device: a typo raises ValueError on the CPU too.
        hot_order: destination node ids, hottest first (default: by degree);
            integers, each in range and listed at most once (TypeError for
            float ids, IndexError and ValueError otherwise), on every device.
        narrow: hold neighbour ids as int32 when the source node count allows
            (the default); False keeps their width. Either way the topology
            holds its own copy of ``row``, each id checked while copied
            (:func:`held_ids`): the caller's later edits are not seen.
        progress: progress bars while converting and pinning large arrays.
        place_chunks: places the chunks when not every list fits (see above):
            called as ``place_chunks(chunks, hot_order, gpu_budget, device,
            progress)`` with ``chunks`` the int [num_chunks, CHUNK_IDS] host
            table and ``hot_order`` its chunk ids hottest first; returns an
            object with ``table`` (a :class:`~hmgstore.HybridTensor` over
            ``chunks``), ``placement`` and ``close()``. Not used on the CPU.
        weight: edge weights for weighted sampling, one finite number >= 0 per
            edge in the order the edges were given (checked by
            :func:`~hmgstore.graph.csc.edge_weight_in_csc_order`); None:
            uniform sampling.
        src_time: int64 time of each source node (node-level temporal
            sampling), or ``edge_time``: of each edge, in the order the edges
            were given; each node's list must be sorted by it
            (:func:`hmgstore.graph.temporal.sort_by_time`), else ValueError.
            Weights and times are copied (once): later edits are not seen.

    Raises (besides the above): IndexError for a ``row`` id outside
    ``[0, num_src)``; ValueError or IndexError for a ``csc.perm`` that is not
    a permutation of ``range(E)``.

    Attributes: ``colptr`` (int64 [num_dst + 1] on ``device``), ``row`` (the
    host array the host tier reads), ``weight`` (float32 [E] in CSC order on
    the host, or None), ``rejection_wmax`` (float32 [num_dst] on ``device``,
    or None: see :func:`~hmgstore.graph.weighted.rejection_wmax`), ``perm``
    (CSC position -> given edge id, or None; checked at build, then held as
    given when it is int64 on the CPU: a copy would double its E ids, and
    PyG's own samplers hold the graph store's the same way, so an edit of
    ``csc.perm`` afterwards changes the batches' ``e_id``), ``gpu_edges``
    (positions held on the GPU).
    """

    def __init__(self, csc: CSC, device=None, *, gpu_budget=None, hot_order=None, narrow: bool = True,
                 progress: bool = True, place_chunks=None, weight=None, src_time=None, edge_time=None):
        self.device = resolve_device(device)
        self.num_src, self.num_dst = csc.size
        self.num_edges = csc.num_edges
        # First: the times and weights below are read through the checked perm and ids.
        self.perm = checked_perm(csc)
        self.row = held_ids(csc.row, self.num_src, narrow, progress)
        self.src_time, self.edge_time, self.time_device = self._times(csc, src_time, edge_time)
        self.weight = None if weight is None else edge_weight_in_csc_order(weight, csc)
        # Computed once here, the same for the CPU and GPU samplers, which must agree on each node's method.
        self.rejection_wmax = None if self.weight is None else rejection_wmax(self.weight, csc.colptr, progress)
        self.gpu_weight: torch.Tensor | None = None  # the GPU tier's weights, in the GPU tier's order
        self._pinned_weight: PinnedHost | None = None
        self._placed_weight: Any = None  # a chunked topology's weight chunks, placed as the ids' chunks
        self.weight_tiers: torch.Tensor | None = None
        self.weight_tail: torch.Tensor | None = None
        self.gpu_edges = 0
        self.gpu_row: torch.Tensor | None = None
        self.start: torch.Tensor | None = None
        self.hot_nodes: torch.Tensor | None = None  # destinations whose lists are on the GPU, when only some are
        self._pinned: PinnedHost | None = None
        self._closed = False
        self._counter: TierCounter | None = None
        # A chunked topology (see the module docstring): its placed chunk table, the kernel's description of its tiers
        # (gather_job.cuh words, on the device), ids per chunk, and the last ids (fewer than a chunk) on the GPU.
        self._placed: Any = None  # a hmgstore.distributed.DistributedTensor (a layer above this one) or None
        self.tiers: torch.Tensor | None = None
        self.chunk = CHUNK_IDS
        self.tail: torch.Tensor | None = None
        self.tail_start = self.num_edges
        if hot_order is not None:  # checked on every device, so a CPU run fails as a GPU run would
            hot_order = hotness.check_order(hot_order, self.num_dst, hint="it orders destination nodes; "
                                            "hmgstore.hotness.order_by_score(score) turns a score per node "
                                            "(a degree, a count) into one")
        gpu_budget = hotness.parse_budget(gpu_budget)  # a typo fails on a CPU machine too
        if self.device.type == "cpu":
            self.colptr = csc.colptr  # the CSC's own copy (CSC() and to_csc copy the caller's offsets)
            return

        cuda.check_device(self.device)
        try:
            self._build(csc.colptr, gpu_budget, hot_order, progress, place_chunks)
        except BaseException:
            self.close()
            raise

    def _build(self, colptr: torch.Tensor, gpu_budget, hot_order, progress: bool, place_chunks) -> None:
        device, item = self.device, self.row.element_size() + (0 if self.weight is None else 4)
        self.colptr = colptr.to(device)
        if self.rejection_wmax is not None:
            self.rejection_wmax = self.rejection_wmax.to(device)
        budget = hotness.resolve_budget(gpu_budget, self.num_edges * item, device) or 0
        degree = colptr.diff()
        if budget >= self.num_edges * item:  # every list fits: the whole topology on the GPU
            self.gpu_row, self.gpu_edges = self.row.to(device), self.num_edges
            self.gpu_weight = None if self.weight is None else self.weight.to(device)
            return
        if place_chunks is not None:
            order = hotness.order_by_score(degree) if hot_order is None else hot_order  # checked in __init__
            self._build_chunked(colptr, budget, order, progress, place_chunks)
            return
        self._pinned = PinnedHost(self.row, device, progress=progress)
        if self.weight is not None:
            self._pinned_weight = PinnedHost(self.weight, device, progress=progress)
        if budget < item:
            return
        order = hotness.order_by_score(degree) if hot_order is None else hot_order
        fits = int((degree[order].cumsum(0) * item <= budget).sum())
        hot = order[:fits]
        sizes = degree[hot]
        self.gpu_edges = int(sizes.sum())
        packed_at = sizes.cumsum(0) - sizes  # where each hot list starts in the GPU tier
        # Positions of the hot lists' edges in `row`, list after list.
        edges = torch.repeat_interleave(colptr[hot] - packed_at, sizes, output_size=self.gpu_edges)
        edges += torch.arange(self.gpu_edges)
        self.gpu_row = self.row[edges].to(device)
        self.gpu_weight = None if self.weight is None else self.weight[edges].to(device)
        start = colptr[:-1] + self.gpu_edges  # host lists: after the GPU tier's positions
        start[hot] = packed_at
        self.start = start.to(device)
        self.hot_nodes = hot

    def _build_chunked(self, colptr: torch.Tensor, budget: int, order: torch.Tensor, progress: bool,
                       place_chunks) -> None:
        body = self.num_edges - self.num_edges % CHUNK_IDS
        if body == 0:  # not one whole chunk: the few ids are simply on this GPU
            self.gpu_row, self.gpu_edges = self.row.to(self.device), self.num_edges
            self.gpu_weight = None if self.weight is None else self.weight.to(self.device)
            return
        self.tail_start = body
        self.tail = self.row[body:].to(self.device)
        chunks = self.row[:body].view(-1, CHUNK_IDS)
        hot_chunks = chunk_order(colptr, order.cpu(), len(chunks))
        id_budget = budget
        if self.weight is not None:  # the weights' chunks placed alike, with their share of the budget
            id_budget = budget * self.index_bytes // (self.index_bytes + 4)
            self.weight_tail = self.weight[body:].to(self.device)
            self._placed_weight = place_chunks(self.weight[:body].view(-1, CHUNK_IDS), hot_chunks,
                                               budget - id_budget, self.device, progress)
            self.weight_tiers = _tier_words(self._placed_weight.table, self.device)
        self._placed = place_chunks(chunks, hot_chunks, id_budget, self.device, progress)
        table = self._placed.table
        p = self._placed.placement
        self.gpu_edges = p.resident_rows * CHUNK_IDS
        self.tiers = _tier_words(table, self.device)
        new = torch.arange(len(chunks), device=self.device) if table.row_map is None else table.row_map
        self._chunk_on_gpu = new < p.resident_rows  # resident (GPU-held) new ids come before the host tier's

    @property
    def chunked(self) -> bool:
        """Whether the lists that do not fit are read through placed chunks (see the module docstring)."""
        return self._placed is not None

    def _times(self, csc: CSC, src_time, edge_time) -> tuple:
        """``(src_time, edge_time in CSC order, the one given on the sampling device)``, checked; Nones when
        not temporal."""
        if src_time is None and edge_time is None:
            return None, None, None
        if src_time is not None and edge_time is not None:
            raise ValueError("a topology has node times or edge times, not both (as in PyG)")
        if src_time is not None:
            src_time = check_times(src_time, csc.size[0], "node times (src_time)")
            check_sorted(src_time.index_select(0, self.row), csc)
            return src_time, None, src_time.to(self.device)
        edge_time = check_times(edge_time, csc.num_edges, "edge times (edge_time)")
        edge_time = edge_time if self.perm is None else edge_time.index_select(0, self.perm)
        check_sorted(edge_time, csc)
        return None, edge_time, edge_time.to(self.device)

    @property
    def temporal(self) -> bool:
        """Whether the topology holds node or edge times (for temporal sampling)."""
        return self.time_device is not None

    def time_at(self, positions: torch.Tensor) -> torch.Tensor:
        """int64 time of the edges at CSC ``positions`` (CPU): their own, or their source node's."""
        if self.edge_time is not None:
            return self.edge_time.index_select(0, positions)
        return self.src_time.index_select(0, self.row.index_select(0, positions).long())

    @property
    def weighted(self) -> bool:
        """Whether the topology holds edge weights (for weighted sampling)."""
        return self.weight is not None

    @property
    def host_weight_address(self) -> int:
        """Address of the pinned host tier's weights (0 when none, or every weight is on the GPU)."""
        return 0 if self._pinned_weight is None else self._pinned_weight.address

    @property
    def host_address(self) -> int:
        """Address of the pinned host tier (0 when every list is on the GPU or on the CPU)."""
        return 0 if self._pinned is None else self._pinned.address

    @property
    def index_bytes(self) -> int:
        """Bytes of one neighbour id (4 or 8)."""
        return self.row.element_size()

    def degree(self, nodes: torch.Tensor) -> torch.Tensor:
        """int64 neighbours of each of ``nodes`` (ids on ``device``)."""
        return self.colptr.index_select(0, nodes + 1) - self.colptr.index_select(0, nodes)  # not [ ]: 10x on a CPU

    @property
    def counting(self) -> bool:
        """Whether :meth:`reset_stats` started counting."""
        return self._counter is not None

    def reset_stats(self, counting: bool = True) -> None:
        """Start counting (again, from zero) the neighbour ids read from each tier (see
        :mod:`hmgstore.rows.stats`); ``counting=False``: stop counting."""
        self._counter = TierCounter(("gpu", "host"), self.index_bytes, self.device) if counting else None
        if counting and self.device.type == "cuda":  # zeroed on this stream; a sampler may count on another
            torch.cuda.current_stream(self.device).synchronize()

    def stats(self) -> dict:
        """Neighbour ids read per tier since :meth:`reset_stats`, the GPU hit ratio and the sampling
        kernels' time. Raises RuntimeError when not counting."""
        if self._counter is None:
            raise RuntimeError("this topology is not counting statistics: call reset_stats() to start")
        return self._counter.report()

    def count(self, seeds: torch.Tensor, counts: torch.Tensor) -> None:
        """Add the ids read for ``seeds`` (``counts`` each) to the counters, when counting."""
        if self._counter is None:
            return
        if self._placed is not None:  # by the chunk of each list's first id (a list may go on in the next one)
            first = self.colptr[seeds]
            chunk = (first // CHUNK_IDS).clamp(max=max(0, len(self._chunk_on_gpu) - 1))
            held = (first >= self.tail_start) | (self._chunk_on_gpu[chunk] if len(self._chunk_on_gpu) else False)
            on_gpu = (counts * held).sum()
        elif self.start is not None:
            on_gpu = (counts * (self.start[seeds] < self.gpu_edges)).sum()
        else:
            on_gpu = counts.sum() if self.gpu_edges else torch.zeros((), dtype=torch.int64, device=self.device)
        total = counts.sum()
        self._counter.add_counts(torch.stack([on_gpu, total - on_gpu]))
        self._counter.gathers += 1  # hops sampled (not timed: seconds stay 0)

    def check(self) -> None:
        if self._closed:
            raise RuntimeError("this topology was closed; build a new one")

    def close(self) -> None:
        """Free the GPU tier and unregister the host tier (idempotent); waits for the device first."""
        if self._closed:
            return
        self._closed = True
        if self.device.type == "cuda" and torch.cuda.is_available():
            synchronize((self.device,))
        if self._pinned is not None:
            self._pinned.release()
        if self._pinned_weight is not None:
            self._pinned_weight.release()
        for placed in (self._placed, self._placed_weight):
            if placed is not None:
                placed.close()  # sharded over a node's GPUs: collective, every rank closes its sampler
        self._pinned = self.gpu_row = self.start = self._placed = self.tiers = self.tail = None
        self._pinned_weight = self.gpu_weight = self._placed_weight = self.weight_tiers = self.weight_tail = None
        self.rejection_wmax = None
        self.time_device = None

    def __repr__(self) -> str:
        where = (f"gpu_edges={self.gpu_edges}, host_edges={self.num_edges - self.gpu_edges}"
                 if self.device.type == "cuda" else "host")
        if self._placed is not None:
            where += f", chunks in {len(self._placed.placement.names)} tiers"
        weights = ", float32 weights" if self.weighted else ""
        return (f"Topology({self.num_src} -> {self.num_dst} nodes, {self.num_edges} edges, "
                f"int{8 * self.index_bytes} ids{weights}, device={self.device}, {where})")


def checked_perm(csc: CSC) -> torch.Tensor | None:
    """``csc.perm`` as int64 CPU ids, checked to list each edge id ``0..E-1`` once (its entries become batches'
    ``e_id``; a CSC's perm may have been edited since it was built). Errors: :func:`~hmgstore.rows.checks.permutation`,
    saying what the perm is for."""
    if csc.perm is None:
        return None
    try:
        return checks.permutation(csc.perm, csc.num_edges, "perm")
    except (IndexError, ValueError) as err:
        raise type(err)(f"the CSC's perm must list each edge id 0..{csc.num_edges - 1} once (the given id of each "
                        f"CSC edge): {err}; build the CSC with to_csc, or pass perm=None when the edges are given "
                        "in CSC order") from None


def _tier_words(table, device) -> torch.Tensor:
    """A placed chunk table's tiers as the sampling kernel reads them (gather_job.cuh words, on ``device``)."""
    words = tier_words(table.tiers, table.row_map, table.num_rows, table.row_bytes)
    return torch.tensor(words, dtype=torch.int64).to(device)


def chunk_order(colptr: torch.Tensor, order: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """Chunks of :data:`CHUNK_IDS` positions of ``row``, hottest first: a chunk ranks as the hottest
    destination (earliest in ``order``) whose list has an id in it; chunks of no listed destination last.

    ``colptr``: int64 [num_dst + 1] (CPU); ``order``: destination ids, hottest first; ``num_chunks``: the
    whole chunks of ``row`` (a last, partial one is left out).
    """
    num_dst = len(colptr) - 1
    rank = torch.full((num_dst,), len(order), dtype=torch.int64)
    rank[order] = torch.arange(len(order))
    first, end = colptr[:-1] // CHUNK_IDS, (colptr[1:] + CHUNK_IDS - 1) // CHUNK_IDS
    spans = torch.where(colptr[1:] > colptr[:-1], end - first, 0)  # chunks each list touches
    nodes = torch.repeat_interleave(torch.arange(num_dst), spans)
    starts = spans.cumsum(0) - spans
    chunk = first[nodes] + torch.arange(len(nodes)) - starts[nodes]
    best = torch.full((num_chunks + 1,), len(order), dtype=torch.int64)  # the last slot takes the partial chunk
    best.scatter_reduce_(0, chunk.clamp_(max=num_chunks), rank[nodes], "amin")
    return torch.argsort(best[:num_chunks], stable=True)
