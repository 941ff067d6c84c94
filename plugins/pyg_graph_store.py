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

from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, GraphStore
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.index import index2ptr, ptr2index
from torch_geometric.utils import index_sort


@dataclass(frozen=True)
class CSC:
    """One edge type's topology (see the module docstring); ``size`` is ``(num_src, num_dst)``."""

    row: torch.Tensor
    colptr: torch.Tensor
    perm: torch.Tensor | None
    size: tuple[int, int]

    @property
    def num_edges(self) -> int:
        return self.row.numel()

    def in_degree(self) -> torch.Tensor:
        """int64 [num_dst]: edges into each destination node."""
        return self.colptr.diff()


def _as_index(tensor, what: str) -> torch.Tensor:
    """A 1-D int64 CPU tensor (converted only when it is not one already)."""
    if not isinstance(tensor, torch.Tensor):
        tensor = torch.as_tensor(tensor)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer node ids or offsets, got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor.to("cpu", torch.int64)


def _check_ids(ids: torch.Tensor, bound: int | None, what: str) -> int:
    """``bound`` (or ``max + 1`` when None) after checking every id is in ``[0, bound)``."""
    if ids.numel() == 0:
        return bound or 0
    lo, hi = (int(v) for v in torch.aminmax(ids))
    if bound is None:
        bound = hi + 1
    if lo < 0 or hi >= bound:
        raise IndexError(f"{what} holds node id {lo if lo < 0 else hi}, outside [0, {bound}); "
                         "pass the right size=(num_src_nodes, num_dst_nodes)")
    return bound


def _check_ptr(ptr: torch.Tensor, num_edges: int, what: str) -> None:
    if ptr.numel() == 0 or int(ptr[0]) != 0 or int(ptr[-1]) != num_edges or bool((ptr.diff() < 0).any()):
        raise ValueError(f"{what} must start at 0, never decrease and end at the number of edges ({num_edges})")


def to_csc(edge_index, layout, size=None, is_sorted: bool = False) -> CSC:
    """Convert one edge type to :class:`CSC`.

    ``edge_index``: for ``layout="coo"`` a ``[2, E]`` tensor or a pair
    ``(row, col)``; for ``"csr"`` a pair ``(rowptr, col)``; for ``"csc"`` a
    pair ``(row, colptr)``. Integer tensors (int64 is kept without a copy;
    other dtypes and devices are converted). ``size``: ``(num_src, num_dst)``,
    inferred from the ids when None. ``is_sorted``: COO edges already sorted
    by destination (checked; saves the sort).
    Raises TypeError/ValueError for malformed input, IndexError for ids
    outside ``size``.
    """
    layout = EdgeLayout(layout)
    num_src, num_dst = size if size is not None else (None, None)
    if isinstance(edge_index, np.ndarray):
        edge_index = torch.from_numpy(edge_index)
    if isinstance(edge_index, torch.Tensor) and layout == EdgeLayout.COO:
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"a COO edge_index must have shape [2, num_edges], got {tuple(edge_index.shape)}")
    elif not (isinstance(edge_index, (tuple, list)) and len(edge_index) == 2):
        raise TypeError(f"a {layout.value.upper()} edge index is a pair of 1-D tensors, "
                        f"got {type(edge_index).__name__}")
    first, second = edge_index[0], edge_index[1]

    if layout == EdgeLayout.CSC:
        row, colptr = _as_index(first, "row"), _as_index(second, "colptr")
        _check_ptr(colptr, row.numel(), "colptr")
        if num_dst is not None and colptr.numel() != num_dst + 1:
            raise ValueError(f"colptr has {colptr.numel()} entries for {num_dst} destination nodes (needs num_dst + 1)")
        num_src = _check_ids(row, num_src, "row")
        return CSC(row, colptr, None, (num_src, colptr.numel() - 1))

    if layout == EdgeLayout.CSR:
        rowptr, col = _as_index(first, "rowptr"), _as_index(second, "col")
        _check_ptr(rowptr, col.numel(), "rowptr")
        if num_src is not None and rowptr.numel() != num_src + 1:
            raise ValueError(f"rowptr has {rowptr.numel()} entries for {num_src} source nodes (needs num_src + 1)")
        row, num_src, is_sorted = ptr2index(rowptr), rowptr.numel() - 1, False
    else:
        row, col = _as_index(first, "edge_index[0]"), _as_index(second, "edge_index[1]")
        if row.numel() != col.numel():
            raise ValueError(f"row and col differ in length ({row.numel()} and {col.numel()})")
        num_src = _check_ids(row, num_src, "edge_index[0]")
    num_dst = _check_ids(col, num_dst, "edge_index[1]" if layout == EdgeLayout.COO else "col")

    if is_sorted:
        if bool((col.diff() < 0).any()):
            raise ValueError("is_sorted=True but the edges are not sorted by destination (edge_index[1])")
        perm = None
    else:  # PyG's own sort (sampler/utils.py: sort_csc), so the CSC order matches a Data's
        col, perm = index_sort(col, max_value=num_dst)
        row = row[perm]
    return CSC(row, index2ptr(col, num_dst), perm, (num_src, num_dst))


class CSCGraphStore(GraphStore):
    """A ``torch_geometric.data.GraphStore`` over host CSC topology, one entry per edge type.

    Put edges with PyG's usual call, e.g. ``store.put_edge_index(edge_index,
    edge_type=None, layout="coo", size=(N, N))``; any layout is stored as
    :class:`CSC`. ``csc()`` returns the stored ``(row, colptr, perm)`` (dicts
    keyed by edge type for heterogeneous graphs) without a copy.
    ``get_edge_index`` answers ``"csc"`` and ``"coo"`` (edges in the order they were put);
    ``coo()``/``csr()`` convert.
    """

    def __init__(self):
        super().__init__()
        self._edges: dict = {}  # edge type (None when homogeneous) -> CSC

    # ---- PyG's CRUD ---------------------------------------------------------
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
            row, col = csc.row, ptr2index(csc.colptr, output_size=csc.num_edges)
            if csc.perm is None:
                return row, col
            put_order = torch.empty_like(csc.perm)
            put_order[csc.perm] = torch.arange(csc.num_edges, device=csc.perm.device)
            return row[put_order], col[put_order]
        return None  # CSR is not held: csr() converts

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return self._edges.pop(edge_attr.edge_type, None) is not None

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """Fresh ``EdgeAttr(edge_type, "csc", size=(num_src, num_dst))`` objects (PyG may mutate them)."""
        return [EdgeAttr(edge_type, EdgeLayout.CSC, size=csc.size) for edge_type, csc in self._edges.items()]

    # ---- answered from what is held -----------------------------------------
    def csc(self, edge_types=None, store: bool = False):
        """``(row, colptr, perm)`` as held; dicts keyed by edge type when heterogeneous."""
        if not self._edges:
            raise KeyError("the graph store holds no edges; put_edge_index(...) first")
        if None in self._edges:
            csc = self._edges[None]
            return csc.row, csc.colptr, csc.perm
        if edge_types is None:
            edge_types = list(self._edges)
        missing = [t for t in edge_types if t not in self._edges]
        if missing:
            raise ValueError(f"edge types {missing} are not in the graph store (it holds {list(self._edges)})")
        return ({t: self._edges[t].row for t in edge_types}, {t: self._edges[t].colptr for t in edge_types},
                {t: self._edges[t].perm for t in edge_types})

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
        """Node type -> int64 in-degree over every edge type into it (key None when homogeneous)."""
        degree: dict = {}
        for edge_type, csc in self._edges.items():
            dst = None if edge_type is None else edge_type[-1]
            d = csc.in_degree()
            degree[dst] = d if dst not in degree else degree[dst] + d
        return degree

    def __repr__(self) -> str:
        held = ", ".join(f"{t}: {c.num_edges} edges {c.size}" for t, c in self._edges.items())
        return f"CSCGraphStore({held})"
