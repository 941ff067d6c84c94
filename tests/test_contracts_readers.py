"""Readers refuse damaged files by name: OGB raw CSVs (hmgstore.data.raw_csv, via load_node_dataset) and a
part's meta.json whose features and files records disagree (hmgstore.distributed.load_partition).

The OGB cases write a tiny fake ``ogbn-arxiv`` (4 nodes, raw CSVs and a time split) under tmp_path and read
it with the ``ogb`` package; each damaged file must be refused with a ValueError naming the dataset folder,
the file and the line (or "empty"), before pandas or numpy can fill, wrap or refuse it without a name.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hmgstore.cli.partition import main as partition_command
from hmgstore.distributed import load_partition


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def fake_arxiv(root: Path, **files: str) -> Path:
    """A 4-node ``ogbn-arxiv`` under ``root``; ``files`` replaces a file's text by its path under the folder."""
    folder = root / "ogbn_arxiv"
    (folder / "raw").mkdir(parents=True)
    (folder / "RELEASE_v1.txt").write_text("")
    texts = {"raw/edge.csv.gz": "0,1\n1,2\n2,3\n3,0\n", "raw/num-node-list.csv.gz": "4\n",
             "raw/num-edge-list.csv.gz": "4\n", "raw/node-feat.csv.gz": "0.0,0.5\n1.0,1.5\n2.0,2.5\n3.0,3.5\n",
             "raw/node-label.csv.gz": "0\n1\n2\n3\n", "raw/node_year.csv.gz": "2000\n" * 4,
             "split/time/train.csv.gz": "0\n1\n", "split/time/valid.csv.gz": "2\n", "split/time/test.csv.gz": "3\n"}
    texts.update(files)
    for name, text in texts.items():
        _write(folder / name, text)
    return folder


@pytest.fixture
def ogb_reader():
    pytest.importorskip("ogb")
    from hmgstore.data import ogb

    return ogb


def test_the_fake_dataset_reads(ogb_reader, tmp_path):
    fake_arxiv(tmp_path)
    g = ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)
    assert g.x.tolist() == [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5], [3.0, 3.5]] and g.train_idx.tolist() == [0, 1]


@pytest.mark.parametrize("name, text, said", [
    ("raw/node-feat.csv.gz", "0.0,0.5\n1.0\n2.0,2.5\n3.0,3.5\n", "line 2 ('1.0') has a missing column"),
    ("raw/node-feat.csv.gz", "a,b\n1.0,1.5\n2.0,2.5\n3.0,3.5\n", "line 1 holds 'a'"),
    ("raw/edge.csv.gz", "0,1\n1-2,3\n2,3\n3,0\n", "line 2 holds '1-2'"),
    ("raw/edge.csv.gz", "0,1\n1, \n2,3\n3,0\n", "line 2 ('1, ') has a missing column"),
    ("raw/edge.csv.gz", "0,1\n1\n2,3\n3,0\n", "line 2 ('1') has a missing column"),
    ("raw/edge.csv.gz", "0,1\n18446744073709551617,2\n2,3\n3,0\n", "line 2 holds 18446744073709551617, beyond int64"),
    ("raw/edge.csv.gz", "0,1\n18446744073709551614,2\n2,3\n3,0\n", "line 2 holds 18446744073709551614, beyond int64"),
    ("raw/edge.csv.gz", "0,1\n1,2\n2,3.7\n3,0\n", "line 3 holds '3.7'"),
    ("raw/num-node-list.csv.gz", "four\n", "line 1 holds 'four'"),
    ("raw/node-label.csv.gz", "0\n1\ncat\n3\n", "line 3 holds 'cat'"),
    ("split/time/train.csv.gz", "", "is empty"),
    ("split/time/test.csv.gz", "x\n", "line 1 holds 'x'"),
])
def test_a_damaged_raw_csv_is_refused_naming_folder_file_and_line(ogb_reader, tmp_path, name, text, said):
    folder = fake_arxiv(tmp_path, **{name: text})
    with pytest.raises(ValueError) as err:
        ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)
    message = str(err.value)
    assert message.startswith(f"{folder}: {name} ") and said in message, message
    assert "-9223372036854775808" not in message


def test_blank_lines_and_large_files_are_read_in_chunks(tmp_path):
    from hmgstore.data import raw_csv

    folder = tmp_path / "d"
    rows = 300_000  # more than one 4 MiB chunk of text
    _write(folder / "raw" / "edge.csv.gz", "\n".join(f"{i},{i + 1}" for i in range(rows)) + "\n\n")
    assert raw_csv.check_csv(folder, folder / "raw" / "edge.csv.gz") == rows
    _write(folder / "raw" / "edge.csv.gz", "".join(f"{i},{i + 1}\n" for i in range(rows)) + "7\n")
    with pytest.raises(ValueError, match=rf"raw/edge.csv.gz line {rows + 1} \('7'\) has a missing column"):
        raw_csv.check_csv(folder, folder / "raw" / "edge.csv.gz")


# ---- counts: every raw file's rows match the count ogb cuts it by ---------------------------------------------
#: The fake dataset's rows, i from 0: each file counted by num-node-list (node) or num-edge-list (edge).
_ROW = {"raw/node-feat.csv.gz": ("node", lambda i: f"{i}.0,{i}.5\n"),
        "raw/node-label.csv.gz": ("node", lambda i: f"{i % 40}\n"),
        "raw/node_year.csv.gz": ("node", lambda i: "2000\n"),
        "raw/edge.csv.gz": ("edge", lambda i: f"{i % 4},{(i + 1) % 4}\n")}
_COUNT = {"node": "raw/num-node-list.csv.gz", "edge": "raw/num-edge-list.csv.gz"}


def _rows(name: str, n: int) -> str:
    return "".join(_ROW[name][1](i) for i in range(n))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(_ROW)), st.integers(-3, 3).filter(bool))
def test_a_file_cut_or_extended_by_k_rows_is_refused_naming_both_counts(ogb_reader, tmp_path_factory, name, k):
    """F4a generalised: ogb slices every file by its count, so a 5th feature row for 4 nodes was dropped."""
    folder = fake_arxiv(tmp_path_factory.mktemp("counts"), **{name: _rows(name, 4 + k)})
    what = _ROW[name][0]
    with pytest.raises(ValueError) as err:
        ogb_reader.load_node_dataset(folder.parent, "ogbn-arxiv", progress=False)
    message = str(err.value)
    assert message.startswith(f"{folder}: {name} (the ") and f") holds {4 + k} rows, but {_COUNT[what]} says 4 " \
        f"{what}s (line 1 as written: '4')" in message, message
    assert not (folder / "processed" / "data_processed").exists()  # refused before ogb parsed anything


def test_five_feature_rows_for_four_nodes_is_refused(ogb_reader, tmp_path):
    """F4a as the probe found it."""
    folder = fake_arxiv(tmp_path, **{"raw/node-feat.csv.gz": _rows("raw/node-feat.csv.gz", 5)})
    with pytest.raises(ValueError, match=r"raw/node-feat\.csv\.gz \(the node features\) holds 5 rows, "
                                         r"but raw/num-node-list\.csv\.gz says 4 nodes .*drop the last 1"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)
    assert folder.is_dir()


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["node", "edge"]), st.integers(0, 12).filter(lambda v: v != 4), st.sampled_from(["", "+", "0"]))
def test_a_count_that_is_not_the_files_rows_is_refused(ogb_reader, tmp_path_factory, what, value, sign):
    """F4b generalised: num-edge-list 9 with 4 edges in raw/edge loaded; any count but the rows is refused."""
    written = f"{sign}{value}"
    folder = fake_arxiv(tmp_path_factory.mktemp("count"), **{_COUNT[what]: f"{written}\n"})
    said = re.escape(f") holds 4 rows, but {_COUNT[what]} says {value} {what}s (line 1 as written: '{written}')")
    with pytest.raises(ValueError, match=rf"{re.escape(str(folder))}: raw/[a-z_-]+\.csv\.gz \(the [a-z_ -]+{said}"):
        ogb_reader.load_node_dataset(folder.parent, "ogbn-arxiv", progress=False)


def test_nine_edges_counted_for_four_is_refused(ogb_reader, tmp_path):
    """F4b as the probe found it: both files and both counts named."""
    fake_arxiv(tmp_path, **{"raw/num-edge-list.csv.gz": "9\n"})
    with pytest.raises(ValueError, match=r"ogbn_arxiv: raw/edge\.csv\.gz \(the edges\) holds 4 rows, "
                                         r"but raw/num-edge-list\.csv\.gz says 9 edges .*5 of the edges it counts "
                                         r"have no row"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)


@pytest.mark.parametrize("name, text, said", [
    ("raw/num-node-list.csv.gz", "4\n0\n", "raw/num-node-list.csv.gz holds 2 rows, not one"),
    ("raw/num-edge-list.csv.gz", "4\n\n4\n", "raw/num-edge-list.csv.gz holds 2 rows, not one"),
    ("raw/edge-feat.csv.gz", "0.5\n1.5\n2.5\n",
     "raw/edge-feat.csv.gz (the edge features) holds 3 rows, but raw/num-edge-list.csv.gz says 4 edges"),
    ("raw/edge-feat.csv.gz", "0.5\n" * 5, "raw/edge-feat.csv.gz (the edge features) holds 5 rows"),
])
def test_count_files_of_several_graphs_and_edge_features_are_checked(ogb_reader, tmp_path, name, text, said):
    """ogb reads the first of several graphs, and raw/edge-feat whenever it is there (cut by num-edge-list)."""
    folder = fake_arxiv(tmp_path, **{name: text})
    with pytest.raises(ValueError) as err:
        ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)
    assert str(err.value).startswith(f"{folder}: {said}"), err.value


def test_matching_edge_features_read(ogb_reader, tmp_path):
    fake_arxiv(tmp_path, **{"raw/edge-feat.csv.gz": "0.5\n1.5\n2.5\n3.5\n"})
    assert ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False).num_nodes == 4


# ---- presence: every file ogb opens is there before it parses any --------------------------------------------
_READ = sorted(set(_ROW) | set(_COUNT.values()) | {f"split/time/{p}.csv.gz" for p in ("train", "valid", "test")})


@settings(max_examples=25, deadline=None)
@given(st.sets(st.sampled_from([n for n in _READ if n != "raw/edge.csv.gz"]), min_size=1))
def test_missing_files_are_named_with_the_fix_before_ogb_parses(ogb_reader, tmp_path_factory, gone):
    """F5 generalised: a missing split file was a bare FileNotFoundError from gzip.py, after ogb had parsed."""
    folder = fake_arxiv(tmp_path_factory.mktemp("gone"))
    for name in gone:
        (folder / name).unlink()
    with pytest.raises(FileNotFoundError) as err:
        ogb_reader.load_node_dataset(folder.parent, "ogbn-arxiv", progress=False)
    message = str(err.value)
    assert message.startswith(f"{folder} lacks ") and "never downloads; fetch it once with ogb" in message, message
    assert all(name in message for name in gone), message
    assert not (folder / "processed").exists()  # ogb was never started


def test_a_missing_split_file_is_named_after_processing_too(ogb_reader, tmp_path):
    """F5 as the probe found it: split/time/valid.csv.gz gone once processed/data_processed exists."""
    folder = fake_arxiv(tmp_path)
    ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)
    (folder / "split/time/valid.csv.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"ogbn_arxiv lacks split/time/valid\.csv\.gz, which ogb reads "
                                                r"\(processed/data_processed and the time split\).*never downloads"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-arxiv", progress=False)


def test_files_read_follows_ogbs_table(ogb_reader, tmp_path):
    meta = ogb_reader._meta
    proteins = ogb_reader.files_read(tmp_path, meta("ogbn-proteins"), True)
    assert proteins["raw/edge-feat.csv.gz"] == "edge" and proteins["raw/node_species.csv.gz"] == "node"
    assert "raw/node-feat.csv.gz" not in proteins and proteins["split/species/test.csv.gz"] is None
    _write(tmp_path / "raw" / "species.csv.gz", "1\n")  # the old name, which ogb renames
    assert "raw/species.csv.gz" in ogb_reader.files_read(tmp_path, meta("ogbn-proteins"), True)
    papers = ogb_reader.files_read(tmp_path, meta("ogbn-papers100M"), True)
    assert sorted(papers) == ["raw/data.npz", "raw/node-label.npz"] + [f"split/time/{p}.csv.gz" for p in
                                                                         ("test", "train", "valid")]
    assert list(ogb_reader.files_read(tmp_path, meta("ogbn-arxiv"), False)) == [
        f"split/time/{p}.csv.gz" for p in ("train", "valid", "test")]


# ---- load_partition: meta.json's features and files records agree -------------------------------------------
@pytest.fixture
def parts(tmp_path) -> Path:
    partition_command([str(tmp_path / "parts"), "--no-progress", "--parts", "2", "--synthetic", "400",
                       "--feat-dim", "8"])
    return tmp_path / "parts"


def test_a_feature_dropped_from_meta_json_but_still_recorded_is_refused(parts):
    meta_path = parts / "part0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert "y" in meta["features"] and "features/y.npy" in meta["files"]
    meta_path.write_text(json.dumps({**meta, "features": {k: v for k, v in meta["features"].items() if k != "y"}}))
    with pytest.raises(ValueError, match=r"meta\.json: its features \(x\) and its files records .*features/y\.npy"
                                         r".*disagree; records for features/y\.npy, which no feature names"):
        load_partition(parts, 0, "cpu", progress=False)


def test_an_unknown_files_record_is_refused(parts):
    meta_path = parts / "part1" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "files": {**meta["files"], "extra.npy": {"size": 1, "crc32": 0}}}))
    with pytest.raises(ValueError, match=r"features \(x, y\) and its files records .*records for extra\.npy"):
        load_partition(parts, 1, "cpu", progress=False)
