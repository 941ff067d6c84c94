"""Graph topology as CSC, framework-free: what samplers read.

One edge type is held as :class:`CSC`:

- ``row``: int64 [E], source node of each edge, edges grouped by destination;
- ``colptr``: int64 [num_dst + 1], edges of destination ``v`` are
  ``row[colptr[v]:colptr[v + 1]]``;
- ``perm``: int64 [E] or None, position in the given edge list of each CSC
  edge (None when the input was CSC, or COO already sorted by destination),
  so that sampled edge ids refer to the caller's edge ids.

:func:`to_csc` converts COO, CSR or CSC input, with as few copies as the input
allows (int64 CSC input is kept as it is). Everything here is torch on the
CPU; framework adapters build on it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..rows import checks
from ..rows.ids import check_range

LAYOUTS = ("coo", "csr", "csc")
_FLOAT32_SMALLEST = 2.0 ** -149  # float32's smallest positive (subnormal) number: anything below casts to 0


#: Integer dtypes torch stores but cannot add or compare on the CPU.
_NO_ARITHMETIC = (torch.uint16, torch.uint32, torch.uint64)
#: Integer dtypes a CSC widens to int64 (losslessly): torch's CPU sampling kernels have no 8- or 16-bit versions.
_WIDENED = (torch.int8, torch.int16, torch.uint8)


@dataclass(frozen=True, eq=False)
class CSC:
    """One edge type's topology (see the module docstring); ``size`` is ``(num_src, num_dst)``.

    Args:
        row: 1-D integer tensor [E] (int32 or int64; int8, int16 and uint8
            are widened to int64), the source of each edge, each in
            ``[0, num_src)``.
        colptr: 1-D integer tensor [num_dst + 1]: starts at 0, never
            decreases, ends at E (copied as int64: the CSC's offsets are its
            own).
        perm: None, or a 1-D integer tensor [E] (widened as ``row``): the given edge id of each
            CSC edge, a permutation of ``range(E)`` (checked where it is
            inverted, :meth:`coo_in_given_order`, and where a
            :class:`~hmgstore.graph.Topology` takes it for a sampler).
        size: ``(num_src, num_dst)``, two integers >= 0.

    Raises:
        TypeError: ``row``, ``colptr`` or ``perm`` not a tensor, or holding
            floats, bools or unsigned integers wider than 8 bits (torch
            cannot do arithmetic on them); ``size`` not a pair of integers.
        ValueError: ``size`` not of two sizes >= 0; a tensor not 1-D;
            ``colptr`` not ``num_dst + 1`` offsets from 0 to E that never
            decrease; ``perm`` not of length E.
        IndexError: a ``row`` id outside ``[0, num_src)``.
    """

    row: torch.Tensor
    colptr: torch.Tensor
    perm: torch.Tensor | None
    size: tuple[int, int]

    def __post_init__(self):
        size = checks.shape(self.size, "size")
        if len(size) != 2:
            raise ValueError(f"size is (num_src, num_dst), got {self.size!r}")
        object.__setattr__(self, "size", size)
        for name in ("row", "colptr", "perm"):
            value = getattr(self, name)
            if not (isinstance(value, torch.Tensor) or (name == "perm" and value is None)):
                raise TypeError(f"CSC's {name} is a 1-D integer tensor, got {type(value).__name__}")
            if value is not None and value.dtype in _NO_ARITHMETIC:  # torch has no add/min/max for them
                raise TypeError(f"CSC's {name} has dtype {value.dtype}, which torch cannot add or compare on the "
                                f"CPU; pass {name}.long() (to_csc converts it for you)")
        checks.integers(self.row, "row")
        checks.integers(self.colptr, "colptr")  # before the cast below: floats refused, never truncated
        for name in ("row", "perm"):  # torch's CPU kernels (repeat_interleave, sorts) lack 8- and 16-bit ints
            value = getattr(self, name)
            if value is not None and value.dtype in _WIDENED:
                object.__setattr__(self, name, value.long())
        # Offsets copied as int64 (8 bytes a node), then checked: samplers trust them for every read of row, so an
        # edit of the caller's tensor afterwards must not reach them (it made the CPU sampler read past row).
        object.__setattr__(self, "colptr", self.colptr.to(torch.int64, copy=True))
        checks.offsets(self.colptr, "colptr", self.row.numel(), length=size[1] + 1)
        try:
            check_range(self.row, size[0])
        except IndexError as err:
            raise IndexError(f"row holds a source id outside [0, {size[0]}) (num_src): {err}") from None
        if self.perm is not None and checks.integers(self.perm, "perm").numel() != self.row.numel():
            raise ValueError(f"perm holds {self.perm.numel()} edge ids for {self.row.numel()} edges")

    @classmethod
    def trusted(cls, row: torch.Tensor, colptr: torch.Tensor, perm: torch.Tensor | None,
                size: tuple[int, int]) -> CSC:
        """A CSC of parts its builder has already checked or made valid (:func:`to_csc`, a reorder of a
        CSC's edges): no second scan of every id and offset, which costs seconds at papers100M's size."""
        csc = object.__new__(cls)
        for name, value in (("row", row), ("colptr", colptr), ("perm", perm), ("size", (int(size[0]), int(size[1])))):
            object.__setattr__(csc, name, value)
        return csc

    @property
    def num_edges(self) -> int:
        return self.row.numel()

    def in_degree(self) -> torch.Tensor:
        """int64 [num_dst]: edges into each destination node."""
        return self.colptr.diff()

    def col(self) -> torch.Tensor:
        """int64 [E]: destination of each edge, in CSC order."""
        return ptr2index(self.colptr, self.num_edges)

    def coo_in_given_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row, col)`` of every edge, in the order the edges were given."""
        row, col = self.row, self.col()
        if self.perm is None:
            return row, col
        given = checks.inverse(checks.permutation(self.perm, self.num_edges, "perm")).to(row.device)
        return row[given], col[given]


def index2ptr(index, size: int) -> torch.Tensor:
    """Offsets of sorted ids: CSR/CSC compression, the inverse of :func:`ptr2index`.

    Args:
        index: 1-D integer tensor (or numpy array, list) of ids sorted in
            ascending order, each in ``[0, size)``; any device.
        size: the number of ids (nodes), an integer >= 0.

    Returns:
        int64 [size + 1] on ``index``'s device: entry ``v`` is the number of
        ids below ``v``.

    Raises:
        TypeError: ``size`` not an integer; ``index`` of floats or bools.
        ValueError: ``index`` not 1-D, or not sorted.
        IndexError: an id outside ``[0, size)``.
    """
    size = checks.count(size, "size")
    index = checks.integers(index, "index")
    falls = (index.diff() < 0).nonzero()
    if len(falls):
        raise ValueError(f"index must be sorted in ascending order; entry {int(falls[0, 0]) + 1} is smaller than "
                         "the one before (sort it, or use to_csc)")
    try:
        check_range(index, size)
    except IndexError as err:
        raise IndexError(f"index: {err}") from None
    return torch._convert_indices_from_coo_to_csr(index, size, out_int32=False)


def ptr2index(ptr, output_size: int | None = None) -> torch.Tensor:
    """The id of each entry of offsets ``ptr``: the inverse of :func:`index2ptr`.

    Args:
        ptr: offsets, a 1-D integer tensor [num_ids + 1] that starts at 0 and
            never decreases (:func:`hmgstore.rows.checks.offsets`); any device.
        output_size: None, or the number of entries, ``ptr[-1]`` (saves a
            read back on a GPU).

    Returns:
        ``ptr.dtype`` [ptr[-1]] on ``ptr``'s device: id ``v`` repeated
        ``ptr[v + 1] - ptr[v]`` times.

    Raises:
        TypeError: ``ptr`` of floats or bools; ``output_size`` not an integer.
        ValueError: ``ptr`` empty, not 1-D, not from 0 or decreasing;
            ``output_size`` other than ``ptr[-1]``.
    """
    if output_size is not None:
        output_size = checks.count(output_size, "output_size")
    ptr = checks.offsets(ptr, "ptr", output_size)
    index = torch.arange(ptr.numel() - 1, dtype=ptr.dtype, device=ptr.device)
    return index.repeat_interleave(ptr.diff(), output_size=output_size)


def stable_sort(col, num_dst: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids sorted, ties kept in input order: the default ``sort`` of :func:`to_csc`.

    Args:
        col: 1-D integer tensor (or numpy array, list) of destination ids,
            each in ``[0, num_dst)``.
        num_dst: the number of destination nodes, an integer >= 0.

    Returns:
        ``(sorted col, perm)``: ``sorted col == col[perm]``, ``perm`` int64
        [len(col)], equal ids in the order they were given.

    Raises:
        TypeError: ``num_dst`` not an integer; ``col`` of floats or bools.
        ValueError: ``col`` not 1-D.
        IndexError: an id outside ``[0, num_dst)``.
    """
    num_dst = checks.count(num_dst, "num_dst")
    col = checks.integers(col, "col")
    try:
        check_range(col, num_dst)
    except IndexError as err:
        raise IndexError(f"col: {err}") from None
    return torch.sort(col, stable=True)


def _as_index(tensor, what: str) -> torch.Tensor:
    """A 1-D int64 CPU tensor (converted only when it is not one already)."""
    if isinstance(tensor, np.ndarray):
        tensor = torch.from_numpy(tensor)
    elif not isinstance(tensor, torch.Tensor):
        tensor = torch.as_tensor(tensor)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer node ids or offsets, got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(tensor.shape)}")
    if checks.past_int64(tensor):
        raise ValueError(f"{what} holds a value of 2**63 or more, past int64's range (ids and offsets are int64; "
                         "the cast would wrap it negative): no graph has that many nodes or edges, so check the data")
    return tensor.to("cpu", torch.int64)


def _pair_offsets(ptr: torch.Tensor, name: str, total: int, pair: str) -> None:
    """:func:`hmgstore.rows.checks.offsets`, its error saying the pair's order: a pair given the other way round
    fails here first."""
    try:
        checks.offsets(ptr, name, total)
    except ValueError as err:
        raise ValueError(f"{err}; the pair is {pair}, in that order") from None


def _node_count(ids: torch.Tensor, bound: int | None, what: str) -> int:
    """``bound`` (or ``max + 1`` when None) after checking every id is in ``[0, bound)``."""
    if ids.numel() == 0:
        return bound or 0
    if bound is None:
        bound = int(ids.max()) + 1
    try:
        check_range(ids, bound)
    except IndexError as err:
        raise IndexError(f"{what} holds a node id outside [0, {bound}): {err}; "
                         "pass the right node count: size=(num_src_nodes, num_dst_nodes) to put_edge_index, "
                         "num_nodes= to from_tensors, data.num_nodes for from_data") from None
    return bound


def _size(size) -> tuple:
    """``size`` as ``(num_src, num_dst)``, each an int >= 0 or None (inferred): TypeError for another kind,
    ValueError for a negative size or another length."""
    if size is None:
        return None, None
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__"):
        raise TypeError(f"size is (num_src, num_dst), a pair of node counts; got {size!r}")
    if len(size) != 2:
        raise ValueError(f"size is (num_src, num_dst), a pair of node counts; got {len(size)} values {tuple(size)}")
    return tuple(None if s is None else checks.count(s, f"size[{k}]") for k, s in enumerate(size))


def _layout(layout) -> str:
    """``layout`` (a string or PyG's ``EdgeLayout``) as one of :data:`LAYOUTS`."""
    name = getattr(layout, "value", layout)
    if not isinstance(name, str):
        raise TypeError(f"layout is one of {LAYOUTS} (a string), got {layout!r}")
    if name.lower() not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {name!r}")
    return name.lower()


def to_csc(edge_index, layout: str, size=None, is_sorted: bool = False,
           sort: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] = stable_sort) -> CSC:
    """Convert one edge type to :class:`CSC`.

    ``edge_index``: for ``layout="coo"`` a ``[2, E]`` tensor (or numpy
    array) or a pair ``(row, col)``; for ``"csr"`` a pair ``(rowptr, col)``;
    for ``"csc"`` a pair ``(row, colptr)``. Integer tensors (int64 ids are kept
    without a copy, CSC offsets are copied; other dtypes and devices are converted to int64 on the CPU,
    unsigned ones included, but a uint64 value past int64's range is refused, never wrapped). ``size``:
    ``(num_src, num_dst)``, inferred from the ids when None. ``is_sorted``:
    COO edges already sorted by destination (checked; saves the sort).
    ``sort``: how COO edges are ordered by destination, ``(col, num_dst) ->
    (sorted col, perm)``; adapters pass their framework's own sort so that
    its samplers see the same edge order as from its own graph objects.
    An empty graph (``E = 0``) is accepted; its size is ``size``, else ``(0, 0)``.

    Raises:
        TypeError: ``layout`` not a string; ``size`` not a pair, or a size that is not an integer (floats,
            bools); ``is_sorted`` not a bool; ``edge_index`` not a tensor, array or pair for its layout;
            ids or offsets that are not integers (float ids are never truncated).
        ValueError: a layout other than ``"coo"``, ``"csr"``, ``"csc"``; a negative size or a ``size`` of
            another length than 2; a COO tensor not ``[2, E]``; parts that are not 1-D or differ in length;
            offsets that do not start at 0, decrease, end elsewhere than at E, or whose count disagrees with
            ``size``; ``is_sorted=True`` on CSR input (it has no destination order to trust) or on COO edges
            not sorted by destination; a uint64 id or offset of 2**63 or more.
        IndexError: a node id outside ``size`` (negative ids included), naming the part that holds it.
    """
    layout = _layout(layout)
    num_src, num_dst = _size(size)
    checks.boolean(is_sorted, "is_sorted")
    if is_sorted and layout == "csr":
        raise ValueError("is_sorted=True does not apply to CSR input (edges grouped by source); pass it for COO "
                         "edges sorted by destination")
    if isinstance(edge_index, np.ndarray):
        edge_index = torch.from_numpy(edge_index)
    if isinstance(edge_index, torch.Tensor) and layout == "coo":
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"a COO edge_index must have shape [2, num_edges], got {tuple(edge_index.shape)}")
    elif not (isinstance(edge_index, (tuple, list)) and len(edge_index) == 2):
        raise TypeError(f"a {layout.upper()} edge index is a pair of 1-D tensors, got {type(edge_index).__name__}")
    first, second = edge_index[0], edge_index[1]

    if layout == "csc":
        row, colptr = _as_index(first, "row"), _as_index(second, "colptr")
        _pair_offsets(colptr, "colptr", row.numel(), "(row, colptr)")
        if num_dst is not None and colptr.numel() != num_dst + 1:
            raise ValueError(f"colptr has {colptr.numel()} entries for {num_dst} destination nodes (needs num_dst + 1)")
        num_src = _node_count(row, num_src, "row")
        # colptr owned as CSC() owns it (row is kept): samplers trust the checked offsets, so a later edit of the
        # caller's array (numpy's included: from_numpy shares it) must not reach them
        given = torch.from_numpy(second) if isinstance(second, np.ndarray) else second
        owned = unshared(colptr, given) if isinstance(given, torch.Tensor) else colptr
        return CSC.trusted(row, owned, None, (num_src, colptr.numel() - 1))  # checked above

    if layout == "csr":
        rowptr, col = _as_index(first, "rowptr"), _as_index(second, "col")
        _pair_offsets(rowptr, "rowptr", col.numel(), "(rowptr, col)")
        if num_src is not None and rowptr.numel() != num_src + 1:
            raise ValueError(f"rowptr has {rowptr.numel()} entries for {num_src} source nodes (needs num_src + 1)")
        row, num_src, is_sorted = ptr2index(rowptr, col.numel()), rowptr.numel() - 1, False
    else:
        row, col = _as_index(first, "edge_index[0]"), _as_index(second, "edge_index[1]")
        if row.numel() != col.numel():
            raise ValueError(f"row and col differ in length ({row.numel()} and {col.numel()})")
        num_src = _node_count(row, num_src, "edge_index[0]")
    num_dst = _node_count(col, num_dst, "edge_index[1]" if layout == "coo" else "col")

    if is_sorted:
        if bool((col.diff() < 0).any()):
            raise ValueError("is_sorted=True but the edges are not sorted by destination (edge_index[1])")
        perm = None
    else:
        col, perm = sort(col, num_dst)
        row = row[perm]
    return CSC.trusted(row, index2ptr(col, num_dst), perm, (num_src, num_dst))  # checked above


def edge_weight_in_csc_order(weight, csc: CSC) -> torch.Tensor:
    """One sampling weight per edge, in the order the edges were given, as float32 [E] in CSC order.

    ``weight``: a 1-D tensor, numpy array or list of E finite numbers, each 0
    or more (an edge of weight 0 is sampled only when its node has fewer
    edges of positive weight than the fanout asks for). The result never
    shares the caller's memory (a copy, made once). Raises TypeError for
    non-numeric input and ValueError for a wrong length, a negative, NaN or
    infinite weight, or one that float32 cannot hold (above its largest, or
    positive but below its smallest), naming the first bad edge.
    """
    try:
        if isinstance(weight, np.ndarray):
            weight = torch.from_numpy(weight)
        elif not isinstance(weight, torch.Tensor):
            weight = torch.as_tensor(weight)
    except (TypeError, ValueError, RuntimeError) as err:  # strings, None, objects: torch's words vary by kind
        raise TypeError(f"edge weights must be real numbers (a tensor, array or list), got {type(weight).__name__}"
                        f": {err}") from None
    if weight.dtype == torch.bool or weight.dtype.is_complex:
        raise TypeError(f"edge weights must be real numbers, got dtype {weight.dtype}")
    source = weight
    if weight.dim() == 2 and weight.shape[1] == 1:  # PyG's [E, 1] edge attributes
        weight = weight.view(-1)
    given = weight.detach().cpu()
    if given.dim() != 1 or given.numel() != csc.num_edges:
        raise ValueError(f"edge weights must hold one number per edge ({csc.num_edges}), got shape "
                         f"{tuple(given.shape)}")
    wide = given.double()  # checked as given: a float64 weight past float32's range would turn inf in the cast
    bad = (~torch.isfinite(wide) | (wide < 0)).nonzero()
    if len(bad):
        at = int(bad[0])
        raise ValueError(f"edge weight {at} is {given[at].item()}: sampling weights must be finite and 0 or more "
                         "(clamp or drop such edges first)")
    big = (wide > torch.finfo(torch.float32).max).nonzero()
    if len(big):
        at = int(big[0])
        raise ValueError(f"edge weight {at} is {given[at].item()}: above float32's largest "
                         f"({torch.finfo(torch.float32).max:.3g}), the type weights are stored in; divide every "
                         "weight by the same number (only their ratios matter)")
    weight = given.to(torch.float32)
    lost = ((weight == 0) & (wide > 0)).nonzero()  # below float32's smallest: sampled as an edge of weight 0
    if len(lost):
        at = int(lost[0])
        raise ValueError(f"edge weight {at} is {given[at].item()}: positive, but 0 once stored as float32 (the type "
                         f"weights are stored in; its smallest positive number is {_FLOAT32_SMALLEST:.3g}), so it "
                         "would be drawn as an edge of weight 0; multiply every weight by the same number (only "
                         "their ratios matter)")
    # A float32 CPU tensor converts to itself: copied then, so that the caller's later edits never reach the sampler.
    return unshared(weight, source) if csc.perm is None else weight.index_select(0, csc.perm)


def unshared(result: torch.Tensor, given: torch.Tensor) -> torch.Tensor:
    """``result``, a conversion of the caller's ``given``, cloned when it still shares ``given``'s memory.

    A conversion to the dtype and device a tensor already has (``.to``, ``.cpu``, ``.reshape``) is no copy; what
    a topology or sampler holds must not change when the caller edits its own tensor afterwards. Both tensors:
    any shape, dtype and device; the result keeps ``result``'s.
    """
    shared = (result.device == given.device
              and result.untyped_storage().data_ptr() == given.untyped_storage().data_ptr())
    return result.clone() if shared else result

