"""Property tests of the PyG store: every index PyG can hand ``get_tensor`` reads what the same index reads from
the source tensor, whatever the store's host options; writes through ``update_tensor`` read back.

The index kinds are the ones PyG's loaders and users pass: slices with any step, runs of consecutive ids (read as
one slice of host memory past ``ranges.MIN_RUN``), id tensors with repeats, lists, numpy arrays of ids or a mask
(PyG's ``IndexType``), bool masks and none at all.
Compared bit for bit with torch indexing of the rows the table reads (for int8 rows: their documented rounding,
read once through the table).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hmgstore.plugins.pyg import HybridFeatureStore, ranges

# A share of the loaded profile's cases (tests/conftest.py): a few dozen in make test, 20x more under
# HYPOTHESIS_PROFILE=long.
FAST = settings(max_examples=max(1, settings.default.max_examples * 5 // 6), deadline=None)


@st.composite
def stores(draw):
    """(store, the rows it serves by id): a float32 source of random size under random host options."""
    n = draw(st.one_of(st.integers(1, 60), st.integers(ranges.MIN_RUN, 2 * ranges.MIN_RUN)))  # runs need MIN_RUN
    dim = draw(st.sampled_from([1, 3, 8]))
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**31)))) * 4 + 0.5
    options = draw(st.sampled_from([{}, {"copy": True}, {"compress": "int8"}, {"host_dtype": torch.bfloat16},
                                    {"layout": "hotness"}]))
    hotness = {None: torch.rand(n, generator=torch.Generator().manual_seed(n))} if "layout" in options else None
    store = HybridFeatureStore.from_sources({(None, "x"): x}, "cpu", hotness=hotness, **options)
    served = store.get_tensor(None, "x", torch.arange(n))  # the rows as the table reads them, by id
    if not options or "copy" in options or "layout" in options:
        assert torch.equal(served, x)  # lossless options serve the source itself
    return store, served


def _index(draw, n: int):
    kind = draw(st.sampled_from(["slice", "run", "ids", "list", "numpy", "numpy-mask", "mask", "empty"]))
    if kind == "slice":
        return slice(draw(st.integers(-n - 2, n + 2)), draw(st.integers(-n - 2, n + 2)), draw(st.integers(1, 5)))
    if kind == "run":
        start = draw(st.integers(0, n - 1))
        return torch.arange(start, draw(st.integers(start, n)))
    if kind == "ids":
        return torch.tensor(draw(st.lists(st.integers(0, n - 1), max_size=64)), dtype=torch.int64)
    if kind == "list":
        return draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20))
    if kind == "numpy":
        dtype = draw(st.sampled_from([np.int64, np.int32]))
        return np.array(draw(st.lists(st.integers(0, n - 1), max_size=64)), dtype=dtype)
    if kind == "numpy-mask":
        return np.random.default_rng(draw(st.integers(0, 2**31))).random(n) < 0.5
    if kind == "mask":
        seed, share = draw(st.integers(0, 2**31)), draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
        return torch.rand(n, generator=torch.Generator().manual_seed(seed)) < share
    return torch.empty(0, dtype=torch.int64)


def _want(served: torch.Tensor, index) -> torch.Tensor:
    """What torch indexing of the served rows reads for ``index`` (lists and numpy arrays as tensors)."""
    return served[torch.as_tensor(index)] if isinstance(index, (list, np.ndarray)) else served[index]


@FAST
@given(stores(), st.data())
def test_get_tensor_reads_what_torch_indexing_reads(case, data):
    store, served = case
    index = _index(data.draw, len(served))
    got = store.get_tensor(None, "x", index)
    assert got.dtype == _want(served, index).dtype and torch.equal(got, _want(served, index))


@FAST
@given(stores(), st.data())
def test_many_reads_at_once_match_each_read(case, data):
    store, served = case
    indices = [_index(data.draw, len(served)) for _ in range(data.draw(st.integers(1, 3)))]
    attrs = [store._tensor_attr_cls(None, "x", index) for index in indices]
    for got, index in zip(store.multi_get_tensor(attrs), indices):
        assert torch.equal(got, _want(served, index))


@FAST
@given(stores(), st.data())
def test_update_tensor_reads_back_and_leaves_other_rows(case, data):
    store, served = case
    n = len(served)
    ids = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(n, 64), unique=True)))
    rows = torch.full((len(ids), served.shape[1]), 2.5)  # exact in every stored format here (int8: a row's scale)
    store.update_tensor(rows, group_name=None, attr_name="x", index=ids)
    after = store.get_tensor(None, "x", torch.arange(n))
    assert torch.equal(after[ids], rows)
    others = torch.ones(n, dtype=torch.bool)
    others[ids] = False
    assert torch.equal(after[others], served[others])


@FAST
@given(stores(), st.integers(1, 2**40))
def test_ids_out_of_range_raise_index_error(case, past):
    store, served = case
    with pytest.raises(IndexError):
        store.get_tensor(None, "x", torch.tensor([0, len(served) - 1 + past]))
