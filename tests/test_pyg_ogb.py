"""hmgstore.ogb: reading an OGB node dataset from its on-disk layout, never downloading.

The dataset is a tiny fake ``ogbn-products`` written in tmp_path in OGB's
CSV layout; the stores built from it must serve NeighborLoader batches.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("ogb")
pytest.importorskip("torch_geometric")

from hmgstore.data import ogb as hogb  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")

NUM_NODES, NUM_EDGES, FEAT_DIM = 60, 200, 8


def write_fake_products(root, seed: int = 0) -> dict:
    """A tiny ogbn-products in OGB's on-disk CSV layout; returns what was written."""
    rng = np.random.default_rng(seed)
    folder = root / "ogbn_products"
    (folder / "raw").mkdir(parents=True)
    split_dir = folder / "split" / "sales_ranking"
    split_dir.mkdir(parents=True)
    (folder / "RELEASE_v1.txt").write_text("fake release for tests\n")
    edges = rng.integers(0, NUM_NODES, size=(NUM_EDGES, 2))
    feats = rng.standard_normal((NUM_NODES, FEAT_DIM)).astype(np.float32)
    labels = rng.integers(0, 47, size=(NUM_NODES, 1))

    def csv(array, path):
        pd.DataFrame(array).to_csv(path, header=False, index=False, compression="gzip")

    csv(edges, folder / "raw" / "edge.csv.gz")
    csv(feats, folder / "raw" / "node-feat.csv.gz")
    csv(labels, folder / "raw" / "node-label.csv.gz")
    csv(np.array([[NUM_NODES]]), folder / "raw" / "num-node-list.csv.gz")
    csv(np.array([[NUM_EDGES]]), folder / "raw" / "num-edge-list.csv.gz")
    perm = rng.permutation(NUM_NODES)
    split = {"train": np.sort(perm[:30]), "valid": np.sort(perm[30:45]), "test": np.sort(perm[45:])}
    for part, ids in split.items():
        csv(ids.reshape(-1, 1), split_dir / f"{part}.csv.gz")
    return {"edges": edges, "feats": feats, "labels": labels[:, 0], "split": split}


@pytest.fixture
def fake_products(tmp_path):
    return tmp_path, write_fake_products(tmp_path)


def test_reads_raw_then_processed(fake_products):
    root, written = fake_products
    for _ in range(2):  # first from raw CSV (ogb writes processed/), then from processed
        g = hogb.load_node_dataset(root, "ogbn-products")
        assert g.num_nodes == NUM_NODES and g.num_classes == 47
        torch.testing.assert_close(g.x, torch.from_numpy(written["feats"]), rtol=1e-6, atol=1e-6)
        assert torch.equal(g.y, torch.from_numpy(written["labels"]).long())
        # ogbn-products is undirected: ogb adds the inverse of every edge
        forward = torch.from_numpy(written["edges"].T.copy())
        assert g.edge_index.dtype == torch.int64 and g.edge_index.shape == (2, 2 * NUM_EDGES)
        assert set(map(tuple, g.edge_index.T.tolist())) == set(map(tuple, forward.T.tolist())) | set(
            map(tuple, forward.flip(0).T.tolist()))
        for ours, part in ((g.train_idx, "train"), (g.val_idx, "valid"), (g.test_idx, "test")):
            assert torch.equal(ours, torch.from_numpy(written["split"][part]))
        assert (root / "ogbn_products" / "processed" / "data_processed").exists()


def test_missing_dataset_is_a_clear_error_not_a_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        hogb.load_node_dataset(tmp_path, "ogbn-products")
    (tmp_path / "ogbn_products").mkdir()
    with pytest.raises(FileNotFoundError, match="RELEASE_v1.txt"):
        hogb.load_node_dataset(tmp_path, "ogbn-products")
    (tmp_path / "ogbn_products" / "RELEASE_v1.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        hogb.load_node_dataset(tmp_path, "ogbn-products")


def test_unknown_or_hetero_dataset(tmp_path):
    with pytest.raises(ValueError, match="not an OGB"):
        hogb.load_node_dataset(tmp_path, "ogbn-nothing")
    with pytest.raises(ValueError, match="heterogeneous"):
        hogb.load_node_dataset(tmp_path, "ogbn-mag")


def test_stores_from_ogb_files_serve_batches(fake_products):
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import from_tensors

    root, _ = fake_products
    g = hogb.load_node_dataset(root, "ogbn-products")
    feature_store, graph_store = from_tensors(edge_index=g.edge_index, x=g.x, y=g.y, device="cpu")
    loader = NeighborLoader((feature_store, graph_store), num_neighbors=[4, 4], input_nodes=g.train_idx,
                            batch_size=8)
    for batch in loader:
        assert torch.equal(batch.x, g.x[batch.n_id]) and torch.equal(batch.y, g.y[batch.n_id])
