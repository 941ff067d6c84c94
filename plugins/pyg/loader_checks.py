"""Stock PyG loaders built over hmgstore's objects: what PyG does not check, checked when the loader is built.

PyG's ``NeighborLoader`` and ``LinkNeighborLoader`` take hmgstore's store
pair and :class:`~hmgstore.plugins.pyg.HybridNeighborSampler` unchanged, but
(PyG 2.8, ``torch_geometric/loader/neighbor_loader.py`` and ``utils.py``):

- given ``neighbor_sampler=``, the loader passes none of ``num_neighbors``,
  ``replace``, ``disjoint``, ``subgraph_type``, ``time_attr`` or
  ``weight_attr`` to it, and keeps none of them: the sampler's own values are
  used, silently;
- over a ``(FeatureStore, GraphStore)`` pair PyG asserts (a bare
  ``AssertionError``) where a ``Data`` has a meaning: no ``input_nodes`` (a
  ``Data``: every node); ``input_nodes=(None, ids)``; an ``edge_label_index``
  that is None or a plain ``[2, E]`` tensor (a ``Data``: those edges, or all).
  ``input_nodes=(node_type, None)`` passes ``None`` on as the node type and
  ends in "Unable to accurately infer the number of nodes ... query None";
  ids that are not a torch tensor (a numpy array, a list, a range), which a
  ``Data`` takes, fall through every branch of its store path
  (``cannot unpack non-iterable NoneType object``, or an AssertionError for a
  list);
- PyG's own sampler needs pyg-lib or torch-sparse; without them it fails at
  the first batch: ``ImportError: 'NeighborSampler' requires either 'pyg-lib'
  or 'torch-sparse'``, after a 30-line traceback.

No call reaches hmgstore's objects while such a loader is built, and by the
first batch the loader's options are gone, so the one place to look is the
loader's constructor: :func:`install` (run when the first of hmgstore's
stores, or a ``HybridNeighborSampler``, is built; importing
:mod:`hmgstore.plugins.pyg` alone changes nothing) wraps ``NeighborLoader.__init__`` and
``LinkNeighborLoader.__init__``. The wrapper acts only when the sampler is a
``HybridNeighborSampler`` or the data an hmgstore store pair (a
:class:`HybridFeatureStore`, :class:`ClusterFeatureStore` or
:class:`CSCGraphStore` in it); anything else reaches PyG as given. It:

- warns (``UserWarning``) naming every option given to the loader that
  differs from its ``HybridNeighborSampler``'s, and which value is used;
- gives the stores what a ``Data`` means: ``input_nodes=None`` is every node,
  ``(None, ids)`` is ``ids``, ``(node_type, None)`` is ``node_type``, and on
  a homogeneous pair ``edge_label_index=tensor`` is ``(None, tensor)`` and
  None (or ``(None, None)``) is every edge in the order it was put. On
  heterogeneous stores, where no default is clear, it raises ValueError
  naming the node or edge types and what to pass;
- checks seed ids where they are given: numpy arrays, lists and ranges of
  ids become tensors (the batches of the same ids as a tensor), a numpy bool
  mask a torch one (a ``Data`` reads it as the ids 0 and 1), and every id is
  checked against its node type's count, floats refused (a ``Data``
  truncates them), an unknown node type named, before any batch is drawn;
- on stores that hold edge tables (:func:`from_data` of a ``Data`` with
  ``edge_attr``, or ``put_edge_tables``), puts the edge rows on every batch
  as a ``Data`` would (``batch.edge_attr``): the hooks of
  :func:`edge_features`, around the loader's own ``transform`` and
  ``transform_sampler_output``, unless ``**edge_features(stores)`` was
  passed already;
- without pyg-lib and torch-sparse, where the loader would build PyG's own
  sampler, samples with a CPU ``HybridNeighborSampler`` given the loader's
  options (``num_neighbors``, ``replace``, ``disjoint``, ``subgraph_type``,
  ``time_attr``, ``weight_attr``, ``temporal_strategy``; a warning says so;
  draws differ from PyG's).

What stays PyG's: a custom sampler over a plain ``Data`` gets the option
check only; PyG's other loaders (``HGTLoader``, ``ClusterLoader``, ...), and
a ``torch_geometric.sampler.NeighborSampler`` built by hand over the stores,
are not checked (the latter still raises PyG's ImportError at its first batch
without pyg-lib or torch-sparse). :func:`uninstall` puts PyG's constructors
back. The forms PyG itself takes over store pairs, which need no filling in::

    # homogeneous stores: the edge type is None
    loader = LinkNeighborLoader(stores, [10, 5], edge_label_index=(None, pairs), neg_sampling_ratio=1.0,
                                batch_size=1024)
    # heterogeneous stores: an edge type with its pairs, or the type alone for all its edges
    loader = LinkNeighborLoader(stores, [10, 5], edge_label_index=(("author", "writes", "paper"), pairs),
                                batch_size=1024)
    loader = NeighborLoader(stores, [10, 5], input_nodes=("paper", paper_ids), batch_size=1024)
"""
from __future__ import annotations

import functools
import inspect
import logging
import warnings

import numpy as np
import torch
import torch_geometric.typing
from torch_geometric.data import FeatureStore, GraphStore, remote_backend_utils
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader
from torch_geometric.sampler.base import NumNeighbors, SubgraphType

from hmgstore.rows import checks

from .cluster import ClusterFeatureStore
from .edge_features import EdgeFeatures, edge_features
from .feature_store import HybridFeatureStore
from .graph_store import CSCGraphStore
from .sampler import HybridNeighborSampler

log = logging.getLogger(__name__)

__all__ = ["install", "uninstall", "pyg_sampler_available", "PYG_SAMPLER_MISSING"]

#: What to do when PyG's own sampler is missing (shared with the examples and the docs).
PYG_SAMPLER_MISSING = ("PyG's own NeighborSampler needs pyg-lib or torch-sparse, and neither is installed: run "
                       "`make pyg-sampler` (builds torch-sparse, about 17 minutes on 2 cores), or pass "
                       "neighbor_sampler=HybridNeighborSampler(stores, num_neighbors) (hmgstore's sampler, no "
                       "compiled extension)")


def pyg_sampler_available() -> bool:
    """Whether PyG's own ``NeighborSampler`` can sample here (pyg-lib or torch-sparse imported).

    Returns:
        True where PyG found pyg-lib or torch-sparse when it was imported; False otherwise (the stores then
        sample with ``HybridNeighborSampler``).

    Raises:
        Nothing: it only reads the flags PyG set on import.
    """
    return bool(torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE)


# ---- what the loader was given ------------------------------------------------------------
def _hmgstore_pair(data) -> bool:

    return (isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], FeatureStore)
            and isinstance(data[1], GraphStore)
            and (isinstance(data[0], (HybridFeatureStore, ClusterFeatureStore)) or isinstance(data[1], CSCGraphStore)))


def _edge_types(graph_store) -> list:
    return [attr.edge_type for attr in graph_store.get_all_edge_attrs()]


def _node_types(feature_store) -> list:
    return sorted({attr.group_name for attr in feature_store.get_all_tensor_attrs()}, key=str)


def _num_nodes(data) -> int:
    """Node count of a homogeneous pair: its edges' size, else its first attribute's rows."""
    feature_store, graph_store = data
    for attr in graph_store.get_all_edge_attrs():
        if attr.size is not None:
            return max(attr.size)
    attrs = feature_store.get_all_tensor_attrs()
    if not attrs:
        raise ValueError("the stores hold neither edges nor node attributes; put them before building a loader")
    return feature_store.get_tensor_size(attrs[0])[0]


def _all_edges(graph_store) -> torch.Tensor:
    """int64 [2, E]: every edge of a homogeneous graph store, in the order it was put."""
    if isinstance(graph_store, CSCGraphStore):
        row, col = graph_store.edges(None).coo_in_given_order()
    else:
        row, col, _ = graph_store.coo()
    return torch.stack([row.long(), col.long()])


# ---- the checks -------------------------------------------------------------------------------
def _input_nodes(args: dict, data) -> None:
    """NeighborLoader over a store pair: ``input_nodes`` as a ``Data``/``HeteroData`` would read it, its ids
    checked against the node count of their type (PyG's store path takes torch tensors only: anything else
    falls through its branches into ``cannot unpack non-iterable NoneType``, or an ``AssertionError``)."""
    nodes = args.get("input_nodes")
    node_types = _node_types(data[0])
    homogeneous = None in _edge_types(data[1]) or node_types == [None]
    if nodes is None:
        if not homogeneous:
            raise ValueError(
                "NeighborLoader over heterogeneous stores needs input_nodes: a node type (all its nodes, e.g. "
                f"input_nodes={node_types[0]!r}) or (node type, ids); the stores hold node types {node_types}")
        args["input_nodes"] = torch.arange(_num_nodes(data))
        log.debug("input_nodes=None over a store pair: every node, as with a Data")
        return
    if isinstance(nodes, str):
        _known_node_type(nodes, node_types, homogeneous)
        return
    typed = isinstance(nodes, (tuple, list)) and len(nodes) == 2 and (nodes[0] is None or isinstance(nodes[0], str))
    node_type, ids = nodes if typed else (None, nodes)  # a list of ids (even two of them) is ids, as with a Data
    if node_type is None and not homogeneous:
        raise ValueError(f"input_nodes={'(None, ids)' if typed else 'ids'} names no node type, and these stores "
                         f"hold several: {node_types}; pass (node type, ids), e.g. ({node_types[0]!r}, ids)")
    if node_type is not None:
        _known_node_type(node_type, node_types, homogeneous)
    if ids is None:  # (node_type, None): every node of the type; PyG's store path loses the type
        args["input_nodes"] = torch.arange(_num_nodes(data)) if node_type is None else node_type
        return
    count = _num_nodes(data) if homogeneous else remote_backend_utils.num_nodes(data[0], data[1], node_type)
    seeds = _seeds(ids, count, "input_nodes" if node_type is None else f"input_nodes of {node_type!r}")
    args["input_nodes"] = seeds if node_type is None else (node_type, seeds)


def _known_node_type(node_type, node_types: list, homogeneous: bool) -> None:
    if not homogeneous and node_type not in node_types:
        raise ValueError(f"input_nodes names the node type {node_type!r}, which these stores do not hold; "
                         f"they hold {node_types}")


def _seeds(ids, num_nodes: int, name: str) -> torch.Tensor:
    """Seed ids as PyG's loader takes them over a ``Data``: ids (torch, numpy, list, range) or a bool mask of
    ``num_nodes`` entries; each id checked to lie in ``[0, num_nodes)`` (:func:`hmgstore.rows.checks.id_list`).

    A torch tensor is handed on as given; anything else becomes an int64 CPU tensor, and a numpy bool mask
    a torch bool mask (PyG's ``Data`` path turns it into the ids 0 and 1). Raises TypeError for floats (never
    truncated, as PyG's ``Data`` path truncates them) and other kinds, ValueError for a mask of another length
    or ids of another rank, IndexError naming the first id out of range.
    """
    mask = (isinstance(ids, np.ndarray) and ids.dtype == np.bool_) or \
        (isinstance(ids, torch.Tensor) and ids.dtype == torch.bool)
    if mask:
        if tuple(ids.shape) != (num_nodes,):
            raise ValueError(f"{name} is a bool mask of shape {tuple(ids.shape)}; a mask holds one entry per node, "
                             f"({num_nodes},); pass ids otherwise")
        return ids if isinstance(ids, torch.Tensor) else torch.from_numpy(np.array(ids))
    if isinstance(ids, range):
        ids = torch.arange(ids.start, ids.stop, ids.step, dtype=torch.int64)
    checked = checks.id_list(ids, name, num_nodes)
    return ids if isinstance(ids, torch.Tensor) else checked


def _edge_label_index(args: dict, data) -> None:
    """LinkNeighborLoader over a store pair: ``edge_label_index`` as a ``Data``/``HeteroData`` would read it."""
    edges = args.get("edge_label_index")
    edge_types = _edge_types(data[1])
    homogeneous = None in edge_types
    if homogeneous:
        if edges is None or (isinstance(edges, (tuple, list)) and len(edges) == 2 and edges[0] is None
                             and edges[1] is None):
            args["edge_label_index"] = (None, _all_edges(data[1]))
        elif isinstance(edges, torch.Tensor):
            args["edge_label_index"] = (None, edges)
        return
    if edges is None or isinstance(edges, torch.Tensor):
        raise ValueError(
            "LinkNeighborLoader over heterogeneous stores needs edge_label_index=(edge type, [2, E] tensor), or "
            f"an edge type alone for all its edges (e.g. edge_label_index={edge_types[0]!r}); the stores hold "
            f"edge types {edge_types}")


_OPTIONS = ("num_neighbors", "replace", "disjoint", "subgraph_type", "time_attr", "weight_attr", "temporal_strategy")


def _option_differences(sampler, given: dict) -> list[str]:
    """``name=loader's value (the sampler's: value)`` for each option given to the loader that the sampler
    does not share."""
    out = []
    for name in _OPTIONS:
        if name not in given:
            continue
        value = given[name]
        if name == "num_neighbors":
            key = sampler.edge_types if sampler.is_hetero else None
            try:
                differ = NumNeighbors(value)._get_values(key) != sampler.num_neighbors._get_values(key)
            except (TypeError, ValueError):
                differ = True
            mine = sampler.num_neighbors.values
        elif name in ("time_attr", "weight_attr", "temporal_strategy"):
            mine = getattr(sampler, name)
            differ = value != mine and not (name == "temporal_strategy" and mine is None)
        elif name == "subgraph_type":
            differ, mine = SubgraphType(value) != sampler.subgraph_type, sampler.subgraph_type.value
        else:
            mine = getattr(sampler, name)
            differ = bool(value) != bool(mine)
        if differ:
            out.append(f"{name}={value!r} (the sampler's: {mine!r})")
    return out


def _check_sampler_options(loader_name: str, sampler, given: dict) -> None:
    differences = _option_differences(sampler, given)
    if differences:
        warnings.warn(
            f"{loader_name}: options given to the loader differ from its neighbor_sampler's: "
            f"{', '.join(differences)}. PyG does not pass loader options to a custom sampler, so the sampler's "
            "values are used; give them to HybridNeighborSampler(...) instead and drop them from the loader",
            UserWarning, stacklevel=4)


def _sampler_for_missing_pyg(loader_name: str, args: dict):
    """A CPU HybridNeighborSampler with the loader's options, where PyG's own sampler cannot run."""
    subgraph_type = SubgraphType(args.get("subgraph_type", "directional"))
    if args.get("directed", True) is False:
        subgraph_type = SubgraphType.induced
    warnings.warn(f"{loader_name}: {PYG_SAMPLER_MISSING}. Sampling with HybridNeighborSampler on the CPU, "
                  "with the loader's num_neighbors, replace, disjoint, subgraph_type, time_attr, weight_attr and "
                  "temporal_strategy (the same distribution, other draws than PyG's)", UserWarning, stacklevel=4)
    return HybridNeighborSampler(args["data"], args["num_neighbors"], replace=args.get("replace", False),
                                 disjoint=args.get("disjoint", False), subgraph_type=subgraph_type, device="cpu",
                                 time_attr=args.get("time_attr"), weight_attr=args.get("weight_attr"),
                                 temporal_strategy=args.get("temporal_strategy", "uniform"), progress=False)


def _check(loader_name: str, args: dict) -> None:
    """Look at (and where said above, complete) a loader's arguments before PyG's constructor sees them."""
    given = dict(args)  # what the caller passed, before anything is filled in
    data, sampler = args.get("data"), args.get("neighbor_sampler")
    if isinstance(sampler, HybridNeighborSampler):
        _check_sampler_options(loader_name, sampler, given)
    if not _hmgstore_pair(data):
        return
    if loader_name == "NeighborLoader":
        _input_nodes(args, data)
    else:
        _edge_label_index(args, data)
    _edge_attributes(args, data)
    if sampler is None and not pyg_sampler_available():
        args["neighbor_sampler"] = _sampler_for_missing_pyg(loader_name, args)


def _edge_attributes(args: dict, data) -> None:
    """Stores holding edge tables: their rows ride on every batch (``batch.edge_attr``, ...) as they do from a
    ``Data``, through :func:`edge_features`' hooks, wrapped around the caller's own ``transform`` and
    ``transform_sampler_output``; already given (``**edge_features(stores)``): left as they are."""
    feature_store = data[0]
    tables = feature_store.edge_tables() if callable(getattr(feature_store, "edge_tables", None)) else {}
    if not tables or isinstance(args.get("transform"), EdgeFeatures):
        return
    args.update(edge_features(data, transform=args.get("transform"),
                              transform_sampler_output=args.get("transform_sampler_output")))


# ---- installing the check -----------------------------------------------------------------------
def _wrapped(cls):
    original = cls.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # PyG's own message for a bad call
            return original(self, *args, **kwargs)
        _check(cls.__name__, bound.arguments)
        return original(*bound.args, **bound.kwargs)

    __init__.__hmgstore_original__ = original
    return __init__


def install() -> None:
    """Wrap ``NeighborLoader.__init__`` and ``LinkNeighborLoader.__init__`` with the checks above (once)."""
    for cls in (NeighborLoader, LinkNeighborLoader):
        if not hasattr(cls.__init__, "__hmgstore_original__"):
            cls.__init__ = _wrapped(cls)


def uninstall() -> None:
    """Give PyG's loaders their own constructors back."""
    for cls in (NeighborLoader, LinkNeighborLoader):
        original = getattr(cls.__init__, "__hmgstore_original__", None)
        if original is not None:
            cls.__init__ = original
