"""Attributes of a Data/HeteroData into the stores (hmgstore.plugins.pyg.attributes): none lost without a word.

An attribute whose rows match neither its node count nor (edge attributes)
its edge count raises ValueError naming it, both sizes and the fix, in
``from_data`` (``Data`` and ``HeteroData``) and ``from_tensors``; what is
legitimately not per node (graph-level values, ``num_nodes``, the topology,
index tensors, link supervision) still works, and edge attributes are
stored as edge tables (those left out of ``edge_attrs`` are named in a warning).
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data, HeteroData  # noqa: E402

from hmgstore.plugins import pyg as hpyg  # noqa: E402

NODES, EDGES = 1000, 5000


@pytest.fixture
def edge_index():
    return torch.randint(0, NODES, (2, EDGES), generator=torch.Generator().manual_seed(0))


def _raises(words, fn, *args, **kwargs) -> str:
    """Call ``fn``; it must raise ValueError whose message holds every one of ``words``."""
    with pytest.raises(ValueError) as err:
        fn(*args, **kwargs)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    return str(err.value)


def test_a_short_x_raises_instead_of_vanishing(edge_index):
    """The issue's case: x of 900 rows for 1000 nodes was dropped, and batch.x was None much later."""
    data = Data(x=torch.randn(900, 16), y=torch.randint(0, 4, (NODES,)), edge_index=edge_index, num_nodes=NODES)
    _raises(["'x'", "900 rows", "1000 nodes", "attrs=['y']", "num_nodes"], hpyg.from_data, data, device="cpu")
    # without num_nodes PyG counts x's rows: then y is the attribute that does not fit
    data = Data(x=torch.randn(900, 16), y=torch.randint(0, 4, (NODES,)), edge_index=edge_index[:, :0])
    _raises(["'y'", "1000 rows", "900 nodes"], hpyg.from_data, data, device="cpu")


def test_named_attributes_are_checked_and_others_may_be_left_out(edge_index):
    data = Data(x=torch.randn(NODES, 4), y=torch.ones(NODES - 1), train_idx=torch.arange(10), edge_index=edge_index)
    _raises(["'y'", "999 rows", "1000 nodes", "attrs=['x']"], hpyg.from_data, data, attrs=["x", "y"], device="cpu")
    _raises(["'train_idx'", "10 rows"], hpyg.from_data, Data(x=data.x, train_idx=data.train_idx, edge_index=edge_index),
            device="cpu")
    feature_store, _ = hpyg.from_data(data, attrs=["x"], device="cpu")  # the user's way out: name what to store
    assert [attr.attr_name for attr in feature_store.get_all_tensor_attrs()] == ["x"]


def test_an_edge_attribute_of_the_wrong_length_raises(edge_index):
    data = Data(x=torch.randn(NODES, 4), edge_attr=torch.randn(EDGES - 1, 3), edge_index=edge_index)
    _raises(["'edge_attr'", "4999 rows", "5000 edges", "del data.edge_attr"], hpyg.from_data, data, device="cpu")


def test_what_is_not_per_node_still_works_and_edge_attributes_are_named(edge_index, caplog):
    data = Data(x=torch.randn(NODES, 4), y=torch.randint(0, 3, (NODES,)), edge_index=edge_index, num_nodes=NODES,
                train_mask=torch.rand(NODES) < 0.5, feat_np=np.ones((NODES, 2), np.float32),  # node attributes
                edge_attr=torch.randn(EDGES, 3), edge_weight=torch.rand(EDGES),  # edge attributes
                label=torch.tensor(3), name="toy", num_classes=3,  # graph-level values
                edge_label_index=edge_index[:, :10], edge_label=torch.ones(10))  # link supervision
    with caplog.at_level(logging.WARNING, logger="hmgstore.plugins.pyg"):
        feature_store, _ = hpyg.from_data(data, device="cpu")
    stored = sorted(attr.attr_name for attr in feature_store.get_all_tensor_attrs())
    assert stored == ["feat_np", "train_mask", "x", "y"]
    assert torch.equal(feature_store.get_tensor(None, "feat_np", torch.tensor([0, 7])), torch.ones(2, 2))
    assert sorted(feature_store.edge_tables()) == [(None, "edge_attr"), (None, "edge_weight")]  # edge tables
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    with caplog.at_level(logging.WARNING, logger="hmgstore.plugins.pyg"):
        feature_store, _ = hpyg.from_data(data, device="cpu", edge_attrs=["edge_attr"])
    assert list(feature_store.edge_tables()) == [(None, "edge_attr")]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "'edge_weight'" in warned[0] and "not stored" in warned[0]


def test_hetero_node_and_edge_attributes_are_checked():
    data = HeteroData()
    data["paper"].x = torch.randn(10, 3)
    data["paper"].y = torch.ones(12)
    data["author"].x = torch.randn(4, 3)
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 2], [3, 4, 5]])
    _raises(["'y'", "12 rows", "node type 'paper'", "10 nodes", "batch['paper'].y", "data['paper'].num_nodes"],
            hpyg.from_data, data, device="cpu")
    data["paper"].y = torch.ones(10)
    data["author", "writes", "paper"].edge_attr = torch.ones(2, 5)
    _raises(["'edge_attr'", "2 rows", "('author', 'writes', 'paper')", "3 edges"], hpyg.from_data, data,
            device="cpu")
    data["author", "writes", "paper"].edge_attr = torch.ones(3, 5)
    data["paper"].year = torch.tensor(2024)  # a 0-d value: graph-level, left alone
    feature_store, _ = hpyg.from_data(data, device="cpu")
    assert sorted((a.group_name, a.attr_name) for a in feature_store.get_all_tensor_attrs()) == [
        ("author", "x"), ("paper", "x"), ("paper", "y")]
    assert list(feature_store.edge_tables()) == [(("author", "writes", "paper"), "edge_attr")]


def test_from_tensors_names_the_feature_both_sizes_and_the_fix(edge_index):
    _raises(["'x'", "900 rows", "1000 nodes (num_nodes)", "Give it 1000 rows"], hpyg.from_tensors,
            edge_index=edge_index, x=torch.randn(900, 4), num_nodes=NODES)
    _raises(["'y'", "1000 rows", "900 nodes", "'x', the first feature", "num_nodes="], hpyg.from_tensors,
            edge_index=edge_index[:, :0], x=torch.randn(900, 4), y=torch.ones(NODES))
    _raises(["'label'", "0-d tensor"], hpyg.from_tensors, edge_index=edge_index, x=torch.randn(NODES, 4),
            label=torch.tensor(1))
