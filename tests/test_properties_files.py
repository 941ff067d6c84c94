"""Property tests of tables read from files: ``hmgstore.load`` of ``.npy`` and raw files, with and without
``dtype=``/``shape=``/``offset=``, either reads exactly the file's rows or raises the documented error (docs/errors.md,
:func:`hmgstore.load`); header bytes are never read as rows; and a file changed under a table over it is detected
(:mod:`hmgstore.rows.file_identity`).

References are numpy's own reads of the arrays written. The hypothesis profile is the suite's ("ci") from conftest.py.
"""
from __future__ import annotations

import mmap
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from helpers import close_map_files
from hmgstore.rows.file_identity import FileChangedError

# A share of the loaded profile's cases (tests/conftest.py): a few dozen in make test, 20x more under
# HYPOTHESIS_PROFILE=long.
FAST = settings(max_examples=max(1, settings.default.max_examples * 2 // 3), deadline=None)

NP_DTYPES = [np.float32, np.float16, np.float64, np.int64, np.int32, np.int16, np.int8, np.uint8, np.bool_]


@st.composite
def arrays(draw, dtypes=NP_DTYPES, min_rows=0):
    n = draw(st.integers(min_rows, 30))
    row_shape = draw(st.sampled_from([(), (1,), (3,), (5,), (2, 3)]))
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    if dtype == np.bool_:
        return rng.integers(0, 2, (n, *row_shape)).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal((n, *row_shape)) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -10**6), min(info.max, 10**6), (n, *row_shape)).astype(dtype)


def _rows(table) -> np.ndarray:
    return table[torch.arange(table.shape[0])].numpy()


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal shapes, dtypes and bytes (NaN-safe and -0.0-safe)."""
    return got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()


def _fresh(tmp_path_factory, name: str):
    return tmp_path_factory.mktemp("files") / name


# ---- .npy ------------------------------------------------------------------------------------------------------------
@FAST
@given(arrays(min_rows=1), st.data())
def test_npy_loads_exactly_with_or_without_agreeing_arguments(tmp_path_factory, arr, data):
    path = _fresh(tmp_path_factory, "x.npy")
    np.save(path, arr)
    kwargs = {}
    if data.draw(st.booleans()):
        kwargs["dtype"] = data.draw(st.sampled_from([arr.dtype, torch.from_numpy(arr[:0]).dtype]))
    if data.draw(st.booleans()):
        kwargs["shape"] = data.draw(st.sampled_from([arr.shape, (-1, *arr.shape[1:])]))
    table = hmgstore.load(path, "cpu", progress=False, **kwargs)
    assert tuple(table.shape) == arr.shape and _same(_rows(table), arr)
    ids = np.asarray(data.draw(st.lists(st.integers(0, len(arr) - 1), max_size=20)), dtype=np.int64)
    assert _same(table[torch.from_numpy(ids)].numpy(), arr[ids])


@FAST
@given(arrays(dtypes=[np.float32, np.int64, np.int32, np.uint8], min_rows=1), st.data())
def test_npy_refuses_arguments_its_header_disagrees_with(tmp_path_factory, arr, data):
    """A file that describes itself is believed over the arguments: a disagreeing dtype, shape or any offset is
    refused with ValueError, never obeyed (which would read header bytes or other bytes as rows)."""
    path = _fresh(tmp_path_factory, data.draw(st.sampled_from(["x.npy", "x.bin", "x.raw"])))
    np.save(path.with_suffix(".tmp.npy"), arr)
    os.replace(path.with_suffix(".tmp.npy"), path)  # the .npy magic, whatever the name
    kind = data.draw(st.sampled_from(["dtype", "shape", "offset"]))
    if kind == "dtype":
        other = {np.float32: np.int32, np.int64: np.float64, np.int32: np.float32, np.uint8: np.int8}
        kwargs = {"dtype": other[arr.dtype.type], "shape": (-1, *arr.shape[1:])}
    elif kind == "shape":
        bad = data.draw(st.sampled_from([(len(arr) + 1, *arr.shape[1:]), (len(arr), *arr.shape[1:], 2),
                                         (-1, int(np.prod(arr.shape[1:], dtype=np.int64)) + 1)]))
        kwargs = {"dtype": arr.dtype, "shape": bad}
    else:
        kwargs = {"dtype": arr.dtype, "shape": (-1, *arr.shape[1:]), "offset": data.draw(st.integers(1, 256))}
    with pytest.raises(ValueError):
        hmgstore.load(path, "cpu", progress=False, **kwargs)


@FAST
@given(arrays(dtypes=[np.float32, np.int64, np.uint8], min_rows=1), st.data())
def test_npy_cut_short_or_padded_is_refused(tmp_path_factory, arr, data):
    path = _fresh(tmp_path_factory, "x.npy")
    np.save(path, arr)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if data.draw(st.booleans()):
            f.truncate(data.draw(st.integers(0, size - 1)))  # a file cut at any length
        else:
            f.seek(size)
            f.write(b"\x00" * data.draw(st.integers(1, 64)))  # bytes left over
    with pytest.raises(ValueError):
        hmgstore.load(path, "cpu", progress=False)


# ---- raw files -------------------------------------------------------------------------------------------------------
@FAST
@given(arrays(), st.integers(0, 80), st.data())
def test_raw_rows_after_a_header_read_exactly_or_are_refused(tmp_path_factory, arr, offset, data):
    """A raw file of rows after ``offset`` bytes of a header: ``shape[0] == -1`` reads every whole row, a full shape
    the rows it names; a length that is not whole rows, or a file too short, raises ValueError."""
    path = _fresh(tmp_path_factory, "x.bin")
    header = bytes((k * 37 + 11) % 251 for k in range(offset))  # bytes that are not rows of the array
    tail = data.draw(st.sampled_from([0, 0, 1, arr.dtype.itemsize]))  # a partial row, or a stray item
    with open(path, "wb") as f:
        f.write(header + arr.tobytes() + b"\x07" * tail)
    row_shape = arr.shape[1:]
    row_bytes = arr.dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    given_offset = data.draw(st.sampled_from([offset, offset, max(offset - 1, 0), offset + 1]))
    rows_asked = data.draw(st.sampled_from([-1, len(arr), max(len(arr) - 1, 0), len(arr) + 1]))
    dtype = data.draw(st.sampled_from([arr.dtype, torch.from_numpy(arr[:0]).dtype]))
    after = offset + len(arr) * row_bytes + tail - given_offset  # bytes past the offset given
    if rows_asked == -1:
        ok = after % row_bytes == 0 if row_bytes else True
        n = after // row_bytes if row_bytes else 0
    else:
        ok, n = rows_asked * row_bytes <= after, rows_asked
    call = dict(dtype=dtype, shape=(rows_asked, *row_shape), offset=given_offset, progress=False)
    raw = np.fromfile(path, dtype=np.uint8)[given_offset:given_offset + n * row_bytes]
    if ok and arr.dtype == np.bool_ and bool((raw > 1).any()):
        ok = False  # a bool is stored as 0 or 1: other bytes are refused, not read as True
    if not ok:
        with pytest.raises(ValueError):
            hmgstore.load(path, "cpu", **call)
        return
    table = hmgstore.load(path, "cpu", **call)
    want = raw.view(arr.dtype).reshape(n, *row_shape) if n else np.empty((0, *row_shape), arr.dtype)
    assert tuple(table.shape) == (n, *row_shape)
    got = _rows(table)
    assert _same(got, want)
    if given_offset == offset and n <= len(arr):
        assert _same(got, arr[:n])  # the rows written, never header bytes


@FAST
@given(arrays(dtypes=[np.float32, np.int64], min_rows=1), st.data())
def test_raw_offsets_and_shapes_that_are_not_integers_or_in_range_raise(tmp_path_factory, arr, data):
    path = _fresh(tmp_path_factory, "x.bin")
    arr.tofile(path)
    size = path.stat().st_size
    shape = (-1, *arr.shape[1:])
    bad = data.draw(st.sampled_from(["negative", "past", "float_offset", "bool_offset", "float_shape"]))
    if bad == "negative":
        err, call = ValueError, dict(shape=shape, offset=-data.draw(st.integers(1, 16)))
    elif bad == "past":
        err, call = ValueError, dict(shape=shape, offset=size + data.draw(st.integers(1, 16)))
    elif bad == "float_offset":
        err, call = TypeError, dict(shape=shape, offset=float(data.draw(st.integers(0, 4))))
    elif bad == "bool_offset":
        err, call = TypeError, dict(shape=shape, offset=True)
    else:
        err, call = TypeError, dict(shape=(float(len(arr)), *arr.shape[1:]), offset=0)
    with pytest.raises(err):
        hmgstore.load(path, "cpu", dtype=arr.dtype, progress=False, **call)


# ---- files changed after a build -------------------------------------------------------------------------------------
@FAST
@given(arrays(dtypes=[np.float32, np.int64], min_rows=1), st.sampled_from(["replace", "truncate", "rewrite"]))
def test_a_loaded_table_keeps_its_rows_when_the_file_changes(tmp_path_factory, arr, change):
    """``hmgstore.load`` reads into memory hmgstore owns: a file changed afterwards does not reach its rows."""
    path = _fresh(tmp_path_factory, "x.npy")
    np.save(path, arr)
    table = hmgstore.load(path, "cpu", progress=False)
    if change == "replace":
        np.save(path.with_name("y.npy"), arr[::-1] + 1)
        os.replace(path.with_name("y.npy"), path)
    elif change == "truncate":
        os.truncate(path, 10)
    else:
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            f.write(b"\xff")
    assert _same(_rows(table), arr)


def _memmap_table(tmp_path_factory, arr):
    path = _fresh(tmp_path_factory, "x.npy")
    np.save(path, arr)
    mm = np.load(path, mmap_mode="r")
    return path, mm, hmgstore.HybridTensor(mm, "cpu")


@FAST
@given(arrays(dtypes=[np.float32, np.int64], min_rows=2), st.data())
def test_a_memmap_table_raises_after_its_file_is_cut_short(tmp_path_factory, arr, data):
    """A file cut short under a live table raises RuntimeError at the next gather instead of reading a lost page."""
    path, mm, table = _memmap_table(tmp_path_factory, arr)
    assert _same(_rows(table), arr)
    size = path.stat().st_size
    os.truncate(path, data.draw(st.integers(0, size - 1)))
    with pytest.raises(RuntimeError):
        table[torch.arange(len(arr))]
    with pytest.raises(RuntimeError):
        table.dense()
    del table, mm


@FAST
@given(arrays(dtypes=[np.float32, np.int64], min_rows=1), st.sampled_from(["replace", "rewrite", "truncate"]))
def test_a_memmap_table_sent_elsewhere_refuses_a_changed_file(tmp_path_factory, arr, change):
    """A table over a memmap travels by file name and identity: a copy unpickled after the file was replaced,
    rewritten in place (same size) or cut short refuses it (FileChangedError, or RuntimeError for lost bytes)
    rather than reading other rows."""
    path, mm, table = _memmap_table(tmp_path_factory, arr)
    blob = pickle.dumps(table)
    assert _same(_rows(pickle.loads(blob)), arr)  # unchanged: the copy reads the same rows
    if change == "replace":
        np.save(path.with_name("y.npy"), arr + 1)  # same shape, dtype and size
        os.replace(path.with_name("y.npy"), path)
    elif change == "rewrite":
        with open(path, "r+b") as f:
            f.seek(-arr[-1:].nbytes, os.SEEK_END)
            f.write((arr[-1:] + 1).tobytes())
    else:
        os.truncate(path, path.stat().st_size - 1)
    with pytest.raises((FileChangedError, RuntimeError)):
        copy = pickle.loads(blob)
        copy[torch.arange(len(arr))]
    del table, mm


# ---- every kind of source over a mapped file, changed before or after the build --------------------------------------
def _over_file(kind: str, path, arr):
    """A source over the pages of ``path`` (an ``np.save`` of ``arr``), of one of the kinds a table takes."""
    if kind == "memmap":
        return np.load(path, mmap_mode="r")
    if kind == "view":  # a plain array over a memmap's pages
        return np.asarray(np.load(path, mmap_mode="r"))[:]
    header = path.stat().st_size - arr.nbytes
    if kind == "frombuffer":  # a plain array over an mmap.mmap, no memmap anywhere
        with open(path, "rb") as f:
            pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(pages, arr.dtype, offset=header).reshape(arr.shape)
    return torch.from_numpy(np.load(path, mmap_mode="r+"))  # a torch tensor over a memmap, which shows no file


def _change(path, arr, change: str) -> np.ndarray | None:
    """Change the file at ``path``; the rows a mapping of the old file reads now (None: cut short)."""
    if change == "replace":  # another file renamed into its place: the mapping keeps the old one
        np.save(path.with_name("new.npy"), arr + 1)
        os.replace(path.with_name("new.npy"), path)
    elif change == "unlink":
        os.unlink(path)
    elif change == "rewrite":  # in place: the mapping shows the new bytes
        with open(path, "r+b") as f:
            f.seek(-arr.nbytes, os.SEEK_END)
            f.write((arr + 1).tobytes())
        return arr + 1
    elif change == "truncate":
        os.truncate(path, path.stat().st_size - 1)
        return None
    return arr


@FAST
@given(arrays(dtypes=[np.float32, np.int64], min_rows=1),
       st.sampled_from(["memmap", "view", "frombuffer", "torch"]),
       st.sampled_from(["none", "replace", "unlink", "rewrite", "truncate"]),
       st.booleans(), st.booleans())
def test_a_table_over_a_mapped_file_reads_the_mapped_rows_or_refuses(tmp_path_factory, arr, kind, change,
                                                                     before_build, map_files):
    """Whatever the source over a file's pages and whenever its file changes, a table reads the rows its mapping
    holds or raises, and a copy sent to another process reads the same rows as the table or raises: never the
    rows of another file (a file renamed into the name before the build), never a lost page (SIGBUS). With or
    without ``/proc/self/map_files`` (which asks privileges most processes lack)."""
    path = _fresh(tmp_path_factory, "x.npy")
    np.save(path, arr)
    source = _over_file(kind, path, arr)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a torch source whose file is out of reach is not watched
        if not map_files:
            close_map_files(patch)
        mapped = _change(path, arr, change) if before_build else arr
        try:
            table = hmgstore.HybridTensor(source, "cpu")
        except (RuntimeError, ValueError):
            assert before_build and mapped is None  # only a file cut short may be refused at the build
            return
        if not before_build:
            mapped = _change(path, arr, change)
        try:
            live = _rows(table)
        except RuntimeError as err:
            assert mapped is None and "cut short" in str(err)
            return
        assert mapped is not None and _same(live, mapped)
        try:
            copy = _rows(pickle.loads(pickle.dumps(table)))
        except (FileChangedError, RuntimeError):
            assert kind == "memmap" and change != "none"  # sent by name: refused once the file changed
            return
        assert _same(copy, live)


# ---- files known by their first bytes, whatever their names ---------------------------------------------------------
def _write(path, arr, writer: str) -> None:
    with open(path, "wb") as f:
        if writer == "npy":
            np.save(f, arr)
        elif writer == "npz":
            np.savez(f, a=arr)
        else:
            torch.save(torch.from_numpy(arr), f, _use_new_zipfile_serialization=writer == "torch",
                       pickle_protocol=4 if writer.endswith("4") else 2)  # protocol 4 frames the magic number


@FAST
@given(arrays(dtypes=[np.float32, np.int64], min_rows=1),
       st.sampled_from(["npy", "torch", "torch-legacy", "torch-legacy4", "npz"]),
       st.sampled_from([".bin", ".raw", "", ".pt", ".npy", ".npz"]), st.sampled_from(["none", "exact", "rows"]))
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch's note on a legacy file's protocol
def test_a_file_is_read_as_what_it_is_whatever_its_name(tmp_path_factory, arr, writer, suffix, arguments):
    """A ``.npy``, a ``torch.save`` file (zip or legacy) or an ``.npz`` under any name, loaded with or without a raw
    file's ``dtype=``/``shape=``: the saved rows, or a ValueError/TypeError naming the file; never its header (or
    an archive's) read as rows."""
    path = _fresh(tmp_path_factory, "x" + suffix)
    _write(path, arr, writer)
    kwargs = {"none": {}, "exact": {"dtype": arr.dtype, "shape": arr.shape},
              "rows": {"dtype": arr.dtype, "shape": (-1, *arr.shape[1:])}}[arguments]
    try:
        table = hmgstore.load(path, "cpu", progress=False, **kwargs)
    except (ValueError, TypeError) as err:
        assert path.name in str(err)
        return
    assert writer != "npz" and _same(_rows(table), arr)
