"""hmgstore.data: the synthetic community graphs (community.py) and the OGB reader (ogb.py).

The OGB tests read a tiny fake ``ogbn-products`` written in tmp_path in
OGB's CSV layout (helpers.write_fake_products), never downloading; they need
the ``ogb`` package. The stores built from such files are tested in
test_pyg_loaders.py.
"""
from __future__ import annotations

import pytest
import torch

from helpers import FAKE_PRODUCTS_EDGES, FAKE_PRODUCTS_NODES, write_fake_products
from hmgstore import data as datasets


# ---- synthetic ---------------------------------------------------------------------------
def test_synthetic_shapes_and_dtypes():
    g = datasets.synthetic(num_nodes=1_000, avg_degree=6, feat_dim=12, num_classes=5, seed=3)
    assert isinstance(g, datasets.NodeGraph) and g.num_nodes == 1_000 and g.num_classes == 5
    assert g.x.shape == (1_000, 12) and g.x.dtype == torch.float32
    assert g.y.shape == (1_000,) and g.y.dtype == torch.int64
    assert int(g.y.min()) == 0 and int(g.y.max()) == 4 and len(g.y.unique()) == 5
    assert g.edge_index.shape == (2, 6_000) and g.edge_index.dtype == torch.int64
    assert int(g.edge_index.min()) >= 0 and int(g.edge_index.max()) < 1_000
    for split in (g.train_idx, g.val_idx, g.test_idx):
        assert split.dtype == torch.int64 and torch.equal(split, split.sort().values)
    half = datasets.synthetic(num_nodes=100, avg_degree=2, feat_dim=3, num_classes=2, dtype=torch.float16)
    assert half.x.dtype == torch.float16


def test_synthetic_splits_are_disjoint_and_cover_every_node():
    g = datasets.synthetic(num_nodes=1_000, avg_degree=4, feat_dim=4, num_classes=4, seed=5)
    assert (len(g.train_idx), len(g.val_idx), len(g.test_idx)) == (600, 200, 200)
    every = torch.cat([g.train_idx, g.val_idx, g.test_idx])
    assert torch.equal(every.sort().values, torch.arange(1_000))  # disjoint and covering


def test_synthetic_is_reproducible_by_seed():
    kwargs = dict(num_nodes=500, avg_degree=5, feat_dim=8, num_classes=4)
    a, b = datasets.synthetic(**kwargs, seed=7), datasets.synthetic(**kwargs, seed=7)
    c = datasets.synthetic(**kwargs, seed=8)
    for name in ("edge_index", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.edge_index, c.edge_index) and not torch.equal(a.x, c.x)


def test_synthetic_in_degree_is_skewed():
    g = datasets.synthetic(num_nodes=20_000, avg_degree=10, feat_dim=2, num_classes=8, seed=1)
    degree = torch.bincount(g.edge_index[1], minlength=g.num_nodes).sort(descending=True).values
    top = degree[: g.num_nodes // 100].sum() / degree.sum()
    assert top > 0.15  # the hottest 1% of nodes receive over 15 times their share of the edges
    assert int(degree[0]) > 50 * 10  # the hottest node: far above the average in-degree of 10
    flat = datasets.synthetic(num_nodes=20_000, avg_degree=10, feat_dim=2, num_classes=8, seed=1, skew=1.0)
    flat_degree = torch.bincount(flat.edge_index[1], minlength=flat.num_nodes).sort(descending=True).values
    assert flat_degree[: flat.num_nodes // 100].sum() / flat_degree.sum() < 0.05  # skew=1: no hot nodes


def test_synthetic_most_edges_stay_in_a_community():
    g = datasets.synthetic(num_nodes=4_000, avg_degree=8, feat_dim=2, num_classes=8, seed=2)
    same = (g.y[g.edge_index[0]] == g.y[g.edge_index[1]]).float().mean()
    assert same > 0.75  # intra=0.8, plus the random communities that happen to match


def test_synthetic_refuses_sizes_that_make_no_graph():
    for kwargs in (dict(num_nodes=3, num_classes=4), dict(num_classes=1), dict(avg_degree=0), dict(feat_dim=0)):
        with pytest.raises(ValueError, match="num_nodes >= num_classes"):
            datasets.synthetic(**{"num_nodes": 100, **kwargs})


# ---- OGB files on disk ----------------------------------------------------------------------
@pytest.fixture
def ogb_reader():
    """hmgstore.data.ogb, which needs the ogb package."""
    pytest.importorskip("ogb")
    from hmgstore.data import ogb

    return ogb


@pytest.fixture
def fake_products(tmp_path):
    return tmp_path, write_fake_products(tmp_path)


def test_reads_raw_then_processed(ogb_reader, fake_products):
    root, written = fake_products
    for _ in range(2):  # first from raw CSV (ogb writes processed/), then from processed
        g = ogb_reader.load_node_dataset(root, "ogbn-products")
        assert g.num_nodes == FAKE_PRODUCTS_NODES and g.num_classes == 47
        torch.testing.assert_close(g.x, torch.from_numpy(written["feats"]), rtol=1e-6, atol=1e-6)
        assert torch.equal(g.y, torch.from_numpy(written["labels"]).long())
        # ogbn-products is undirected: ogb adds the inverse of every edge
        forward = torch.from_numpy(written["edges"].T.copy())
        assert g.edge_index.dtype == torch.int64 and g.edge_index.shape == (2, 2 * FAKE_PRODUCTS_EDGES)
        assert set(map(tuple, g.edge_index.T.tolist())) == set(map(tuple, forward.T.tolist())) | set(
            map(tuple, forward.flip(0).T.tolist()))
        for ours, part in ((g.train_idx, "train"), (g.val_idx, "valid"), (g.test_idx, "test")):
            assert torch.equal(ours, torch.from_numpy(written["split"][part]))
        assert (root / "ogbn_products" / "processed" / "data_processed").exists()


def test_missing_dataset_is_a_clear_error_not_a_download(ogb_reader, tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-products")
    (tmp_path / "ogbn_products").mkdir()
    with pytest.raises(FileNotFoundError, match="RELEASE_v1.txt"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-products")
    (tmp_path / "ogbn_products" / "RELEASE_v1.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-products")


def test_unknown_or_hetero_dataset(ogb_reader, tmp_path):
    with pytest.raises(ValueError, match="not an OGB"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-nothing")
    with pytest.raises(ValueError, match="heterogeneous"):
        ogb_reader.load_node_dataset(tmp_path, "ogbn-mag")


def test_synthetic_fine_communities_keep_edges_inside_and_one_class_each():
    g = datasets.synthetic(num_nodes=20_000, avg_degree=10, feat_dim=4, num_classes=4, communities=400, seed=3)
    default = datasets.synthetic(num_nodes=2_000, avg_degree=5, feat_dim=4, num_classes=4, seed=4)
    same = datasets.synthetic(num_nodes=2_000, avg_degree=5, feat_dim=4, num_classes=4, communities=4, seed=4)
    assert torch.equal(default.edge_index, same.edge_index) and torch.equal(default.x, same.x)  # the default is kept
    src, dst = g.edge_index
    assert (g.y[src] == g.y[dst]).float().mean() > 0.8  # most edges stay inside a community, hence a class
    with pytest.raises(ValueError, match="communities"):
        datasets.synthetic(num_nodes=100, num_classes=4, communities=2)
