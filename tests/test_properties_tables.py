"""Property tests of CPU tables: every way of reading rows returns exactly ``x[idx]`` (or a stored format's
documented rounding of it), whatever the shape, dtype, placement, layout and ids; writes read back; bad ids raise.

Reads are compared against plain torch indexing of the source. Output buffers are filled with NaN or a sentinel
before a gather, so that a row left unwritten cannot pass for a row read as zeros. The hypothesis profile is the
suite's ("ci": derandomized, no example database) from conftest.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore

# A share of the loaded profile's cases (tests/conftest.py): a few dozen in make test, 20x more under
# HYPOTHESIS_PROFILE=long.
FAST = settings(max_examples=max(1, settings.default.max_examples * 5 // 6), deadline=None)

LOSSLESS_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                   torch.int16, torch.int8, torch.uint8, torch.bool]


def _values(shape, dtype, seed: int) -> torch.Tensor:
    """Random values of ``dtype``, every one distinct from the sentinels that poison outputs where the dtype allows."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g).to(dtype)


def _poisoned(shape, dtype) -> torch.Tensor:
    """A buffer no correct gather leaves as it is: NaN for floats, the dtype's extreme for integers."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype)  # half of the rows differ from it; its complement is checked too
    return torch.full(shape, torch.iinfo(dtype).max, dtype=dtype)


@st.composite
def tables(draw, dtypes=LOSSLESS_DTYPES):
    """(source x, table kwargs): random shapes, dtypes, GPU budgets, hot orders and layouts that exist on the CPU."""
    n = draw(st.integers(1, 40))
    row_shape = draw(st.sampled_from([(), (1,), (3,), (7,), (2, 3)]))
    dtype = draw(st.sampled_from(dtypes))
    x = _values((n, *row_shape), dtype, draw(st.integers(0, 2**31)))
    kwargs = {}
    placement = draw(st.sampled_from(["none", "budget", "hot_order", "hotness", "gpu_rows"]))
    if placement == "budget":
        kwargs["gpu_budget"] = draw(st.sampled_from([0, 1, 64, "1KB", "1GB"]))
    elif placement == "hot_order":
        kwargs["hot_order"] = torch.tensor(draw(st.permutations(range(n))))[:draw(st.integers(0, n))]
        kwargs["gpu_budget"] = draw(st.sampled_from([0, 128, "1GB"]))
    elif placement == "hotness":
        kwargs["hotness"] = torch.rand(n, generator=torch.Generator().manual_seed(n))
        kwargs["gpu_budget"] = draw(st.sampled_from([0, 128, "1GB"]))
    elif placement == "gpu_rows":
        kwargs["gpu_rows"] = torch.tensor(draw(st.lists(st.integers(0, n - 1), unique=True)), dtype=torch.int64)
    if draw(st.booleans()):
        kwargs["layout"] = torch.tensor(draw(st.permutations(range(n))), dtype=torch.int64)
    kwargs["copy"] = draw(st.booleans())
    return x, kwargs


def _ids(draw, n: int, max_size: int = 30) -> list:
    """Ids with repeats, in any order, possibly none."""
    return draw(st.lists(st.integers(0, n - 1), max_size=max_size))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality, NaN included (a row read as poison must not compare equal by luck)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    def raw(t):  # dense strides first: a one-row view may keep a stride of 2, which a byte view refuses
        return torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t).view(-1).view(torch.uint8)
    return torch.equal(raw(a), raw(b))


# ---- reads -------------------------------------------------------------------------------------------------------
@FAST
@given(tables(), st.data())
def test_getitem_reads_exactly_x_idx(case, data):
    x, kwargs = case
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    ids = _ids(data.draw, len(x))
    id_dtype = data.draw(st.sampled_from([torch.int64, torch.int32]))
    idx = torch.tensor(ids, dtype=id_dtype)
    want = x[idx.long()]
    assert _equal(table[idx], want)
    assert _equal(table[np.asarray(ids, dtype=np.int64)], want)  # numpy ids read the same rows
    assert _equal(table[list(ids)], want)  # so do lists
    if ids:
        two_d = idx[: len(ids) // 2 * 2].view(-1, 2)  # ids of any shape: the result is [*idx.shape, *row_shape]
        assert _equal(table[two_d], x[two_d.long()])
        assert _equal(table[ids[0]], x[ids[0]])  # a scalar drops the first dimension, as x[i]


@FAST
@given(tables(), st.data())
def test_slices_and_masks_read_as_torch_does(case, data):
    x, kwargs = case
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    n = len(x)
    start, stop = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.integers(1, 3))
    assert _equal(table[start:stop:step], x[start:stop:step])
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    assert _equal(table[mask], x[mask])


@FAST
@given(tables(), st.data())
def test_gather_into_a_poisoned_out_writes_every_row(case, data):
    x, kwargs = case
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    idx = torch.tensor(_ids(data.draw, len(x)), dtype=data.draw(st.sampled_from([torch.int64, torch.int32])))
    want = x[idx.long()]
    out = _poisoned(want.shape, x.dtype)
    got = table.gather(idx, out=out)
    assert got.data_ptr() == out.data_ptr() and _equal(out, want)
    if x.dtype == torch.bool:  # the complement of the poison catches rows left as they were
        out = torch.zeros_like(want)
        table.gather(idx, out=out)
        assert _equal(out, want)


@FAST
@given(st.lists(tables(), min_size=1, max_size=3), st.data())
def test_gather_many_matches_each_table_with_and_without_outs(cases, data):
    built = [(hmgstore.HybridTensor(x.clone(), "cpu", **kw), x) for x, kw in cases]
    shared = data.draw(st.booleans())  # one id tensor for every table where their lengths allow
    n_min = min(len(x) for _, x in built)
    common = torch.tensor(_ids(data.draw, n_min), dtype=torch.int64)
    idxs = [common if shared else torch.tensor(_ids(data.draw, len(x)), dtype=torch.int64) for _, x in built]
    wants = [x[i] for (_, x), i in zip(built, idxs)]
    got = hmgstore.gather_many([(t, i) for (t, _), i in zip(built, idxs)])
    assert len(got) == len(wants) and all(_equal(g, w) for g, w in zip(got, wants))
    outs = [_poisoned(w.shape, w.dtype) for w in wants]
    got = hmgstore.gather_many([(t, i) for (t, _), i in zip(built, idxs)], outs=outs)
    assert all(g.data_ptr() == o.data_ptr() for g, o in zip(got, outs))
    assert all(_equal(o, w) for o, w in zip(outs, wants))
    # some outs given, others not
    mixed = [o if k % 2 else None for k, o in enumerate(_poisoned(w.shape, w.dtype) for w in wants)]
    got = hmgstore.gather_many([(t, i) for (t, _), i in zip(built, idxs)], outs=mixed)
    assert all(_equal(g, w) for g, w in zip(got, wants))


def _ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous views of one storage share a byte."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a.numel() > 0 and b.numel() > 0 and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


@settings(max_examples=settings.default.max_examples * 8, deadline=None)  # cheap; the clashes are a thin slice
@given(st.integers(2, 12), st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8)), min_size=1, max_size=3),
       st.data())
def test_gather_many_outs_over_id_memory_are_refused_or_exact(n, spans, data):
    """Ids and outs carved from one int64 buffer at random offsets: outs that overlap any request's ids (or each
    other) must be refused with ValueError, since rows written over ids not yet read would fetch wrong rows; outs
    clear of every id and out must read exactly."""
    x = torch.arange(n, dtype=torch.int64).flip(0) * 3 + 1  # rows differ from their ids
    table = hmgstore.HybridTensor(x.clone(), "cpu")
    buf = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=48, max_size=48)), dtype=torch.int64)
    ids = [buf[a:a + k] for a, k in spans]
    outs = []
    for _ in ids:
        where = data.draw(st.sampled_from(["none", "own", "buffer"]))
        k = len(_)
        if where == "none":
            outs.append(None)
        elif where == "own":
            outs.append(torch.full((k,), -5, dtype=torch.int64))
        else:
            a = data.draw(st.integers(0, 48 - k))
            outs.append(buf[a:a + k])
    wants = [x[i.clone()] for i in ids]
    given_outs = [o for o in outs if o is not None]
    clash = any(_ranges_overlap(o, i) for o in given_outs for i in ids) or any(
        _ranges_overlap(o, p) for k, o in enumerate(given_outs) for p in given_outs[k + 1:])
    try:
        got = hmgstore.gather_many(list(zip([table] * len(ids), ids)), outs=outs)
    except ValueError:
        assert clash, "outs clear of every id and out were refused"
        return
    assert not clash, "outs over ids not yet read (or over each other) were accepted"
    assert all(_equal(g, w) for g, w in zip(got, wants))


# ---- stored formats -------------------------------------------------------------------------------------------------
MIN_SCALE = 2.0 ** -117  # hmgstore.rows.formats: the smallest scale a scaled row keeps


def _float_rows(draw, n_max=30):
    n = draw(st.integers(1, n_max))
    d = draw(st.sampled_from([1, 3, 8, 17]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    magnitude = draw(st.sampled_from([1e-3, 1.0, 50.0, 1e4]))
    x = torch.randn(n, d, generator=g) * magnitude
    if draw(st.booleans()):
        x[torch.randint(0, n, (1,), generator=g)] = 0.0  # a row of zeros stores scale 1
    return x


@FAST
@given(st.data(), st.sampled_from(["int8", "float8"]), st.sampled_from(["compress", "host_dtype"]))
def test_scaled_formats_stay_within_their_documented_error(data, name, where):
    x = _float_rows(data.draw)
    if where == "host_dtype" and name in ("int8", "float8"):
        where = "compress"  # host_dtype= takes the 16-bit formats only (docs/host-memory.md)
    kw = {where: name, "gpu_budget": data.draw(st.sampled_from([None, 0, 256, "1GB"]))}
    if data.draw(st.booleans()):
        kw["layout"] = torch.tensor(data.draw(st.permutations(range(len(x)))), dtype=torch.int64)
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kw)
    idx = torch.tensor(_ids(data.draw, len(x)), dtype=torch.int64)
    out = torch.full((len(idx), x.shape[1]), float("nan"))
    got = table.gather(idx, out=out)
    assert got.dtype == torch.float32 and bool(torch.isfinite(out).all())
    ref = x[idx]
    qmax = 127.0 if name == "int8" else 448.0
    scale = (ref.abs().amax(dim=1, keepdim=True) / qmax).clamp(min=MIN_SCALE)
    scale = torch.where(ref.abs().amax(dim=1, keepdim=True) == 0, torch.ones_like(scale), scale)
    err = (out - ref).abs()
    if name == "int8":  # rounding to the nearest of q * scale: half a step, plus float32 rounding of the product
        bound = scale * 0.5 + ref.abs() * 2.0 ** -20
    else:  # e4m3: 3 mantissa bits (a relative half-step of 2^-4), subnormals spaced 2^-9 apart
        bound = ref.abs() * 2.0 ** -4 + scale * 2.0 ** -10 + ref.abs() * 2.0 ** -20
    assert bool((err <= bound).all()), float((err - bound).max())
    assert _equal(table[idx], out)  # reads of one row agree with each other


@FAST
@given(st.data(), st.sampled_from([torch.float16, torch.bfloat16]), st.sampled_from(["compress", "host_dtype"]))
def test_half_width_formats_read_as_torch_rounds(data, dtype, where):
    x = _float_rows(data.draw)
    name = "float16" if dtype == torch.float16 else "bfloat16"
    table = hmgstore.HybridTensor(x.clone(), "cpu", **{where: name},
                                  gpu_budget=data.draw(st.sampled_from([None, 0, 256, "1GB"])))
    idx = torch.tensor(_ids(data.draw, len(x)), dtype=torch.int32)
    out = torch.full((len(idx), x.shape[1]), float("nan"))
    table.gather(idx, out=out)
    assert _equal(out, x.to(dtype).float()[idx.long()])  # docs: every row reads as x.to(host_dtype).float()[idx]


@FAST
@given(st.data(), st.sampled_from(["int8", "float8"]))
def test_scaled_formats_refuse_rows_with_nan_or_infinity(data, name):
    x = _float_rows(data.draw)
    row = data.draw(st.integers(0, len(x) - 1))
    x[row, data.draw(st.integers(0, x.shape[1] - 1))] = data.draw(st.sampled_from([float("nan"), float("inf"),
                                                                                  -float("inf")]))
    with pytest.raises(ValueError):
        hmgstore.HybridTensor(x, "cpu", compress=name)


# ---- writes ---------------------------------------------------------------------------------------------------------
@FAST
@given(tables(dtypes=[torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8]),
       st.data())
def test_writes_to_unique_ids_read_back(case, data):
    x, kwargs = case
    kwargs["copy"] = True
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    n = len(x)
    ids = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    idx = torch.tensor(ids, dtype=data.draw(st.sampled_from([torch.int64, torch.int32])))
    v = _values((len(ids), *x.shape[1:]), x.dtype, data.draw(st.integers(0, 2**31)))
    table[idx] = v
    want = x.clone()
    want[idx.long()] = v
    assert _equal(table[torch.arange(n)], want)  # written rows are v; every other row is untouched
    assert _equal(table[idx], v)


@FAST
@given(st.data(), st.sampled_from(["int8", "float16", "bfloat16"]))
def test_writes_to_a_compressed_table_read_as_the_written_rows_encoded(data, name):
    x = _float_rows(data.draw)
    table = hmgstore.HybridTensor(x.clone(), "cpu", compress=name, gpu_budget=data.draw(st.sampled_from([0, "1GB"])))
    before = table[torch.arange(len(x))]
    ids = data.draw(st.lists(st.integers(0, len(x) - 1), unique=True, min_size=1))
    v = torch.randn(len(ids), x.shape[1], generator=torch.Generator().manual_seed(len(ids))) * 2
    table[torch.tensor(ids)] = v
    fresh = hmgstore.HybridTensor(v.clone(), "cpu", compress=name)  # the same rows encoded at build
    after = table[torch.arange(len(x))]
    assert _equal(after[torch.tensor(ids)], fresh[torch.arange(len(ids))])
    untouched = torch.tensor(sorted(set(range(len(x))) - set(ids)), dtype=torch.int64)
    assert _equal(after[untouched], before[untouched])


# ---- bad ids --------------------------------------------------------------------------------------------------------
@FAST
@given(tables(dtypes=[torch.float32, torch.int64]), st.data())
def test_out_of_range_ids_raise_index_error_and_leave_out_alone(case, data):
    x, kwargs = case
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    n = len(x)
    good = _ids(data.draw, n, max_size=10)
    bad = data.draw(st.one_of(st.integers(n, n + 5), st.integers(-n - 5, -1), st.just(2**40), st.just(-2**40)))
    ids = good.copy()
    ids.insert(data.draw(st.integers(0, len(good))), bad)
    id_dtype = torch.int64 if abs(bad) > 2**31 - 1 else data.draw(st.sampled_from([torch.int64, torch.int32]))
    idx = torch.tensor(ids, dtype=id_dtype)
    out = _poisoned((len(ids), *x.shape[1:]), x.dtype)
    with pytest.raises(IndexError):
        table.gather(idx, out=out)
    assert _equal(out, _poisoned(out.shape, x.dtype))  # CPU ids are checked before any row is read
    with pytest.raises(IndexError):
        table[idx]
    with pytest.raises(IndexError):
        hmgstore.gather_many([(table, torch.tensor(good, dtype=torch.int64)), (table, idx)])
    with pytest.raises(IndexError):
        table[bad]


@FAST
@given(tables(dtypes=[torch.float32]), st.data())
def test_non_integer_ids_raise_type_error(case, data):
    x, kwargs = case
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    ids = _ids(data.draw, len(x), max_size=6) or [0]
    bad = data.draw(st.sampled_from([
        torch.tensor(ids, dtype=torch.float32), torch.tensor(ids, dtype=torch.float64),
        np.asarray(ids, dtype=np.float64), 1.0, 0.5, True, False, [float(i) for i in ids],
    ]))
    with pytest.raises(TypeError):
        table[bad]
    with pytest.raises(TypeError):
        hmgstore.gather_many([(table, bad)])
    write = torch.zeros(len(ids), *x.shape[1:])
    with pytest.raises(TypeError):
        table[torch.tensor(ids, dtype=torch.float32)] = write
    assert _equal(table[torch.arange(len(x))], x)  # refused writes change nothing


@FAST
@given(tables(dtypes=[torch.float32]), st.data())
def test_bool_tensors_of_another_shape_than_a_row_mask_raise(case, data):
    """A bool tensor is a row mask of shape (N,) only: any other shape (a 0-dim True included) is refused, never
    read as ids 0 and 1."""
    x, kwargs = case
    table = hmgstore.HybridTensor(x.clone(), "cpu", **kwargs)
    shape = data.draw(st.sampled_from([(), (len(x) + 1,), (len(x), 1), (1, len(x))]))
    mask = torch.ones(shape, dtype=torch.bool)
    with pytest.raises((IndexError, TypeError)):
        table[mask]
    with pytest.raises((IndexError, TypeError)):
        table.gather(mask, out=torch.full((int(mask.sum()), *x.shape[1:]), float("nan")))
