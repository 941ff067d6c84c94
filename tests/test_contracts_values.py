"""Contracts of what takes ids, orders, sizes and values: the shared checkers and the entry points that use them.

Generated inputs (hypothesis) of every kind: integers and what only looks
like one (floats, bools, strings), ids of the wrong dtype or rank, orders
that are not permutations, degenerate graphs (no edges, one node) and sizes
(0 seeds, fanouts of 2**31), rows of extreme values under every stored
format. Each property is the exact result or the documented error, never a
crash, a hang or uninitialised memory.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from hmgstore.graph import NeighborSampler, Topology, hit_ratio, locality, presample, to_csc
from hmgstore.rows import checks, formats

FLT_MAX = float(torch.finfo(torch.float32).max)

#: What only looks like an integer, and what is no integer at all.
NOT_INTEGERS = st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=3), st.none(),
                         st.just(np.float32(2.0)), st.just(torch.tensor(2.5)), st.just(torch.tensor(True)))


# ---- the checkers ---------------------------------------------------------------------------------------
@given(st.one_of(st.integers(-2**40, 2**40), st.integers(-5, 5).map(np.int64), st.integers(-5, 5).map(torch.tensor)),
       st.integers(0, 3))
def test_count_takes_integers_at_least_its_minimum(value, at_least):
    if int(value) < at_least:
        with pytest.raises(ValueError, match=f"n must be at least {at_least}"):
            checks.count(value, "n", at_least=at_least)
    else:
        assert checks.count(value, "n", at_least=at_least) == int(value)


@given(NOT_INTEGERS)
def test_count_refuses_what_is_not_an_integer(value):
    with pytest.raises(TypeError, match="n takes an integer"):
        checks.count(value, "n")


@given(st.one_of(st.integers(-3, 200), NOT_INTEGERS, st.just("auto")))
def test_a_table_and_a_pipeline_take_the_same_max_sms(value):
    ok_table = value is None or (type(value) is int and value >= 1)
    x = torch.zeros(4, 2)
    if ok_table:
        assert hmgstore.HybridTensor(x, "cpu", max_sms=value).max_sms == value
        assert hmgstore.Pipeline([], device="cpu", max_sms=value).max_sms == value
        return
    with pytest.raises(ValueError, match="max_sms is a number of SMs"):
        hmgstore.HybridTensor(x, "cpu", max_sms=value)
    if value != "auto":
        with pytest.raises(ValueError, match="max_sms is a number of SMs"):
            hmgstore.Pipeline([], device="cpu", max_sms=value)


@given(st.integers(0, 30), st.data())
def test_permutations_are_accepted_exactly(n, data):
    order = data.draw(st.lists(st.integers(-2, n + 1), min_size=0, max_size=n + 2))
    is_perm = sorted(order) == list(range(n))
    if is_perm:
        checked = checks.permutation(order, n)
        assert checked.tolist() == order
        assert torch.equal(checks.inverse(checked)[checked], torch.arange(n))
    else:
        with pytest.raises((ValueError, IndexError), match="layout"):
            checks.permutation(order, n)


@given(st.sampled_from([torch.float32, torch.float64, torch.bool, torch.complex64]), st.integers(0, 5))
def test_id_lists_refuse_non_integers_and_name_a_file(dtype, n):
    ids = torch.zeros(n, dtype=dtype)
    with pytest.raises(TypeError, match="ids are integers"):
        checks.id_list(ids, "seeds", 10)
    with pytest.raises(ValueError, match="split.npy.*ids are integers"):
        checks.id_list(ids, "seeds", 10, source="split.npy")
    with pytest.raises(ValueError, match="1-D"):
        checks.id_list(torch.zeros(2, 2, dtype=torch.int64), "seeds", 10)
    with pytest.raises(IndexError, match="seeds: index 10 at position 1"):
        checks.id_list([0, 10], "seeds", 10)


def test_a_misspelt_keyword_names_the_function_called():
    with pytest.raises(TypeError, match=r"f\(\) got an unexpected keyword argument 'gpu_bugdet'; did you mean "
                                        r"'gpu_budget'"):
        checks.keywords("f", {"gpu_bugdet": 1}, ("copy",), named=("gpu_budget",))
    with pytest.raises(TypeError, match="it takes copy, split"):
        checks.keywords("f", {"zzz": 1}, ("split", "copy"))
    checks.keywords("f", {"copy": True}, ("copy",))


# ---- class 3: scores checked on every device ------------------------------------------------------------
@given(st.integers(1, 20), st.integers(0, 25), st.booleans())
def test_hotness_is_checked_on_the_cpu_with_or_without_a_budget(rows, length, nan):
    score = torch.rand(length)
    if nan and length:
        score[length // 2] = float("nan")
    ok = length == rows and not (nan and length)
    for budget in ("auto", 64):
        if ok:
            hmgstore.HybridTensor(torch.zeros(rows, 2), "cpu", gpu_budget=budget, hotness=score)
        else:
            with pytest.raises(ValueError, match="hotness"):
                hmgstore.HybridTensor(torch.zeros(rows, 2), "cpu", gpu_budget=budget, hotness=score)


# ---- class 4: permutations where one is required --------------------------------------------------------
@given(st.integers(1, 40), st.integers(1, 8), st.data())
def test_locality_helpers_read_only_positions_a_layout_gives(n, part_rows, data):
    layout = data.draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
    if sorted(layout) == list(range(n)):
        part = locality.parts_of(torch.tensor(layout), part_rows)
        assert torch.equal(part[torch.tensor(layout)], torch.arange(n) // part_rows)  # exact, every call
        ids = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=10)), dtype=torch.int64)
        pages = locality.pages_touched(ids, 1 << 20, torch.tensor(layout))
        position = {row: k for k, row in enumerate(layout)}
        assert pages == len({position[int(i)] // 2 for i in ids})
    else:
        with pytest.raises(ValueError, match="layout lists every row once"):
            locality.parts_of(torch.tensor(layout), part_rows)
        with pytest.raises(ValueError, match="layout lists every row once"):
            locality.pages_touched(torch.tensor([0]), 128, torch.tensor(layout))
    with pytest.raises(ValueError, match="layout lists every row once: 3 ids, got 2"):
        checks.permutation(torch.empty(2, dtype=torch.int64).fill_(0), 3)


# ---- class 5: degenerate sizes --------------------------------------------------------------------------
@st.composite
def small_graphs(draw):
    n = draw(st.integers(1, 12))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40))
    edge_index = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t()
    return n, edge_index


@given(small_graphs(), st.sampled_from([0, 1, 3, 2**31, 2**40]), st.data())
def test_a_node_gets_min_k_degree_neighbours(graph, k, data):
    n, edge_index = graph
    csc = to_csc(edge_index, "coo", size=(n, n))
    sampler = NeighborSampler({None: Topology(csc, "cpu")}, {None: n}, [k],
                              generator=torch.Generator().manual_seed(0))
    seeds = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True)), dtype=torch.int64)
    out = sampler.sample({None: seeds})
    degree = csc.colptr.diff()
    counts = torch.bincount(out.col[None], minlength=len(seeds))[:len(seeds)] if len(seeds) else torch.zeros(0)
    assert torch.equal(counts.to(torch.int64), torch.minimum(degree[seeds], torch.tensor(k)))


@given(small_graphs(), st.integers(0, 3), st.integers(1, 5))
def test_presampling_no_seeds_makes_no_batches(graph, epochs, batch_size):
    n, edge_index = graph
    sampler = NeighborSampler({None: Topology(to_csc(edge_index, "coo", size=(n, n)), "cpu")}, {None: n}, [2])
    hot = presample(sampler, torch.empty(0, dtype=torch.int64), epochs=epochs, batch_size=batch_size, progress=False)
    assert hot.batches == 0 and int(hot.features[None].sum()) == 0
    hot = presample(sampler, torch.arange(n), epochs=epochs, batch_size=batch_size, progress=False)
    assert hot.batches == epochs * -(-n // batch_size)
    for bad in (0, -1, 2.5):
        with pytest.raises((ValueError, TypeError), match="batch_size"):
            presample(sampler, torch.arange(n), batch_size=bad, progress=False)
    with pytest.raises(TypeError, match="seeds.*integers"):
        presample(sampler, torch.tensor([0.5]), progress=False)
    with pytest.raises(ValueError, match="seeds"):  # two dimensions: refused, not flattened
        presample(sampler, torch.zeros(1, 1, dtype=torch.int64), progress=False)
    if n:  # one seed as a 0-d tensor: one batch
        assert presample(sampler, torch.tensor(n - 1), epochs=1, progress=False).batches == 1


@given(st.integers(0, 3))
def test_batch_sizes_under_one_are_refused_by_name(batch_size):
    nodes = torch.arange(10)
    if batch_size < 1:
        with pytest.raises(ValueError, match="batch_size must be at least 1"):
            locality.LocalityBatchSampler(nodes, torch.zeros(10, dtype=torch.int64), batch_size)
    else:
        batches = list(locality.LocalityBatchSampler(nodes, torch.zeros(10, dtype=torch.int64), batch_size))
        assert sorted(i for b in batches for i in b) == list(range(10))
    with pytest.raises(TypeError, match="batch_size takes an integer"):
        locality.LocalityBatchSampler(nodes, torch.zeros(10, dtype=torch.int64), 2.0)


def test_a_pipeline_over_a_generator_says_so_at_its_second_epoch():
    pipeline = hmgstore.Pipeline((b for b in range(3)), device="cpu")
    assert list(pipeline) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="one-shot iterator.*second epoch"):
        list(pipeline)
    again = hmgstore.Pipeline([0, 1], device="cpu")
    assert list(again) == list(again) == [0, 1]


class _SameIterator:
    """An iterable whose __iter__ hands out one iterator every time: a generator in disguise."""

    def __init__(self, items):
        self.it = iter(items)

    def __iter__(self):
        return self.it


def test_a_pipeline_over_an_iterable_that_hands_out_a_used_iterator_says_so():
    pipeline = hmgstore.Pipeline(_SameIterator([0, 1, 2]), device="cpu")
    assert list(pipeline) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="one-shot iterator.*no batch, the last one 3"):
        list(pipeline)
    empty = hmgstore.Pipeline([], device="cpu")  # an empty loader stays an empty epoch, every time
    assert list(empty) == list(empty) == []
    pipeline = hmgstore.Pipeline(_SameIterator(range(100)), device="cpu")
    for _ in zip(range(2), pipeline):  # a pass left early: not a whole epoch, nothing to compare with
        pass
    assert len(list(pipeline)) > 0


def test_a_producer_over_a_generator_says_so_at_its_second_epoch():
    with hmgstore.Producer(_generator_loader, device="cpu") as producer:
        assert [int(b[0]) for b in producer] == [0, 1, 2]
        with pytest.raises(RuntimeError, match="one-shot iterator.*second epoch"):
            list(producer)


def _generator_loader():
    return (torch.full((2,), i) for i in range(3))


def test_scores_and_counts_refuse_booleans():
    with pytest.raises(TypeError, match="booleans; pass mask.float()"):
        hit_ratio(torch.tensor([True, False]), torch.tensor([0]))


# ---- class 6: compressed rows at the extremes -----------------------------------------------------------
EXTREMES = st.sampled_from([FLT_MAX, -FLT_MAX, FLT_MAX / 2, 1.0, 0.0, -0.0, 1e-38, -1e-45, 3e38, 1e-30, 448.0])


@given(st.sampled_from(["int8", "float8", "bfloat16", "float16"]),
       st.lists(st.lists(EXTREMES, min_size=3, max_size=3), min_size=1, max_size=6))
def test_every_format_decodes_extremes_to_finite_normal_floats(name, rows):
    fmt = formats.get(name)
    x = torch.tensor(rows, dtype=torch.float32)
    if not fmt.scaled and bool((torch.isinf(x.to(fmt.element)) & torch.isfinite(x)).any()):
        with pytest.raises(ValueError, match=f"past {name}'s largest finite value"):  # it would read as infinity
            fmt.encode(x)
        return
    decoded = fmt.decode(fmt.encode(x), (3,))
    if fmt.scaled:
        assert bool(torch.isfinite(decoded).all())
        nonzero = decoded[decoded != 0].abs()
        assert bool((nonzero >= torch.finfo(torch.float32).tiny).all())  # normal floats or zero
        largest = x.abs().amax(dim=1, keepdim=True)
        # int8: within one step of the row's scale; float8 (3 mantissa bits): also an eighth of the value
        relative = x.abs() / 8 if name == "float8" else 0.0
        assert bool(((decoded - x).abs() <= largest / fmt.qmax + relative + 1e-30).all())
    else:
        assert torch.equal(decoded, x.to(fmt.element).float())


@given(st.sampled_from(["int8", "float8"]), st.integers(2, 12), st.data())
def test_a_non_finite_row_is_named_by_the_callers_id(name, n, data):
    bad = data.draw(st.integers(0, n - 1))
    x = torch.rand(n, 4)
    x[bad, 1] = data.draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    perm = torch.tensor(data.draw(st.permutations(range(n))))
    with pytest.raises(ValueError, match=f"row {bad} holds NaN or infinity"):
        hmgstore.HybridTensor(x, "cpu", compress=name, layout=perm)
    table = hmgstore.HybridTensor(torch.rand(n, 4), "cpu", compress=name)
    ids = torch.tensor(data.draw(st.permutations(range(n))))[:2]
    value = torch.rand(2, 4)
    value[1, 0] = float("nan")
    with pytest.raises(ValueError, match=f"row {int(ids[1])} holds NaN"):
        table[ids] = value


# ---- class 7: types and lifecycle -----------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
def test_a_sparse_source_gets_the_right_advice():
    for sparse in (torch.eye(4).to_sparse(), torch.eye(4).to_sparse_csr()):
        with pytest.raises(TypeError, match=r"sparse.*source\.to_dense\(\)"):
            hmgstore.HybridTensor(sparse, "cpu")


@given(st.sampled_from([None, "int8", "bfloat16"]))
def test_writing_a_value_that_requires_grad_leaves_the_table_usable(compress):
    table = hmgstore.HybridTensor(torch.zeros(6, 3), "cpu", compress=compress)
    value = torch.ones(2, 3, requires_grad=True)
    table[[1, 4]] = value * 2
    for _ in range(2):  # every later gather works, and carries no gradient
        rows = table[[1, 4, 0]]
        assert not rows.requires_grad
        assert torch.equal(rows, torch.tensor([[2.0] * 3, [2.0] * 3, [0.0] * 3]))


@given(st.lists(st.one_of(st.integers(-2, 5), st.floats(0, 5), st.booleans()), min_size=1, max_size=3))
def test_sizes_of_an_empty_table_are_integers_never_truncated(shape):
    ok = all(type(s) is int and s >= 0 for s in shape)
    if ok:
        table = hmgstore.HybridTensor.empty(shape, device="cpu")
        assert tuple(table.shape) == tuple(shape) and not bool(table[:].any())  # zeros, as promised
    else:
        with pytest.raises((TypeError, ValueError), match=r"shape\[\d\]"):
            hmgstore.HybridTensor.empty(shape, device="cpu")
    for depth in (0, 2.5, True):
        with pytest.raises(ValueError, match="depth is the number of batches"):
            hmgstore.Pipeline([], depth=depth, device="cpu")


@given(st.lists(st.one_of(st.integers(-2, 12), st.floats(0, 9)), max_size=8))
def test_locality_batches_take_integer_node_ids_in_range(nodes):
    part = torch.arange(10) // 3
    if all(isinstance(n, int) and 0 <= n < 10 for n in nodes):
        batches = list(locality.LocalityBatchSampler(torch.tensor(nodes, dtype=torch.int64), part, 3))
        assert sorted(i for b in batches for i in b) == list(range(len(nodes)))  # every position once
    elif any(isinstance(n, float) for n in nodes):
        with pytest.raises(TypeError, match="input_nodes.*integers"):
            locality.LocalityBatchSampler(torch.tensor(nodes), part, 3)
    else:
        bad = next(n for n in nodes if not 0 <= n < 10)
        with pytest.raises(ValueError, match=f"node_part has 10 entries.*index {bad} "):
            locality.LocalityBatchSampler(torch.tensor(nodes), part, 3)


# ---- gather_many: several tables, one launch ------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([torch.float32, torch.int64, torch.float16]),
                          st.lists(st.integers(-45, 45), max_size=12)), min_size=1, max_size=4),
       st.booleans())
def test_gather_many_gives_each_tables_rows_or_refuses_before_writing(requests, with_outs):
    """Every request's rows bit for bit, or IndexError with every destination untouched (ids are 0..n-1; a
    negative id is out of range, not counted from the end)."""
    tables, pairs, outs, expected = [], [], [], []
    for k, (n, dtype, ids) in enumerate(requests):
        x = (torch.arange(n * 3, dtype=torch.float64).reshape(n, 3) * (k + 1)).to(dtype)
        tables.append(hmgstore.HybridTensor(x, "cpu"))
        index = torch.tensor(ids, dtype=torch.int64)
        pairs.append((tables[-1], index))
        outs.append(torch.full((len(ids), 3), 7, dtype=dtype))  # poison: no row holds 7 in every column
        expected.append(x[index] if all(0 <= i < n for i in ids) else None)
    if any(e is None for e in expected):
        with pytest.raises(IndexError):
            hmgstore.gather_many(pairs, outs=outs if with_outs else None)
        assert all(bool((o == 7).all()) for o in outs), "a refused gather wrote rows"
        return
    got = hmgstore.gather_many(pairs, outs=outs if with_outs else None)
    for g, e, o in zip(got, expected, outs):
        assert torch.equal(g, e) and g.dtype == e.dtype
        if with_outs:
            assert g.data_ptr() == o.data_ptr()


def test_gather_many_refuses_float_ids_and_bad_destinations_by_kind():
    t = hmgstore.HybridTensor(torch.arange(12.0).reshape(6, 2), "cpu")
    with pytest.raises(TypeError):
        hmgstore.gather_many([(t, torch.tensor([0.5]))])
    for bad in ([torch.zeros(2, 3)], [torch.zeros(2, 2, dtype=torch.int64)], [torch.zeros(2, 2), torch.zeros(2, 2)]):
        with pytest.raises(ValueError):
            hmgstore.gather_many([(t, torch.tensor([0, 1]))], outs=bad)


@pytest.mark.parametrize("make", [np.array, torch.tensor, lambda v: np.array(v, dtype=np.int32)])
def test_a_0d_index_gives_one_row_without_its_dimension(make):
    x = torch.arange(20.0).reshape(10, 2)
    t = hmgstore.HybridTensor(x, "cpu")
    assert torch.equal(t[make(3)], x[3]) and t[make(3)].shape == (2,)
    assert hmgstore.gather_many([(t, make(3))])[0].shape == (2,)


def test_writes_are_never_cut_in_silence():
    """A tensor value of a kind the table cannot hold is refused as torch refuses x[ids] = v; integers past an
    integer table's range are refused; the table is unchanged after either."""
    t64 = hmgstore.HybridTensor(torch.zeros(3, 2, dtype=torch.int64), "cpu")
    with pytest.raises(TypeError, match="torch.float32 value would be cut to this table's torch.int64"):
        t64[[0]] = torch.tensor([[float("nan"), 2.7]])
    t32 = hmgstore.HybridTensor(torch.zeros(3, 2, dtype=torch.int32), "cpu")
    with pytest.raises(ValueError, match=r"past this table's torch.int32 range"):
        t32[[0]] = torch.tensor([[2**40, 1]])
    tf = hmgstore.HybridTensor(torch.zeros(3, 2), "cpu")
    with pytest.raises(TypeError, match="complex64"):
        tf[[0]] = torch.tensor([[1 + 2j, 0j]])
    assert int(t64[torch.arange(3)].abs().sum()) == 0 and int(t32[torch.arange(3)].abs().sum()) == 0
    t32[[1]] = torch.tensor([[7, -7]])  # int64 values in range: written
    tf[[2]] = np.array([[1, 2]], dtype=np.int64)  # integers into floats: exact here
    t64[[2]] = 5  # a Python number converts as torch's x[ids] = 5 does
    assert t32[[1]].tolist() == [[7, -7]] and tf[[2]].tolist() == [[1.0, 2.0]] and t64[[2]].tolist() == [[5, 5]]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 15), st.integers(1, 5), st.booleans())
def test_a_gather_refuses_an_out_that_shares_the_tables_memory(start, count, copy):
    """out aliasing the rows a gather reads would be overwritten while read: refused by name, the table's rows
    untouched; a separate out gets x[ids]."""
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(start))
    table = hmgstore.HybridTensor(x, "cpu", copy=copy)
    ids = torch.arange(count).flip(0)
    before = table.source.clone()
    alias = table.source[start:start + count]
    if len(alias) == count:
        with pytest.raises(ValueError, match="out shares memory with the table"):
            table.gather(ids, out=alias)
        with pytest.raises(ValueError, match="out shares memory with the table"):
            hmgstore.gather_many([(table, ids)], outs=[alias])
        assert torch.equal(table.source, before)
    out = torch.full((count, 3), float("nan"))
    assert table.gather(ids, out=out) is out and torch.equal(out, x[ids])
