"""What ``bench train`` trains: its graphs, its GraphSAGE and each configuration's loader.

The loader of a configuration is built by :func:`build_loader`, in the
training process, or by :func:`produced_loader` in the producer process of
the ``+proc`` configurations (:class:`hmgstore.Producer`), which builds the
graph again there from the same ``--graph`` spec (a generated graph is the
same in both processes).
"""
from __future__ import annotations

import copy
import time
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

import hmgstore

from ..cli import flags
from ..data import power_law_csc, synthetic
from ..graph import expected_draws


class SAGE(torch.nn.Module):
    """GraphSAGE, one layer per hop. Given each hop's sampled node and edge counts (``nodes_per_hop``,
    ``edges_per_hop``: the batch's ``num_sampled_nodes`` / ``num_sampled_edges``), each layer runs only over
    the nodes and edges that still reach the seeds (``torch_geometric.utils.trim_to_layer``): the last layer
    over the seeds alone. The seeds' outputs are the same either way (test_bench.py checks it)."""

    def __init__(self, dims):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x, edge_index, nodes_per_hop=None, edges_per_hop=None):
        from torch_geometric.utils import trim_to_layer

        for i, conv in enumerate(self.convs):
            if nodes_per_hop is not None:
                x, edge_index, _ = trim_to_layer(i, nodes_per_hop, edges_per_hop, x, edge_index)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), p=0.5, training=self.training)
        return x


def trimmable(batch) -> bool:
    """Whether ``batch`` carries per-hop counts that :class:`SAGE` can trim by (hmgstore's sampler and
    pyg-lib give them; PyG's torch-sparse sampler does not)."""
    nodes, edges = getattr(batch, "num_sampled_nodes", None), getattr(batch, "num_sampled_edges", None)
    return bool(nodes) and edges is not None and len(edges) > 0


def train_step(model, optimizer, batch, trim: bool) -> torch.Tensor:
    """One optimiser step on ``batch`` (its first ``batch_size`` nodes are the seeds); its loss. ``trim``:
    layers trimmed per hop where the batch allows it (:func:`trimmable`)."""
    optimizer.zero_grad()
    if trim and trimmable(batch):
        out = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    else:
        out = model(batch.x, batch.edge_index)
    loss = F.cross_entropy(out[:batch.batch_size], batch.y[:batch.batch_size])
    loss.backward()
    optimizer.step()
    return loss


def build_graph(spec: str, feat_dim: int):
    """``(Data on the CPU, CSC or None, train ids, classes, description)`` for a ``--graph`` spec; the CSC,
    for a graph generated straight in CSC form (the Data then has no edge_index)."""
    from torch_geometric.data import Data


    kind, _, rest = spec.partition(":")
    if kind == "synthetic":
        g = synthetic(num_nodes=flags.count(rest), avg_degree=10, feat_dim=feat_dim, seed=0)
        return Data(x=g.x, y=g.y, edge_index=g.edge_index), None, g.train_idx, g.num_classes, spec
    if kind == "products":
        g = synthetic(num_nodes=2_449_029, avg_degree=50, feat_dim=100, num_classes=47, seed=0)
        train = g.train_idx[torch.randperm(len(g.train_idx), generator=torch.Generator().manual_seed(1))][:196_615]
        return Data(x=g.x, y=g.y, edge_index=g.edge_index), None, train.sort().values, g.num_classes, "products-shaped"
    if kind == "papers":
        nodes, edges = (flags.count(v) for v in rest.split(":"))
        cuda = torch.cuda.is_available()
        csc = power_law_csc(nodes, edges, 0.6, device="cuda" if cuda else None)
        x = torch.empty(nodes, 128, dtype=torch.float32)
        x.view(torch.int32).view(-1)[:] = 0x3F800000  # 1.0f everywhere: cheap to make, never all zeros
        y = torch.randint(0, 172, (nodes,))
        train = torch.randperm(nodes, generator=torch.Generator().manual_seed(1))[:max(1, nodes * 11 // 1000)]
        return Data(x=x, y=y, num_nodes=nodes), csc, train.sort().values, 172, f"papers-shaped {rest}"
    raise SystemExit(f"unknown --graph {spec!r}: use synthetic:NODES, products or papers:NODES:EDGES")


class Built(NamedTuple):
    """A configuration's loader, what it reads from and how long the stores took to build (None: none built)."""

    # PyG's objects (torch_geometric is optional): a NeighborLoader, a Data, the (feature, graph) stores and
    # hmgstore's PyG sampler.
    loader: Any
    data: Any
    stores: Any
    sampler: Any
    build_s: float | None


def build_loader(base: str, data, csc, train, device, args, hot, topology_cache: float | None = None,
                 split: float | None = None, split_threads: int | None = None) -> Built:
    """The loader of configuration ``base`` (stock, all_gpu, host, cache or api) and what it reads from; the cache
    holds ``args.cache`` of the features' bytes and ``topology_cache`` (default ``args.cache``) of the
    topology's on the GPU, and its features' table reads ``split`` of its host rows on the CPU (with
    ``split_threads`` of torch's threads); api is the README's swap, ``from_data(data, gpu_budget=B)`` and
    ``HybridNeighborSampler(stores, fanout)`` with the cache's feature budget and ``--compress``, nothing else."""
    from ..plugins.pyg import HybridNeighborSampler, from_data

    progress = not args.no_progress
    labor = getattr(args, "labor", False)  # --labor: every configuration's sampler LABOR-0 instead of uniform
    build = None
    stores = sampler = None
    topology_bytes = csc.row.element_size() * csc.num_edges if csc is not None else None
    if base == "all_gpu" and csc is not None:  # no edge_index to move: every feature row in the GPU tier
        stores = from_data(_features_only(data, csc), device=device, gpu_budget=2**62,
                           hotness=torch.zeros(data.num_nodes), progress=progress)
        sampler = HybridNeighborSampler(_graph_source(data, csc, stores), args.fanout, device=device,
                                        gpu_budget=2**62, progress=progress, labor=labor)
    elif base == "all_gpu":
        data = copy.copy(data).to(device)  # Data.to moves in place; a shallow copy keeps the CPU tensors, uncopied
        sampler = HybridNeighborSampler(_graph_source(data, csc), args.fanout, device=device, gpu_budget=2**62,
                                        progress=progress, labor=labor)
    elif base == "api":  # the README's swap: the public API with every default but the budget and row format
        budget = int(args.cache * data.x.element_size() * data.x.numel())
        build = time.perf_counter()
        # from_data's default hotness, computed here for a graph made as CSC (its Data then holds no edges)
        draws = expected_draws(csc, progress=progress, device=device) if csc is not None else None
        stores = from_data(_features_only(data, csc), device=device, gpu_budget=budget, hotness=draws,
                           compress=args.compress, progress=progress)
        sampler = HybridNeighborSampler(_graph_source(data, csc, stores), args.fanout, device=device,
                                        progress=progress, labor=labor)
        build = time.perf_counter() - build
    elif base in ("host", "cache"):
        budget = None
        feature_hot = None
        if base == "cache":
            feature_bytes = data.x.element_size() * data.x.numel()
            budget = int(args.cache * feature_bytes)
            feature_hot = hot.features[None]
        build = time.perf_counter()
        layout = {"auto": "auto", "hotness": "hotness", "id": None}[getattr(args, "host_layout", "auto")] \
            if base == "cache" else None
        stores = from_data(_features_only(data, csc), device=device, gpu_budget=budget, hotness=feature_hot,
                           compress=args.compress, progress=progress, layout=layout,
                           gpu_whole=("y",) if base == "cache" and getattr(args, "labels_on_gpu", False) else ())
        topo_budget = None
        if base == "cache":
            edges = topology_bytes or 4 * data.edge_index.shape[1]
            topo_budget = int(_topology_share(args, topology_cache) * edges)
        sampler = HybridNeighborSampler(_graph_source(data, csc, stores), args.fanout, device=device,
                                        gpu_budget=topo_budget, progress=progress, labor=labor,
                                        hot_order=None if base == "host" else
                                        hmgstore.hotness.order_by_score(hot.topology[None]))
        build = time.perf_counter() - build
        if split and base == "cache":  # the features' table only: labels are 8 B rows, not worth a read-back
            stores[0].table(None, "x").set_split(split, split_threads)
    if sampler is not None:
        sampler.sampler.cuda_graphs = getattr(args, "sampler_graphs", "on") == "on"
    return Built(_loader(base, data, train, args, stores, sampler), data, stores, sampler, build)


def _topology_share(args, value: float | None = None) -> float:
    """The cache's share of the topology's bytes on the GPU: ``value``, else the first --topology-cache, else
    --cache."""
    if value is None:
        value = (getattr(args, "topology_cache", None) or [None])[0]
    return args.cache if value is None else value


def produced_loader(base: str, args, hot, device, topology_cache: float | None = None, split: float | None = None,
                    split_threads: int | None = None):
    """:func:`build_loader`'s loader, built in a producer process from the ``--graph`` spec."""
    data, csc, train, _, _ = build_graph(args.graph, args.feat_dim)
    return build_loader(base, data, csc, train, device, args, hot, topology_cache, split, split_threads).loader


def _loader(config: str, data, train, args, stores, sampler):
    from torch_geometric.loader import NeighborLoader

    kwargs = dict(input_nodes=train, batch_size=args.batch_size, shuffle=True, drop_last=True)
    if config == "stock":
        return NeighborLoader(data, args.fanout, **kwargs)
    source = stores if stores is not None else data
    return NeighborLoader(source, args.fanout, neighbor_sampler=sampler, **kwargs)


def _features_only(data, csc):
    """The Data, or, for a graph generated as CSC, its node attributes with no edges (the sampler reads
    the CSC itself)."""
    from torch_geometric.data import Data

    if csc is None:
        return data
    return Data(x=data.x, y=data.y, edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=data.num_nodes)


def _graph_source(data, csc=None, stores=None):
    """What HybridNeighborSampler reads the topology from: the stores, the Data, or a prepared CSC."""
    if csc is not None:
        from ..plugins.pyg import CSCGraphStore, HybridFeatureStore

        graph_store = CSCGraphStore()
        graph_store.put_csc(csc)
        feature_store = stores[0] if stores is not None else HybridFeatureStore("cpu")
        return feature_store, graph_store
    return stores if stores is not None else data
