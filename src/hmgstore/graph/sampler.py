"""Neighbour sampling over :class:`~hmgstore.graph.topology.Topology` objects, hop by hop.

For each hop and edge type, every node found in the previous hop (the seeds
first) gets up to ``k`` of its in-neighbours, uniformly: without replacement
(every ``min(k, degree)``-subset equally likely; Floyd's algorithm), or with
replacement (``k`` draws when the degree is not 0); ``k = -1`` takes every
neighbour. New nodes are numbered in the order they are first met, after the
nodes already known, so that a batch's nodes come seeds first and hop by hop,
as PyG's loaders expect.

The same code runs on both devices: on a GPU the per-slot work is done by the
kernels of ``kernels/sample.cu`` and the rest (counts, offsets, relabelling)
by torch; on the CPU all of it is vectorised torch, with no compiled
extension. Draws come from a counter-based hash keyed per hop by the
sampler's ``torch.Generator`` (or torch's default one), so results are
reproducible under ``torch.manual_seed`` and are the same on the CPU and on
a GPU.

Relabelling (:mod:`.relabel`) maps node keys to local ids: by sorting
(``dedup="sort"``, any device) or with a hash table on the GPU
(``dedup="hash"``). In disjoint mode a key is ``seed index * num_nodes +
node``, so every seed grows its own tree.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from ..rows.stats import merge
from .arguments import check_graph
from .captured import CapturedBatch, _sizes
from .fanout import check_fanout
from .hop import _queue_hop, _sample_hop
from .labor import sample_hop_labor
from .relabel import DENSE_MAX_NODES, DenseMaps, DenseNodeSet, HashNodeSet, node_set
from .sample import Sample
from .sampling_stream import StreamUse
from .seeds import check_replace_fanout, check_seeds
from .temporal import STRATEGIES, tree_times

log = logging.getLogger(__name__)
_Parts = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]  # an edge type's rows, cols, edges per hop

class NeighborSampler:
    """Multi-hop neighbour sampling over the edge types of a graph, on one device.

    Args:
        topologies: edge type -> :class:`Topology` (one device for all); key
            None for a homogeneous graph, ``(src, rel, dst)`` tuples otherwise.
        num_nodes: node type -> node count (key None when homogeneous).
        num_neighbors: edge type -> neighbours per hop (``-1``: all); a list
            for every edge type alike. Hops past an edge type's list sample 0.
        replace: sample with replacement.
        disjoint: every seed gets its own subgraph (see the module docstring).
        generator: the ``torch.Generator`` (CPU) that keys the draws; default:
            torch's global one, so ``torch.manual_seed`` fixes the samples.
        cuda_graphs: on a GPU, capture a batch's queued kernels in a CUDA graph
            (per seed count, from the second batch of that size on, in the
            main thread) and replay it for later batches, in any thread: one
            launch instead of some thirty. Off while a topology counts
            statistics.
        labor: LABOR-0 sampling (:mod:`.labor`) instead of uniform: seeds
            that share neighbours take them together (``k`` per seed on
            average), so a batch holds fewer nodes; hops then read their
            sizes back. Not with weights, times or ``replace``.
        temporal_strategy: ``"uniform"`` or ``"last"``, how a temporal
            topology's time windows are sampled (:mod:`.temporal`). A sampler
            with a temporal topology is disjoint (as PyG's) and takes seed
            times in :meth:`sample`; the trees' times are among a captured
            batch's inputs, like the seeds.
        dedup: ``"sort"`` or ``"hash"`` (GPU only), how nodes are relabelled;
            both give the same output. Default: ``"hash"`` on a GPU, where a
            batch's hops are then queued with their sizes kept on the device
            (one read-back per batch; with ``-1`` in a fanout, one per hop),
            ``"sort"`` on the CPU.

    Raises:
        TypeError: ``topologies`` or ``num_nodes`` not a dict; a topology
            not a :class:`Topology`; a node count not an integer; a fanout
            not whole numbers (``1.5``, ``True``); ``replace``, ``disjoint``,
            ``cuda_graphs`` or ``labor`` not a bool; ``generator`` not a
            ``torch.Generator``.
        ValueError: no topology; topologies on several devices; a node type
            of an edge type missing from ``num_nodes``, a negative node count,
            or counts other than a topology's; a fanout under -1;
            ``num_neighbors`` naming an unknown edge type; an unknown
            ``dedup`` or ``temporal_strategy``, ``dedup="hash"`` off a GPU,
            ``temporal_strategy="last"`` without times, ``labor`` with
            replacement, weights or times; weights and times on one edge
            type.
    """

    def __init__(self, topologies: dict, num_nodes: dict, num_neighbors, *, replace: bool = False,
                 disjoint: bool = False, generator: torch.Generator | None = None, dedup: str | None = None,
                 cuda_graphs: bool = True, temporal_strategy: str = "uniform", labor: bool = False):
        self.device, self.num_nodes = check_graph(topologies, num_nodes, generator, replace=replace,
                                                  disjoint=disjoint, cuda_graphs=cuda_graphs, labor=labor)
        self.topologies, self.hetero = dict(topologies), None not in topologies
        if not isinstance(num_neighbors, dict):
            every = check_fanout(num_neighbors)  # once: an iterator is read once
            num_neighbors = {et: list(every) for et in self.topologies}
        unknown = [et for et in num_neighbors if et not in self.topologies]
        if unknown:
            raise ValueError(f"num_neighbors names edge types {unknown} that the graph does not have")
        self.num_neighbors = {et: check_fanout(num_neighbors.get(et, []), f"num_neighbors of {et!r}" if self.hetero
                                               else "num_neighbors") for et in self.topologies}
        if replace:
            check_replace_fanout(self.num_neighbors)
        self.num_hops = max((len(v) for v in self.num_neighbors.values()), default=0)
        self.temporal = any(t.temporal for t in self.topologies.values())
        if any(t.temporal and t.weighted for t in self.topologies.values()):
            raise ValueError("an edge type has both weights and times: weighted temporal sampling is not defined "
                             "(PyG refuses it too); drop weight_attr or time_attr")
        if temporal_strategy not in STRATEGIES:
            raise ValueError(f"temporal_strategy is one of {STRATEGIES}, got {temporal_strategy!r}")
        if temporal_strategy != "uniform" and not self.temporal:
            raise ValueError(f"temporal_strategy={temporal_strategy!r} applies to topologies with times only "
                             "(src_time or edge_time); these have none")
        self.temporal_strategy = temporal_strategy
        if labor and (replace or any(t.temporal or t.weighted for t in self.topologies.values())):
            raise ValueError("LABOR sampling is defined here without replacement, weights or times; pass labor=False "
                             "for those")
        self.labor = labor
        disjoint = disjoint or self.temporal  # a seed's time bounds its own tree only
        dedup = dedup or ("hash" if self.device.type == "cuda" else "sort")
        if dedup not in ("sort", "hash") or (dedup == "hash" and self.device.type != "cuda"):
            raise ValueError(f"dedup is 'sort' or, on a GPU, 'hash'; got {dedup!r} on {self.device}")
        self.replace, self.disjoint, self.generator, self.dedup = replace, disjoint, generator, dedup
        self._max_degree: dict = {}  # edge type -> its largest in-degree, once a fanout needs it
        dense = self.device.type == "cpu" and not disjoint  # CPU relabelling without sorts (see .relabel)
        self._dense = {nt: DenseMaps(n) for nt, n in self.num_nodes.items() if dense and n <= DENSE_MAX_NODES}
        self.cuda_graphs = cuda_graphs
        self._graphs: dict = {}  # seed counts -> captured batch (CapturedBatch), or None once warmed up
        self._closed, self._active, self._idle = False, 0, threading.Condition()  # see close()
        self._stream = StreamUse(self.device)

    def __getstate__(self):  # a CPU sampler sent to a loader's worker: its own lock there
        state = dict(self.__dict__)
        del state["_idle"]
        state["_active"] = 0
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._idle = threading.Condition()

    def _expected_nodes(self, seeds: int) -> int:
        """A bound on a batch's nodes per type for sizing hash tables (grown if passed)."""
        total, frontier = seeds, seeds
        for hop in range(self.num_hops):
            fanout = max((v[hop] for v in self.num_neighbors.values() if hop < len(v)), default=0)
            frontier *= fanout if fanout > 0 else 1
            total += frontier
        return min(total, 1 << 24)

    def _draw_keys(self) -> torch.Tensor:
        """One draw key per (hop, edge type), in that order: int64 [hops * edge types], CPU."""
        return torch.randint(0, 2**62, (self.num_hops * len(self.topologies),), generator=self.generator)

    def _key_index(self, hop: int, et) -> int:
        return hop * len(self.topologies) + list(self.topologies).index(et)

    def sample(self, seeds: dict, seed_time: dict | None = None) -> Sample:
        """Sample the subgraphs around ``seeds``.

        Args:
            seeds: node type -> node ids (key None when homogeneous):
                integer ids as a table takes them (a tensor on any device, a
                numpy array, a list, read in order; none is fine: a batch of
                no nodes), 1-D, each in ``[0, num_nodes[type])``.
            seed_time: with a temporal topology (required there), node type
                -> int64 time of each seed (seeds of one node type only);
                every neighbour in a seed's tree is no later than it.

        Returns:
            A :class:`Sample` on the sampler's device; a node gets
            ``min(k, degree)`` neighbours per hop without replacement.

        Raises:
            TypeError: ``seeds`` not a dict; non-integer ids or times.
            KeyError: a node type the graph does not have.
            ValueError: seeds that are not 1-D; ``seed_time`` without a
                temporal topology, missing, not 1-D or not one per seed; a
                disjoint batch whose keys pass int64 (:func:`.seeds.check_seeds`).
            IndexError: an id out of range (before sampling).
            MemoryError: on the CPU, a hop with replacement needing more host memory than is available.
            RuntimeError: the sampler, or one of its topologies, is closed.
        """
        if not isinstance(seeds, dict):
            raise TypeError(f"seeds is a dict node type -> ids ({{None: ids}} when homogeneous), got "
                            f"{type(seeds).__name__}")
        with self._idle:
            if self._closed:
                raise RuntimeError("this sampler was closed; build a new one to sample again")
            self._active += 1
        try:
            for topo in self.topologies.values():
                topo.check()  # a topology closed on its own, not through this sampler
            with self._stream.batch(seeds, seed_time) as hand_over:  # see graph.sampling_stream
                seeds = check_seeds(seeds, self.num_nodes, self.device, self.disjoint)
                return hand_over(self._sample(seeds, tree_times(seeds, seed_time, self.temporal, self.device)))
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def _sample(self, seeds: dict, tree_time: torch.Tensor | None) -> Sample:
        """``seeds``: node type -> int64 [S] ids on the device, checked (:func:`.seeds.check_seeds`)."""
        keys = {}
        for nt in self.num_nodes:  # node keys: ids, or (seed index, id) pairs in disjoint mode
            ids = seeds.get(nt)
            ids = torch.empty(0, dtype=torch.int64, device=self.device) if ids is None else ids
            keys[nt] = torch.arange(len(ids), device=self.device) * self.num_nodes[nt] + ids if self.disjoint else ids
        fanouts = [k for v in self.num_neighbors.values() for k in v]
        draws = self._draw_keys()
        if self.device.type == "cuda" and self.dedup == "hash" and min(fanouts, default=0) >= 0 and not self.labor:
            return self._sample_queued(keys, draws, tree_time)
        return self._sample_synced(keys, draws, tree_time)

    def _fanout(self, et, hop: int) -> int:
        """Hop ``hop``'s fanout of ``et``; without replacement at most the largest in-degree, which is what a
        node gets anyway (min(k, degree)): a fanout of 2**31 on a small graph sizes no 2**31 slots."""
        fanout = self.num_neighbors[et]
        k = fanout[hop] if hop < len(fanout) else 0
        if k > 0 and not self.replace:
            if et not in self._max_degree:
                colptr = getattr(self.topologies[et], "colptr", None)
                self._max_degree[et] = int(colptr.diff().max()) if colptr is not None and len(colptr) > 1 else k
            k = min(k, self._max_degree[et])
        return k

    def _ends(self, et) -> tuple:
        return (et[0], et[-1]) if self.hetero else (None, None)

    def _sample_synced(self, keys: dict, draws: torch.Tensor, tree_time: torch.Tensor | None = None) -> Sample:
        """Hop after hop, reading each hop's sizes back (any device, any relabelling)."""
        draws_cpu = draws
        if self.device.type == "cuda":
            draws = draws.to(self.device)
        sets = {nt: node_set(k, self.dedup, self._expected_nodes(len(k)), self._dense.get(nt))
                for nt, k in keys.items()}
        frontier = {nt: (0, len(k)) for nt, k in keys.items()}
        num_nodes_hop = {nt: [len(k)] for nt, k in keys.items()}
        parts: dict[Any, _Parts] = {et: ([], [], []) for et in self.topologies}  # rows, cols, edges per hop
        num_edges_hop: dict[Any, list[int]] = {et: [] for et in self.topologies}
        for hop in range(self.num_hops):
            before = {nt: s.count for nt, s in sets.items()}
            for et, topo in self.topologies.items():
                k = self._fanout(et, hop)
                src, dst = self._ends(et)
                at = self._key_index(hop, et)
                key = draws[at:at + 1] if self.device.type == "cuda" else int(draws[at])
                lo, hi = frontier[dst]
                if k == 0 or hi == lo:
                    num_edges_hop[et].append(0)
                    continue
                hop_keys = sets[dst].keys[lo:hi]
                nodes = hop_keys % self.num_nodes[dst] if self.disjoint else hop_keys
                times = None if tree_time is None or not topo.temporal else \
                    tree_time.index_select(0, hop_keys // self.num_nodes[dst])
                if self.labor:
                    nbr, eid, counts = sample_hop_labor(topo, nodes, k, int(draws_cpu[at]))
                else:
                    nbr, eid, counts = _sample_hop(topo, nodes, k, self.replace, key, seed_time=times,
                                                  strategy=self.temporal_strategy)
                seed_local = torch.arange(lo, hi, device=self.device).repeat_interleave(counts, output_size=len(nbr))
                if self.disjoint:
                    owner = (hop_keys // self.num_nodes[dst]).repeat_interleave(counts, output_size=len(nbr))
                    nbr = owner * self.num_nodes[src] + nbr
                rows, cols, edges = parts[et]
                rows.append(sets[src].add(nbr))
                cols.append(seed_local)
                edges.append(eid)
                num_edges_hop[et].append(len(eid))
            for nt, s in sets.items():
                frontier[nt] = (before[nt], s.count)
                num_nodes_hop[nt].append(s.count - before[nt])
        nodes = {nt: s.keys for nt, s in sets.items()}
        for s in sets.values():
            if isinstance(s, DenseNodeSet):
                s.release()  # on success only: a map an error left half-written is dropped
        return self._output(nodes, parts, num_nodes_hop, num_edges_hop)

    def _sample_queued(self, keys: dict, draws: torch.Tensor, tree_time: torch.Tensor | None = None) -> Sample:
        """Every hop queued on the GPU with its sizes kept on the device; one read-back at the end.

        With ``cuda_graphs``, the first batch of a given seed count runs
        eagerly (warming up), the second is captured in a CUDA graph, and
        later ones replay it with new seeds and keys.
        """
        counting = any(t.counting for t in self.topologies.values())
        shape = (tuple(len(k) for k in keys.values()), tuple(map(tuple, self.num_neighbors.values())), self.replace,
                 self.disjoint)
        if self.cuda_graphs and not counting:
            captured = self._graphs.get(shape)
            if captured is None and shape in self._graphs and threading.current_thread() is threading.main_thread():
                # Captured in the main thread only: a capture puts torch's CUDA random generator in capture
                # mode, and another thread drawing from it meanwhile (dropout in a training loop) would fail.
                try:
                    captured = self._graphs[shape] = CapturedBatch(self, keys, draws, tree_time)
                except Exception as err:  # noqa: BLE001 - sampling goes on without graphs
                    log.warning("hmgstore: capturing the sampler's CUDA graph failed (%s: %s); sampling goes on "
                                "without CUDA graphs", type(err).__name__, str(err).splitlines()[0])
                    self.cuda_graphs = False
                    self._graphs.clear()
            if captured is not None:
                return captured.run(keys, draws, tree_time)
            self._graphs.setdefault(shape, None)  # warmed up by this eager batch
        state = self._queue_batch(keys, draws.to(self.device), tree_time)
        return self._finish_queued(state, _sizes(keys, state).tolist(), copy=False)

    def _queue_batch(self, keys: dict, draws: torch.Tensor, tree_time: torch.Tensor | None = None):
        """Queue a batch's kernels (no host synchronisation): ``(sets, starts, queued, hops)``.

        Each hop is launched over an upper bound of its seeds and slots (the
        previous hop's slots times the fanout), computed on the host; kernels
        read the real bounds from device memory. ``draws``: the keys, on the
        device.
        """
        hops = self.num_hops
        most = {nt: [len(k)] for nt, k in keys.items()}  # upper bound of the nodes each hop finds, per type
        for hop in range(hops):
            found = dict.fromkeys(keys, 0)
            for et in self.topologies:
                src, dst = self._ends(et)
                found[src] += most[dst][hop] * max(self._fanout(et, hop), 0)
            for nt in keys:
                most[nt].append(found[nt])
        sets, starts = {}, {}
        for nt, k in keys.items():
            room = sum(most[nt]) if self.disjoint else min(sum(most[nt]), len(k) + self.num_nodes[nt])
            sets[nt] = HashNodeSet(k, room)
            starts[nt] = torch.full((hops + 2,), len(k), dtype=torch.int64, device=self.device)
            starts[nt][:1].zero_()
        # per hop: (rows, cols, edges, used slots) or None
        queued: dict[Any, list[tuple | None]] = {et: [] for et in self.topologies}
        for hop in range(hops):
            for et, topo in self.topologies.items():
                k = self._fanout(et, hop)
                src, dst = self._ends(et)
                max_seeds = most[dst][hop]
                if k == 0 or max_seeds == 0:
                    queued[et].append(None)
                    continue
                at = self._key_index(hop, et)
                lohi = starts[dst][hop:hop + 2]
                nbr, eid, seed_local, counts, ends = _queue_hop(
                    topo, sets[dst].buffer, lohi, max_seeds, k, self.replace, draws[at:at + 1], self.num_nodes[dst],
                    self.disjoint, seed_time=tree_time, per_tree=True, strategy=self.temporal_strategy)
                if topo.counting:
                    at_seed = lohi[0] + torch.arange(max_seeds, device=self.device)
                    nodes = sets[dst].buffer[at_seed.clamp(max=len(sets[dst].buffer) - 1)]
                    nodes = torch.where(at_seed < lohi[1], nodes, 0)  # past the hop's seeds: not written yet
                    topo.count(nodes % self.num_nodes[dst] if self.disjoint else nodes, counts)
                rows = sets[src].add_queued(nbr, ends[-1:], max_seeds * k)
                queued[et].append((rows, seed_local, eid, ends[-1:]))
            for nt, s in sets.items():
                starts[nt][hop + 2:hop + 3].copy_(s.device_count)
        return sets, starts, queued, hops

    def _finish_queued(self, state, sizes: list, copy: bool) -> Sample:
        """The batch from a queued state and its sizes read back (``copy``: the state's memory is
        reused by the next replay, so the output must own its own)."""
        sets, starts, queued, hops = state
        num_nodes_hop, node_keys = {}, {}
        for nt, s in sets.items():
            bounds, sizes = sizes[:hops + 2], sizes[hops + 2:]
            num_nodes_hop[nt] = [b - a for a, b in zip(bounds, bounds[1:])]
            node_keys[nt] = s.buffer[:bounds[-1]]
            if copy:
                node_keys[nt] = node_keys[nt].clone()
        parts: dict[Any, _Parts] = {et: ([], [], []) for et in self.topologies}
        num_edges_hop: dict[Any, list[int]] = {et: [] for et in self.topologies}
        for et, per_hop in queued.items():
            for q in per_hop:
                m = 0 if q is None else sizes.pop(0)
                num_edges_hop[et].append(m)
                if m:
                    for part, values in zip(parts[et], q[:3]):
                        part.append(values[:m])
        return self._output(node_keys, parts, num_nodes_hop, num_edges_hop)

    def _output(self, keys: dict, parts: dict, num_nodes_hop: dict, num_edges_hop: dict) -> Sample:
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        node, batch = {}, {}
        for nt, k in keys.items():
            node[nt] = k % self.num_nodes[nt] if self.disjoint else k
            if self.disjoint:
                batch[nt] = k // self.num_nodes[nt]
        row, col, edge = ({et: torch.cat(p[i]) if p[i] else empty for et, p in parts.items()} for i in range(3))
        return Sample(node, row, col, edge, batch if self.disjoint else None, num_nodes_hop, num_edges_hop)

    def reset_stats(self, counting: bool = True) -> None:
        """Start counting, per topology, the neighbour ids read from each tier (see :mod:`hmgstore.rows.stats`);
        ``counting=False``: stop counting.

        Captured CUDA graphs are dropped: batches run eagerly while counting, and are captured again once
        counting stops."""
        self._graphs.clear()
        for topo in self.topologies.values():
            topo.reset_stats(counting)

    def stats(self) -> dict:
        """Every topology's statistics merged. Raises RuntimeError when not counting."""
        return merge(t.stats() for t in self.topologies.values())

    def close(self) -> None:
        """Refuse new batches, wait for batches being sampled in other threads, then free the topologies'
        GPU memory and host registrations and the captured CUDA graphs (idempotent)."""
        with self._idle:
            self._closed = True
            while self._active:
                self._idle.wait()
        self._graphs.clear()
        for topo in self.topologies.values():
            topo.close()
