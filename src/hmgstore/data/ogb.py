"""OGB node-property datasets read from disk with the ``ogb`` package, never downloaded.

:func:`load_node_dataset` turns an OGB homogeneous node dataset that is
already on disk (``ogbn-products``, ``ogbn-papers100M``, ``ogbn-arxiv``, ...)
into a :class:`hmgstore.data.NodeGraph`, the form the examples and
adapters take. It reads with ``ogb.nodeproppred.NodePropPredDataset`` (raw
CSV/NPZ files, or ``processed/data_processed`` once ogb has written it), after
checking that the files are present: ogb itself would download a missing
dataset, or stop to ask on the terminal when the release marker is missing,
neither of which a library call should do. ogb's console chatter goes to
this module's logger (its progress bars too, with ``progress=False``). When
ogb writes ``processed/data_processed``, the raw files it was made from are
recorded beside it and checked on every later load
(:mod:`hmgstore.data.processed_record`), so stale processed rows are refused.

The layout looked for, under ``root``::

    ogbn_products/RELEASE_v1.txt
    ogbn_products/raw/edge.csv.gz, node-feat.csv.gz, node-label.csv.gz, ...   (CSV datasets)
    ogbn_papers100M/raw/data.npz, node-label.npz                            (binary datasets)
    <dataset>/processed/data_processed                                      (written by ogb)
    <dataset>/split/<split name>/train.csv.gz, valid.csv.gz, test.csv.gz

Features and edges stay the numpy arrays ogb returns (no copy). ogb holds
them in memory: papers100M needs about 60 GB of RAM.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..memory import owned
from ..rows import checks
from ..table.file_args import NPY_HEADER_ERRORS
from . import ogb_split, processed_record, raw_csv
from .community import NodeGraph

log = logging.getLogger(__name__)


def _meta(name: str):
    """ogb's own table of dataset facts (version, binary, hetero, ...) for ``name``."""
    import ogb.nodeproppred
    import pandas as pd

    master = pd.read_csv(Path(ogb.nodeproppred.__file__).parent / "master.csv", index_col=0, keep_default_na=False)
    if name not in master:
        raise ValueError(f"{name!r} is not an OGB node-property dataset; known: {', '.join(master.keys())}")
    return master[name]


def dataset_dir(root, name: str) -> Path:
    """Where ogb keeps ``name`` under ``root`` (``ogbn-products`` -> ``root/ogbn_products``)."""
    return checks.path(root, "the datasets' folder (root)", "load_node_dataset") / name.replace("-", "_")


def check_present(root, name: str) -> Path:
    """The dataset folder, after checking ogb can read it without downloading or prompting.

    Every file ogb will open (:func:`files_read`) must be there. Raises
    FileNotFoundError naming what is missing and how to fetch it,
    ValueError for unknown or heterogeneous datasets.
    """
    meta = _meta(name)
    if meta["is hetero"] == "True":
        raise ValueError(f"{name} is heterogeneous; load_node_dataset reads homogeneous node datasets")
    folder = dataset_dir(root, name)
    fetch = (f"hmgstore never downloads; fetch it once with ogb: python -c \"from ogb.nodeproppred import "
             f"NodePropPredDataset; NodePropPredDataset('{name}', root='{root}')\"")
    if not folder.is_dir():
        raise FileNotFoundError(f"no {name} under {root} (looked for {folder}). {fetch}")
    release = folder / f"RELEASE_v{meta['version']}.txt"
    if not release.exists():
        raise FileNotFoundError(f"{folder} has no {release.name}: it is incomplete or from another OGB "
                                f"release (ogb would ask on the terminal whether to re-download). {fetch}")
    raw = folder / "raw" / ("data.npz" if meta["binary"] == "True" else "edge.csv.gz")
    if not (folder / "processed" / "data_processed").exists() and not raw.exists():
        raise FileNotFoundError(f"{folder} holds neither processed/data_processed nor {raw.relative_to(folder)}. "
                                f"{fetch}")
    # ogb opens its files one by one as it parses: a missing one stops it halfway with a bare path (gzip) or
    # RuntimeError('No necessary file'), so every file it will open is looked for first
    from_raw = not (folder / "processed" / "data_processed").exists()
    missing = [path for path in files_read(folder, meta, from_raw) if not (folder / path).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}, which ogb reads "
                                f"({'raw files' if from_raw else 'processed/data_processed'} and the "
                                f"{meta['split']} split): the dataset is incomplete. {fetch}")
    return folder


#: The count files ogb cuts the raw files by, by what they count.
_COUNT_FILES = {"node": "raw/num-node-list.csv.gz", "edge": "raw/num-edge-list.csv.gz"}


def files_read(folder: Path, meta, from_raw: bool) -> dict[str, str | None]:
    """Every file ogb opens to read the dataset ``meta`` describes under ``folder``, by its path under
    ``folder``, with what its rows count (``"node"``, ``"edge"``; None for count, split and binary files).
    From ``processed/data_processed`` only the split is read (none when ``split_dict.pt`` holds it)."""
    split = f"split/{meta['split']}"
    files: dict[str, str | None] = {} if (folder / split / "split_dict.pt").is_file() else {
        f"{split}/{part}.csv.gz": None for part in ("train", "valid", "test")}
    if not from_raw:
        return files
    if meta["binary"] == "True":
        return {"raw/data.npz": None, "raw/node-label.npz": None, **files}
    raw: dict[str, str | None] = {"raw/edge.csv.gz": "edge", _COUNT_FILES["node"]: None,
                                  _COUNT_FILES["edge"]: None, "raw/node-label.csv.gz": "node"}
    for stem, what, attr in (("node-feat", "node", "has_node_attr"), ("edge-feat", "edge", "has_edge_attr")):
        if meta[attr] == "True" or (folder / "raw" / f"{stem}.csv.gz").is_file():  # ogb reads it whenever present
            raw[f"raw/{stem}.csv.gz"] = what
    for key, what in (("additional node files", "node"), ("additional edge files", "edge")):
        for stem in meta[key].split(",") if meta[key] != "None" else []:
            path = f"raw/{stem}.csv.gz"
            if stem == "node_species" and not (folder / path).is_file() and (folder / "raw/species.csv.gz").is_file():
                path = "raw/species.csv.gz"  # ogbn-proteins' first name for it, which ogb renames before reading
            raw[path] = what
    return {**raw, **files}


def _check_counts(folder: Path, meta, rows: dict[str, int]) -> None:
    """Every raw CSV's rows (counted by :func:`raw_csv.check_dataset_csvs`) against the node or edge count
    that ogb cuts it by; binary datasets are left to :func:`_checked` and :func:`_check_all_edges_kept`."""
    if meta["binary"] == "True":
        return
    counts = {what: (path, *raw_csv.read_count(folder, path, rows[path])) for what, path in _COUNT_FILES.items()}
    counted_by = {path: what for path, what in files_read(folder, meta, True).items() if what is not None}
    raw_csv.check_counts(folder, counts, rows, counted_by)


#: A tqdm progress bar's line, as ogb's bars write it ("100%|####| 1/1 [00:00<...]", "3it [00:00, ...]").
_BAR = re.compile(r"\d+%\||\d+it \[|\d+/\d+ \[")


@contextlib.contextmanager
def _ogb_quietly(progress: bool = True):
    """Run ogb: its prints go to the log, and its ``torch.load`` of numpy pickles is allowed.

    With ``progress=False`` its stderr is captured too: tqdm's bars are
    logged at DEBUG, any other line (a warning) at WARNING, so nothing is
    lost; exceptions pass through untouched. While it runs, ``sys.stderr``
    is swapped for the whole process (``contextlib.redirect_stderr``).
    ogb 1.3 calls ``torch.load`` without ``weights_only``; since torch 2.6 that
    refuses the numpy arrays ogb itself saved. The files are the caller's
    local dataset, which ogb trusts, so its loads run as ogb intended.
    """
    out, err, key = io.StringIO(), io.StringIO(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stdout(out))
            if not progress:
                stack.enter_context(contextlib.redirect_stderr(err))
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=".*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD.*")
            yield
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before
        for line in out.getvalue().splitlines():
            if line.strip():
                log.info("ogb: %s", line)
        for line in re.split(r"[\r\n]+", err.getvalue()):  # a bar redraws its line with \r
            if line.strip():
                log.log(logging.DEBUG if _BAR.search(line) else logging.WARNING, "ogb: %s", line.rstrip())


def load_node_dataset(root, name: str = "ogbn-products", owned_memory: bool = True,
                      progress: bool = True) -> NodeGraph:
    """A homogeneous OGB node dataset already under ``root``, as a :class:`NodeGraph`.

    Returns CPU tensors: ``edge_index`` int64 [2, E] (with the inverse edges
    ogb adds for undirected datasets), ``x`` [N, D] (copied into host memory
    hmgstore owns (cudaHostAlloc when a GPU is present, which forked loader
    workers share, else 2 MiB pages), which a GPU reads zero-copy faster than
    ogb's own array; ``owned_memory=False`` keeps ogb's array, without a
    copy, when it is row-major), ``y`` int64 [N] (-1 for unlabelled nodes, as in
    papers100M), and the official split as int64 id tensors. The first call
    on raw files makes ogb write ``processed/data_processed`` (the folder must
    be writable); later calls read that. Raises FileNotFoundError when the
    files are absent (see :func:`check_present`), ImportError without ogb,
    and ValueError naming the dataset's folder when the files disagree with
    each other (:func:`_checked`: the node count, features, labels, edges
    and split ids are all checked before any is trusted; a split lists each
    node once, in one of train/valid/test), when ``processed/data_processed``
    was made from other raw files than those there now (ogb would read the
    old rows: older than a raw file, or, by the record hmgstore writes beside
    it, a raw file of another size or checksum, even with its old mtime kept,
    or a ``data_processed`` copied in; one without a record, from ogb's own
    download, is checked by mtime and its first rows, then recorded: see
    :mod:`hmgstore.data.processed_record`), when ogb kept
    fewer edges than ``raw/edge`` holds (``num-edge-list`` short of it), when
    a raw CSV's rows differ from the count ogb cuts it by (``num-node-list``
    for node features, labels and years, ``num-edge-list`` for edges and edge
    features; ogb would drop the rows past it in silence), and
    when a CSV file ogb reads (``raw/*.csv.gz``, ``split/*/*.csv.gz``) is
    empty, has a line with a missing column, or holds anything but integer
    ids in an id file (a float such as 3.7, which ogb would truncate, an id
    past int64) or numbers in another, or is not a whole gzip file
    (:mod:`hmgstore.data.raw_csv`; the file and line are named). With
    ``progress=False`` nothing is printed: ogb's bars go to the log.
    """
    try:
        from ogb.nodeproppred import NodePropPredDataset
    except ImportError as err:
        raise ImportError(f"reading OGB datasets needs the ogb package ({err}); pip install ogb") from None
    folder = check_present(root, name)
    meta = _meta(name)
    raw_paths = [path for path in files_read(folder, meta, True) if path.startswith("raw/")]
    from_raw = not (folder / "processed" / "data_processed").exists()
    record = None if from_raw else processed_record.read(folder)
    _check_processed_is_current(folder, raw_paths, record)
    # Before ogb parses the CSVs (pandas truncates floats, fills a missing column with NaN): every line checked,
    # and the raw edges counted for the check below.
    rows = raw_csv.check_dataset_csvs(folder, from_raw)
    raw_read = processed_record.identities(folder, raw_paths) if from_raw else {}  # as ogb reads them
    if from_raw:  # ogb slices each file by the counts without comparing: a short or long file would go unseen
        _check_counts(folder, meta, rows)
    held = _raw_edges_held(folder, meta, rows) if from_raw else None
    (folder / "processed").mkdir(exist_ok=True)
    with _ogb_quietly(progress):
        dataset = NodePropPredDataset(name, root=str(folder.parent))  # root as a str, whatever form it came in
        split = ogb_split.read_split(dataset, folder)
    graph, labels = dataset[0]
    if from_raw:  # the processed rows are bound to the raw files they came from, checked on later loads
        _keep_processed(folder, graph, held, raw_read)
    if not from_raw and record is None:
        _adopt_processed(folder, meta, raw_paths, graph, labels)
    labels, edge_index, split = _checked(folder, graph, labels, split, int(dataset.num_classes))
    features = graph["node_feat"]
    if owned_memory:  # column-major CSV reads are made row-major by the copy, piece by piece
        x = owned.copy_in(owned.empty(features.shape, torch.from_numpy(features[:0]).dtype, zero=False), features,
                          progress,
                          desc=f"{name} features into host memory")
    else:
        x = torch.from_numpy(np.ascontiguousarray(features))  # CSV reads are column-major
    del graph["node_feat"]
    return NodeGraph(
        edge_index=edge_index,
        x=x,
        y=torch.from_numpy(labels),
        train_idx=split["train"], val_idx=split["valid"], test_idx=split["test"],
        num_classes=int(dataset.num_classes),
    )


def _keep_processed(folder: Path, graph: dict, held, raw_read: dict) -> None:
    """After ogb processed the raw files in this call: refuse a graph short of ``raw/edge`` (ogb keeps the edges
    num-edge-list counts), removing what it wrote so that no later load reads it, then record the raw files."""
    if held is not None:
        try:
            _check_all_edges_kept(folder, graph, held)
        except ValueError:
            (folder / "processed" / "data_processed").unlink(missing_ok=True)
            raise
    processed_record.write(folder, raw_read)


def _check_processed_is_current(folder: Path, raw_paths: list[str], record: dict | None) -> None:
    """Refuse ``processed/data_processed`` made from other raw files than those under ``folder`` now: ogb reads
    it whenever it exists, so raw files replaced since (new features, fixed labels) would be ignored in silence.

    A raw file newer than it is refused unless ``record`` (:func:`processed_record.read`) holds that file's
    content (a copy without ``-p`` moves mtimes only); with a record, every raw file's size and checksum must
    be the recorded ones (:func:`processed_record.check`: catches a file replaced with its old mtime kept, and
    a ``data_processed`` copied from another dataset). Raises ValueError naming the file and the fix.
    """
    processed = folder / "processed" / "data_processed"
    if not processed.exists() or not (folder / "raw").is_dir():
        return
    written = processed.stat().st_mtime_ns
    newer = sorted(p.name for p in (folder / "raw").iterdir() if p.is_file() and p.stat().st_mtime_ns > written)
    if record is not None:
        now = processed_record.identities(folder, [f"raw/{name}" for name in newer])
        newer = [name for name in newer if not processed_record.same_content(record["raw"].get(f"raw/{name}"),
                                                                             now.get(f"raw/{name}"))]
    if newer:
        raise ValueError(f"{folder}: processed/data_processed is older than raw/{newer[0]}; ogb would read the "
                         "rows it processed before, not the raw files as they are now. Delete "
                         f"{processed} to read the raw files again")
    if record is not None:
        processed_record.check(folder, record, raw_paths)


def _adopt_processed(folder: Path, meta, raw_paths: list[str], graph: dict, labels) -> None:
    """Record a ``processed/data_processed`` that came without a record (ogb's own download wrote it, or an
    older hmgstore), once its first rows are checked against the raw files (:func:`processed_record.head_differs`);
    ValueError naming the raw file when they differ (another dataset's processed rows)."""
    raw_now = processed_record.identities(folder, raw_paths)
    if not raw_now:  # no raw files to compare with or record: ogb reads processed/ alone
        return
    differs = processed_record.head_differs(folder, graph, labels, meta["add_inverse_edge"] == "True")
    if differs is not None:
        raise ValueError(f"{folder}: the first rows of {differs} are not those of processed/data_processed, which "
                         "was made from other raw files (copied in from another dataset, or the raw files were "
                         f"replaced since). Delete {folder / 'processed'} to rebuild it from the raw files")
    log.info("%s: processed/data_processed came without a record of its raw files; its first rows match them, "
             "recorded now (%s)", folder, processed_record.RECORD)
    processed_record.write(folder, raw_now)


def _raw_edges_held(folder: Path, meta, rows: dict[str, int]) -> int | None:
    """The edges the raw files hold (inverse edges counted): ``raw/edge.csv.gz``'s rows (counted by
    :func:`raw_csv.check_dataset_csvs`) or ``raw/data.npz``'s ``edge_index`` (from its header); None where
    they cannot be counted (ogb will say why, or read a header this count does not)."""
    if meta["binary"] != "True":
        held = rows.get("raw/edge.csv.gz")
    else:
        try:
            held = _npz_edge_count(folder)
        except (OSError, KeyError, zipfile.BadZipFile, *NPY_HEADER_ERRORS) as err:  # ogb then says what is wrong
            log.debug("not counting %s's raw edges: %s", folder, err)
            return None
    if held is None:
        return None
    return 2 * held if meta["add_inverse_edge"] == "True" else held


def _npz_edge_count(folder: Path) -> int:
    """The number of edges in ``raw/data.npz``'s ``edge_index``, read from its header only."""
    with zipfile.ZipFile(folder / "raw" / "data.npz") as z, z.open("edge_index.npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape = read(f)[0]  # the header only, never the edges
    return int(shape[1]) if len(shape) == 2 else -1


def _check_all_edges_kept(folder: Path, graph: dict, held: int) -> None:
    """Refuse a graph with fewer edges than the raw edge file: ogb cuts ``raw/edge`` into graphs by
    ``num-edge-list`` and keeps the first, so a count short of the file drops edges without a word."""
    edges = np.asarray(graph.get("edge_index"))
    kept = edges.shape[1] if edges.ndim == 2 else -1
    if kept != held:
        raise ValueError(f"{folder}: the graph ogb read has {kept} edges, but raw/edge holds {held} (inverse edges "
                         "counted); raw/num-edge-list does not count the edge file's rows, the file is damaged")


def _checked(folder: Path, graph: dict, labels, split: dict, num_classes: int | None = None
             ) -> tuple[np.ndarray, torch.Tensor, dict]:
    """``(labels [N], edge_index int64 [2, E], split as int64 id tensors)``, after checking what ogb read
    against the node count.

    The node count (``num-node-list``) must be a non-negative integer; the
    features must have one row per node, the labels one per node (a label
    file with more or fewer rows is refused, never reshaped), every edge must
    join two nodes, and every split id must be an integer node id (floats
    are refused, never truncated) listed once in one split only. Labels are
    whole numbers in ``[0, num_classes)`` or -1 (NaN, papers100M's
    unlabelled nodes, becomes -1; 2.5 is refused, never truncated). Returns
    the labels as int64. Raises ValueError naming ``folder``.
    """
    where = f"{folder}"
    n = graph.get("num_nodes")
    try:
        n = checks.count(n, "num_nodes")
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: the node count (raw/num-node-list) is not a node count: {err}") from None
    features = graph.get("node_feat")
    if features is None:
        raise ValueError(f"{where} has no node features (raw/node-feat)")
    if features.ndim != 2 or features.shape[0] != n:
        raise ValueError(f"{where}: the node features (raw/node-feat) have shape {tuple(features.shape)}, not one "
                         f"row per node of the {n} the dataset says (raw/num-node-list)")
    labels = np.asarray(labels)
    if labels.ndim not in (1, 2) or labels.shape[0] != n or (labels.ndim == 2 and labels.shape[1] != 1):
        raise ValueError(f"{where}: the labels (raw/node-label) have shape {tuple(labels.shape)}, not one label per "
                         f"node of the {n} the dataset says (raw/num-node-list)")
    labels = _whole_labels(where, labels.reshape(n), num_classes)
    edges = np.asarray(graph.get("edge_index"))
    if edges.ndim != 2 or edges.shape[0] != 2 or (edges.size and edges.dtype.kind not in "iu"):
        raise ValueError(f"{where}: the edges (raw/edge) have shape {tuple(edges.shape)} of {edges.dtype}, not "
                         "[2, E] integer node ids")
    edge_index = torch.from_numpy(np.ascontiguousarray(edges, dtype=np.int64))
    checks.id_list(edge_index.reshape(-1), "the edges (raw/edge)", n, source=where)
    ids = ogb_split.checked_split(split, n, where)
    return labels, edge_index, ids


def _whole_labels(where: str, labels: np.ndarray, num_classes: int | None) -> np.ndarray:
    """``labels`` as int64: NaN (an unlabelled node) is -1; other values must be whole numbers in
    ``[-1, num_classes)``, never truncated or wrapped by the cast."""
    if labels.dtype.kind == "f":
        finite = labels[~np.isnan(labels)]
        if finite.size and not bool(np.all(np.isfinite(finite) & (finite == np.round(finite)))):
            bad = finite[~(np.isfinite(finite) & (finite == np.round(finite)))][0].item()
            raise ValueError(f"{where}: the labels (raw/node-label) hold {bad!r}, not a class number; labels are "
                             "whole numbers (NaN marks an unlabelled node)")
        labels = np.where(np.isnan(labels), -1, labels)
    elif labels.dtype.kind not in "iub":
        raise ValueError(f"{where}: the labels (raw/node-label) hold {labels.dtype} values, not class numbers")
    high = num_classes if num_classes is not None else np.inf
    out = (labels < -1) | (labels >= high)
    if bool(out.any()):
        raise ValueError(f"{where}: the labels (raw/node-label) hold {labels[out][0].item()!r}; labels are in "
                         f"[0, {num_classes}) (num classes), or -1 for an unlabelled node")
    return labels.astype(np.int64)
