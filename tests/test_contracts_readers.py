"""Readers refuse damaged files by name: OGB raw CSVs (hmgstore.data.raw_csv, via load_node_dataset) and a
part's meta.json whose features and files records disagree (hmgstore.distributed.load_partition).

The OGB cases write a tiny fake ``ogbn-arxiv`` (4 nodes, raw CSVs and a time split) under tmp_path and read
it with the ``ogb`` package; each damaged file must be refused with a ValueError naming the dataset folder,
the file and the line (or "empty"), before pandas or numpy can fill, wrap or refuse it without a name.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

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
