"""Which raw files ``processed/data_processed`` was made from, recorded beside it, so stale processed rows are refused.

ogb reads ``processed/data_processed`` whenever it exists and never looks at
the raw files again. Comparing modification times misses two ways it goes
stale: a raw file replaced with its old mtime kept (``cp -p``, ``rsync -a``),
and a ``data_processed`` copied in from another dataset (newer than every raw
file). So when hmgstore has ogb write ``data_processed`` it records, in
:data:`RECORD`, the size, ``mtime_ns`` and checksum of every raw file ogb read
and of ``data_processed`` itself, and on every later load it refuses, naming
the file, a raw file whose size or checksum differs from the record, a raw file
that was not there, or a ``data_processed`` that is not the one recorded.

The checksum is :class:`hmgstore.rows.file_identity.FileIdentity`'s: CRC-32
of the first page and four pages spread to the end. The last page of a
``.csv.gz`` holds gzip's CRC-32 of the whole uncompressed text, and that of a
``.npz`` or of ``data_processed`` (zip files) its central directory with each
member's CRC-32, so any change of content changes it: 20 KiB read per file,
microseconds, where a CRC-32 of the whole files runs at 1.6 GB/s (zlib on
this machine): about 1 s a load for ogbn-products' 1.4 GB of raw files, 35 s
for ogbn-papers100M's. ``mtime_ns`` alone moving (a copy without ``-p``, a
``touch``) leaves the content, so it is not refused; a raw file recorded but
gone is not either (ogb never reads it again).

A ``data_processed`` without a record (written by ogb's own download, or by
hmgstore before it kept one) is checked once, when first read: no raw file
may be newer, and the first rows of the raw node features, labels and edges
(CSV datasets) must be the processed ones, which a ``data_processed`` of
another dataset fails. It is then recorded as it is. Raw rows changed past the
first ones with the old mtime kept before that first read go unseen: delete
``processed/`` to have hmgstore rebuild and record it.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from ..rows.file_identity import FileIdentity

log = logging.getLogger(__name__)

#: The record, under the dataset folder.
RECORD = "processed/hmgstore_raw_files.json"
_PROCESSED = "processed/data_processed"
#: Rows of each raw file compared with ``data_processed`` when it comes without a record.
_HEAD_ROWS = 64


def identities(folder: Path, paths) -> dict[str, dict]:
    """Size, ``mtime_ns`` and checksum of each of ``paths`` (under ``folder``) that exists, by its path."""
    found = {}
    for path in paths:
        if (folder / path).is_file():
            ident = FileIdentity.of(folder / path)
            found[path] = {"size": ident.size, "mtime_ns": ident.mtime_ns, "checksum": ident.checksum}
    return found


def read(folder: Path) -> dict | None:
    """The record under ``folder``, or None when there is none. ValueError naming it when it is damaged."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder}: {RECORD} cannot be read ({err}); it is damaged. Delete {folder / 'processed'} "
                         "to rebuild it from the raw files") from None
    def identity(entry) -> bool:  # as identities() writes them
        return isinstance(entry, dict) and all(type(entry.get(k)) is int for k in ("size", "mtime_ns", "checksum"))

    if not isinstance(record, dict) or not isinstance(record.get("raw"), dict) or not all(
            map(identity, record["raw"].values())) or not (record.get("processed") is None
                                                         or identity(record["processed"])):
        raise ValueError(f"{folder}: {RECORD} is not a record of raw files; it is damaged. Delete "
                         f"{folder / 'processed'} to rebuild it from the raw files")
    return record


def write(folder: Path, raw: dict[str, dict]) -> None:
    """Record ``raw`` (:func:`identities` of the raw files ogb read) and ``data_processed`` as it is now.
    A folder that cannot be written is logged, not raised: the rows read are right, only later checks weaken."""
    record = {"raw": raw, "processed": identities(folder, [_PROCESSED]).get(_PROCESSED)}
    temporary = folder / (RECORD + ".tmp")
    try:
        temporary.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(temporary, folder / RECORD)  # whole or absent, never half written
    except OSError as err:
        log.warning("%s: cannot record the raw files processed/data_processed was made from (%s); later loads "
                    "check it by modification time only", folder, err)


def same_content(recorded: dict | None, now: dict | None) -> bool:
    """Whether two identities hold the same bytes: size and checksum (``mtime_ns`` alone moving is a copy)."""
    return recorded is not None and now is not None and (recorded["size"], recorded["checksum"]) == (
        now["size"], now["checksum"])


def check(folder: Path, record: dict, raw_paths) -> None:
    """Refuse ``data_processed`` when it or the raw files in ``raw_paths`` are not those ``record`` holds.
    Raises ValueError naming the file, what differs, and the fix (delete ``processed/`` to rebuild)."""
    rebuild = (f"ogb would read the rows processed before, not the raw files as they are now. Delete "
               f"{folder / 'processed'} to rebuild it from the raw files")
    processed = identities(folder, [_PROCESSED]).get(_PROCESSED)
    if not same_content(record.get("processed"), processed):
        raise ValueError(f"{folder}: {_PROCESSED} is not the file hmgstore recorded in {RECORD} when it was "
                         f"written (copied in from another dataset, or rewritten since); its rows may not be "
                         f"these raw files'. Delete {folder / 'processed'} to rebuild it from the raw files")
    now = identities(folder, raw_paths)
    for path, ident in sorted(now.items()):
        was = record["raw"].get(path)
        if was is None:
            raise ValueError(f"{folder}: {path} was not there when {_PROCESSED} was made from the raw files; "
                             f"{rebuild}")
        if not same_content(was, ident):
            size = f"its size went from {was['size']} to {ident['size']} bytes" if was["size"] != ident["size"] \
                else "its checksum differs (same size)"
            kept = "; its modification time was kept" if was["mtime_ns"] == ident["mtime_ns"] else ""
            raise ValueError(f"{folder}: {path} is not the file {_PROCESSED} was made from ({size}{kept}: it was "
                             f"replaced or rewritten); {rebuild}")


def head_differs(folder: Path, graph: dict, labels, add_inverse_edge: bool) -> str | None:
    """The first raw CSV file (``raw/node-feat``, ``raw/node-label``, ``raw/edge``) whose first rows are not
    those of ``graph`` and ``labels`` (as ogb read them from ``data_processed``), read as ogb reads them
    (pandas); None when all match, or for a binary dataset (``raw/data.npz``: not compared)."""
    import pandas as pd

    def head(name: str) -> np.ndarray | None:
        path = folder / "raw" / f"{name}.csv.gz"
        if not path.is_file():
            return None
        return pd.read_csv(path, compression="gzip", header=None, nrows=_HEAD_ROWS).values

    edges = np.asarray(graph.get("edge_index"))
    edges = edges[:, 0::2] if add_inverse_edge and edges.ndim == 2 else edges  # ogb interleaves the inverse edges
    held = {"node-feat": np.asarray(graph.get("node_feat")), "node-label": np.asarray(labels),
            "edge": edges.T if edges.ndim == 2 else edges}
    for name, processed in held.items():
        raw = head(name)
        if raw is None:
            continue
        part = processed[:len(raw)] if processed.ndim else processed
        if part.shape != raw.shape:
            return f"raw/{name}.csv.gz"
        # as ogb casts: float rows to the processed float dtype; ids and labels compared as numbers, never truncated
        ours, theirs = (raw.astype(part.dtype), part) if part.dtype.kind == "f" else (
            raw.astype(np.float64), part.astype(np.float64))
        if not np.array_equal(ours, theirs, equal_nan=True):
            return f"raw/{name}.csv.gz"
    return None
