"""Hostile inputs against orders, degenerate sizes, stored formats and a table's lifecycle.

Complements tests/test_contracts_values.py (which it does not repeat): each
property compares with a plain reference (``x[idx]``, a torch conversion, a
Python loop) or expects the documented error; never a crash, a hang, a
truncated float, a wrapped negative id or uninitialised memory.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from hmgstore.graph import NeighborSampler, Topology, locality, to_csc
from hmgstore.rows import formats

FLT_MAX = float(torch.finfo(torch.float32).max)
FORMATS = ["int8", "float8", "bfloat16", "float16"]
FEW = settings(max_examples=30, deadline=None)


def _one_node_sampler(fanout):
    csc = to_csc(torch.empty(2, 0, dtype=torch.int64), "coo", size=(1, 1))
    return NeighborSampler({None: Topology(csc, "cpu")}, {None: 1}, fanout)


# ---- class 4: orders that are not permutations ------------------------------------------------------------
@st.composite
def layouts(draw, n):
    """A permutation of range(n), or something that only looks like one."""
    kind = draw(st.sampled_from(["perm", "list", "bool", "2d", "float", "bool-list", "short"]))
    if kind == "perm":
        return kind, draw(st.permutations(range(n)))
    if kind == "list":
        return kind, draw(st.lists(st.integers(-2, n + 1), min_size=n, max_size=n))
    if kind == "bool":  # a mask of the right length: must not be read as the identity
        return kind, torch.ones(n, dtype=torch.bool)
    if kind == "2d":
        return kind, torch.arange(n).reshape(1, n)
    if kind == "float":
        return kind, torch.arange(n, dtype=torch.float32)
    if kind == "bool-list":
        return kind, [True] * n
    return kind, list(range(max(n - 1, 0)))


@FEW
@given(st.integers(1, 8), st.data())
def test_a_table_takes_exactly_a_permutation_as_its_layout(n, data):
    kind, layout = data.draw(layouts(n))
    x = torch.randn(n, 3)
    ok = kind == "perm" or (kind == "list" and sorted(layout) == list(range(n)))
    if not ok:
        with pytest.raises((TypeError, ValueError, IndexError), match="layout"):
            hmgstore.HybridTensor(x, "cpu", layout=layout)
        return
    table = hmgstore.HybridTensor(x, "cpu", layout=layout)
    ids = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=12)), dtype=torch.int64)
    for _ in range(2):  # the same answer every call
        assert torch.equal(table[ids], x[ids])
    assert torch.equal(table.dense(), x)


@FEW
@given(st.integers(1, 10), st.sampled_from(["float", "bool", "2d", "int"]), st.integers(1, 4))
def test_locality_batches_take_integer_parts_only(n, kind, batch_size):
    nodes = torch.arange(n)
    part = {"float": torch.rand(n) * 3, "bool": torch.rand(n) < 0.5,
            "2d": torch.zeros(1, n, dtype=torch.int64), "int": torch.randint(0, 3, (n,))}[kind]
    if kind == "int":
        batches = list(locality.LocalityBatchSampler(nodes, part, batch_size, window=1))
        assert sorted(i for b in batches for i in b) == list(range(n))
        for b in batches[:-1]:
            assert len(b) == batch_size
        return
    with pytest.raises(TypeError if kind != "2d" else ValueError, match="node_part"):
        locality.LocalityBatchSampler(nodes, part, batch_size)


@FEW
@given(st.integers(1, 10), st.integers(0, 12))
def test_a_mask_of_input_nodes_has_one_entry_per_node(n, length):
    mask = torch.arange(length) % 2 == 0
    part = torch.zeros(n, dtype=torch.int64)
    if length != n:  # a short mask would drop the nodes past its end, a long one name nodes that are not
        with pytest.raises(ValueError, match="bool mask"):
            locality.LocalityBatchSampler(mask, part, 2)
        return
    batches = list(locality.LocalityBatchSampler(mask, part, 2))
    assert sorted(i for b in batches for i in b) == list(range(int(mask.sum())))


@FEW
@given(st.integers(1, 6), st.lists(st.lists(st.one_of(st.integers(-3, 8), st.booleans(), st.floats(0, 3)),
                                            max_size=4), max_size=3))
def test_co_access_positions_are_checked_never_wrapped(n, batches):
    sampler = _one_node_sampler([1])
    seeds = torch.zeros(n, dtype=torch.int64)
    bad_type = any(isinstance(p, (bool, float)) for b in batches for p in b)
    bad_range = any(not 0 <= p < n for b in batches for p in b)
    if bad_type:
        with pytest.raises(TypeError, match=r"batches\[\d\]"):
            locality.coaccess_order(sampler, seeds, batches=batches, progress=False)
    elif bad_range:
        with pytest.raises(IndexError, match=r"batches\[\d\]"):
            locality.coaccess_order(sampler, seeds, batches=batches, progress=False)
    else:
        assert locality.coaccess_order(sampler, seeds, batches=batches, progress=False).tolist() == [0]


@FEW
@given(st.lists(st.integers(0, 10**7), max_size=10), st.one_of(st.integers(-2, 5000), st.floats(0, 5000)))
def test_pages_touched_counts_pages_of_whole_rows(ids, row_bytes):
    if isinstance(row_bytes, float) or row_bytes < 0:
        with pytest.raises((TypeError, ValueError), match="row_bytes"):
            locality.pages_touched(ids, row_bytes)
        return
    per_page = max(1, locality.PAGE_BYTES // max(1, row_bytes))
    assert locality.pages_touched(ids, row_bytes) == len({i // per_page for i in ids})


@given(st.one_of(st.integers(-3, -1), st.floats(0.5, 3), st.booleans()))
def test_label_propagation_takes_a_count_of_rounds(rounds):
    csc = to_csc(torch.tensor([[0, 1], [1, 0]]), "coo", size=(2, 2))
    with pytest.raises((TypeError, ValueError), match="rounds"):
        locality.label_propagation(csc, rounds=rounds, progress=False)


# ---- class 5: degenerate sizes -----------------------------------------------------------------------------
@FEW
@given(st.sampled_from([None, *FORMATS]), st.integers(0, 4), st.sampled_from([(), (0,), (1,), (3,), (2, 0)]),
       st.data())
def test_tables_of_no_rows_or_empty_rows_gather_like_torch(compress, n, row_shape, data):
    if compress is not None and row_shape == ():
        row_shape = (1,)
    x = torch.randn(n, *row_shape)
    table = hmgstore.HybridTensor(x, "cpu", compress=compress)
    ids = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=5)) if n else [], dtype=torch.int64)
    got = table[ids]
    want = x[ids] if compress is None else formats.get(compress).decode(
        formats.get(compress).encode(x), row_shape)[ids]
    assert got.shape == want.shape and torch.equal(got, want)
    assert table[[]].shape == (0, *row_shape)
    empty = hmgstore.HybridTensor.empty((n, *row_shape), device="cpu", compress=compress)
    assert torch.equal(empty[ids], torch.zeros(len(ids), *row_shape))  # zeros, never what the memory held


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("fanout", [[0], [-1], [2**31], [3, -1]])
def test_a_pyg_loader_over_one_node_gives_that_node(fanout):
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    for edges in (torch.empty(2, 0, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64)):  # alone, self loop
        data = Data(x=torch.tensor([[1.5, -2.0]]), y=torch.tensor([7]), edge_index=edges, num_nodes=1)
        stores = from_data(data, device="cpu", progress=False)
        sampler = HybridNeighborSampler(stores, fanout, progress=False)
        batches = list(NeighborLoader(stores, fanout, neighbor_sampler=sampler, input_nodes=torch.tensor([0]),
                                      batch_size=4))
        assert len(batches) == 1
        b = batches[0]
        assert b.n_id.tolist() == [0] and torch.equal(b.x, data.x[b.n_id]) and b.y.tolist() == [7]
        expected = 0 if fanout[0] == 0 or edges.shape[1] == 0 else 1
        assert b.edge_index.shape == (2, expected)
        assert list(NeighborLoader(stores, fanout, neighbor_sampler=sampler,
                                   input_nodes=torch.empty(0, dtype=torch.int64), batch_size=4)) == []


# ---- class 6: compressed rows at the extremes --------------------------------------------------------------
EXTREMES = st.sampled_from([FLT_MAX, -FLT_MAX, 1.0, 0.0, -0.0, 1e-45, -1e-40, 1e-38, 3e38, 65504.0, -1.0])


@FEW
@given(st.sampled_from(FORMATS), st.integers(1, 3), st.integers(2, 6), st.data())
def test_rows_written_after_build_read_as_rows_built_with(name, width, n, data):
    rows = torch.tensor(data.draw(st.lists(st.lists(EXTREMES, min_size=width, max_size=width), min_size=1,
                                           max_size=n)), dtype=torch.float32)
    ids = torch.tensor(data.draw(st.permutations(range(n)))[:len(rows)])
    layout = data.draw(st.permutations(range(n)))
    table = hmgstore.HybridTensor(torch.zeros(n, width), "cpu", compress=name, layout=layout)
    fmt = formats.get(name)
    overflow = torch.zeros(len(rows), dtype=torch.bool) if fmt.scaled else \
        (torch.isinf(rows.to(fmt.element)) & torch.isfinite(rows)).any(dim=1)
    if bool(overflow.any()):
        first = int(ids[int(overflow.nonzero()[0, 0])])  # the caller's id, not a host position
        with pytest.raises(ValueError, match=f"row {first} holds"):
            table[ids] = rows
        assert not bool(table[torch.arange(n)].any())  # nothing written
        return
    table[ids] = rows
    built = torch.zeros(n, width)
    built[ids] = rows
    want = fmt.decode(fmt.encode(built), (width,))
    got = table[torch.arange(n)]
    assert torch.equal(got, want) and bool(torch.isfinite(got).all())
    assert torch.equal(torch.signbit(got), torch.signbit(want))  # -0.0 as the format keeps it


# ---- class 7: types and lifecycle --------------------------------------------------------------------------
@FEW
@given(st.sampled_from([torch.float32, torch.int64, torch.int32, torch.int8, torch.bool]), st.integers(2, 6),
       st.data())
def test_views_and_integer_tables_write_and_read_as_torch_does(dtype, n, data):
    x = (torch.randn(n, 4) * 50).to(dtype)
    table = hmgstore.HybridTensor(x.clone(), "cpu")
    ids = torch.tensor(data.draw(st.permutations(range(n)))[:2])
    value = (torch.randn(4, 2) * 50).to(dtype).t()  # a non-contiguous view
    value.requires_grad_(dtype.is_floating_point)
    table[ids] = value
    x[ids] = value.detach()
    index = ids.repeat(2).reshape(2, 2).t()  # non-contiguous ids of two dimensions
    assert torch.equal(table[index], x[index])
    assert torch.equal(table.dense(), x) and not table[ids].requires_grad


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
def test_a_sparse_value_is_refused_and_leaves_the_table_as_it_was():
    table = hmgstore.HybridTensor(torch.ones(4, 3), "cpu")
    for sparse in (torch.eye(2, 3).to_sparse(), torch.eye(2, 3).to_sparse_csr()):
        with pytest.raises(TypeError, match=r"sparse value.*to_dense\(\)"):
            table[[0, 1]] = sparse
    assert torch.equal(table[torch.arange(4)], torch.ones(4, 3))


@given(st.sampled_from([None, "int8", "bfloat16"]), st.sampled_from(["gather", "index", "write", "dense", "many"]))
def test_a_closed_table_and_its_pickled_copy_refuse_every_read(compress, how):
    table = hmgstore.HybridTensor(torch.ones(3, 2), "cpu", compress=compress)
    table.close()
    table.close()  # idempotent
    for t in (table, pickle.loads(pickle.dumps(table))):
        assert t.closed and len(t) == 3
        with pytest.raises(RuntimeError, match="closed"):
            if how == "gather":
                t.gather(torch.tensor([0]))
            elif how == "index":
                t[0]
            elif how == "write":
                t[[0]] = torch.zeros(1, 2)
            elif how == "dense":
                t.dense()
            else:
                hmgstore.gather_many([(t, np.array([1]))])


@pytest.mark.parametrize("make", [lambda: (b for b in [1, 2]), lambda: iter([1, 2]), lambda: map(int, "12"),
                                  lambda: iter([])])
def test_a_pipeline_over_any_one_shot_iterator_refuses_a_second_epoch(make):
    pipeline = hmgstore.Pipeline(make(), device="cpu")
    first = list(pipeline)
    assert first in ([1, 2], [])
    with pytest.raises(RuntimeError, match="one-shot iterator"):
        list(pipeline)
