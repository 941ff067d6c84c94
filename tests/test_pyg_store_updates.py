"""Changing a PyG store's attributes without losing them, and batches that never alias its tables.

``update_tensor`` writes rows in place or replaces a whole table, and a refused
update leaves the old attribute readable with its old values (PyG's default
removes it first, then fails to put); ``remove_tensor`` refuses an index of rows
rather than dropping the whole table; ``multi_get_tensor``, which PyG's loaders
fill batches with, copies runs of rows that ``get_tensor`` hands out as views
(hmgstore.plugins.pyg.updates, hmgstore.plugins.pyg.feature_store).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data, TensorAttr  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402

from hmgstore.plugins import pyg as hpyg  # noqa: E402
from hmgstore.plugins.pyg import ranges  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")

N = 10


def _data(num_nodes: int = N, seed: int = 0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    ring = torch.arange(num_nodes)
    return Data(x=torch.randn(num_nodes, 4, generator=gen), y=torch.arange(num_nodes),
                edge_index=torch.stack([ring, ring.roll(1)]))


def _store(data: Data) -> hpyg.HybridFeatureStore:
    return hpyg.from_data(data, device="cpu", progress=False)[0]


def _aliases(got: torch.Tensor, table: torch.Tensor) -> bool:
    """Whether ``got`` lies in ``table``'s memory (a view of it)."""
    return got.numel() > 0 and got.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()


def test_update_with_an_index_writes_the_rows_in_place():
    data = _data()
    want = data.x.clone()
    store = _store(data)
    assert store.update_tensor(torch.zeros(2, 4), None, "x", index=torch.tensor([1, 2]))
    want[1:3] = 0
    assert store.get_tensor_size(None, "x") == (N, 4)
    assert torch.equal(store.get_tensor(None, "x", None), want)
    assert store.update_tensor(torch.ones(4), None, "x", index=slice(5, 7))  # a row broadcasts, as in torch
    want[5:7] = 1
    assert torch.equal(store.get_tensor(None, "x", torch.arange(N)), want)


@pytest.mark.parametrize("rows, index, error", [
    (torch.zeros(3, 4), torch.tensor([1, 2]), ValueError),  # three rows for two ids
    (torch.zeros(2, 5), torch.tensor([1, 2]), ValueError),  # rows of another width
    (torch.zeros(2, 4), torch.tensor([1, N]), IndexError),  # an id past the end
    (torch.zeros(2, 4, dtype=torch.complex64), torch.tensor([1, 2]), TypeError),  # complex into float
])
def test_a_refused_row_update_changes_no_row(rows, index, error):
    data = _data()
    want = data.x.clone()
    store = _store(data)
    with pytest.raises(error):
        store.update_tensor(rows, None, "x", index=index)
    assert store.get_tensor_size(None, "x") == (N, 4)
    assert torch.equal(store.get_tensor(None, "x", None), want)


def test_a_row_update_of_read_only_memory_keeps_the_attribute(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(40, dtype=np.float32).reshape(N, 4))
    store = hpyg.HybridFeatureStore("cpu")
    store.put_tensor(np.load(path, mmap_mode="r"), group_name=None, attr_name="x")
    with pytest.raises(TypeError, match="read-only.*index=None.*copy=True"):
        store.update_tensor(torch.zeros(2, 4), None, "x", index=torch.tensor([1, 2]))
    assert store.get_tensor_size(None, "x") == (N, 4)
    assert torch.equal(store.get_tensor(None, "x", None), torch.arange(40.0).reshape(N, 4))
    assert store.update_tensor(torch.zeros(N, 4), None, "x")  # the whole attribute: a new, writable table
    assert torch.equal(store.get_tensor(None, "x", None), torch.zeros(N, 4))


@pytest.mark.parametrize("new, error, match", [
    (torch.zeros(3, 4), ValueError, "one row per node"),  # y says the type has N nodes
    (torch.zeros(N, 4, dtype=torch.uint16), TypeError, "uint16"),  # a dtype tables cannot hold
])
def test_a_refused_whole_update_keeps_the_old_table(new, error, match):
    data = _data()
    want = data.x.clone()
    store = _store(data)
    with pytest.raises(error, match=match):
        store.update_tensor(new, None, "x", index=None)
    assert store.get_tensor_size(None, "x") == (N, 4)
    assert torch.equal(store.get_tensor(None, "x", torch.arange(N)), want)


def test_a_whole_update_replaces_the_table_and_spares_the_old_source():
    data = _data()
    old = data.x.clone()
    store = _store(data)
    assert store.update_tensor(torch.full((N, 4), 3.0), TensorAttr(None, "x", None))
    assert torch.equal(store.get_tensor(None, "x", torch.arange(N)), torch.full((N, 4), 3.0))
    assert torch.equal(data.x, old)  # replaced, not overwritten: the caller's tensor is as it was
    assert store.update_tensor(torch.ones(N, 2), None, "z")  # an attribute the store lacked is put, as in PyG
    assert store.get_tensor_size(None, "z") == (N, 2)


def test_update_of_rows_the_store_lacks_or_half_named_raises():
    store = _store(_data())
    with pytest.raises(KeyError, match="'z'"):
        store.update_tensor(torch.zeros(1, 4), None, "z", index=torch.tensor([0]))
    with pytest.raises(ValueError, match="group_name"):
        store.update_tensor(torch.zeros(N, 4), attr_name="x")
    assert store.get_tensor_size(None, "x") == (N, 4)


@pytest.mark.parametrize("index", [torch.tensor([1]), slice(0, 3), 2, torch.ones(N, dtype=torch.bool)])
def test_remove_refuses_rows_and_keeps_the_table(index):
    data = _data()
    store = _store(data)
    with pytest.raises(ValueError, match="only the whole attribute.*index=None"):
        store.remove_tensor(None, "x", index=index)
    with pytest.raises(ValueError, match="only the whole attribute"):
        del store[None, "x", index]
    assert torch.equal(store.get_tensor(None, "x", None), data.x)
    assert store.remove_tensor(None, "x", slice(None)) and store.get_tensor_size(None, "x") is None


def test_an_in_place_transform_of_a_full_batch_leaves_the_table_alone():
    """A full, ordered batch's ids are one run, read as a slice of host memory: the batch must be a copy, as
    stock PyG's are, or ``b.x.mul_(2)`` doubles the table and the caller's ``data.x`` every epoch."""
    num_nodes = ranges.MIN_RUN + 904
    data = _data(num_nodes)
    want = data.x.clone()
    stores = hpyg.from_data(data, device="cpu", progress=False)
    loader = NeighborLoader(stores, [1], input_nodes=torch.arange(num_nodes), batch_size=num_nodes, shuffle=False,
                            transform=lambda b: (b.x.mul_(2), b)[1])
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == 1 and torch.equal(batches[0].x, want[batches[0].n_id] * 2)
    assert torch.equal(data.x, want)
    assert torch.equal(stores[0].get_tensor(None, "x", None), want)


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(["run", "slice", "all", "ids", "int", "mask"]), lo=st.integers(0, 2 * ranges.MIN_RUN),
       seed=st.integers(0, 2**31 - 1))
def test_multi_get_never_aliases_the_table_and_get_keeps_its_views(kind, lo, seed):
    num_rows = 3 * ranges.MIN_RUN
    x = torch.randn(num_rows, 3, generator=torch.Generator().manual_seed(seed))
    store = hpyg.HybridFeatureStore("cpu")
    store.put_tensor(x, group_name=None, attr_name="x")
    index = {"run": torch.arange(lo, lo + ranges.MIN_RUN), "slice": slice(lo, lo + 5), "all": slice(None),
             "ids": torch.randint(0, num_rows, (50,), generator=torch.Generator().manual_seed(seed)), "int": lo,
             "mask": torch.arange(num_rows) % 7 == lo % 7}[kind]
    got = store.multi_get_tensor([TensorAttr(None, "x", index)])[0]
    assert torch.equal(got, x[index]) and not _aliases(got, x)
    if kind in ("run", "slice", "all"):  # get_tensor and store[...] read a run as a view (docs/pyg.md)
        assert _aliases(store.get_tensor(None, "x", index), x) and _aliases(store[None, "x", index], x)
