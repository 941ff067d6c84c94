"""Files that change or were never whole: every read of a file-backed table checks the file first, and
readers name the file for every damage.

- a memmap's file cut short under a table: ``dense()``, a copy or encoding at build, and pickling a
  copy-on-write memmap raise instead of dying of SIGBUS (each run in a child process, so that a regression
  fails the test instead of killing pytest);
- a memmap's file deleted: pickling raises FileChangedError naming the file;
- a damaged .npy header (numpy's tokenizer error), a .pt of a meta tensor and a key= that is no str are
  refused with errors that say so.
"""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import hmgstore
from hmgstore.rows.file_identity import FileChangedError


def _child(tmp_path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` after a memmap of 4096 x 8 float32 over ``tmp_path/m.bin`` (``mm``) is cut to 100 bytes."""
    code = textwrap.dedent(f"""
        import os, pickle, numpy as np, hmgstore
        path = {str(tmp_path / "m.bin")!r}
        np.arange(1, 1 + 4096 * 8, dtype=np.float32).tofile(path)
        mode = os.environ["MODE"]
        mm = np.memmap(path, np.float32, mode=mode, shape=(4096, 8))
        """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MODE": "r"})


def _refused(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 1, f"exit {result.returncode} (-7: SIGBUS): {result.stderr[-800:]}"
    assert "was cut short under a live table" in result.stderr


@pytest.mark.parametrize("build", ["", "copy=True", "compress='bfloat16'"])
def test_a_table_over_a_file_cut_short_before_it_is_built_is_refused_not_sigbus(tmp_path, build):
    _refused(_child(tmp_path, f"""
        os.truncate(path, 100)
        hmgstore.HybridTensor(mm, "cpu", progress=False, {build})
        """))


def test_dense_over_a_file_cut_short_is_refused_not_sigbus(tmp_path):
    _refused(_child(tmp_path, """
        table = hmgstore.HybridTensor(mm, "cpu", progress=False)
        assert table.dense()[4095, 7] == 4096 * 8
        os.truncate(path, 100)
        table.dense().sum()
        """))


def test_pickling_a_copy_on_write_memmap_cut_short_is_refused_not_sigbus(tmp_path):
    result = _child(tmp_path, """
        mm = np.memmap(path, np.float32, mode="c", shape=(4096, 8))
        table = hmgstore.HybridTensor(mm, "cpu", progress=False)
        os.truncate(path, 100)
        pickle.dumps(table)
        """)
    _refused(result)


def test_a_table_whose_file_is_deleted_says_so_when_pickled(tmp_path):
    path = tmp_path / "d.bin"
    np.arange(1, 65, dtype=np.float32).tofile(path)
    table = hmgstore.HybridTensor(np.memmap(path, np.float32, mode="r", shape=(8, 8)), "cpu", progress=False)
    sent = pickle.dumps(table)
    os.remove(path)
    with pytest.raises(FileChangedError, match=r"d\.bin is gone"):
        pickle.loads(sent)
    with pytest.raises(FileChangedError, match=r"d\.bin is gone"):
        pickle.dumps(table)


def test_a_damaged_npy_header_is_named(tmp_path):
    path = tmp_path / "h.npy"
    np.save(path, np.ones((4, 3), dtype=np.float32))
    data = path.read_bytes()
    path.write_bytes(data.replace(b"(4, 3)", b" 4, 3)"))  # numpy's tokenizer: EOF in a multi-line statement
    with pytest.raises(ValueError, match=r"h\.npy is not a \.npy file numpy can read"):
        hmgstore.load(path, "cpu", progress=False)


def test_a_torch_file_of_a_meta_tensor_or_a_key_that_is_no_str_is_refused(tmp_path):
    torch.save(torch.empty(3, 4, device="meta"), tmp_path / "meta.pt")
    with pytest.raises(ValueError, match=r"meta\.pt holds a tensor on the meta device"):
        hmgstore.load(tmp_path / "meta.pt", "cpu", progress=False)
    torch.save({"a": torch.ones(3, 4)}, tmp_path / "d.pt")
    with pytest.raises(TypeError, match=r"key= names one tensor of d\.pt's dict \(a str\), got list"):
        hmgstore.load(tmp_path / "d.pt", "cpu", key=["a"], progress=False)
    assert torch.equal(hmgstore.load(tmp_path / "d.pt", "cpu", key="a", progress=False)[[2]], torch.ones(1, 4))


@pytest.mark.parametrize("path", ["x.npy", b"x.npy"])
def test_a_table_built_from_a_path_points_to_load(path):
    with pytest.raises(TypeError, match=r"hmgstore\.load\(path\) reads \.npy, \.pt and raw files"):
        hmgstore.HybridTensor(path, "cpu")
