"""A graph cut into one part per machine on disk: :func:`partition` writes, :func:`load_partition` reads.

Machine ``m``'s part holds the nodes the :class:`PartitionBook` gives it,
in increasing global id order (row ``r`` of the part is node
``book.nodes_of(m)[r]``)::

    out_dir/part{m}/book.pt               the whole book (each part is enough on its own)
    out_dir/part{m}/meta.json             machine, sizes, the attributes' shapes and dtypes
    out_dir/part{m}/features/{name}.npy   the part's rows of each node attribute
    out_dir/part{m}/colptr.npy            int64 [nodes + 1]: in-edges of the part's nodes (CSC)
    out_dir/part{m}/row.npy               int64 [edges]: their sources, as global ids

Rows are written piece by piece into ``.npy`` files, so a part never has to
fit in memory twice; :func:`load_partition` reads them with
:func:`hmgstore.load` into host memory hmgstore owns.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from ..progress import tqdm

from ..files import load, read
from ..graph.csc import CSC, to_csc
from ..index import check_range
from ..memory.pinned import as_host_tensor
from ..tensor import HybridTensor
from .book import PartitionBook

#: Bytes written per step (one progress update).
WRITE_CHUNK_BYTES = 64 << 20


@dataclass
class Partition:
    """One machine's part, as :func:`load_partition` returns it.

    ``features``: name -> :class:`~hmgstore.HybridTensor` of the part's rows;
    ``colptr``/``row``: int64 CPU tensors, the in-edges of the part's nodes
    (``row`` holds global ids of sources, which may live on any machine);
    ``nodes``: int64 global id of each of the part's rows.
    """

    machine: int
    book: PartitionBook
    features: dict[str, HybridTensor]
    colptr: torch.Tensor
    row: torch.Tensor

    @property
    def nodes(self) -> torch.Tensor:
        return self.book.nodes_of(self.machine)

    def close(self) -> None:
        for table in self.features.values():
            table.close()


def part_dir(out_dir, machine: int) -> Path:
    return Path(out_dir) / f"part{machine}"


def _features(features, num_nodes: int, files: bool = True) -> dict[str, torch.Tensor]:
    if not isinstance(features, dict):
        features = {"x": features}
    out = {}
    for name, table in features.items():
        if not name.isidentifier():
            raise ValueError(f"attribute names become file names: use letters, digits and _, got {name!r}")
        table, _ = as_host_tensor(table)
        if table.shape[0] != num_nodes:
            raise ValueError(f"attribute {name!r} has {table.shape[0]} rows for a book of {num_nodes} nodes")
        if files:
            try:
                torch.empty(0, dtype=table.dtype).numpy()
            except TypeError:
                raise ValueError(f"attribute {name!r} is {table.dtype}, which .npy files cannot hold; convert it "
                                 "(e.g. to float32) first") from None
        out[name] = table
    return out


def _write_rows(path: Path, source: torch.Tensor, ids: torch.Tensor | None, bar) -> None:
    """``source[ids]`` (all of ``source`` when ids is None) into a new .npy file, piece by piece."""
    n = len(ids) if ids is not None else source.shape[0]
    shape = (n, *source.shape[1:])
    dtype = torch.empty(0, dtype=source.dtype).numpy().dtype
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    row_bytes = max(1, dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64)))
    step = max(1, WRITE_CHUNK_BYTES // row_bytes)
    for start in range(0, n, step):
        end = min(n, start + step)
        piece = source[start:end] if ids is None else source[ids[start:end]]
        array[start:end] = piece.numpy()
        bar.update((end - start) * row_bytes)
    array.flush()
    del array


def partition(features, edge_index, book: PartitionBook, out_dir, *, progress: bool = True) -> list[Path]:
    """Write one part per machine of ``book`` under ``out_dir`` (layout in the module docstring).

    ``features``: ``[num_nodes, ...]`` table (torch CPU tensor or numpy
    array, memmaps read piece by piece), or a dict name -> table (a bare
    table is named ``"x"``); dtypes numpy can hold. ``edge_index``: the
    graph as COO ``[2, E]`` (row 0 source, row 1 destination; tensor or numpy)
    or a :class:`hmgstore.graph.CSC`. Edges are assigned to the part of their
    destination. Shows a progress bar of the bytes written unless
    ``progress=False``. Returns the parts' folders. Raises ValueError for
    attributes or graphs whose node count is not the book's, IndexError for
    edges naming nodes beyond it.
    """
    n = book.num_nodes
    tables = _features(features, n)
    csc = _csc(edge_index, n)
    total = sum(t.nbytes for t in tables.values()) + 8 * (csc.num_edges + n + book.num_machines)
    folders = []
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"writing {book.num_machines} parts", disable=not progress,
              leave=False) as bar:
        for m in range(book.num_machines):
            folder = part_dir(out_dir, m)
            (folder / "features").mkdir(parents=True, exist_ok=True)
            nodes = book.nodes_of(m)
            for name, table in tables.items():
                _write_rows(folder / "features" / f"{name}.npy", table, nodes, bar)
            colptr, edges = _in_edges(csc, nodes)
            _write_rows(folder / "colptr.npy", colptr, None, bar)
            _write_rows(folder / "row.npy", csc.row, edges, bar)
            book.save(folder / "book.pt")
            meta = {"machine": m, "num_machines": book.num_machines, "num_nodes": n, "part_nodes": len(nodes),
                    "part_edges": len(edges),
                    "features": {k: {"shape": list(t.shape[1:]), "dtype": str(t.dtype)} for k, t in tables.items()}}
            (folder / "meta.json").write_text(json.dumps(meta, indent=1))
            folders.append(folder)
    return folders


def part_of(features, edge_index, book: PartitionBook, machine: int, device=None, *, progress: bool = True,
            **placement) -> Partition:
    """Machine ``machine``'s part of a graph held in memory: what :func:`load_partition` reads back from the
    files :func:`partition` writes, without the files (tests, benchmarks, notebooks; every rank holds the
    whole graph first).

    ``features``, ``edge_index``: as for :func:`partition`; ``device``, ``placement``: as for
    :func:`load_partition` (the part's rows are copied into new tables). Raises as :func:`partition` does.
    """
    if not 0 <= machine < book.num_machines:
        raise ValueError(f"machine {machine} is not one of the book's {book.num_machines}")
    tables = _features(features, book.num_nodes, files=False)
    csc = _csc(edge_index, book.num_nodes)
    nodes = book.nodes_of(machine)
    colptr, edges = _in_edges(csc, nodes)
    parts = {}
    try:
        for name, table in tables.items():
            parts[name] = HybridTensor(table[nodes], device, progress=progress, **placement)
    except BaseException:
        for table in parts.values():
            table.close()
        raise
    return Partition(machine, book, parts, colptr, csc.row[edges].long())  # int64, as load_partition's


def _csc(edge_index, n: int) -> CSC:
    """``edge_index`` (COO ``[2, E]`` or a CSC) as a checked CSC over ``n`` nodes."""
    csc = edge_index if isinstance(edge_index, CSC) else to_csc(edge_index, "coo", size=(n, n))
    if tuple(csc.size) != (n, n):
        raise ValueError(f"the graph has {csc.size[0]} source and {csc.size[1]} destination nodes, the book {n}")
    if csc.num_edges:
        check_range(csc.row, n)  # a CSC given as is: its sources are checked here, as COO ids are by to_csc
    return csc


def _in_edges(csc: CSC, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(colptr, edges)``: CSC offsets over ``nodes`` and the positions in ``csc.row`` of their in-edges."""
    starts, degree = csc.colptr[nodes], csc.colptr.diff()[nodes]
    colptr = torch.zeros(len(nodes) + 1, dtype=torch.int64)
    torch.cumsum(degree, 0, out=colptr[1:])
    edges = torch.arange(int(colptr[-1])) + (starts - colptr[:-1]).repeat_interleave(degree)
    return colptr, edges


def load_partition(out_dir, machine: int, device=None, *, share: bool = False, progress: bool = True,
                   **placement) -> Partition:
    """Machine ``machine``'s part from ``out_dir`` (written by :func:`partition`), and nothing else.

    Features become :class:`~hmgstore.HybridTensor` s on ``device`` through
    :func:`hmgstore.load` (host memory hmgstore owns; ``placement``, e.g.
    ``gpu_budget`` with ``hot_order``, applies to each attribute); the
    topology is read into CPU tensors. ``share``: read the part once per
    machine into shared memory (:func:`hmgstore.distributed.share_on_node`)
    that every rank of the machine maps, instead of a copy per rank;
    collective over the machine's ranks. Raises FileNotFoundError for a
    missing part, ValueError when its files do not match its book.
    """
    folder = part_dir(out_dir, machine)
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(f"no part {machine} under {out_dir} (looked for {folder / 'meta.json'}); write the "
                                "parts with python -m hmgstore.partition")
    meta = json.loads((folder / "meta.json").read_text())
    book = PartitionBook.load(folder / "book.pt")
    if meta["machine"] != machine or book.sizes[machine] != meta["part_nodes"]:
        raise ValueError(f"{folder} does not hold part {machine} of its book ({meta['machine']}, "
                         f"{meta['part_nodes']} nodes vs {book.sizes[machine]})")
    features = {}
    if share:
        from .node import share_on_node

        def read_once(path):  # the machine's first rank reads; every rank maps the same pages
            return share_on_node(lambda: read(path, progress=progress), progress=progress)
    try:
        for name in meta["features"]:
            path = folder / "features" / f"{name}.npy"
            features[name] = HybridTensor(read_once(path), device, progress=progress, **placement) if share \
                else load(path, device, progress=progress, **placement)
        colptr, row = ((read_once if share else lambda p: read(p, progress=progress))(folder / name)
                       for name in ("colptr.npy", "row.npy"))
    except BaseException:
        for table in features.values():
            table.close()
        raise
    return Partition(machine, book, features, colptr, row)
