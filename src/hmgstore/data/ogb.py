"""OGB node-property datasets read from disk with the ``ogb`` package, never downloaded.

:func:`load_node_dataset` turns an OGB homogeneous node dataset that is
already on disk (``ogbn-products``, ``ogbn-papers100M``, ``ogbn-arxiv``, ...)
into a :class:`hmgstore.data.NodeGraph`, the form the examples and
adapters take. It reads with ``ogb.nodeproppred.NodePropPredDataset`` (raw
CSV/NPZ files, or ``processed/data_processed`` once ogb has written it), after
checking that the files are present: ogb itself would download a missing
dataset, or stop to ask on the terminal when the release marker is missing,
neither of which a library call should do. ogb's console chatter goes to
this module's logger.

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
import warnings
from pathlib import Path

import numpy as np
import torch

from ..memory import owned
from ..rows import checks
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
    return Path(root) / name.replace("-", "_")


def check_present(root, name: str) -> Path:
    """The dataset folder, after checking ogb can read it without downloading or prompting.

    Raises FileNotFoundError naming what is missing and how to fetch it,
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
    return folder


@contextlib.contextmanager
def _ogb_quietly():
    """Run ogb: its prints go to the log, and its ``torch.load`` of numpy pickles is allowed.

    ogb 1.3 calls ``torch.load`` without ``weights_only``; since torch 2.6 that
    refuses the numpy arrays ogb itself saved. The files are the caller's
    local dataset, which ogb trusts, so its loads run as ogb intended.
    """
    out, key = io.StringIO(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
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
    and split ids are all checked before any is trusted).
    """
    try:
        from ogb.nodeproppred import NodePropPredDataset
    except ImportError as err:
        raise ImportError(f"reading OGB datasets needs the ogb package ({err}); pip install ogb") from None
    folder = check_present(root, name)
    (folder / "processed").mkdir(exist_ok=True)
    with _ogb_quietly():
        dataset = NodePropPredDataset(name, root=str(root))
        split = dataset.get_idx_split()
    graph, labels = dataset[0]
    labels, edge_index, split = _checked(folder, graph, labels, split)
    if labels.dtype.kind == "f":  # papers100M: NaN marks unlabelled nodes
        labels = np.where(np.isnan(labels), -1, labels)
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
        y=torch.from_numpy(labels.astype(np.int64)),
        train_idx=split["train"], val_idx=split["valid"], test_idx=split["test"],
        num_classes=int(dataset.num_classes),
    )


def _checked(folder: Path, graph: dict, labels, split: dict) -> tuple[np.ndarray, torch.Tensor, dict]:
    """``(labels [N], edge_index int64 [2, E], split as int64 id tensors)``, after checking what ogb read
    against the node count.

    The node count (``num-node-list``) must be a non-negative integer; the
    features must have one row per node, the labels one per node (a label
    file with more or fewer rows is refused, never reshaped), every edge must
    join two nodes, and every split id must be an integer node id (floats
    are refused, never truncated). Raises ValueError naming ``folder``.
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
    labels = labels.reshape(n)
    edges = np.asarray(graph.get("edge_index"))
    if edges.ndim != 2 or edges.shape[0] != 2 or (edges.size and edges.dtype.kind not in "iu"):
        raise ValueError(f"{where}: the edges (raw/edge) have shape {tuple(edges.shape)} of {edges.dtype}, not "
                         "[2, E] integer node ids")
    edge_index = torch.from_numpy(np.ascontiguousarray(edges, dtype=np.int64))
    checks.id_list(edge_index.reshape(-1), "the edges (raw/edge)", n, source=where)
    ids = {}
    for part in ("train", "valid", "test"):
        if part not in split:
            raise ValueError(f"{where}: the split has no {part!r} ids (split/<name>/{part}.csv.gz)")
        ids[part] = checks.id_list(np.asarray(split[part]).reshape(-1), f"the {part} split", n, source=where)
    return labels, edge_index, ids
