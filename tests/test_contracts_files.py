"""Contracts of what reads files: generated files, cut files and arguments that disagree with them.

Each property holds for every generated case: :func:`hmgstore.load` returns
exactly the rows written, or raises the documented error (ValueError naming
the file, TypeError for what is not a path or a keyword it takes), never
another file's rows, a header read as rows or a crash. File identity: a
table over a memmap refuses a replaced, rewritten or truncated file
(:mod:`hmgstore.rows.file_identity`). The number of cases is the hypothesis
profile's (tests/conftest.py: ``HYPOTHESIS_PROFILE=long`` for a deeper run).
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
from helpers import close_map_files
from hmgstore.rows import file_identity
from hmgstore.rows.file_identity import FileChangedError, FileIdentity

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.int16, np.uint8, np.float16, np.bool_]


@st.composite
def tables(draw, max_rows: int = 12):
    """A small table of any dtype hmgstore holds and rank 1-3."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = (draw(st.integers(0, max_rows)), *draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    values = np.random.default_rng(draw(st.integers(0, 2**16))).integers(0, 100, size=shape)
    return values.astype(dtype)


def same(table: hmgstore.HybridTensor, expected: np.ndarray) -> bool:
    got = table[:].numpy()
    return got.shape == expected.shape and got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contracts")


# ---- class 1: arguments that disagree with a self-describing file ---------------------------------------
@given(tables(), st.data())
def test_npy_arguments_are_checked_against_the_header_never_obeyed(folder, array, data):
    path = folder / "t.npy"
    np.save(path, array)
    wrong_dtype = data.draw(st.sampled_from([d for d in DTYPES if np.dtype(d) != array.dtype]))
    other_shape = data.draw(st.lists(st.integers(-1, 20), min_size=1, max_size=3).map(tuple))
    for kwargs in ({"dtype": wrong_dtype}, {"dtype": wrong_dtype, "shape": array.shape}, {"offset": 128},
                   {"offset": data.draw(st.integers(1, 10**6))}, {"key": "x"}):
        with pytest.raises(ValueError, match=r"t\.npy"):
            hmgstore.load(path, "cpu", progress=False, **kwargs)
    agrees = len(other_shape) == array.ndim and all(
        g == f or (k == 0 and g == -1) for k, (g, f) in enumerate(zip(other_shape, array.shape)))
    if agrees:  # arguments that say what the header says are accepted: exactly the rows
        assert same(hmgstore.load(path, "cpu", shape=other_shape, progress=False), array)
    else:
        with pytest.raises(ValueError, match=r"t\.npy.*header says shape"):
            hmgstore.load(path, "cpu", shape=other_shape, progress=False)
    agreeing = {"dtype": array.dtype, "shape": (-1, *array.shape[1:])}
    assert same(hmgstore.load(path, "cpu", progress=False, **agreeing), array)
    assert same(hmgstore.load(path, "cpu", progress=False), array)


def test_the_listed_cases_of_disagreeing_arguments(folder):
    x = np.arange(2000 * 16, dtype=np.float32).reshape(2000, 16)
    np.save(folder / "x.npy", x)
    with pytest.raises(ValueError, match=r"x\.npy.*\(2000, 16\).*shape=\(-1, 8\)"):
        hmgstore.load(folder / "x.npy", "cpu", shape=(-1, 8), progress=False)
    with pytest.raises(ValueError, match=r"x\.npy.*float32.*dtype=float64"):
        hmgstore.load(folder / "x.npy", "cpu", dtype=np.float64, progress=False)
    with pytest.raises(TypeError, match=r"np\.memmap.*HybridTensor\(x, device\)"):
        hmgstore.load(np.load(folder / "x.npy", mmap_mode="r"), "cpu")
    with pytest.raises(TypeError, match=r"path.*got int"):
        hmgstore.load(3, "cpu")
    with pytest.raises(TypeError, match=r"hmgstore\.load\(\).*'gpu_bugdet'.*did you mean 'gpu_budget'"):
        hmgstore.load(folder / "x.npy", "cpu", gpu_bugdet=100)
    torch.save(torch.from_numpy(x), folder / "x.pt")
    with pytest.raises(ValueError, match=r"x\.pt.*offset"):
        hmgstore.load(folder / "x.pt", "cpu", offset=8, progress=False)


@given(st.integers(1, 40), st.data())
def test_load_with_a_layout_keeps_the_callers_ids(folder, rows, data):
    x = np.random.default_rng(rows).standard_normal((rows, 3)).astype(np.float32)
    np.save(folder / "l.npy", x)
    perm = torch.tensor(data.draw(st.permutations(range(rows))))
    table = hmgstore.load(folder / "l.npy", "cpu", layout=perm, progress=False)
    ids = torch.tensor(data.draw(st.lists(st.integers(0, rows - 1), max_size=20)), dtype=torch.int64)
    assert torch.equal(table[ids], torch.from_numpy(x)[ids])  # the file's row i for id i, whatever the layout
    assert torch.equal(table.layout, perm)
    bad = perm.clone()
    bad[0] = bad[-1] if rows > 1 else rows  # a repeated row, or one out of range
    with pytest.raises((ValueError, IndexError), match="layout"):
        hmgstore.load(folder / "l.npy", "cpu", layout=bad, progress=False)


# ---- files cut at every length, headers that lie ---------------------------------------------------------
@given(tables(max_rows=6), st.data())
def test_npy_cut_anywhere_is_refused_by_name(folder, array, data):
    np.save(folder / "whole.npy", array)
    content = (folder / "whole.npy").read_bytes()
    length = data.draw(st.integers(0, len(content)))
    (folder / "cut.npy").write_bytes(content[:length])
    if length == len(content):
        assert same(hmgstore.load(folder / "cut.npy", "cpu", progress=False), array)
    else:
        with pytest.raises(ValueError, match=r"cut\.npy"):
            hmgstore.load(folder / "cut.npy", "cpu", progress=False)


@given(tables(max_rows=6), st.integers(0, 64), st.data())
def test_raw_files_read_whole_rows_after_offset_or_refuse(folder, array, offset, data):
    path = folder / "r.bin"
    path.write_bytes(b"\x07" * offset + array.tobytes())
    if array.ndim < 2:
        array = array.reshape(-1, 1)
    extra = data.draw(st.integers(0, 3))  # bytes appended: rows no longer whole unless the row is 1 byte
    with open(path, "ab") as f:
        f.write(b"\x01" * extra)
    row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:]))
    shape = (-1, *array.shape[1:])
    if extra % row_bytes:
        with pytest.raises(ValueError, match=r"r\.bin.*left over"):
            hmgstore.load(path, "cpu", dtype=array.dtype, shape=shape, offset=offset, progress=False)
    else:
        got = hmgstore.load(path, "cpu", dtype=array.dtype, shape=shape, offset=offset, progress=False)[:].numpy()
        assert got[:len(array)].tobytes() == array.tobytes() and len(got) == len(array) + extra // row_bytes


# ---- class 2: file identity over time ---------------------------------------------------------------------
def memmap_table(path: Path, rows: int = 1000, mode: str = "r"):
    np.save(path, np.arange(rows * 8, dtype=np.float32).reshape(rows, 8))
    return hmgstore.HybridTensor(np.load(path, mmap_mode=mode), "cpu")


def test_a_reopened_table_refuses_a_replaced_or_rewritten_file(folder):
    path = folder / "m.npy"
    table = memmap_table(path)
    sent = pickle.dumps(table)
    assert torch.equal(pickle.loads(sent)[[3]], table[[3]])  # the same file: reopened
    np.save(folder / "other.npy", np.zeros((1000, 8), dtype=np.float32))
    os.replace(folder / "other.npy", path)  # another file renamed into its place, same size
    with pytest.raises(FileChangedError, match=r"m\.npy was replaced by another file \(another inode\)"):
        pickle.loads(sent)
    table = memmap_table(path)
    sent = pickle.dumps(table)
    with open(path, "r+b") as f:  # rewritten in place: same inode and size, other rows
        f.seek(200)
        f.write(b"\xff" * 16)
    os.utime(path, ns=(1, 1))
    with pytest.raises(FileChangedError, match=r"m\.npy changed.*(mtime|checksum)"):
        pickle.loads(sent)


def test_each_change_of_a_tables_file_is_refused_with_what_it_means_and_the_fix(folder):
    """Rewritten in place, the file shows its new bytes through the sender's mapping (the sender's table does
    not hold the old rows); only ctime moved, the rows may be the same (a chmod); replaced, the sender keeps
    the old file. Each message says which, and the fix that fits it."""
    path = folder / "r.npy"
    table = memmap_table(path)
    sent = pickle.dumps(table)
    rewrite = np.load(path, mmap_mode="r+")
    rewrite[3] = -1.0
    rewrite.flush()
    del rewrite
    assert torch.equal(table[[3]], torch.full((1, 8), -1.0))  # the sender's table reads the new bytes already
    with pytest.raises(FileChangedError, match=r"r\.npy changed.*\(checksum\)\. It was rewritten in place: a table "
                                               r"built over it before reads the new bytes.*Build the table again.*"
                                               r"table\[ids\] = rows.*mode='r\+'") as err:
        pickle.loads(sent)
    assert "are not the ones the table holds" not in str(err.value)
    table = memmap_table(path)
    sent = pickle.dumps(table)
    os.chmod(path, 0o600)  # ctime alone: the same rows, or a write with its times set back
    with pytest.raises(FileChangedError, match=r"\(ctime\)\. Its size, mtime and sampled pages are as recorded: a "
                                               r"chmod .* cannot be told apart\. Build the table again"):
        pickle.loads(sent)
    writable = memmap_table(folder / "rw.npy", mode="r+")
    np.save(folder / "new.npy", np.zeros((1000, 8), dtype=np.float32))
    os.replace(folder / "new.npy", folder / "rw.npy")
    with pytest.raises(FileChangedError, match=r"rw\.npy was replaced by another file \(another inode\) since a "
                                               r"table was built over it\. A table built over it before still reads "
                                               r"the old file.*Build the table again over the file now at that path"):
        pickle.dumps(writable)  # its own writes would be taken anew: another inode is not its own write
    assert torch.equal(writable[[3]], torch.full((1, 8), 24.0).add(torch.arange(8.0)))  # still the old file


def test_a_caller_gives_its_own_fix(folder):
    path = folder / "f.bin"
    path.write_bytes(b"a" * 10000)
    before = FileIdentity.of(path)
    path.write_bytes(b"b" * 10000)
    with pytest.raises(FileChangedError, match=r"f\.bin changed since it was read: .*checksum\)\. Read it again$"):
        before.check("it was read", fix="Read it again")
    os.remove(path)
    with pytest.raises(FileChangedError, match=r"gone\. Read it again$"):
        before.check("it was read", fix="Read it again")
    with pytest.raises(FileChangedError, match=r"gone\. A table built over it before still reads it.*copy=True"):
        before.check()


def test_a_writable_memmap_table_is_sent_with_its_own_writes(folder):
    table = memmap_table(folder / "w.npy", mode="r+")
    table[[5]] = torch.full((1, 8), 7.0)
    other = pickle.loads(pickle.dumps(table))  # its own writes are not a change
    assert torch.equal(other[[5]], torch.full((1, 8), 7.0))


def test_a_copy_on_write_memmap_travels_as_its_rows(folder):
    path = folder / "c.npy"
    np.save(path, np.ones((50, 4), dtype=np.float32))
    array = np.load(path, mmap_mode="c")
    array[2] = -5.0  # in this process's pages only
    table = hmgstore.HybridTensor(array, "cpu")
    assert torch.equal(pickle.loads(pickle.dumps(table))[[2]], torch.full((1, 4), -5.0))


def test_a_file_cut_short_under_a_live_table_is_refused_at_the_next_gather(folder):
    path = folder / "t.npy"
    table = memmap_table(path, rows=4000)
    assert table[[3999]].shape == (1, 8)
    os.truncate(path, 4096)
    with pytest.raises(RuntimeError, match=r"t\.npy was cut short under a live table.*copy=True"):
        table[[3999]]
    with pytest.raises(RuntimeError, match="cut short"):
        table.gather(torch.tensor([0]))
    memmap_table(folder / "whole.npy")  # a file of its own: another test may not have run in this process
    copied = hmgstore.HybridTensor(np.load(folder / "whole.npy", mmap_mode="r"), "cpu", copy=True)
    assert file_identity.watch(copied.source) is None  # a copy has no file to watch


@pytest.mark.parametrize("plain", [np.asarray, lambda mm: mm.view(np.ndarray), lambda mm: np.asarray(mm)[::2]])
def test_a_plain_array_over_a_memmap_is_watched_as_the_memmap(folder, plain):
    """A plain numpy array viewing a memmap's pages is cut short with its file: refused, never a SIGBUS."""
    path = folder / "p.npy"
    np.save(path, np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64))
    table = hmgstore.HybridTensor(plain(np.load(path, mmap_mode="r")), "cpu")
    last = table.num_rows - 1
    assert table[[last]].shape == (1, 64)
    os.truncate(path, 4096)
    with pytest.raises(RuntimeError, match=r"p\.npy was cut short under a live table"):
        table[[last]]


def test_a_torch_tensor_over_a_memmap_is_watched_through_the_memory_map(folder):
    """torch.from_numpy of a memmap shows no file; the table finds it in /proc/self/maps: cut short, refused at
    the next gather, never a SIGBUS. Anonymous memory has no file to watch."""
    path = folder / "f.npy"
    np.save(path, np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64))
    table = hmgstore.HybridTensor(torch.from_numpy(np.load(path, mmap_mode="r+"))[1:], "cpu")
    assert torch.equal(table[[4094]], torch.arange(4095 * 64, 4096 * 64, dtype=torch.float32).view(1, 64))
    os.truncate(path, 4096)
    with pytest.raises(RuntimeError, match=r"f\.npy was cut short under a live table: it holds 4096 bytes"):
        table[[4094]]
    assert file_identity.watch(torch.arange(1 << 20)) is None


def test_without_map_files_the_mapped_file_is_opened_by_name_if_it_is_still_the_one(folder, monkeypatch):
    """/proc/self/map_files asks privileges most users lack: the file is then opened by its name, kept only where
    it is still the file mapped (device and inode); one replaced since warns that it cannot be watched."""
    close_map_files(monkeypatch)
    path = folder / "n.npy"
    np.save(path, np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64))
    table = hmgstore.HybridTensor(torch.from_numpy(np.load(path, mmap_mode="r+")), "cpu")
    os.truncate(path, 4096)
    with pytest.raises(RuntimeError, match=r"n\.npy was cut short under a live table"):
        table[[4095]]
    for name in ("mapped.npy", "other.npy"):
        np.save(folder / name, np.ones((4096, 64), dtype=np.float32))
    mapped = torch.from_numpy(np.load(folder / "mapped.npy", mmap_mode="r+"))
    os.replace(folder / "other.npy", folder / "mapped.npy")  # another file under the name now
    with pytest.warns(RuntimeWarning, match=r"mapped\.npy, the file under this table's rows, cannot be opened"):
        assert file_identity.watch(mapped) is None


def test_identities_name_what_changed(folder):
    path = folder / "i.bin"
    path.write_bytes(b"a" * 10000)
    before = FileIdentity.of(path)
    before.check()
    path.write_bytes(b"a" * 9999)
    with pytest.raises(FileChangedError, match=r"i\.bin.*size went from 10000 to 9999"):
        before.check()
    os.remove(path)
    with pytest.raises(FileChangedError, match=r"i\.bin.*gone"):
        before.check()


@pytest.mark.parametrize("kind", ["npy", "pt", "raw"])
@pytest.mark.parametrize("host_dtype,value", [(torch.float16, 1e6), (torch.bfloat16, -3.4028e38)])
def test_load_refuses_values_past_a_half_width_host_tier_by_row(folder, kind, host_dtype, value):
    """hmgstore.load(host_dtype=...) checks what HybridTensor(host_dtype=...) checks: a finite value that would
    read back as infinity is refused, naming its row; in range, the rows are the cast ones."""
    x = np.array([[1.0, 2.0], [value, 1.0], [0.5, -0.25]], np.float32)
    path, kw = folder / f"half.{kind}", {}
    if kind == "npy":
        np.save(path, x)
    elif kind == "pt":
        torch.save(torch.from_numpy(x), path)
    else:
        x.tofile(path)
        kw = dict(dtype=np.float32, shape=(-1, 2))
    with pytest.raises(ValueError, match=r"row 1 holds .*largest finite value"):
        hmgstore.load(path, host_dtype=host_dtype, progress=False, **kw)
    x[1, 0] = 3.0
    (np.save(path, x) if kind == "npy" else torch.save(torch.from_numpy(x), path) if kind == "pt" else x.tofile(path))
    got = hmgstore.load(path, host_dtype=host_dtype, progress=False, **kw)[torch.arange(3)]
    assert torch.equal(got, torch.from_numpy(x).to(host_dtype).float())


@pytest.mark.parametrize("name", ["rows.bin", "rows", "rows.raw"])
def test_a_npy_file_under_another_name_is_read_by_its_header(folder, name):
    """Its header is never read as rows: the arguments must agree with it, as for a .npy name."""
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.save(folder / "x.npy", x)
    os.replace(folder / "x.npy", folder / name)
    for kw in ({}, dict(dtype=np.float32, shape=(-1, 4)), dict(dtype=np.float32, shape=(6, 4))):
        t = hmgstore.load(folder / name, progress=False, **kw)
        assert t.shape == (6, 4) and torch.equal(t[torch.arange(6)], torch.from_numpy(x))
    with pytest.raises(ValueError, match="header says dtype float32; dtype=int32 disagrees"):
        hmgstore.load(folder / name, dtype=np.int32, shape=(-1, 4), progress=False)


def test_a_writable_memmap_cut_short_is_not_sent_nor_grown_back(folder):
    """Sending a table over an r+ memmap whose file was cut short is refused: opened again (mode r+), numpy
    would grow the file with zeros and the rows would read back as zeros."""
    path = folder / "w.bin"
    np.arange(64 * 256, dtype=np.float32).tofile(path)
    table = hmgstore.HybridTensor(np.memmap(path, np.float32, mode="r+", shape=(64, 256)), "cpu")
    os.truncate(path, 4096)
    with pytest.raises(FileChangedError, match=r"w\.bin was cut short"):
        pickle.dumps(table)
    assert os.path.getsize(path) == 4096  # left as it is


def test_the_mapped_file_is_opened_by_name_when_only_its_device_number_differs(folder, monkeypatch):
    """btrfs shows another device in /proc/self/maps than stat gives: without /proc/self/map_files the file at the
    name is the mapped one when its inode is (a mapped file's inode is not reused, and renames stay within a
    filesystem); another inode is refused."""
    from hmgstore.memory.mapped import Mapping, open_mapped

    close_map_files(monkeypatch)
    path = folder / "b.bin"
    path.write_bytes(b"x" * 4096)
    inode = os.stat(path).st_ino
    fd = open_mapped(Mapping(0x1000, 0x2000, "r--s", 0, "ff:7f", inode, str(path)))
    assert fd is not None and os.fstat(fd).st_ino == inode
    os.close(fd)
    assert open_mapped(Mapping(0x1000, 0x2000, "r--s", 0, "ff:7f", inode + 1, str(path))) is None


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_an_array_over_a_file_in_dev_shm_is_watched():
    """Files in /dev/shm are files too: cut short under a table, the next gather raises, never a SIGBUS (run in a
    process of its own, which a SIGBUS would kill)."""
    script = textwrap.dedent("""
        import mmap, os, sys, tempfile, numpy as np, torch, hmgstore
        fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="hmgstore-test-")
        try:
            os.write(fd, np.arange(4096 * 4, dtype=np.float32).tobytes())
            pages = mmap.mmap(fd, 0)
            for source in (np.frombuffer(pages, np.float32).reshape(-1, 4),
                           torch.from_numpy(np.memmap(path, np.float32, "r+", shape=(4096, 4)))):
                table = hmgstore.HybridTensor(source, "cpu")
                os.truncate(path, 4096)  # one page of the 16 the table maps
                try:
                    table[[4095]]
                    sys.exit("read a lost page")
                except RuntimeError as err:
                    assert "cut short" in str(err), err
                os.truncate(path, 4096 * 16)
        finally:
            os.unlink(path)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_where_the_map_cannot_name_the_file_its_bytes_do(folder, monkeypatch):
    """Where /proc/self/maps shows numbers stat does not (overlayfs before Linux 6.8) and map_files is closed, the
    file at a memmap's name is taken for the mapped one when its sampled pages hold the memmap's bytes: such a
    table is sent as before, and one over a file replaced before the build is still refused."""
    monkeypatch.setattr(file_identity, "open_mapped", lambda found: None)
    x = np.arange(4096 * 8, dtype=np.float32).reshape(-1, 8)
    path = folder / "o.npy"
    np.save(path, x)
    table = hmgstore.HybridTensor(np.load(path, mmap_mode="r"), "cpu")
    assert torch.equal(pickle.loads(pickle.dumps(table))[[7]], torch.from_numpy(x[[7]]))
    np.save(folder / "p.npy", x)
    mapped = np.load(folder / "p.npy", mmap_mode="r")
    np.save(folder / "new.npy", x + 1)
    os.replace(folder / "new.npy", folder / "p.npy")  # another file under the name, before the build
    replaced = hmgstore.HybridTensor(mapped, "cpu")
    with pytest.raises(FileChangedError, match=r"p\.npy"):
        pickle.dumps(replaced)
