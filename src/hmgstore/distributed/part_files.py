"""What a part's files must be: the records :func:`hmgstore.distributed.partition` writes, checked at load.

Each part's ``meta.json`` records every file's size and the CRC-32 of its
sampled pages (:class:`hmgstore.rows.file_identity.FileIdentity`); the
checks here refuse, naming the file, one that was changed, cut short or
replaced since, one whose ``.npy`` header disagrees with the part's book,
and a topology that is not offsets from 0 and sources of the book.
"""
from __future__ import annotations

import json
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

from ..rows import checks
from ..rows.file_identity import FileIdentity
from ..rows.ids import check_range
from ..table.files import npy_layout
from .partition_book import PartitionBook


def read_meta_and_book(folder: Path, machine: int, out_dir) -> tuple[dict, dict, PartitionBook]:
    """A part's ``meta.json`` (checked), its files' records (``{}`` for parts written before the records, with
    a warning) and its book (its record checked), which must describe part ``machine``."""
    if not (folder / "meta.json").is_file():
        raise FileNotFoundError(f"no part {machine} under {out_dir} (looked for {folder / 'meta.json'}); write the "
                                "parts with python -m hmgstore.cli.partition")
    meta = read_meta(folder / "meta.json")
    records = meta.get("files")
    if records is None:
        warnings.warn(f"{folder / 'meta.json'} records no size and checksum of the part's files (parts written "
                      "before partition() recorded them): a file replaced by another of the same shape cannot be "
                      "told apart. Rewrite the parts with python -m hmgstore.cli.partition ... --overwrite to get "
                      "the check", UserWarning, stacklevel=3)
        records = {}
    elif not (folder / "book.pt").is_file():
        raise FileNotFoundError(f"no partition book at {folder / 'book.pt'}")
    else:
        check_record(folder / "book.pt", recorded(folder / "meta.json", records, "book.pt"))
    book = PartitionBook.load(folder / "book.pt")
    check_run(folder, meta, book, out_dir)
    said = (meta["machine"], meta["num_machines"], meta["num_nodes"], meta["part_nodes"])
    if said != (machine, book.num_machines, book.num_nodes, book.sizes[machine] if machine < book.num_machines else -1):
        raise ValueError(f"{folder / 'meta.json'} does not describe part {machine} of {folder / 'book.pt'}: it says "
                         f"part {said[0]} of {said[1]} machines, {said[2]} nodes, {said[3]} in the part; the book "
                         f"has {book.num_machines} machines, {book.num_nodes} nodes"
                         + (f", {book.sizes[machine]} in part {machine}" if machine < book.num_machines else ""))
    return meta, records, book


#: The file under a partition's folder that names the run which wrote its parts.
RUN_FILE = "partition.json"


def seal(meta: dict) -> int:
    """The CRC-32 of ``meta`` (a part's ``meta.json`` without its seal), keys sorted."""
    return zlib.crc32(json.dumps(meta, sort_keys=True).encode())


def check_run(folder: Path, meta: dict, book: PartitionBook, out_dir) -> None:
    """Refuse (ValueError naming the part and the fix) a ``meta.json`` edited since it was sealed, and a part
    or book of another :func:`partition` run than the folder's ``partition.json``. Folders written before runs
    were recorded (no ``partition.json``) pass."""
    run_file = checks.path(out_dir, "the parts' folder (out_dir)", "the partition") / RUN_FILE
    if not run_file.exists() and "seal" not in meta:
        return  # a part written before runs and seals
    try:  # a part copied alone (no partition.json) is still held to its seal and its book's run
        folder_run = json.loads(run_file.read_text())["run"] if run_file.exists() else meta.get("run")
        if not isinstance(folder_run, str):
            raise TypeError(f"its run is a {type(folder_run).__name__}, not a string")
    except (OSError, ValueError, UnicodeDecodeError, TypeError, KeyError) as err:
        raise ValueError(f"{run_file} is not the JSON partition() writes ({err!r}): the folder is damaged; rewrite "
                         "the parts: python -m hmgstore.cli.partition OUT_DIR --parts N ... --overwrite") from None
    if seal({k: v for k, v in meta.items() if k != "seal"}) != meta.get("seal"):
        raise ValueError(f"{folder / 'meta.json'} was edited since partition() wrote it (its seal does not match); "
                         "rewrite the parts: python -m hmgstore.cli.partition OUT_DIR --parts N ... --overwrite")
    for what, run in ((f"{folder / 'book.pt'}", book.run), (f"{folder}", meta.get("run"))):
        if run != folder_run:
            raise ValueError(f"{what} comes from another partition() run than {run_file} (run {run} against "
                             f"{folder_run}): parts of two runs were mixed in one folder. Copy the whole folder "
                             "of one run, or rewrite the parts: python -m hmgstore.cli.partition ... --overwrite")


def record(path: Path) -> dict:
    """What load_partition compares a part's file with: its size and the CRC-32 of its sampled pages."""
    identity = FileIdentity.of(path)
    return {"size": identity.size, "crc32": identity.checksum}


def check_record(path: Path, recorded: dict | None) -> None:
    """Refuse ``path`` when it is not the file :func:`partition` recorded (ValueError naming it and the fix)."""
    if recorded is None:  # parts without records: load_partition warned once for the part
        return
    now = record(path)
    if now != recorded:
        what = (f"it holds {now['size']} bytes, {recorded['size']} were written" if now["size"] != recorded["size"]
                else "its sampled pages' CRC-32 differs from the one recorded")
        raise ValueError(f"{path} is not the file partition() wrote: {what}. It was changed, cut short or replaced "
                         "since; rewrite the parts: python -m hmgstore.cli.partition OUT_DIR --parts N ... "
                         "--overwrite (or partition(..., overwrite=True))")


def read_meta(path: Path) -> dict:
    """``meta.json``, its keys and their types checked (ValueError naming it)."""
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not the JSON partition() writes: {err}; the part is cut short or damaged") \
            from err
    counts = ("machine", "num_machines", "num_nodes", "part_nodes", "part_edges")
    ok = isinstance(meta, dict) and all(type(meta.get(k)) is int and meta[k] >= 0 for k in counts)
    ok = ok and isinstance(meta.get("features"), dict) and all(
        isinstance(a, dict) and isinstance(a.get("dtype"), str) and isinstance(a.get("shape"), list)
        and all(type(s) is int and s >= 0 for s in a["shape"]) and str(name).isidentifier()
        for name, a in meta["features"].items())
    files = meta.get("files") if isinstance(meta, dict) else None
    ok = ok and (files is None or isinstance(files, dict) and all(
        isinstance(r, dict) and set(r) == {"size", "crc32"} and all(type(v) is int and v >= 0 for v in r.values())
        for r in files.values()))
    if not ok:
        raise ValueError(f"{path} does not hold what partition() writes: non-negative integers {', '.join(counts)}, "
                         "features {name: {shape: [ints], dtype: str}} and files {name: {size: int, crc32: int}}; "
                         "the part is damaged")
    if files is not None:
        _check_files_match_features(path, meta["features"], files)
    return meta


def _check_files_match_features(path: Path, features: dict, files: dict) -> None:
    """Refuse a ``meta.json`` whose ``files`` records are not exactly the files its ``features`` (and the
    topology and book) name: an attribute dropped from ``features`` would load without it in silence, an
    unknown record would vouch for nothing. ValueError naming both lists."""
    expected = {f"features/{name}.npy" for name in features} | {"colptr.npy", "row.npy", "book.pt"}
    if set(files) != expected:
        unrecorded = sorted(expected - set(files))
        unknown = sorted(set(files) - expected)
        raise ValueError(f"{path}: its features ({', '.join(sorted(features)) or 'none'}) and its files records "
                         f"({', '.join(sorted(files)) or 'none'}) disagree"
                         + (f"; it records no size and checksum for {', '.join(unrecorded)}" if unrecorded else "")
                         + (f"; records for {', '.join(unknown)}, which no feature names" if unknown else "")
                         + ". The part is damaged or was edited by hand: rewrite the parts with python -m "
                         "hmgstore.cli.partition ... --overwrite")


def recorded(meta_path: Path, records: dict, name: str) -> dict:
    """The record ``meta.json`` holds for the part's file ``name``; ValueError when it holds none."""
    if name not in records:
        raise ValueError(f"{meta_path} records no size and checksum for {name}, which partition() writes; the "
                         "part is damaged: rewrite the parts with python -m hmgstore.cli.partition ... --overwrite")
    return records[name]


def expect(path: Path, shape: tuple, dtype: str, recorded: dict | None) -> FileIdentity:
    """Refuse a .npy file that is not the one partition() recorded, or whose header gives another shape or dtype
    than the part's book and meta.json; the identity of the file checked (:mod:`hmgstore.rows.file_identity`), to
    check again once it is read."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the part; rewrite the parts with python -m "
                                "hmgstore.cli.partition ... --overwrite")
    check_record(path, recorded)
    identity = FileIdentity.of(path)
    found_shape, found_dtype = npy_layout(path)
    try:
        found = str(torch.from_numpy(np.empty(0, found_dtype)).dtype)  # meta.json names torch dtypes
    except TypeError:
        found = str(found_dtype)
    if found_shape != tuple(shape) or found != dtype:
        raise ValueError(f"{path} should hold shape {tuple(shape)} of {dtype} (from the part's book and meta.json), "
                         f"found {found_shape} of {found}; the part is damaged or from another partition")
    return identity


def check_topology(folder: Path, colptr: torch.Tensor, row: torch.Tensor, num_nodes: int) -> None:
    """colptr rises from 0 to ``len(row)``; every source in ``row`` is a node of the book."""
    if int(colptr[0]) != 0:
        raise ValueError(f"{folder / 'colptr.npy'} must start at 0, found {int(colptr[0])}")
    falls = colptr[1:] < colptr[:-1]
    if bool(falls.any()):
        i = int(falls.nonzero()[0, 0])
        raise ValueError(f"{folder / 'colptr.npy'} decreases at entry {i + 1} ({int(colptr[i])} then "
                         f"{int(colptr[i + 1])}); offsets into row.npy never decrease")
    if int(colptr[-1]) != len(row):
        raise ValueError(f"{folder / 'colptr.npy'} ends at {int(colptr[-1])}, but {folder / 'row.npy'} holds "
                         f"{len(row)} edges")
    try:
        check_range(row, num_nodes)
    except IndexError as err:
        raise ValueError(f"{folder / 'row.npy'} names a source outside the book: {err}; the book has {num_nodes} "
                         "nodes") from None
