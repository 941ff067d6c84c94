"""Files that change or were never whole: every read of a file-backed table checks the file first, and
readers name the file for every damage.

- a memmap's file cut short: building a table over it (with or without a copy or encoding), ``dense()`` and
  pickling any form that sends rows raise instead of dying of SIGBUS. Each such step runs in a forked child,
  so that a regression fails its test instead of killing pytest. The check measures the file the pages come
  from (the mapping's own descriptor), not whatever the name holds now;
- a memmap's file deleted: pickling raises FileChangedError saying it is gone;
- a damaged .npy header (numpy's tokenizer error), a .pt of a meta or nested tensor, a key= that is no str or
  int, and a .npy file named .pt are refused or read as the docstring of hmgstore.load says.
"""
import os
import pickle
import select
import signal

import numpy as np
import pytest
import torch

import hmgstore
from hmgstore.rows.file_identity import FileChangedError
from hmgstore.table.files import npy_layout

ROWS, WIDTH = 1024, 8  # 32 KiB: eight pages, seven of them lost when the file is cut to 100 bytes


def _in_child(step, timeout: float = 30) -> str:
    """Run ``step()`` in a forked child; return ``"Type: message"`` of what it raised, or ``"returned"``.
    A child killed by a signal (7: SIGBUS; 9: still running after ``timeout``) fails the test, not the run."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without pytest's exit handlers
        os.close(r)
        torch.set_num_threads(1)  # the parent's OpenMP threads are not in the child: a parallel op would hang
        try:
            step()
            said = "returned"
        except BaseException as err:  # noqa: BLE001 - whatever it raised is the answer
            said = f"{type(err).__name__}: {err}"
        os.write(w, said.encode()[:60000])
        os._exit(0)
    os.close(w)
    try:
        if not select.select([r], [], [], timeout)[0]:
            os.kill(pid, signal.SIGKILL)
        with os.fdopen(r, "rb") as f:
            said = f.read().decode()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child died of signal {os.WTERMSIG(status)} (7: SIGBUS); it said {said!r}"
    return said


def _memmap(tmp_path, mode: str = "r", name: str = "m.bin") -> tuple[str, np.memmap]:
    path = str(tmp_path / name)
    np.arange(1, 1 + ROWS * WIDTH, dtype=np.float32).tofile(path)
    return path, np.memmap(path, np.float32, mode=mode, shape=(ROWS, WIDTH))


def _refused(said: str, name: str = "m.bin") -> None:
    assert said.startswith("RuntimeError: ") and f"{name} was cut short" in said and "SIGBUS" in said, said


BUILDS = {"in place": {}, "copy": {"copy": True}, "host_dtype": {"host_dtype": "bfloat16"},
          "compress": {"compress": "int8"}, "layout": {"layout": torch.arange(ROWS - 1, -1, -1)}}
VIEWS = {"memmap": lambda mm: mm, "plain array": np.asarray, "columns": lambda mm: mm[:, :4]}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("build", BUILDS)
def test_a_table_over_a_file_already_cut_short_is_refused_at_build(tmp_path, build, view):
    path, mm = _memmap(tmp_path)
    os.truncate(path, 100)
    _refused(_in_child(lambda: hmgstore.HybridTensor(VIEWS[view](mm), "cpu", progress=False, **BUILDS[build])))


@pytest.mark.parametrize("mode", ["r", "r+", "c"])
@pytest.mark.parametrize("view", VIEWS)
def test_dense_over_a_file_cut_short_is_refused_at_the_call(tmp_path, mode, view):
    path, mm = _memmap(tmp_path, mode)
    table = hmgstore.HybridTensor(VIEWS[view](mm), "cpu", progress=False)
    assert torch.equal(table.dense(), torch.from_numpy(np.array(VIEWS[view](mm))))
    os.truncate(path, 100)
    _refused(_in_child(lambda: table.dense().sum()))


def test_dense_hands_back_a_writable_memmaps_own_pages(tmp_path):
    """What the docstring says: over mode r+ the result is the mapped host tier itself, checked at the call only."""
    _, mm = _memmap(tmp_path, "r+")
    table = hmgstore.HybridTensor(mm, "cpu", progress=False)
    table.dense()[3, 0] = -1.0
    assert mm[3, 0] == -1.0


@pytest.mark.parametrize("mode,view", [("c", "memmap"), ("c", "columns"), ("r", "columns"), ("r", "plain array")])
def test_pickling_rows_of_a_file_cut_short_is_refused_not_sigbus(tmp_path, mode, view):
    """Forms sent as rows (copy-on-write, a view that is no whole file) read them: checked first."""
    path, mm = _memmap(tmp_path, mode)
    table = hmgstore.HybridTensor(VIEWS[view](mm), "cpu", progress=False)
    assert pickle.loads(pickle.dumps(table))[[ROWS - 1]].shape[0] == 1
    os.truncate(path, 100)
    _refused(_in_child(lambda: pickle.dumps(table)))


def test_pickling_a_memmap_sent_by_name_says_its_file_was_cut_short(tmp_path):
    path, mm = _memmap(tmp_path)
    table = hmgstore.HybridTensor(mm, "cpu", progress=False)
    os.truncate(path, 100)
    with pytest.raises(FileChangedError, match=r"m\.bin was cut short"):
        pickle.dumps(table)


def test_a_first_gather_checks_the_file_before_a_deferred_build_reads_rows(tmp_path, monkeypatch):
    """An unpickled CUDA table builds on first use, copying a small source into pinned memory: the file is
    checked before that build, which would read lost pages."""
    path, mm = _memmap(tmp_path)
    table = hmgstore.HybridTensor(mm, "cpu", progress=False)
    table._deferred = {"unusable": None}  # as Table.rebuilt leaves a CUDA table

    def build():
        raise AssertionError("the deferred build ran before the file was checked")

    monkeypatch.setattr(table, "_build", build)
    os.truncate(path, 100)
    with pytest.raises(RuntimeError, match=r"m\.bin was cut short under a live table"):
        table[[0]]


def test_a_table_whose_file_is_deleted_says_it_is_gone_when_pickled(tmp_path):
    path, mm = _memmap(tmp_path)
    table = hmgstore.HybridTensor(mm, "cpu", progress=False)
    sent = pickle.dumps(table)
    os.remove(path)
    for step in (lambda: pickle.loads(sent), lambda: pickle.dumps(table)):
        with pytest.raises(FileChangedError, match=r"m\.bin cannot be opened again .*it is gone.*copy=True"):
            step()


def test_the_check_measures_the_mapped_file_not_the_name(tmp_path):
    """A file deleted or replaced by a shorter one under its name leaves the mapping whole: its rows are read."""
    path, mm = _memmap(tmp_path, "c")
    cow = hmgstore.HybridTensor(mm, "cpu", progress=False)
    os.remove(path)
    table = hmgstore.HybridTensor(mm, "cpu", progress=False, copy=True)
    assert table[[ROWS - 1]][0, -1] == ROWS * WIDTH
    assert pickle.loads(pickle.dumps(cow))[[ROWS - 1]][0, -1] == ROWS * WIDTH  # sent as its rows
    path, mm = _memmap(tmp_path, "r", "n.bin")
    with open(tmp_path / "short.bin", "wb") as f:
        f.write(b"\0" * 100)
    os.replace(tmp_path / "short.bin", path)
    assert hmgstore.HybridTensor(mm, "cpu", progress=False, host_dtype="bfloat16")[[ROWS - 1]][0, -1] == 8192


def _damaged_npy(path, version) -> None:
    """A .npy whose header has an unbalanced bracket: numpy's tokenizer raises TokenError, not ValueError."""
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.ones((4, 3), dtype=np.float32), version=version)
    path.write_bytes(path.read_bytes().replace(b"(4, 3)", b" 4, 3)"))


@pytest.mark.parametrize("version", [(1, 0), (3, 0)])  # hmgstore's header reader, numpy's np.load
def test_a_damaged_npy_header_is_named(tmp_path, version):
    path = tmp_path / "h.npy"
    _damaged_npy(path, version)
    with pytest.raises(ValueError, match=r"h\.npy is not a \.npy file numpy can read"):
        hmgstore.load(path, "cpu", progress=False)
    with pytest.raises(ValueError, match=r"h\.npy is not a \.npy file numpy can read"):
        npy_layout(path)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.parametrize("saved,said", [
    (lambda: torch.empty(3, 4, device="meta"), "holds a tensor on the meta device"),
    (lambda: {"a": torch.empty(3, 4, device="meta")}, "holds a tensor on the meta device"),
    (lambda: torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)]), "holds a nested tensor"),
])
def test_a_torch_file_without_cpu_values_is_refused_naming_it(tmp_path, saved, said):
    torch.save(saved(), tmp_path / "v.pt")
    with pytest.raises(ValueError, match=rf"v\.pt {said}"):
        hmgstore.load(tmp_path / "v.pt", "cpu", progress=False)


def test_key_takes_a_str_or_an_int_checked_before_the_file_is_read(tmp_path):
    torch.save({"a": torch.ones(3, 4), "b": torch.zeros(3, 4)}, tmp_path / "d.pt")
    torch.save({0: torch.ones(3, 4), 1: torch.zeros(3, 4)}, tmp_path / "i.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    for path, key in [("d.pt", ["a"]), ("i.pt", True), ("i.pt", 0.0), ("bad.pt", ["a"])]:
        with pytest.raises(TypeError, match=rf"key= names one tensor of {path}'s dict by its key"):
            hmgstore.load(tmp_path / path, "cpu", key=key, progress=False)
    assert torch.equal(hmgstore.load(tmp_path / "d.pt", "cpu", key="a", progress=False)[[2]], torch.ones(1, 4))
    assert torch.equal(hmgstore.load(tmp_path / "i.pt", "cpu", key=1, progress=False)[[2]], torch.zeros(1, 4))


def test_a_npy_file_named_pt_is_read_by_its_header(tmp_path):
    """hmgstore.load: any file that starts with the .npy magic is a .npy file, whatever its name."""
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.save(tmp_path / "x.npy", x)
    os.replace(tmp_path / "x.npy", tmp_path / "x.pt")
    assert torch.equal(hmgstore.load(tmp_path / "x.pt", "cpu", progress=False)[torch.arange(6)], torch.from_numpy(x))
    with pytest.raises(ValueError, match=r"x\.pt is not a torch file: drop key="):
        hmgstore.load(tmp_path / "x.pt", "cpu", key="a", progress=False)
    with pytest.raises(ValueError, match="header says dtype float32; dtype=int32 disagrees"):
        hmgstore.load(tmp_path / "x.pt", "cpu", dtype=np.int32, progress=False)


def test_load_says_a_directory_is_not_a_file_and_which_key_is_not_in_a_dict(tmp_path):
    with pytest.raises(FileNotFoundError, match="is a directory, not a file of rows"):
        hmgstore.load(tmp_path, "cpu", progress=False)
    torch.save({"feat": torch.ones(3, 2), "y": torch.zeros(3)}, tmp_path / "both.pt")
    with pytest.raises(ValueError, match=r"holds a dict, and 'nope' is not one of its keys; pass key= one of 'feat'"):
        hmgstore.load(tmp_path / "both.pt", "cpu", key="nope", progress=False)
    with pytest.raises(ValueError, match=r"holds a dict; pass key= one of 'feat', 'y'"):  # no key given
        hmgstore.load(tmp_path / "both.pt", "cpu", progress=False)
