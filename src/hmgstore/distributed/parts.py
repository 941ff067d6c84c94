"""A graph cut into one part per machine on disk: :func:`partition` writes, :func:`load_partition` reads.

Machine ``m``'s part holds the nodes the :class:`PartitionBook` gives it,
in increasing global id order (row ``r`` of the part is node
``book.nodes_of(m)[r]``)::

    out_dir/partition.json                the run's id (every part and book records it too)
    out_dir/part{m}/book.pt               the whole book (each part is enough on its own)
    out_dir/part{m}/meta.json             machine, sizes, the attributes' shapes and dtypes, each file's record,
                                          the run's id, and a seal (CRC-32 of the rest: a hand edit is refused)
    out_dir/part{m}/features/{name}.npy   the part's rows of each node attribute
    out_dir/part{m}/colptr.npy            int64 [nodes + 1]: in-edges of the part's nodes (CSC)
    out_dir/part{m}/row.npy               int64 [edges]: their sources, as global ids

Rows are written piece by piece into ``.npy`` files, so a part never has to
fit in memory twice; :func:`load_partition` reads them with
:func:`hmgstore.load` into host memory hmgstore owns.

:func:`partition` writes every part into a new folder beside ``out_dir``
and renames it into place (:mod:`hmgstore.distributed.replace`): ``out_dir``
holds the old parts or the new ones, never a mix, and a folder that holds
anything is refused unless ``overwrite=True``. :func:`load_partition` checks
every file against ``meta.json`` and the book before it trusts it: each
file's size and checksum as :func:`partition` recorded them (``files`` in
``meta.json``: the CRC-32 of the first page and of pages spread to the end,
:class:`hmgstore.rows.file_identity.FileIdentity`'s), shapes and dtypes from
the ``.npy`` headers, ``colptr`` rising from 0 to the number of edges, and
every source in ``row`` a node of the book. A file cut short, replaced
(even by another part's file of the same size), or changed in its sampled
pages is refused, naming it; a change of equal size elsewhere in a file is
not seen (reading every byte of every part at each load would cost what
the load costs). A ``meta.json`` edited by hand, and a part folder of
another run (its id differs from ``partition.json``'s), are refused too.
Parts whose ``meta.json`` records no files (written before the record
existed) still load, with a warning: the other checks hold, but a file
replaced by one of the same shape cannot be told apart; rewrite them to get
the check.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..graph.csc import CSC, to_csc
from ..memory.pinned import as_host_tensor
from ..rows import checks
from ..rows.ids import check_range
from ..table.files import LOAD_OPTIONS, load, read
from ..table.tensor import HybridTensor
from ..util.progress import tqdm
from .node import share_on_node
from .part_files import RUN_FILE, check_topology, read_meta_and_book, record, recorded, seal
from .part_files import expect as expect_file
from .partition_book import PartitionBook
from .replace import new_folder

#: Bytes written per step (one progress update).
WRITE_CHUNK_BYTES = 64 << 20


@dataclass
class Partition:
    """One machine's part, as :func:`load_partition` returns it.

    ``features``: name -> :class:`~hmgstore.HybridTensor` of the part's rows;
    ``colptr``/``row``: int64 CPU tensors, the in-edges of the part's nodes
    (``row`` holds global ids of sources, which may live on any machine);
    ``nodes``: int64 global id of each of the part's rows. Made by :func:`load_partition` or :func:`part_of`;
    one made by hand is checked as they check theirs (the sources in ``row`` are checked by the sampler).

    Raises:
        TypeError: for a ``machine`` that is not an integer, a ``book`` that is not a :class:`PartitionBook`,
            ``features`` that are not a dict of :class:`~hmgstore.HybridTensor` s, a ``colptr`` or ``row`` that is
            not an int64 tensor.
        ValueError: for a ``machine`` outside ``[0, book.num_machines)``; a feature table whose row count is not
            the part's (``book.sizes[machine]``); a ``colptr`` or ``row`` that is not 1-D, a ``colptr`` without
            one offset per node of the part plus one, or not starting at 0 and ending at ``len(row)``.
    """

    machine: int
    book: PartitionBook
    features: dict[str, HybridTensor]
    colptr: torch.Tensor
    row: torch.Tensor

    def __post_init__(self):
        if not isinstance(self.book, PartitionBook):
            raise TypeError(f"book must be a PartitionBook, got {type(self.book).__name__}")
        self.machine = checks.count(self.machine, "machine")
        if self.machine >= self.book.num_machines:
            raise ValueError(f"machine {self.machine} is not one of the book's {self.book.num_machines}")
        rows = self.book.sizes[self.machine]
        if not isinstance(self.features, dict) or not all(
                isinstance(k, str) and isinstance(t, HybridTensor) for k, t in self.features.items()):
            raise TypeError("features is a dict of attribute name -> HybridTensor of the part's rows")
        for name, table in self.features.items():
            if table.num_rows != rows:
                raise ValueError(f"feature {name!r} has {table.num_rows} rows; part {self.machine} has {rows} nodes")
        for name in ("colptr", "row"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.dtype != torch.int64:
                raise TypeError(f"{name} is an int64 tensor, got "
                                f"{value.dtype if isinstance(value, torch.Tensor) else type(value).__name__}")
            if value.dim() != 1:
                raise ValueError(f"{name} is 1-D, got shape {tuple(value.shape)}")
        if len(self.colptr) != rows + 1 or int(self.colptr[0]) != 0 or int(self.colptr[-1]) != len(self.row):
            raise ValueError(f"colptr holds one offset per node of part {self.machine} ({rows}) plus one, from 0 to "
                             f"len(row) ({len(self.row)}); got {len(self.colptr)} offsets from "
                             f"{int(self.colptr[0])} to {int(self.colptr[-1])}")

    @property
    def nodes(self) -> torch.Tensor:
        return self.book.nodes_of(self.machine)

    def close(self) -> None:
        for table in self.features.values():
            table.close()


def _check_book(book) -> None:
    if not isinstance(book, PartitionBook):
        raise TypeError(f"book must be a PartitionBook (PartitionBook.range, .hash, .from_assignment), got "
                        f"{type(book).__name__}")


def part_dir(out_dir, machine: int) -> Path:
    return checks.path(out_dir, "the parts' folder (out_dir)", "the partition") / f"part{machine}"


def _features(features, num_nodes: int, files: bool = True) -> dict[str, torch.Tensor]:
    if not isinstance(features, dict):
        features = {"x": features}
    out = {}
    for name, table in features.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"attribute names become file names: use letters, digits and _, got {name!r}")
        table, _ = as_host_tensor(table)
        if table.shape[0] != num_nodes:
            raise ValueError(f"attribute {name!r} has {table.shape[0]} rows for a book of {num_nodes} nodes")
        # what load_partition's tables take (uint16/32/64 would be written, then refused at every load)
        checks.table_dtype(table.dtype, f"attribute {name!r}")
        if files:
            try:
                torch.empty(0, dtype=table.dtype).numpy()
            except TypeError:
                raise ValueError(f"attribute {name!r} is {table.dtype}, which .npy files cannot hold; convert it "
                                 "(e.g. to float32) first") from None
        out[name] = table
    return out


def _write_rows(path: Path, source: torch.Tensor, ids: torch.Tensor | None, bar, as_dtype=None) -> None:
    """``source[ids]`` (all of ``source`` when ids is None) into a new .npy file, piece by piece, as ``as_dtype``
    (None: the source's)."""
    n = len(ids) if ids is not None else source.shape[0]
    shape = (n, *source.shape[1:])
    dtype = torch.empty(0, dtype=as_dtype or source.dtype).numpy().dtype
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


def partition(features, edge_index, book: PartitionBook, out_dir, *, split: dict | None = None,
              overwrite: bool = False, progress: bool = True, keep=()) -> list[Path]:
    """Write one part per machine of ``book`` under ``out_dir`` (layout in the module docstring).

    ``features``: ``[num_nodes, ...]`` table (torch CPU tensor or numpy
    array, memmaps read piece by piece), or a dict name -> table (a bare
    table is named ``"x"``); dtypes numpy can hold. ``edge_index``: the
    graph as COO ``[2, E]`` (row 0 source, row 1 destination; tensor or numpy)
    or a :class:`hmgstore.graph.CSC`. Edges are assigned to the part of their
    destination. Shows a progress bar of the bytes written unless
    ``progress=False``. ``split``: name -> ids, each written to
    ``out_dir/split/{name}.npy`` with the parts. ``out_dir`` is replaced
    whole, in one step, once everything is written: it must not exist, be
    empty, or ``overwrite=True`` (which deletes what it held, but never the
    folder the process runs in nor one of ``keep``, the paths of the
    inputs: FileExistsError). Each part's
    ``meta.json`` records the size and checksum of every file written and the
    run's id (also in ``out_dir/partition.json``), which :func:`load_partition`
    compares. Returns the parts' folders. Every
    argument is checked before anything is written; whatever fails,
    ``out_dir`` is left as it was.

    Raises:
        FileExistsError: for a folder that holds anything without ``overwrite``, and with it for one that holds
            the current folder or a path of ``keep``.
        TypeError: for a ``book`` that is not a :class:`PartitionBook`, a ``split`` that is not a dict,
            ``overwrite``/``progress`` that are not bools, attributes of a dtype tables do not hold (uint16/32/64);
            ``split`` ids that are not integers (floats are never truncated, bools refused).
        ValueError: for attributes or graphs whose node count is not the book's, attribute or split names that
            cannot be file names, dtypes ``.npy`` cannot hold; ``split`` ids that are not 1-D.
        IndexError: for edges naming nodes beyond the book; ``split`` ids outside ``[0, num_nodes)``, negative
            ones included (:func:`hmgstore.rows.checks.id_list`).
    """
    _check_book(book)
    checks.boolean(overwrite, "overwrite")
    checks.boolean(progress, "progress")
    n = book.num_nodes
    tables = _features(features, n)
    csc = _csc(edge_index, n)
    split = {} if split is None else split
    if not isinstance(split, dict):
        raise TypeError(f"split is a dict of name -> node ids, got {type(split).__name__}")
    if not all(isinstance(name, str) and name.isidentifier() for name in split):
        raise ValueError(f"split names become file names: use letters, digits and _, got {list(split)}")
    split = {name: checks.id_list(ids, f"split {name!r}", n) for name, ids in split.items()}  # before writing
    run = uuid.uuid4().hex  # tells this run's parts from another's over the same nodes (load_partition checks)
    out_dir = checks.path(out_dir, "the parts' folder (out_dir)", "partition")
    with new_folder(out_dir, overwrite=overwrite, keep=keep) as new:
        _write_parts(tables, csc, book, new, run, progress)
        (new / RUN_FILE).write_text(json.dumps({"run": run, "num_machines": book.num_machines}))
        if split:
            (new / "split").mkdir()
            for name, ids in split.items():
                np.save(new / "split" / f"{name}.npy", ids.numpy())
    return [part_dir(out_dir, m) for m in range(book.num_machines)]


def _write_parts(tables: dict, csc: CSC, book: PartitionBook, out_dir: Path, run: str, progress: bool) -> None:
    n = book.num_nodes
    total = sum(t.nbytes for t in tables.values()) + 8 * (csc.num_edges + n + book.num_machines)
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
            _write_rows(folder / "row.npy", csc.row, edges, bar, torch.int64)  # as load_partition reads it
            book.save(folder / "book.pt", run=run)
            written = [f"features/{name}.npy" for name in tables] + ["colptr.npy", "row.npy", "book.pt"]
            meta = {"machine": m, "num_machines": book.num_machines, "num_nodes": n, "part_nodes": len(nodes),
                    "part_edges": len(edges),
                    "features": {k: {"shape": list(t.shape[1:]), "dtype": str(t.dtype)} for k, t in tables.items()},
                    "files": {name: record(folder / name) for name in written}, "run": run}
            (folder / "meta.json").write_text(json.dumps({**meta, "seal": seal(meta)}, indent=1))


def part_of(features, edge_index, book: PartitionBook, machine: int, device=None, *, progress: bool = True,
            **placement) -> Partition:
    """Machine ``machine``'s part of a graph held in memory: what :func:`load_partition` reads back from the
    files :func:`partition` writes, without the files (tests, benchmarks, notebooks; every rank holds the
    whole graph first).

    ``features``, ``edge_index``: as for :func:`partition`; ``device``, ``placement``: as for
    :func:`load_partition` (the part's rows are copied into new tables).

    Raises:
        TypeError: for a ``machine`` that is not an integer (a float, a bool), a ``book`` that is not a
            :class:`PartitionBook`; as :func:`partition` and :class:`~hmgstore.HybridTensor` do.
        ValueError: for a ``machine`` outside ``[0, book.num_machines)``; as :func:`partition` does (node counts
            that are not the book's) and as :class:`~hmgstore.HybridTensor` does (``placement``).
        IndexError: for edges naming nodes beyond the book.
    """
    checks.keywords("part_of", placement, checks.takes(HybridTensor, without=("source", "device", "progress")),
                    checks.takes(part_of))
    _check_book(book)
    machine = checks.count(machine, "machine")
    if machine >= book.num_machines:
        raise ValueError(f"machine {machine} is not one of the book's {book.num_machines}")
    tables = _features(features, book.num_nodes, files=False)
    csc = _csc(edge_index, book.num_nodes)
    nodes = book.nodes_of(machine)
    colptr, edges = _in_edges(csc, nodes)
    parts: dict[str, HybridTensor] = {}
    try:
        for name, table in tables.items():
            parts[name] = HybridTensor(table[nodes], device, progress=progress, **placement)
    except BaseException:
        for part in parts.values():
            part.close()
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
    collective over the machine's ranks.

    Raises:
        FileNotFoundError: for a missing part (no ``part{machine}/meta.json``) or book.
        TypeError: for a ``machine`` that is not an integer (a float, a bool).
        ValueError: for a negative ``machine``; naming the file, for one that is not the file :func:`partition`
            recorded in ``meta.json`` (its size or its sampled pages' CRC-32 differ: changed, cut short, or replaced
            by another file, another part's of the same size included), with the fix (rewrite the parts with
            ``python -m hmgstore.cli.partition ... --overwrite``); for a ``meta.json`` edited since it was written,
            and a part or book of another :func:`partition` run than ``out_dir/partition.json`` names; naming the
            file, for one that does not match its book or ``meta.json`` (a shape, dtype or length; a colptr that
            does not rise from 0 to the number of edges; a source outside the book) or is damaged; as
            :class:`~hmgstore.HybridTensor` does (``placement``).
        FileChangedError: (:mod:`hmgstore.rows.file_identity`, a ValueError) naming a file replaced or rewritten
            between the check of its header and the read of its rows (another writer in the folder).

    Warns:
        UserWarning: for a part whose ``meta.json`` records no files (written before partition() recorded them):
            it loads after the other checks, but a file replaced by one of the same shape would go unnoticed.
    """
    # share=True builds each table over shared memory (HybridTensor), else reads it (load, whose placement
    # keywords are its **kwargs, LOAD_OPTIONS): the keywords they take differ
    checks.keywords("load_partition", placement, (*checks.takes(HybridTensor if share else load, without=(
        "source", "path", "device", "progress")), *LOAD_OPTIONS), checks.takes(load_partition))
    machine = checks.count(machine, "machine")
    folder = part_dir(out_dir, machine)
    meta, records, book = read_meta_and_book(folder, machine, out_dir)
    nodes, edges = meta["part_nodes"], meta["part_edges"]

    def expect(name, shape, dtype):
        record_of = recorded(folder / "meta.json", records, name) if meta.get("files") is not None else None
        return expect_file(folder / name, shape, dtype, record_of)

    checked = [expect(f"features/{name}.npy", (nodes, *attr["shape"]), attr["dtype"])
               for name, attr in meta["features"].items()]
    checked += [expect("colptr.npy", (nodes + 1,), "torch.int64"), expect("row.npy", (edges,), "torch.int64")]
    features = {}
    if share:
        def read_once(path):  # the machine's first rank reads; every rank maps the same pages, of the same part
            return share_on_node(lambda: read(path, progress=progress), progress=progress,
                                 key=(str(path.resolve()), machine, meta.get("run")))
    try:
        for name in meta["features"]:
            path = folder / "features" / f"{name}.npy"
            features[name] = HybridTensor(read_once(path), device, progress=progress, **placement) if share \
                else load(path, device, progress=progress, **placement)
        colptr, row = ((read_once if share else lambda p: read(p, progress=progress))(folder / name)
                       for name in ("colptr.npy", "row.npy"))
        check_topology(folder, colptr, row, book.num_nodes)
        for identity in checked:  # each file is still the one whose header was checked: not replaced meanwhile
            identity.check("load_partition checked its header against meta.json",
                           fix="Another process wrote to the part's folder while load_partition read it: load it "
                               "again once that writer is done, or write the parts again with "
                               "python -m hmgstore.cli.partition")
    except BaseException:
        for table in features.values():
            table.close()
        raise
    for table in features.values():  # a ClusterTensor refuses a part handed to another machine's rank
        setattr(table, "_partition_machine", machine)  # noqa: B010 - a mark of load_partition's, not a field
    return Partition(machine, book, features, colptr, row)
