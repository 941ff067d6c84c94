"""hmgstore.data contracts the probe broke: stale processed OGB rows, damaged gzip files, synthetic()'s arguments,
and ogb's progress bars with progress=False.

The OGB cases use the tiny fake ``ogbn-arxiv`` of test_contracts_readers.py (4 nodes, raw CSVs and a time
split) under tmp_path, read with the ``ogb`` package.
"""
from __future__ import annotations

import gzip
import logging
import math
import os
import shutil

import numpy as np
import pytest
import torch
from test_contracts_readers import fake_arxiv

from hmgstore import data as datasets

_FEATURES = "raw/node-feat.csv.gz"
#: The fake dataset's features with other values of the same length: a raw file replaced, same size on disk.
_OTHER_FEATURES = "9.0,9.5\n8.0,8.5\n7.0,7.5\n6.0,6.5\n"


@pytest.fixture
def ogb_reader():
    pytest.importorskip("ogb")
    from hmgstore.data import ogb

    return ogb


def _load(ogb_reader, root):
    return ogb_reader.load_node_dataset(root, "ogbn-arxiv", progress=False)


def _rewrite(path, text: str, keep_mtime: bool = False) -> None:
    """Write ``text`` gzipped over ``path``; ``keep_mtime`` puts the old times back, as cp -p and rsync -a do."""
    before = path.stat()
    with gzip.open(path, "wt") as f:
        f.write(text)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


# ---- 1: processed/data_processed made from other raw files ------------------------------------------------------
def test_a_raw_file_replaced_with_its_old_mtime_is_refused_then_rebuilt(ogb_reader, tmp_path):
    folder = fake_arxiv(tmp_path)
    _load(ogb_reader, tmp_path)  # ogb writes processed/data_processed, hmgstore records the raw files beside it
    _rewrite(folder / _FEATURES, _OTHER_FEATURES, keep_mtime=True)
    with pytest.raises(ValueError) as err:
        _load(ogb_reader, tmp_path)
    message = str(err.value)
    assert message.startswith(f"{folder}: {_FEATURES} is not the file processed/data_processed was made from")
    assert "modification time was kept" in message and f"Delete {folder / 'processed'}" in message, message
    shutil.rmtree(folder / "processed")  # the fix the message names
    assert _load(ogb_reader, tmp_path).x.tolist() == [[9.0, 9.5], [8.0, 8.5], [7.0, 7.5], [6.0, 6.5]]


def test_a_processed_folder_copied_from_another_dataset_is_refused(ogb_reader, tmp_path):
    """The copy is newer than every raw file, so the modification times alone let it through."""
    other = fake_arxiv(tmp_path / "other", **{_FEATURES: _OTHER_FEATURES})
    _load(ogb_reader, tmp_path / "other")
    folder = fake_arxiv(tmp_path / "mine")
    shutil.copytree(other / "processed", folder / "processed", copy_function=shutil.copy)  # newer: the times are new
    with pytest.raises(ValueError, match=rf"{_FEATURES} is not the file processed/data_processed was made from"):
        _load(ogb_reader, tmp_path / "mine")


def test_a_data_processed_copied_in_alone_is_refused(ogb_reader, tmp_path):
    other = fake_arxiv(tmp_path / "other", **{_FEATURES: _OTHER_FEATURES})
    _load(ogb_reader, tmp_path / "other")
    folder = fake_arxiv(tmp_path / "mine")
    (folder / "processed").mkdir()
    shutil.copy(other / "processed" / "data_processed", folder / "processed" / "data_processed")
    with pytest.raises(ValueError, match=rf"the first rows of {_FEATURES} are not those of processed/data_processed"):
        _load(ogb_reader, tmp_path / "mine")  # no record beside it: the raw rows decide
    shutil.rmtree(folder / "processed")
    _load(ogb_reader, tmp_path / "mine")  # the folder's own processed rows, with their record
    shutil.copy(other / "processed" / "data_processed", folder / "processed" / "data_processed")
    with pytest.raises(ValueError, match="processed/data_processed is not the file hmgstore recorded"):
        _load(ogb_reader, tmp_path / "mine")


def test_processed_rows_without_a_record_are_checked_once_then_recorded(ogb_reader, tmp_path):
    """ogb's own download writes processed/ without hmgstore's record: read as before, then recorded."""
    from hmgstore.data import processed_record

    folder = fake_arxiv(tmp_path)
    _load(ogb_reader, tmp_path)
    (folder / processed_record.RECORD).unlink()
    assert _load(ogb_reader, tmp_path).x.tolist()[0] == [0.0, 0.5]
    assert set(processed_record.read(folder)["raw"]) >= {_FEATURES, "raw/edge.csv.gz", "raw/node-label.csv.gz"}
    _rewrite(folder / _FEATURES, _OTHER_FEATURES, keep_mtime=True)
    with pytest.raises(ValueError, match=rf"{_FEATURES} is not the file"):
        _load(ogb_reader, tmp_path)


def test_raw_files_copied_without_their_times_are_still_the_same_rows(ogb_reader, tmp_path):
    """A copy without -p gives the raw files new mtimes, newer than processed/: the record shows the same bytes."""
    folder = fake_arxiv(tmp_path)
    _load(ogb_reader, tmp_path)
    later = (folder / "processed" / "data_processed").stat().st_mtime_ns + 10**9
    for path in (folder / "raw").iterdir():
        os.utime(path, ns=(later, later))
    assert _load(ogb_reader, tmp_path).train_idx.tolist() == [0, 1]


def test_a_raw_file_added_after_processing_is_refused(ogb_reader, tmp_path):
    folder = fake_arxiv(tmp_path)
    _load(ogb_reader, tmp_path)
    written = (folder / "processed" / "data_processed").stat().st_mtime_ns
    with gzip.open(folder / "raw" / "edge-feat.csv.gz", "wt") as f:  # ogb reads it whenever it is there
        f.write("1.0\n2.0\n3.0\n4.0\n")
    os.utime(folder / "raw" / "edge-feat.csv.gz", ns=(written, written))
    with pytest.raises(ValueError, match=r"raw/edge-feat\.csv\.gz was not there when processed/data_processed"):
        _load(ogb_reader, tmp_path)


# ---- 2: a gzip file cut short or damaged ------------------------------------------------------------------------
def _cut_half(data: bytes) -> bytes:
    return data[:len(data) // 2]


def _bad_crc(data: bytes) -> bytes:
    return data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]


@pytest.mark.parametrize("damage", [_cut_half, lambda data: data[:-4], lambda data: b"0.0,0.5\n1.0,1.5\n",
                                    _bad_crc], ids=["cut-half", "cut-trailer", "not-gzip", "bad-crc"])
@pytest.mark.parametrize("name", [_FEATURES, "raw/edge.csv.gz", "split/time/train.csv.gz"])
def test_a_damaged_gzip_file_is_named(ogb_reader, tmp_path, damage, name):
    folder = fake_arxiv(tmp_path)
    path = folder / name
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError) as err:
        _load(ogb_reader, tmp_path)
    message = str(err.value)
    assert message.startswith(f"{folder}: {name}") and "is not a whole gzip file" in message, message
    assert "cut short or damaged, fix or regenerate it" in message, message
    assert not (folder / "processed" / "data_processed").exists()  # refused before ogb parsed anything


# ---- 3: synthetic()'s arguments -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, named", [
    (dict(avg_degree=2.5), TypeError, "avg_degree"), (dict(num_nodes=100.0), TypeError, "num_nodes"),
    (dict(feat_dim="4"), TypeError, "feat_dim"), (dict(num_classes=True), TypeError, "num_classes"),
    (dict(communities=8.0), TypeError, "communities"), (dict(seed=1.5), TypeError, "seed"),
    (dict(intra="high"), TypeError, "intra"), (dict(dtype=torch.int64), TypeError, "dtype"),
    (dict(dtype="float32"), TypeError, "dtype"),
    (dict(intra=-1), ValueError, "intra"), (dict(intra=1.5), ValueError, "intra"),
    (dict(intra=math.nan), ValueError, "intra"), (dict(noise=-1), ValueError, "noise"),
    (dict(noise=math.inf), ValueError, "noise"), (dict(skew=0), ValueError, "skew"),
    (dict(skew=-2.0), ValueError, "skew"), (dict(avg_degree=-3), ValueError, "avg_degree"),
    (dict(num_nodes=-5), ValueError, "num_nodes"), (dict(communities=101), ValueError, "communities"),
    (dict(seed=2**64), ValueError, "seed"),
])
def test_synthetic_refuses_each_bad_argument_by_name(kwargs, error, named):
    with pytest.raises(error, match=rf"\b{named}\b"):
        datasets.synthetic(**{"num_nodes": 100, "avg_degree": 3, "feat_dim": 4, "num_classes": 4, **kwargs})


def test_synthetic_takes_each_range_to_its_ends():
    base = dict(num_nodes=100, avg_degree=3, feat_dim=4, num_classes=4)
    for kwargs in (dict(intra=0), dict(intra=1), dict(noise=0), dict(skew=0.5), dict(communities=100),
                   dict(num_nodes=np.int64(100), avg_degree=torch.tensor(3)), dict(seed=-1), dict(dtype=torch.float64)):
        g = datasets.synthetic(**{**base, **kwargs})
        assert g.num_nodes == 100 and g.edge_index.shape == (2, 300), kwargs
    inside = datasets.synthetic(**base, intra=1)
    assert bool((inside.y[inside.edge_index[0]] == inside.y[inside.edge_index[1]]).all())


# ---- 4: progress=False prints nothing --------------------------------------------------------------------------
def test_progress_false_prints_no_bars_and_logs_them(ogb_reader, tmp_path, capfd, caplog):
    fake_arxiv(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="hmgstore.data.ogb"):
        _load(ogb_reader, tmp_path)  # from raw: ogb's tqdm bars ("Processing graphs", "Saving") go to stderr
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert any("it/s" in r.getMessage() or "%|" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_progress_false_still_raises_and_logs_other_stderr_lines(ogb_reader, caplog):
    with caplog.at_level(logging.DEBUG, logger="hmgstore.data.ogb"):
        with pytest.raises(RuntimeError, match="ogb failed"), ogb_reader._ogb_quietly(progress=False):
            import sys

            print("a line that is not a bar", file=sys.stderr)
            raise RuntimeError("ogb failed")
    said = [r for r in caplog.records if "a line that is not a bar" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING


def test_a_graph_short_of_its_raw_edges_is_refused_on_every_load(ogb_reader, tmp_path):
    # a binary dataset whose num_edges_list keeps 150 of raw/data.npz's 200 edges: ogb writes processed/ from
    # it; the refusal must not leave that short graph for the next load to read in silence
    folder = tmp_path / "ogbn_papers100M"
    (folder / "raw").mkdir(parents=True)
    (folder / "RELEASE_v1.txt").write_text("")
    rng = np.random.default_rng(2)
    np.savez(folder / "raw/data.npz", edge_index=rng.integers(0, 50, (2, 200)), num_nodes_list=np.array([50]),
             num_edges_list=np.array([150]), node_feat=rng.random((50, 4)).astype(np.float32))
    np.savez(folder / "raw/node-label.npz", node_label=(np.arange(50) % 172).astype(np.float32).reshape(50, 1))
    (folder / "split/time").mkdir(parents=True)
    for part, ids in (("train", range(0, 30)), ("valid", range(30, 40)), ("test", range(40, 50))):
        with gzip.open(folder / f"split/time/{part}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"150 edges.*200"):
            ogb_reader.load_node_dataset(tmp_path, "ogbn-papers100M", progress=False)


@pytest.mark.parametrize("damage", ["no checksum", "entry a string", "processed a list"])
def test_a_damaged_record_entry_is_refused_naming_the_record(ogb_reader, tmp_path, damage):
    import json

    folder = fake_arxiv(tmp_path)
    _load(ogb_reader, tmp_path)
    path = folder / "processed" / "hmgstore_raw_files.json"
    record = json.loads(path.read_text())
    if damage == "no checksum":
        del record["raw"][_FEATURES]["checksum"]
    elif damage == "entry a string":
        record["raw"][_FEATURES] = "x"
    else:
        record["processed"] = [1]
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"hmgstore_raw_files\.json is not a record of raw files; it is damaged"):
        _load(ogb_reader, tmp_path)


# ---- files of one value a row, and the split's own file --------------------------------------------------------
@pytest.mark.parametrize("name, text", [
    ("split/time/train.csv.gz", "0,1\n"),  # two ids on one line: ogb would keep 0 and drop 1
    ("split/time/test.csv.gz", "3,9\n"),  # an extra column
    ("raw/num-node-list.csv.gz", "4,1\n"),
    ("raw/node_year.csv.gz", "2000,1\n" * 4),
])
def test_a_file_of_one_value_a_row_with_more_is_refused_naming_it(ogb_reader, tmp_path, name, text):
    fake_arxiv(tmp_path, **{name: text})
    with pytest.raises(ValueError, match=rf"{name} .*holds 2 values a row, not one"):
        _load(ogb_reader, tmp_path)


def test_a_damaged_split_dict_is_named(ogb_reader, tmp_path):
    folder = fake_arxiv(tmp_path)
    (folder / "split" / "time" / "split_dict.pt").write_bytes(b"\x80\x04\x95 cut short")
    with pytest.raises(ValueError, match=r"split/time/split_dict\.pt could not be read.*delete it"):
        _load(ogb_reader, tmp_path)


def test_a_split_dict_holding_a_table_of_ids_is_refused_not_flattened(ogb_reader, tmp_path):
    folder = fake_arxiv(tmp_path)
    torch.save({"train": torch.tensor([[0, 1], [1, 0]]), "valid": torch.tensor([2]), "test": torch.tensor([3])},
               folder / "split" / "time" / "split_dict.pt")
    with pytest.raises(ValueError, match=r"train split holds a table of shape \(2, 2\)"):
        _load(ogb_reader, tmp_path)
    torch.save({"train": torch.tensor([[0], [1]]), "valid": torch.tensor([2]), "test": torch.tensor([3])},
               folder / "split" / "time" / "split_dict.pt")
    assert _load(ogb_reader, tmp_path).train_idx.tolist() == [0, 1]  # a column of ids is a list of ids


def test_the_reader_takes_its_root_as_bytes_and_refuses_what_is_not_a_path(ogb_reader, tmp_path):
    fake_arxiv(tmp_path)
    assert _load(ogb_reader, os.fsencode(tmp_path)).train_idx.tolist() == [0, 1]
    with pytest.raises(TypeError, match=r"load_node_dataset takes the datasets' folder \(root\) as a path"):
        _load(ogb_reader, 3)


@pytest.mark.parametrize("damage", [b"{'descr': '<i8', 'fortran_order': False, 'shape': (2, 100000)) }",
                                    b"{'descr': '<i8', 'fortran_order': False, 'shape': (2, 100000 ", b"not a zip"])
def test_a_damaged_npz_header_leaves_the_edge_count_to_ogb(ogb_reader, tmp_path, damage):
    """raw/data.npz's edge count is read from its header alone; a header that does not parse (an unclosed
    bracket raises tokenize's TokenError, not a ValueError) or a file that is no zip is not counted: ogb's
    reading then names the damage, and no parser's error leaks from the count."""
    folder = tmp_path / "ogbn_x"
    (folder / "raw").mkdir(parents=True)
    path = folder / "raw" / "data.npz"
    edges = np.zeros((2, 100_000), dtype=np.int64)  # past zipfile's first reads: its CRC check never comes
    np.savez(path, edge_index=edges)
    if damage == b"not a zip":
        path.write_bytes(damage)
    else:
        whole = path.read_bytes()
        start = whole.index(b"{'descr'")
        end = whole.index(b"}", start) + 1
        path.write_bytes(whole[:start] + damage.ljust(end - start)[:end - start] + whole[end:])
    meta = {"binary": "True", "add_inverse_edge": "False"}
    assert ogb_reader._raw_edges_held(folder, meta, {}) is None
    np.savez(path, edge_index=edges)
    assert ogb_reader._raw_edges_held(folder, {**meta, "add_inverse_edge": "True"}, {}) == 200_000
