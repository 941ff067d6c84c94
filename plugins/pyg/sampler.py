"""HybridNeighborSampler: PyG's ``BaseSampler`` over hmgstore's neighbour sampler.

A stock loader takes it unchanged::

    sampler = HybridNeighborSampler((feature_store, graph_store), [15, 10, 5], device="cuda", gpu_budget="2GB")
    loader = NeighborLoader((feature_store, graph_store), [15, 10, 5], neighbor_sampler=sampler,
                            input_nodes=train_idx, batch_size=1024, shuffle=True)

It samples with :class:`hmgstore.graph.NeighborSampler` over the graph's
topology held in tiers (:class:`hmgstore.graph.Topology`): on a GPU, the
adjacency lists of hot nodes in GPU memory and the rest in pinned host memory,
read zero-copy; on the CPU, with vectorised torch (no pyg-lib, no
torch-sparse). Its output follows PyG's conventions (``SamplerOutput`` /
``HeteroSamplerOutput``: ``node`` seeds first, ``row`` the neighbour's and
``col`` the seed's local index, ``edge`` the CSC position, mapped to edge ids
by :attr:`edge_permutation`, per-hop counts, ``batch`` when disjoint) and
stays on the sampler's device: the feature store then gathers with ids
already on the GPU.

As with any custom PyG sampler, options such as ``replace`` and ``disjoint``
belong to the sampler's constructor: ``NeighborLoader`` does not forward
them. A GPU sampler runs in the loader's main process (``num_workers=0``).
"""
from __future__ import annotations

import torch
from torch_geometric.data import Data, FeatureStore, GraphStore, HeteroData
from torch_geometric.sampler import (
    BaseSampler,
    EdgeSamplerInput,
    HeteroSamplerOutput,
    NegativeSampling,
    NodeSamplerInput,
    SamplerOutput,
)
from torch_geometric.sampler.base import SubgraphType
from torch_geometric.sampler.neighbor_sampler import edge_sample

from hmgstore import resolve_device
from hmgstore.graph import CSC, NeighborSampler, Topology, check_fanout
from hmgstore.graph.fanout import check_ordered
from hmgstore.graph.induced import induced_edges
from hmgstore.graph.seeds import check_seeds
from hmgstore.graph.temporal import check_times, sort_by_time
from hmgstore.rows import hotness

from .graph_store import CSCGraphStore, adj_t_as_csc, to_csc
from .sampler_attrs import _edge_values, times_of
from .sampler_checks import check_data_ids, check_time_counts, fanout_values, missing_times, store_node_counts


def _graph_of(data) -> tuple[dict, dict]:
    """``(edge type -> CSC, node type -> node count)`` of a Data, HeteroData or (FeatureStore, GraphStore)."""
    if isinstance(data, Data):
        check_data_ids(data)
        n = data.num_nodes
        if getattr(data, "edge_index", None) is not None:
            csc = to_csc(data.edge_index, "coo", (n, n))
        elif getattr(data, "adj_t", None) is not None:
            if not hasattr(data.adj_t, "csr"):  # PyG's loaders cut a batch's adj_t out of the Data: not a torch one
                raise TypeError("PyG's loaders over a Data take adj_t as a torch_sparse.SparseTensor only, not a "
                                f"{type(data.adj_t).__name__}; pass edge_index, or sample over from_data(data)'s "
                                "stores, which take a torch sparse adj_t too")
            csc = to_csc(adj_t_as_csc(data.adj_t, (n, n), "the Data object"), "csc", (n, n))
        else:
            raise ValueError("the Data object has neither edge_index nor adj_t")
        return {None: csc}, {None: n}
    if isinstance(data, HeteroData):
        edges = {}
        for et in data.edge_types:
            size = (data[et[0]].num_nodes, data[et[-1]].num_nodes)
            edges[et] = to_csc(data[et].edge_index, "coo", size)
        return edges, {nt: data[nt].num_nodes for nt in data.node_types}
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], FeatureStore) \
            and isinstance(data[1], GraphStore):
        feature_store, graph_store = data
        if isinstance(graph_store, CSCGraphStore):
            edges = {et: graph_store.edges(et) for et in graph_store.edge_types}
        else:  # any GraphStore: PyG's own CSC call
            attrs = graph_store.get_all_edge_attrs()
            rows, colptrs, perms = graph_store.csc()
            if not isinstance(rows, dict):
                rows, colptrs, perms = {None: rows}, {None: colptrs}, {None: perms}
            edges = {}
            for attr in attrs:
                et = attr.edge_type
                csc = to_csc((rows[et], colptrs[et]), "csc", attr.size)
                edges[et] = CSC(csc.row, csc.colptr, perms.get(et), csc.size)
        num_nodes = store_node_counts(edges)
        for attr in feature_store.get_all_tensor_attrs():  # node types with features but no edges
            if attr.group_name not in num_nodes:
                num_nodes[attr.group_name] = feature_store.get_tensor_size(attr)[0]
        return edges, num_nodes
    raise TypeError("HybridNeighborSampler takes a Data, a HeteroData or a (FeatureStore, GraphStore) pair, "
                    f"got {type(data).__name__}")


def _budgets(gpu_budget, edges: dict, device=None) -> dict:
    """Per edge type, its share of ``gpu_budget`` (a dict is taken as given), by bytes of neighbour ids;
    ``"auto"`` is resolved once for all edge types (int64 ids counted: the most they take) on ``device``."""
    if gpu_budget is None or isinstance(gpu_budget, dict):
        return dict(gpu_budget or {})
    needed = sum(8 * csc.num_edges for csc in edges.values())
    total = hotness.resolve_budget(gpu_budget, needed, device if device is not None else "cpu")
    weights = {et: max(1, csc.num_edges) for et, csc in edges.items()}
    whole = sum(weights.values())
    return {et: total * w // whole for et, w in weights.items()}


class HybridNeighborSampler(BaseSampler):
    """PyG's ``BaseSampler`` sampling neighbours with hmgstore, on the CPU or a GPU.

    Args:
        data: a ``Data``, a ``HeteroData``, or a ``(FeatureStore, GraphStore)``
            pair (hmgstore's :class:`CSCGraphStore` is used without a copy;
            another graph store is read through its ``csc()``).
        num_neighbors: neighbours per hop, a list (``[15, 10, 5]``; ``-1``:
            all), or a dict per edge type.
        replace: sample with replacement.
        disjoint: every seed gets its own subgraph; the output has ``batch``.
        subgraph_type: ``"directional"`` (PyG's default) or
            ``"bidirectional"`` (edges added in both directions afterwards).
        device: where the topology is held and sampling runs (None: the
            current GPU, or the CPU).
        gpu_budget: bytes of GPU memory for hot adjacency lists (int, string
            such as ``"2GB"``, or a dict per edge type); the rest is read from
            pinned host memory. None: none on the GPU. A budget that holds the
            whole topology puts it all on the GPU. The default, ``"auto"``:
            the lesser of every edge type's neighbour ids and half the GPU's
            free memory at build time, split over edge types as a byte budget
            is (:func:`hmgstore.rows.hotness.resolve_budget`; nothing on a CPU).
        hot_order: destination node ids, hottest first (a tensor, or a dict per
            edge type); default: by degree.
        shard_topology: one process per GPU under torch.distributed: the
            adjacency lists that do not fit in ``gpu_budget`` are sharded over
            the node's GPUs and read over NVLink, with the rest read from
            pinned host memory (:func:`hmgstore.distributed.sharded_topology`).
            Collective: every rank of the node builds its sampler alike.
        topology_replicate: with ``shard_topology``, bytes of each GPU's
            ``gpu_budget`` (split over edge types as the budget is) holding
            the hottest lists on every GPU.
        generator: a CPU ``torch.Generator`` for the draws (default: torch's
            global one, so ``torch.manual_seed`` fixes the batches).
        dedup: how sampled nodes are relabelled, ``"hash"`` (GPU) or
            ``"sort"``; default: hash on a GPU, sort on the CPU.
        weight_attr: the edge attribute holding sampling weights (PyG's
            ``weight_attr``): edge-weighted sampling without replacement
            (successive sampling, see :mod:`hmgstore.graph.weighted`) or, with
            ``replace``, in proportion to weight. Edge types without the
            attribute sample uniformly. The weights are held as float32 beside
            the neighbour ids, in the same tiers (4 more bytes an edge of the
            GPU budget).
        subgraph_type: also ``"induced"``: every edge of the graph between the
            sampled nodes (not with ``disjoint``, as in PyG), into every copy of a
            seed listed twice, as PyG gives them; the output's
            ``num_sampled_edges`` is then None.
        time_attr: the node or edge attribute holding int64 times (PyG's
            ``time_attr``): temporal sampling (:mod:`hmgstore.graph.temporal`),
            disjoint, no neighbour later than its tree's seed time: the
            loader's ``input_time`` / ``edge_label_time``, else the seed's
            node time. Times are copied when the sampler is built (later
            edits of the data's times are not seen) and held whole on the
            sampling device (8 bytes a node or an edge, per edge type that
            reads them). Edge types without times sample without a
            time limit. Batches of seeds of two node types (a heterogeneous
            ``LinkNeighborLoader`` between two node types) raise ValueError:
            use PyG's ``NeighborSampler`` for those.
        temporal_strategy: ``"uniform"`` or ``"last"`` (the most recent ``k``
            in-edges), as in PyG.
        labor: LABOR-0 (layer-neighbour) sampling instead of uniform, as
            DGL's ``LaborSampler`` (:mod:`hmgstore.graph.labor`): ``k``
            neighbours per node on average, shared between the batch's nodes,
            so batches hold fewer nodes. Off by default; not with
            ``replace``, ``weight_attr`` or ``time_attr``.
    """

    def __init__(self, data, num_neighbors, *, replace: bool = False, disjoint: bool = False,
                 subgraph_type="directional", device=None, gpu_budget="auto", hot_order=None,
                 generator: torch.Generator | None = None, dedup: str | None = None, time_attr=None,
                 weight_attr=None, temporal_strategy: str = "uniform", labor: bool = False, progress: bool = True,
                 shard_topology: bool = False, topology_replicate=0):
        self.subgraph_type = SubgraphType(subgraph_type)
        if self.subgraph_type == SubgraphType.induced and (disjoint or time_attr is not None):
            raise ValueError("subgraph_type='induced' builds one subgraph for the whole batch: it cannot be "
                             "disjoint or temporal (as in PyG); pass subgraph_type='directional'")
        self.device = resolve_device(device)
        edges, self.num_nodes = _graph_of(data)
        per_edge: dict = {et: {} for et in edges}  # edge type -> Topology keywords: weight, src_time, edge_time
        if weight_attr is not None:
            for et, weight in _edge_values(data, weight_attr, edges, "weight_attr").items():
                per_edge[et]["weight"] = weight
        self.node_time: dict = {}
        if time_attr is not None:
            edges = self._temporal(data, time_attr, edges, per_edge)
        self.edge_types = list(edges)
        self.is_hetero = None not in edges
        num_neighbors = fanout_values(check_ordered(num_neighbors), self.is_hetero)  # a set: refused, not listed
        values = num_neighbors.get_values(self.edge_types if self.is_hetero else None)
        per_type = {et: check_fanout(v, f"num_neighbors of {et!r}") for et, v in values.items()} if self.is_hetero \
            else {None: check_fanout(values)}  # before any topology is built
        budgets, replicas = _budgets(gpu_budget, edges, self.device), _budgets(topology_replicate or None, edges)
        orders = hot_order if isinstance(hot_order, dict) else {et: hot_order for et in edges}
        topologies = {}
        try:
            for et, csc in edges.items():
                if shard_topology:
                    from hmgstore.distributed import sharded_topology

                    topologies[et] = sharded_topology(csc, self.device, gpu_budget=budgets.get(et),
                                                      hot_order=orders.get(et), replicate=replicas.get(et, 0),
                                                      progress=progress, **per_edge[et])
                else:
                    topologies[et] = Topology(csc, self.device, gpu_budget=budgets.get(et),
                                              hot_order=orders.get(et), progress=progress, **per_edge[et])
            self.sampler = NeighborSampler(topologies, self.num_nodes, per_type, replace=replace, disjoint=disjoint,
                                           generator=generator, dedup=dedup, temporal_strategy=temporal_strategy,
                                           labor=labor)
        except BaseException:
            for topo in topologies.values():
                topo.close()
            raise
        self.num_neighbors = num_neighbors
        self.replace, self.disjoint = replace, self.sampler.disjoint  # temporal sampling is disjoint
        self.temporal_strategy, self.time_attr, self.weight_attr = temporal_strategy, time_attr, weight_attr
        # The topologies' perms, checked to be permutations (an entry out of range would become a batch's e_id).
        self._perm = {et: (None if t.perm is None else t.perm.to(self.device)) for et, t in topologies.items()}
        for et, topo in topologies.items():  # node times held once: the topology's own copy serves the loader too
            if topo.src_time is not None:
                self.node_time[et[0] if et is not None else None] = topo.src_time

    def _temporal(self, data, time_attr: str, edges: dict, per_edge: dict) -> dict:
        """Read ``time_attr`` (node- or edge-level), sort each edge type's lists by it, and put the times in
        ``per_edge``; the edge types' CSCs, sorted."""
        self.node_time, edge_time = times_of(data, time_attr, edges, self.num_nodes)
        check_time_counts(time_attr, self.node_time, edge_time, self.num_nodes, edges)
        self.node_time = {nt: check_times(t, self.num_nodes[nt], f"node times of {nt!r}" if nt else "node times")
                          for nt, t in self.node_time.items()}
        sorted_edges = {}
        for et, csc in edges.items():
            src = et[0] if et is not None else None
            if src in self.node_time:
                sorted_edges[et] = sort_by_time(csc, node_time=self.node_time[src])
                per_edge[et]["src_time"] = self.node_time[src]
            elif et in edge_time:
                sorted_edges[et] = sort_by_time(csc, edge_time=edge_time[et])
                per_edge[et]["edge_time"] = edge_time[et]
            else:  # no times for this edge type: sampled without a time limit, as pyg-lib does
                sorted_edges[et] = csc
        return sorted_edges

    @property
    def topologies(self) -> dict:
        """Edge type (None when homogeneous) -> :class:`hmgstore.graph.Topology`."""
        return self.sampler.topologies

    @property
    def edge_permutation(self):
        """CSC position -> edge id, per edge type (on the sampler's device), as PyG's loaders read it."""
        return self._perm if self.is_hetero else self._perm[None]

    def _check_process(self) -> None:
        if self.device.type == "cuda" and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("a GPU HybridNeighborSampler samples in the loader's main process: pass num_workers=0 "
                               "(or build the sampler with device='cpu' to sample in the workers)")

    def _seed_times(self, seeds: dict, seed_time) -> dict | None:
        """Node type -> seed times: those given (a tensor, or a dict per node type), else the seeds' node times."""
        if seed_time is not None:
            return seed_time if isinstance(seed_time, dict) else {nt: seed_time for nt in seeds}
        if not self.sampler.temporal:
            return None
        missing = [nt for nt in seeds if nt not in self.node_time]
        if missing:
            raise ValueError(missing_times(self.time_attr, missing, list(self.node_time)))
        # Checked before they index the times: an id out of range raises the sampler's own IndexError.
        seeds = check_seeds(seeds, self.sampler.num_nodes, torch.device("cpu"))
        return {nt: self.node_time[nt].index_select(0, ids) for nt, ids in seeds.items()}

    def _sample(self, seed, seed_time=None, **kwargs):
        """PyG's ``sample_fn``: seeds (a tensor, or a dict per node type) -> a sampler output."""
        self._check_process()
        seeds = seed if isinstance(seed, dict) else {None: seed}
        out = self.sampler.sample(seeds, self._seed_times(seeds, seed_time))
        if not self.is_hetero:
            return SamplerOutput(node=out.node[None], row=out.row[None], col=out.col[None], edge=out.edge[None],
                                 batch=None if out.batch is None else out.batch[None],
                                 num_sampled_nodes=out.num_sampled_nodes[None],
                                 num_sampled_edges=out.num_sampled_edges[None])
        return HeteroSamplerOutput(node=out.node, row=out.row, col=out.col, edge=out.edge, batch=out.batch,
                                   num_sampled_nodes=out.num_sampled_nodes, num_sampled_edges=out.num_sampled_edges)

    def _finish(self, out):
        if self.subgraph_type == SubgraphType.bidirectional:
            out = out.to_bidirectional()
        elif self.subgraph_type == SubgraphType.induced:
            out = self._induced(out)
        return out

    def _induced(self, out):
        """``out`` with its edges replaced by every edge between its nodes (PyG's induced subgraph)."""
        if not self.is_hetero:
            out.row, out.col, out.edge = induced_edges(self.topologies[None], out.node, out.node)
        else:
            for et, topo in self.topologies.items():
                empty = torch.empty(0, dtype=torch.int64, device=self.device)
                src, dst = out.node.get(et[0], empty), out.node.get(et[-1], empty)
                out.row[et], out.col[et], out.edge[et] = induced_edges(topo, src, dst)
        out.num_sampled_edges = None
        return out

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs):
        """The subgraphs around ``index.node`` (CPU seeds, as PyG gives them); tensors on the sampler's device."""
        seed = index.node if index.input_type is None else {index.input_type: index.node}
        out = self._finish(self._sample(seed, index.time))
        out.metadata = (index.input_id, index.time)
        return out

    def sample_from_edges(self, index: EdgeSamplerInput, neg_sampling: NegativeSampling | None = None):
        """The subgraphs around the edges ``index`` and their negatives, with PyG's own negative sampling;
        the edge labels and label indices come back on the sampler's device."""
        self._check_edges(index)
        if self.is_hetero:
            num_nodes, node_time = self.num_nodes, self.node_time or None
        else:  # a tensor or None (a tensor's truth value is ambiguous: no `or` here)
            num_nodes, node_time = self.num_nodes[None], self.node_time.get(None)
        out = edge_sample(index, self._sample, num_nodes, self.disjoint, node_time, neg_sampling)
        out = self._finish(out)
        out.metadata = tuple(m.to(self.device) if isinstance(m, torch.Tensor) else m for m in out.metadata)
        return out

    def _check_edges(self, index: EdgeSamplerInput) -> None:
        """IndexError naming ``edge_label_index`` where an edge's end is no node of the graph: past here the ends
        are mixed with negatives and de-duplicated, and a bad one would be reported at a position of that mix."""
        ends = (None, None) if index.input_type is None else (index.input_type[0], index.input_type[-1])
        for ids, node_type, side in ((index.row, ends[0], "source"), (index.col, ends[1], "destination")):
            n = int(self.num_nodes[node_type])
            bad = ((ids < 0) | (ids >= n)).nonzero()
            if len(bad):
                k = int(bad[0])  # input_id: the edge's column of edge_label_index, or the loader's own input_id=
                edge = f"edge {int(index.input_id[k])}" if index.input_id is not None else f"edge {k} of the batch"
                kind = f" of type {node_type!r}" if node_type is not None else ""
                valid = f"valid ids are 0..{n - 1}" if n else "the graph has none"
                raise IndexError(f"edge_label_index: the {side} of {edge} is node {int(ids[k])}, out of range for {n} "
                                 f"nodes{kind} ({valid}); check the loader's edge_label_index against the graph's "
                                 "num_nodes")

    def reset_stats(self, counting: bool = True) -> None:
        """Start counting the neighbour ids read from each tier of the topology; ``counting=False``: stop (the
        sampler's CUDA graphs are captured again: counting runs batches eagerly)."""
        self.sampler.reset_stats(counting)

    def stats(self) -> dict:
        """Neighbour ids read per tier since :meth:`reset_stats`, the GPU hit ratio (see :mod:`hmgstore.rows.stats`)."""
        return self.sampler.stats()

    def close(self) -> None:
        """Wait for batches being sampled in other threads, then free the topology's GPU memory and host
        registration (idempotent). Loaders that sample with it afterwards raise RuntimeError."""
        self.sampler.close()

    def __getstate__(self):
        if self.device.type == "cuda":
            raise TypeError("a GPU HybridNeighborSampler cannot be sent to another process; it samples in the "
                            "loader's main process: pass num_workers=0")
        return self.__dict__

    def __repr__(self) -> str:
        return (f"HybridNeighborSampler(device={self.device}, num_neighbors={self.num_neighbors.values}, "
                f"replace={self.replace}, disjoint={self.disjoint}, topologies={list(self.topologies.values())})")
