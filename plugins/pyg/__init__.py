"""PyG adapter: hmgstore behind PyG's remote backend, a ``(FeatureStore, GraphStore)`` pair.

A stock PyG script changes one line, the one that builds the stores::

    from hmgstore.plugins.pyg import from_data
    feature_store, graph_store = from_data(data, device="cuda:0", gpu_budget="8GB")
    loader = NeighborLoader((feature_store, graph_store), num_neighbors=[15, 10, 5],
                            input_nodes=train_idx, batch_size=1024, shuffle=True)

PyG's own sampler draws the neighbours from the :class:`CSCGraphStore` (host
CSC, the same order PyG builds from a ``Data``, so the same seeds draw the
same batches); each batch's node attributes, for every node type, come from
the :class:`HybridFeatureStore` in one :func:`hmgstore.gather_many`, on the
store's device. Rows kept on the GPU under ``gpu_budget`` are chosen by
how often one hop draws each node as a neighbour
(:func:`hmgstore.graph.expected_draws`), or by a ``hotness`` the caller passes.

Without a ``Data``: :func:`from_tensors` takes host arrays (torch tensors,
numpy arrays, memmaps) and a topology as COO, CSR or CSC; OGB datasets on
disk are read by :func:`hmgstore.data.ogb.load_node_dataset` and passed to it.
For heterogeneous graphs without a ``HeteroData``, fill a
:class:`CSCGraphStore` with ``put_edge_index`` and build the feature store
with :meth:`HybridFeatureStore.from_sources`.

Graphs partitioned over several machines: :mod:`hmgstore.plugins.pyg.cluster`
(:class:`ClusterFeatureStore`, :class:`ClusterNeighborSampler`,
:func:`cluster_loader`).

Stock ``NeighborLoader``/``LinkNeighborLoader`` calls over these objects are
checked when the loader is built (:mod:`hmgstore.plugins.pyg.loader_checks`,
installed into PyG's two loader classes when the first store or sampler is
built, not on import):
options that differ from a ``HybridNeighborSampler``'s warn; store inputs that
PyG asserts on (no ``input_nodes``, a plain ``edge_label_index``) read as with
a ``Data``; without pyg-lib or torch-sparse the stores sample with
``HybridNeighborSampler`` (a warning says so), not PyG's ImportError.

Edge attributes (``edge_attr``, ...) are stored too, one row per edge in
edge-id order; PyG's remote-backend loaders do not fetch them, so the
loader takes :func:`edge_features`' hooks, ``NeighborLoader(stores, ...,
**edge_features(stores))``, and batches carry ``edge_attr`` as they do from
a ``Data`` (:mod:`hmgstore.plugins.pyg.edge_features`). Every attribute is
checked against its graph's size, so none is dropped without a word
(:mod:`hmgstore.plugins.pyg.attributes`). Loader
options (workers, ``pin_memory``, ``PrefetchLoader``) are discussed in
:mod:`hmgstore.plugins.pyg.feature_store`.
"""
from __future__ import annotations

import inspect

from torch_geometric.data import Data, HeteroData

from hmgstore.rows import checks
from hmgstore.rows.hotness import hotness_or_default, parse_budget
from hmgstore.util.device import resolve_device

from . import graph_store as _graph_store
from .attributes import (
    check_edge_attributes,
    check_features,
    keep_edge_attributes,
    node_attributes,
    per_edge_attributes,
)
from .cluster import (
    ClusterFeatureStore,
    ClusterNeighborSampler,
    EqualBatches,
    cluster_loader,
)
from .edge_features import EdgeFeatures, edge_features
from .edge_tables import edge_hotness
from .feature_store import HybridFeatureStore, ResidentTensor, resident
from .graph_store import CSC, CSCGraphStore, adj_t_as_csc, to_csc
from .loader_checks import install as _install_loader_checks
from .loader_checks import pyg_sampler_available
from .sampler import HybridNeighborSampler

_graph_store.install_loader_checks = _install_loader_checks  # run when the first store or sampler is built

__all__ = ["from_data", "from_tensors", "HybridFeatureStore", "CSCGraphStore", "CSC", "HybridNeighborSampler",
           "ResidentTensor", "resident", "to_csc", "ClusterFeatureStore", "ClusterNeighborSampler", "EqualBatches",
           "edge_features", "EdgeFeatures", "cluster_loader", "pyg_sampler_available"]


#: The host-memory options :func:`from_data` passes to every table (:meth:`HybridFeatureStore.from_sources`).
TABLE_OPTIONS = ("copy", "host_dtype", "compress", "layout", "backing", "split")


def from_data(data, device=None, *, gpu_budget="auto", hotness=None, attrs=None, max_sms: int | None = None,
              progress: bool = True, edge_attrs=None, edge_gpu_budget=None, gpu_whole="auto",
              **options) -> tuple[HybridFeatureStore, CSCGraphStore]:
    """``(feature_store, graph_store)`` holding a PyG ``Data`` or ``HeteroData``.

    Node attributes (every tensor or numpy array with one row per node, or
    the names in ``attrs``) become HybridTensors over the same host memory
    (CPU tensors only; no host copy); ``edge_index`` (or ``adj_t``, torch_sparse's
    or torch's sparse COO/CSR) of every edge type becomes CSC. Edge attributes (one row per edge) become edge
    tables with the same host-memory ``options``, rows in edge-id order
    (``batch.e_id``); ``edge_attrs``: the names to store (None: every edge
    attribute; a warning names those left out); ``edge_gpu_budget``: bytes
    of GPU memory for edge rows, edges into the hottest nodes first. Batches
    carry them through :func:`edge_features`' loader hooks;
    graph-level values (0-d tensors, numbers, ``num_nodes``) and index
    tensors (``edge_label_index``) are left alone. ``device``: where batches' attributes land (None: the
    current GPU, or the CPU). ``gpu_budget``: bytes (int or ``"8GB"``) of
    rows to keep on the GPU, hottest first by ``hotness``: a score tensor [num_nodes] (homogeneous) or
    ``{node_type: score}``; default: :func:`hmgstore.graph.expected_draws`.
    The default, ``"auto"``, keeps the lesser of every node table and half
    the GPU's free memory at build time
    (:func:`hmgstore.rows.hotness.resolve_budget`; no GPU tier on a CPU); None
    keeps every row in host memory but the ``gpu_whole`` tables. ``gpu_whole``:
    node attribute names kept whole in GPU memory, first out of the budget
    (``("y",)``: labels; see :meth:`HybridFeatureStore.from_sources`); the
    default, ``"auto"``, keeps the narrow tables (labels) whole where they
    take at most a quarter of the budget, ``()`` none.
    ``options``: host memory of every table (``copy``, ``host_dtype``,
    ``backing``, ``split``), as :meth:`HybridFeatureStore.from_sources` takes
    them. Raises TypeError for other inputs; ValueError when there is
    nothing to store, or naming an attribute whose rows match neither its
    node count nor (edge attributes) its edge count, with both sizes and the
    fix; KeyError for a name in ``attrs`` that ``Data`` lacks; and whatever
    HybridTensor raises for unusable sources. A keyword ``from_data`` does
    not take raises TypeError naming it (and the closest one it takes);
    ``device="cuda"`` where torch sees no GPU raises RuntimeError saying
    what to do, before any table is built.
    """
    checks.keywords("from_data", options, TABLE_OPTIONS, named=inspect.signature(from_data).parameters)
    device = resolve_device(device)
    edge_sources = {}
    if isinstance(data, HeteroData):
        graph_store = CSCGraphStore()
        for edge_type in data.edge_types:
            src, _, dst = edge_type
            _put_edges(graph_store, data[edge_type], edge_type, (data[src].num_nodes, data[dst].num_nodes))
            found = check_edge_attributes(data[edge_type], num_edges=data[edge_type].num_edges,
                                          where=f"edge type {edge_type!r}", ref=f"data[{edge_type!r}]")
            found = keep_edge_attributes(found, edge_attrs, f"edge type {edge_type!r}")
            edge_sources.update({(edge_type, name): value for name, value in found.items()})
        sources = {}
        for node_type in data.node_types:
            found = node_attributes(data[node_type], attrs, num_nodes=data[node_type].num_nodes, num_edges=None,
                                    where=f"node type {node_type!r}", ref=f"data[{node_type!r}]", strict=False)
            if not found:
                raise ValueError(
                    f"node type {node_type!r} has no node attributes{'' if attrs is None else f' among {attrs}'}; "
                    "PyG's loaders learn node types from the feature store, so give every type one "
                    "(e.g. data[node_type].x)")
            sources.update({(node_type, name): value for name, value in found.items()})
    elif isinstance(data, Data):
        graph_store = CSCGraphStore()
        _put_edges(graph_store, data, None, (data.num_nodes, data.num_nodes))
        found = node_attributes(data, attrs, num_nodes=data.num_nodes, num_edges=data.num_edges, where="the Data",
                                edges={})
        sources = {(None, name): value for name, value in found.items()}
        per_edge = per_edge_attributes(data, num_nodes=data.num_nodes, num_edges=data.num_edges)
        edge_sources = {(None, n): v for n, v in keep_edge_attributes(per_edge, edge_attrs, "the Data").items()}
        if not sources:
            raise ValueError("the Data object has no node attributes to store (x, y, ...)")
    else:
        raise TypeError(f"from_data takes a torch_geometric Data or HeteroData, got {type(data).__name__}")
    hotness = _ranking(hotness, gpu_budget, graph_store, sources, progress, device)
    feature_store = HybridFeatureStore.from_sources(sources, device, gpu_budget=gpu_budget, hotness=hotness,
                                                    max_sms=max_sms, progress=progress, gpu_whole=gpu_whole,
                                                    **options)
    if edge_sources:
        _put_edge_attributes(feature_store, graph_store, edge_sources, edge_gpu_budget, hotness, sources,
                             max_sms=max_sms, progress=progress, **options)
    return feature_store, graph_store


def _put_edge_attributes(feature_store, graph_store, edge_sources: dict, budget, hotness, sources: dict,
                         **options) -> None:
    """Edge tables into ``feature_store``; hottest edges by the hotness of the node they point to (default
    expected draws). The store is closed if this fails."""
    try:
        scores = None
        if budget is not None:
            nodes = _hotness(hotness, graph_store, sources)
            scores = edge_hotness(graph_store, nodes, {et for et, _ in edge_sources})
        feature_store.put_edge_tables(edge_sources, gpu_budget=budget, hotness=scores, **options)
    except BaseException:
        feature_store.close()
        raise


def from_tensors(*, edge_index=None, csr=None, csc=None, num_nodes: int | None = None, device=None,
                 gpu_budget="auto", hotness=None, max_sms: int | None = None, progress: bool = True, gpu_whole="auto",
                 **features) -> tuple[HybridFeatureStore, CSCGraphStore]:
    """``(feature_store, graph_store)`` of a homogeneous graph from host arrays, without a ``Data``.

    Topology, exactly one of: ``edge_index`` int [2, E] (COO, source row
    first), ``csr=(rowptr, col)`` or ``csc=(row, colptr)`` (kept as is, no
    copy when int64). ``features``: node attributes by name, e.g.
    ``x=np.load("feat.npy", mmap_mode="r"), y=labels``: each ``[num_nodes,
    ...]`` torch CPU tensor, numpy array or memmap, used in place.
    ``num_nodes`` defaults to the features' row count. ``device``,
    ``gpu_budget``, ``hotness`` and ``gpu_whole`` as in :func:`from_data`;
    so are the host-memory options of every table (``copy``, ``host_dtype``,
    ``compress``, ``layout``, ``backing``, ``split``: these names are options,
    never node attributes). Raises ValueError
    for a topology given twice or not at all, no features, or a feature
    whose rows are not ``num_nodes`` (naming it, both sizes and the fix);
    TypeError naming ``from_tensors`` for a keyword that misspells one of
    its parameters (``gpu_bugdet=``) rather than naming a node attribute.
    """
    options = {name: features.pop(name) for name in TABLE_OPTIONS if name in features}  # as from_data takes them
    given = [(name, v) for name, v in (("coo", edge_index), ("csr", csr), ("csc", csc)) if v is not None]
    if len(given) != 1:
        raise ValueError("pass the topology once: edge_index=..., csr=(rowptr, col) or csc=(row, colptr)")
    checks.misspelt("from_tensors", [k for k, v in features.items() if not hasattr(v, "shape")],
                    [*inspect.signature(from_tensors).parameters, *TABLE_OPTIONS])
    if not features:
        raise ValueError("pass node attributes by name, e.g. from_tensors(edge_index=ei, x=x, y=y)")
    counted = num_nodes is not None
    if num_nodes is None:
        first = next(iter(features.values()))
        num_nodes = first.shape[0] if getattr(first, "ndim", 0) else 0
    check_features(features, num_nodes, counted)
    layout, topology = given[0]
    graph_store = CSCGraphStore()
    graph_store.put_edge_index(topology, edge_type=None, layout=layout, size=(num_nodes, num_nodes))
    sources = {(None, name): value for name, value in features.items()}
    hotness = _ranking(hotness, gpu_budget, graph_store, sources, progress, device)
    feature_store = HybridFeatureStore.from_sources(sources, device, gpu_budget=gpu_budget, hotness=hotness,
                                                    max_sms=max_sms, progress=progress, gpu_whole=gpu_whole,
                                                    **options)
    return feature_store, graph_store


def _put_edges(graph_store: CSCGraphStore, store, edge_type, size: tuple[int, int]) -> None:
    """One edge type of a Data/HeteroData into the graph store, as CSC."""
    if getattr(store, "edge_index", None) is not None:
        graph_store.put_edge_index(store.edge_index, edge_type=edge_type, layout="coo", size=size)
    elif getattr(store, "adj_t", None) is not None:
        graph_store.put_edge_index(adj_t_as_csc(store.adj_t, size, f"edge type {edge_type!r}"), edge_type=edge_type,
                                   layout="csc", size=size)
    else:
        raise ValueError(f"edge type {edge_type!r} has neither edge_index nor adj_t")


def _ranks_rows(gpu_budget, hotness, device) -> bool:
    """Whether a store needs its nodes' hotness: a budget given (a typo raises here, on every device), except
    the default ``"auto"`` on a CPU with no hotness of the caller's to check (no GPU tier: no ranking needed)."""
    budget = parse_budget(gpu_budget)
    if hotness is not None:  # the caller's scores are checked on every device, with or without a budget
        return True
    if budget is None:
        return False
    return budget != "auto" or resolve_device(device).type == "cuda"


def _ranking(hotness, gpu_budget, graph_store: CSCGraphStore, sources: dict, progress: bool, device) -> dict | None:
    """The stores' hotness where the budget ranks rows (:func:`_ranks_rows`), else None; summed on ``device``."""
    return _hotness(hotness, graph_store, sources, progress, device) if _ranks_rows(gpu_budget, hotness, device) \
        else None


def _hotness(hotness, graph_store: CSCGraphStore, sources: dict, progress: bool = False, device=None) -> dict:
    """Node type -> score: the caller's, or how often one hop draws each node (see
    :func:`hmgstore.hotness.hotness_or_default` and :meth:`CSCGraphStore.expected_draws`)."""
    rows = {group: source.shape[0] for (group, _), source in sources.items()}
    if hotness is not None and not isinstance(hotness, dict):
        if list(rows) != [None]:
            raise ValueError("a heterogeneous graph needs hotness as {node_type: score}")
        hotness = {None: hotness}
    return hotness_or_default(hotness, lambda: graph_store.expected_draws(progress=progress, device=device), rows)
