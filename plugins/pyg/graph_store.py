"""CSCGraphStore: a PyG ``GraphStore`` that holds each edge type as CSC.

PyG's neighbour samplers read the topology once, as CSC ``(row, colptr,
perm)`` on the CPU, from ``graph_store.csc()``. This store converts whatever
it is given (COO ``edge_index``, CSR or CSC) to that form when it is put, so
``csc()`` answers from what it holds without converting again:

- ``row``: int64 [E], source node of each edge, edges grouped by destination;
- ``colptr``: int64 [num_dst + 1], edges of destination ``v`` are
  ``row[colptr[v]:colptr[v + 1]]``;
- ``perm``: int64 [E] or None, position in the given edge list of each CSC
  edge (None when the input was CSC or COO already sorted by destination),
  so that PyG's ``e_id`` refers to the caller's edge ids.

COO input is sorted with the function PyG itself uses on a ``Data`` object,
so a sampler draws exactly the neighbours it would draw from the ``Data``
(same CSC order, same random draws). Homogeneous graphs use edge type
``None``; heterogeneous graphs one ``(src, rel, dst)`` tuple per edge type.
Everything lives in host memory (PyG samples on the CPU).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch_geometric.data import EdgeAttr, GraphStore
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.utils import index_sort

from hmgstore.graph import CSC, expected_draws, index2ptr
from hmgstore.graph import to_csc as _to_csc
from hmgstore.graph.topology import checked_perm
from hmgstore.rows import checks
from hmgstore.util.device import resolve_device

from .sampler_checks import store_node_counts

__all__ = ["CSC", "CSCGraphStore", "to_csc"]


def pyg_sort(col: torch.Tensor, num_dst: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PyG's own sort of edges by destination (sampler/utils.py: sort_csc), so the CSC order
    matches what PyG builds from a ``Data`` and the same seeds draw the same neighbours."""
    return index_sort(col, max_value=num_dst)


def _as_csr(csc: CSC) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rowptr, col, perm)`` of ``csc``'s edges grouped by source (PyG's sort, stable), ``perm`` in given ids."""
    row, col = csc.coo_in_given_order()
    row, perm = index_sort(row, max_value=csc.size[0])
    return index2ptr(row, csc.size[0]), col[perm], perm


def adj_t_as_csc(adj_t, size: tuple[int, int], what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, colptr)`` of the graph a PyG ``adj_t`` holds (the transposed adjacency, a row per destination), whose
    CSR is the graph's CSC: a ``torch_sparse.SparseTensor``, or a torch sparse CSR or COO tensor (PyG's
    ``ToSparseTensor(layout=...)``). TypeError naming ``what`` for anything else, and ValueError for a shape other
    than ``(num_dst, num_src)`` of ``size``."""
    shape = tuple(adj_t.sizes()) if hasattr(adj_t, "sizes") else tuple(getattr(adj_t, "shape", ()))
    if shape != (size[1], size[0]):
        raise ValueError(f"{what}: adj_t has shape {shape}, not (destinations, sources) = {(size[1], size[0])}")
    if hasattr(adj_t, "csr"):  # torch_sparse.SparseTensor
        colptr, row, _ = adj_t.csr()
        return row, colptr
    if isinstance(adj_t, torch.Tensor) and adj_t.layout == torch.sparse_csr:
        return adj_t.col_indices(), adj_t.crow_indices()
    if isinstance(adj_t, torch.Tensor) and adj_t.layout == torch.sparse_coo:
        dst, src = adj_t.coalesce().indices()  # sorted by destination, then source: CSC order
        return src, index2ptr(dst, size[1])
    raise TypeError(f"{what}: adj_t is a {type(adj_t).__name__}"
                    f"{f' ({adj_t.layout})' if isinstance(adj_t, torch.Tensor) else ''}; pass a "
                    "torch_sparse.SparseTensor, a torch sparse CSR or COO tensor, or edge_index")


#: What :func:`check_loaders` runs: :func:`hmgstore.plugins.pyg.loader_checks.install`, set by the package
#: (that module imports this one, so it cannot be imported from here).
install_loader_checks: Callable[[], None] = lambda: None


def check_loaders() -> None:
    """Install the checks of PyG's loaders built over hmgstore's objects (:mod:`.loader_checks`), once.

    Called where such an object is built (the stores, and the CSC every ``HybridNeighborSampler`` builds), so
    that importing the adapter leaves PyG's loaders alone until they can meet hmgstore's objects.
    """
    install_loader_checks()


def to_csc(edge_index, layout, size=None, is_sorted: bool = False) -> CSC:
    """One edge type as :class:`CSC`, edges in PyG's order (see :func:`pyg_sort`).

    Args:
        edge_index: ``"coo"``: an integer ``[2, E]`` tensor or numpy array, or a pair ``(row, col)``; ``"csr"``:
            ``(rowptr, col)``; ``"csc"``: ``(row, colptr)``. Integer tensors on any device (int64 CPU kept
            without a copy); E may be 0.
        layout: ``"coo"``, ``"csr"`` or ``"csc"`` (or PyG's ``EdgeLayout``).
        size: ``(num_src, num_dst)``, integers >= 0 (None, or a None entry: inferred from the ids).
        is_sorted: COO edges already sorted by destination (checked; saves the sort). Not for CSR.

    Returns:
        The :class:`CSC`: int64 CPU ``row``, ``colptr``, ``perm`` (None when no reordering was needed).

    Raises:
        TypeError: a non-string layout, a size that is not a pair of integers (floats, bools), a non-bool
            ``is_sorted``, an ``edge_index`` that is neither a tensor, an array nor a pair, float ids.
        ValueError: a layout other than coo/csr/csc, a negative size, a COO tensor not ``[2, E]`` (another
            rank or first dimension), parts of another rank or of different lengths, offsets that disagree with
            ``size`` or the edge count, ``is_sorted=True`` for CSR or for COO edges not sorted by destination.
        IndexError: a node id outside ``[0, size)`` (negative included).
    """
    check_loaders()  # the topology of a HybridNeighborSampler or a CSCGraphStore: a loader may be next
    return _to_csc(edge_index, layout, size, is_sorted, sort=pyg_sort)


class CSCGraphStore(GraphStore):
    """A ``torch_geometric.data.GraphStore`` over host CSC topology, one entry per edge type.

    Put edges with PyG's usual call, e.g. ``store.put_edge_index(edge_index,
    edge_type=None, layout="coo", size=(N, N))``; any layout is stored as
    :class:`CSC`. ``csc()`` returns the stored ``(row, colptr, perm)`` (dicts
    keyed by edge type for heterogeneous graphs) without a copy. Every layout
    numbers edges as they were put, as batches' ``e_id`` and the edge tables
    do: ``coo()`` gives them in that order (``perm`` None), ``csr()`` and
    ``csc()`` a ``perm`` of those ids; ``get_edge_index`` answers every
    layout alike (CSR converted on each call).

    Homogeneous (edge type None) or heterogeneous (``(src, rel, dst)`` edge types), not both. The constructor
    takes no arguments.

    Raises:
        TypeError: from ``put_edge_index``, a keyword other than ``edge_type``, ``layout``, ``is_sorted``,
            ``size`` (naming ``put_edge_index``), and the TypeErrors of :func:`to_csc`; from ``put_csc``,
            anything but a :class:`CSC`.
        ValueError: from ``put_edge_index``/``put_csc``, an edge type None beside typed ones (or the reverse),
            a layout PyG does not know, and the ValueErrors of :func:`to_csc`; from ``csc(edge_types)``,
            edge types the store does not hold.
        IndexError: from ``put_edge_index``, node ids outside ``size`` (:func:`to_csc`).
        KeyError: ``csc()`` of an empty store; ``edges(edge_type)`` of a type not held.
    """

    def __init__(self):
        super().__init__()
        check_loaders()
        self._edges: dict = {}  # edge type (None when homogeneous) -> CSC

    # ---- PyG's CRUD ---------------------------------------------------------
    def put_edge_index(self, edge_index, *args, **kwargs) -> bool:
        """PyG's ``put_edge_index(edge_index, edge_type=..., layout=..., size=..., is_sorted=...)`` (or an
        ``EdgeAttr``), converted by :func:`to_csc`; see the class docstring for what it raises."""
        # PyG's own refusal names EdgeAttr.__init__, which the caller never called
        checks.keywords("put_edge_index", kwargs, ("edge_type", "layout", "is_sorted", "size"),
                        named=("edge_index",))
        return super().put_edge_index(edge_index, *args, **kwargs)

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        edge_type = edge_attr.edge_type
        if self._edges and (edge_type is None) != (next(iter(self._edges)) is None):
            raise ValueError("a graph store is homogeneous (edge_type=None) or heterogeneous "
                             "((src, rel, dst) edge types), not both")
        self._edges[edge_type] = to_csc(edge_index, edge_attr.layout, edge_attr.size, edge_attr.is_sorted)
        return True

    def _get_edge_index(self, edge_attr: EdgeAttr):
        csc = self._edges.get(edge_attr.edge_type)
        if csc is None:
            return None
        if edge_attr.layout == EdgeLayout.CSC:
            return csc.row, csc.colptr
        if edge_attr.layout == EdgeLayout.COO:  # in the order the edges were put (edge_label pairs with it)
            return csc.coo_in_given_order()
        return _as_csr(csc)[:2]  # not held: converted

    def put_csc(self, csc: CSC, edge_type=None) -> None:
        """Hold ``csc`` (a :class:`hmgstore.graph.CSC`, e.g. built straight in CSC form) for
        ``edge_type`` as it is: no copy, its ``row`` kept in its own dtype; its lengths were checked when it was
        built, its ids are not scanned. Its ``perm`` is checked to list every edge id once (one pass): PyG's own
        sampler hands its entries out as batches' ``e_id``. Raises TypeError for anything but a CSC, ValueError
        for an edge type None beside typed ones (or the reverse) and for a perm that is not a permutation."""
        if not isinstance(csc, CSC):
            raise TypeError(f"put_csc takes an hmgstore.graph.CSC, got {type(csc).__name__}; "
                            "put_edge_index converts tensors")
        if self._edges and (edge_type is None) != (next(iter(self._edges)) is None):
            raise ValueError("a graph store is homogeneous (edge_type=None) or heterogeneous "
                             "((src, rel, dst) edge types), not both")
        checked_perm(csc)
        self._edges[edge_type] = csc

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return self._edges.pop(edge_attr.edge_type, None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """Fresh ``EdgeAttr(edge_type, "csc", size=(num_src, num_dst))`` objects (PyG may mutate them)."""
        return [EdgeAttr(edge_type, EdgeLayout.CSC, size=csc.size) for edge_type, csc in self._edges.items()]

    # ---- answered from what is held -----------------------------------------
    def csc(self, edge_types=None, store: bool = False):
        """``(row, colptr, perm)`` as held; dicts keyed by edge type when heterogeneous. ``store``: ignored (CSC is
        what is held)."""
        return self._each_type(edge_types, lambda csc: (csc.row, csc.colptr, csc.perm))

    def coo(self, edge_types=None, store: bool = False):
        """``(row, col, None)``: every edge in the order it was put, so that position ``i`` is edge id ``i``, as
        ``e_id`` and the edge tables number them (PyG's own conversion from CSC would list them in CSC order and
        still say ``perm`` None); dicts keyed by edge type when heterogeneous. ``store``: ignored."""
        return self._each_type(edge_types, lambda csc: (*csc.coo_in_given_order(), None))

    def csr(self, edge_types=None, store: bool = False):
        """``(rowptr, col, perm)``, ``perm[i]`` the id (the order edges were put) of the ``i``-th CSR edge, as PyG
        gives it for a graph put as COO; dicts keyed by edge type when heterogeneous. ``store``: ignored."""
        return self._each_type(edge_types, _as_csr)

    def _each_type(self, edge_types, convert):
        """``convert(csc)`` of the homogeneous graph, or of each of ``edge_types`` (all when None) as three
        dicts."""
        if not self._edges:
            raise KeyError("the graph store holds no edges; put_edge_index(...) first")
        if None in self._edges:
            return convert(self._edges[None])
        if edge_types is None:
            edge_types = list(self._edges)
        missing = [t for t in edge_types if t not in self._edges]
        if missing:
            raise ValueError(f"edge types {missing} are not in the graph store (it holds {list(self._edges)})")
        out = {t: convert(self._edges[t]) for t in edge_types}
        return tuple({t: parts[i] for t, parts in out.items()} for i in range(3))

    def edges(self, edge_type=None) -> CSC:
        """The :class:`CSC` held for ``edge_type`` (KeyError if absent)."""
        try:
            return self._edges[edge_type]
        except KeyError:
            raise KeyError(f"no edges of type {edge_type!r}; the store holds {list(self._edges)}") from None

    @property
    def edge_types(self) -> list:
        return list(self._edges)

    def in_degree(self) -> dict:
        """Node type -> int64 in-degree over every edge type into it (key None when homogeneous). Raises
        ValueError when edge types disagree on a node type's count (put without ``size``), naming the fix."""
        store_node_counts(self._edges)  # a sum over edge types needs one count per node type
        degree: dict = {}
        for edge_type, csc in self._edges.items():
            dst = None if edge_type is None else edge_type[-1]
            d = csc.in_degree()
            degree[dst] = d if dst not in degree else degree[dst] + d
        return degree

    def expected_draws(self, progress: bool = False, device=None) -> dict:
        """Node type -> float64 score: how often one hop draws each node as a neighbour over every edge type
        out of it (:func:`hmgstore.graph.expected_draws`; key None when homogeneous), the stores' default
        hotness. Summed on ``device`` when that is a GPU with room for it (the CPU otherwise: same answer).
        Raises ValueError when edge types disagree on a node type's count, as :meth:`in_degree` does."""
        store_node_counts(self._edges)
        device = resolve_device(device)
        draws: dict = {}
        for edge_type, csc in self._edges.items():
            src = None if edge_type is None else edge_type[0]
            try:
                d = expected_draws(csc, progress=progress, device=device)
            except torch.cuda.OutOfMemoryError:  # the GPU is full: its sums are the CPU's, bit for bit
                d = expected_draws(csc, progress=progress)
            draws[src] = d if src not in draws else draws[src] + d
        return draws

    def __repr__(self) -> str:
        held = ", ".join(f"{t}: {c.num_edges} edges {c.size}" for t, c in self._edges.items())
        return f"CSCGraphStore({held})"
