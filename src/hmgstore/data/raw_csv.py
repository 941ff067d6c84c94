"""The raw CSV files of an OGB dataset, checked line by line before ogb parses them.

ogb reads ``raw/*.csv.gz`` and ``split/<name>/*.csv.gz`` with pandas and
casts the columns: a float id is truncated, a missing column becomes NaN (a
feature in silence, an id as -2**63), a letter or an id past int64 stops
pandas or numpy with an error that names no file, and an empty file stops
pandas with ``EmptyDataError``. :func:`check_dataset_csvs` reads every such
file first and raises ValueError naming the dataset folder, the file and the
line (or "empty") for anything but the rows ogb expects: integer ids (and
counts, years) in the id files, numbers elsewhere, the same number of
columns on every line. Blank lines are no rows (pandas skips them too).
:func:`check_counts` then holds each file's rows to the count (``num-node-list``,
``num-edge-list``) ogb slices it by, which ogb never compares.

Each chunk is checked by a fast pass (a byte set, one regular expression,
a numpy count of commas per line); only a chunk that fails it is read line by
line in Python, to name the line and what it holds.
"""
from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import numpy as np

#: Files of integer ids, counts or years; every other raw CSV holds numbers (features, labels that may be NaN).
_INTEGER_FILES = {"edge", "num-node-list", "num-edge-list", "node_year", "train", "valid", "test"}
#: Files of one value a row (counts, years, split ids): ogb keeps the first column of each and drops the rest.
_ONE_COLUMN = {"num-node-list", "num-edge-list", "node_year", "train", "valid", "test"}
_INT = rb"[-+]?\d+"
_NUM = rb"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|NAN|inf|Inf|INF)"
#: The fast pass: ids of at most 18 digits (always within int64), no sign, spaces or CR; anything else is read
#: line by line.
_FAST = {True: (b"0123456789,\n", re.compile(rb"(?:(?:\d{1,18}(?:,\d{1,18})*)?\n)*")),
         False: (b"0123456789.eE+-,\n", re.compile(rb"(?:(?:(?:%s)(?:,(?:%s))*)?\n)*" % (_NUM, _NUM)))}
_TOKEN = {True: re.compile(_INT), False: re.compile(_NUM)}
_CHUNK = 1 << 22  # 4 MiB of text: the comma count's int64 cumsum stays 32 MiB
_INT64_MAX = (1 << 63) - 1


def check_dataset_csvs(folder: Path, from_raw: bool) -> dict[str, int]:
    """Check the CSV files ogb will read under ``folder`` (``raw/*.csv.gz`` when ``from_raw``, and
    ``split/*/*.csv.gz``); returns each file's row count by its path under ``folder``
    (``"raw/edge.csv.gz"``). Raises ValueError naming ``folder``, the file and the line."""
    paths = sorted((folder / "raw").glob("*.csv.gz")) if from_raw else []
    paths += sorted((folder / "split").glob("*/*.csv.gz"))
    return {p.relative_to(folder).as_posix(): check_csv(folder, p) for p in paths}


def check_csv(folder: Path, path: Path, integer: bool | None = None) -> int:
    """The rows (non-blank lines) of the gzipped CSV ``path``, after checking every line holds the same number
    of integers (``integer``; by default for the id files) or numbers, and one a line in the files of one value
    a row (counts, years, split ids). ValueError naming the file and line, or naming the file when it is not a
    whole gzip file (cut short, damaged, not compressed)."""
    if integer is None:
        integer = path.name.split(".")[0] in _INTEGER_FILES
    where = f"{folder}: {path.relative_to(folder).as_posix()}"
    if path.parent.parent.name == "split":
        where += f" (the {path.name.split('.')[0]} split)"
    rows, lines, columns, rest = 0, 0, None, b""
    with gzip.open(path, "rb") as f:
        while True:
            chunk = _read_chunk(f, where)
            text = rest + chunk
            cut = len(text) if not chunk else text.rfind(b"\n") + 1
            whole, rest = text[:cut], text[cut:]
            if whole and not whole.endswith(b"\n"):
                whole += b"\n"
            if whole:
                if columns is None:
                    columns = _first_columns(whole)
                held = _fast_rows(whole, integer, columns)
                rows += held if held is not None else _slow_rows(where, whole, lines, integer, columns)
                lines += whole.count(b"\n")
            if not chunk:
                break
    if rows == 0:
        raise ValueError(f"{where} is empty (no rows); ogb cannot read it: the file is cut short or damaged, "
                         "fix or regenerate it")
    if columns != 1 and path.name.split(".")[0] in _ONE_COLUMN:
        raise ValueError(f"{where} holds {columns} values a row, not one: ogb keeps the first of each row and "
                         "drops the others in silence (ids written on one line, or an extra column). Write one "
                         "value a line")
    return rows


def _read_chunk(f, where: str) -> bytes:
    """The next chunk of uncompressed text; ValueError naming the file where gzip or zlib would raise without
    naming it (a file cut short, a damaged stream, a failed CRC, a file that is not gzip at all)."""
    try:
        return f.read(_CHUNK)
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ValueError(f"{where} is not a whole gzip file ({type(err).__name__}: {err}); ogb cannot read it: "
                         "the file is cut short or damaged, fix or regenerate it") from None


def _first_columns(text: bytes) -> int | None:
    for line in text.split(b"\n"):
        if line.strip():
            return line.count(b",") + 1
    return None


def _fast_rows(text: bytes, integer: bool, columns: int | None) -> int | None:
    """The rows of ``text`` (whole lines) when it surely holds only good rows of ``columns`` columns, else None
    (it may still be good: :func:`_slow_rows` decides)."""
    allowed, pattern = _FAST[integer]
    if text.translate(None, allowed) or pattern.fullmatch(text) is None:
        return None
    data = np.frombuffer(text, np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    commas = np.diff(np.cumsum(data == ord(","))[ends], prepend=0)
    lengths = np.diff(ends, prepend=-1) - 1
    filled = lengths > 0
    return int(filled.sum()) if bool(np.all(commas[filled] + 1 == columns)) else None


def _slow_rows(where: str, text: bytes, before: int, integer: bool, columns: int | None) -> int:
    """The rows of ``text``, read line by line; ValueError naming its first bad line (``before`` lines precede
    it in the file)."""
    rows = 0
    for number, raw in enumerate(text.split(b"\n")[:-1], start=before + 1):
        line = raw.strip()
        if not line:
            continue
        rows += 1
        shown = raw[:60].decode(errors="replace")
        fields = [field.strip() for field in line.split(b",")]
        if len(fields) != columns or not all(fields):
            raise ValueError(f"{where} line {number} ({shown!r}) has a missing column: {len(fields)} columns, "
                             f"{sum(1 for f in fields if f)} filled, where the file's first row has {columns}; "
                             "pandas would fill the gap with NaN. Fix or regenerate the file")
        for field in fields:
            if _TOKEN[integer].fullmatch(field) is None:
                what = ("integer node ids or counts (integers: ogb would truncate or refuse it)" if integer
                        else "a number")
                raise ValueError(f"{where} line {number} holds {field[:40].decode(errors='replace')!r} "
                                 f"({shown!r}), not {what}; fix or regenerate the file")
            if integer and abs(int(field)) > _INT64_MAX:
                raise ValueError(f"{where} line {number} holds {field[:40].decode(errors='replace')}, beyond "
                                 "int64 (ogb's ids are int64, it would wrap or overflow); fix or regenerate the file")
    return rows


def read_count(folder: Path, name: str, rows: int) -> tuple[int, str]:
    """The count in the count file ``name`` (``raw/num-node-list.csv.gz``, already checked by :func:`check_csv`,
    which counted its ``rows``) and its line as written. ValueError when it holds more than one row: a node
    dataset is one graph, and ogb would read the first count and leave the rest of the rows unread."""
    if rows != 1:
        raise ValueError(f"{folder}: {name} holds {rows} rows, not one: a node dataset is one graph, counted on one "
                         "line (ogb would read the first graph and leave the other rows unread). Fix or regenerate "
                         "the file")
    with gzip.open(folder / name, "rb") as f:
        line = next(line for line in f if line.strip()).strip()
    return int(line), line.decode()


def check_counts(folder: Path, counts: dict[str, tuple[str, int, str]], rows: dict[str, int],
                 counted_by: dict[str, str]) -> None:
    """Check every data file's rows against the count that cuts it.

    ``counts`` maps what is counted (``"node"``) to ``(count file, count, its line as written)``; ``rows`` holds
    each file's rows (:func:`check_dataset_csvs`); ``counted_by`` maps each data file to what its rows count.
    ogb slices every file by the count without comparing: rows past it are dropped in silence, and a count past
    the rows makes a graph with fewer rows than it says. Raises ValueError naming both files and both numbers.
    """
    for name, what in counted_by.items():
        count_name, value, written = counts[what]
        held = rows[name]
        if held != value:
            gap = (f"ogb would keep the first {value} rows and drop the last {held - value} without a word"
                   if held > value else f"{value - held} of the {what}s it counts have no row")
            raise ValueError(f"{folder}: {name} ({_held_as(name)}) holds {held} rows, but {count_name} says "
                             f"{value} {what}s (line 1 as written: {written!r}); each {what} has one row, and {gap}. "
                             "Fix the count or regenerate the files")


def _held_as(name: str) -> str:
    """What the raw file ``name`` holds, in the words the other checks use (``raw/node-label.csv.gz``: labels)."""
    stem = name.rsplit("/", 1)[-1].split(".")[0]
    return {"edge": "the edges", "edge-feat": "the edge features", "node-feat": "the node features",
            "node-label": "the labels"}.get(stem, f"the {stem} values")
