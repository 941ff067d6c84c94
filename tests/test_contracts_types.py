"""Contracts of dtypes, format names, settings and sizes at the entry points that take them.

What a table may hold (:func:`hmgstore.rows.checks.table_dtype`), what
``host_dtype=``/``compress=`` may name (:func:`hmgstore.rows.formats.get`,
the same for a table and for :func:`hmgstore.load`), what a ``.npy`` file's
``dtype=`` must agree with, which integers a setting takes
(:func:`hmgstore.rows.checks.setting`), which values a write may hold
(:func:`hmgstore.rows.writes.rows_to_write`), how sizes are read
(:func:`hmgstore.rows.hotness.parse_bytes`) and how scores of several groups
are ranked. Each property is the exact result or the documented error,
saying what was wrong and what to pass, never a wrong row or a raw torch
error from deep inside.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
from hmgstore.rows import checks, formats
from hmgstore.rows.hotness import MAX_BYTES, hot_rows_under_budget, parse_bytes

#: Dtypes torch gathers but cannot write rows of or pickle: refused by every table-building entry point.
HALF_SUPPORTED = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e5m2, torch.float8_e4m3fn]
#: Every spelling of a stored row format, as ``compress=`` takes it.
FORMAT_NAMES = ["int8", torch.int8, "float8", "fp8", torch.float8_e4m3fn, "bfloat16", "bf16", torch.bfloat16,
                "float16", "half", torch.float16]
CHOICES = "'bfloat16', 'float16', 'float8', 'int8'"
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("types")


def varied(rows: int = 40, width: int = 6) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(rows)) * 3


def saved(folder: Path, x: torch.Tensor, kind: str, name: str = "t") -> tuple[Path, dict]:
    """``x`` written as a ``kind`` file (npy, pt or raw), and the arguments load needs to read it."""
    path = folder / f"{name}.{kind}"
    if kind == "npy":
        np.save(path, x.numpy())
        return path, {}
    if kind == "pt":
        torch.save(x, path)
        return path, {}
    x.numpy().tofile(path)
    return path, {"dtype": x.numpy().dtype, "shape": (-1, *x.shape[1:])}


# ---- .npy dtype= that disagrees with the header ---------------------------------------------------------
@pytest.mark.parametrize("dtype, to_do", [(torch.bfloat16, "pass host_dtype='bfloat16' instead"),
                                          (torch.float16, "pass host_dtype='float16' instead"),
                                          (np.float64, "to get float64 rows, convert the table after loading"),
                                          (torch.int32, "convert the table after loading")])
def test_a_npy_dtype_that_disagrees_says_what_the_header_holds_and_what_to_pass(folder, dtype, to_do):
    """Never the advice for a raw file (read the bytes as int16 and view them), which a .npy file never needs."""
    path, _ = saved(folder, varied(), "npy")
    with pytest.raises(ValueError, match="header says dtype float32") as err:
        hmgstore.load(path, "cpu", dtype=dtype, progress=False)
    message = str(err.value)
    assert "drop dtype= (or pass dtype=torch.float32" in message and to_do in message
    assert "int16" not in message and ".view(" not in message


@given(st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.int16, np.uint8, np.float16, np.bool_]),
       st.sampled_from(checks.TABLE_DTYPES))
def test_a_npy_dtype_is_believed_only_where_the_header_agrees(folder, held, wanted):
    array = np.arange(12).reshape(4, 3).astype(held)
    path = folder / "agree.npy"
    np.save(path, array)
    header = torch.from_numpy(array).dtype
    if wanted == header:
        assert torch.equal(hmgstore.load(path, "cpu", dtype=wanted, progress=False)[:], torch.from_numpy(array))
        return
    with pytest.raises(ValueError, match=f"agree.npy is a .npy file whose header says dtype {array.dtype}; "
                                         f"dtype={wanted} disagrees.*pass dtype={header}"):
        hmgstore.load(path, "cpu", dtype=wanted, progress=False)


# ---- host_dtype= and compress=: one reading for a table and for load ------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["npy", "pt", "raw"])
@pytest.mark.parametrize("name", FORMAT_NAMES, ids=str)
def test_load_keeps_host_rows_in_every_format_a_table_takes(folder, device, kind, name):
    """load(host_dtype=name) reads back the rows HybridTensor(x, host_dtype=name) reads, for every name."""
    x = varied()
    path, kw = saved(folder, x, kind, "formats")
    gpu_rows = torch.arange(0, len(x), 3)
    loaded = hmgstore.load(path, device, host_dtype=name, gpu_rows=gpu_rows, progress=False, **kw)
    built = hmgstore.HybridTensor(x, device, host_dtype=name, gpu_rows=gpu_rows, progress=False)
    assert loaded.host_format == built.host_format == formats.get(name)
    assert loaded.dtype == torch.float32 and loaded.shape == x.shape
    ids = torch.randperm(len(x))
    assert torch.equal(loaded[ids], built[ids])
    layout = torch.randperm(len(x))  # stored rows put in layout order, read by the caller's ids
    assert torch.equal(hmgstore.load(path, device, host_dtype=name, layout=layout, progress=False, **kw)[ids],
                       built[ids])


@pytest.mark.parametrize("device", DEVICES)
def test_load_takes_compress_as_a_table_does(folder, device):
    x = varied()
    path, _ = saved(folder, x, "npy", "compress")
    loaded = hmgstore.load(path, device, compress="int8", gpu_rows=torch.arange(10), progress=False)
    built = hmgstore.HybridTensor(x, device, compress="int8", gpu_rows=torch.arange(10), progress=False)
    assert loaded.gpu_format == loaded.host_format == formats.get("int8")
    assert torch.equal(loaded[torch.arange(len(x))], built[torch.arange(len(x))])
    with pytest.raises(ValueError, match="pass one of them"):
        hmgstore.load(path, device, compress="int8", host_dtype="bfloat16", progress=False)


NOT_FORMATS = st.one_of(st.text(max_size=8).filter(lambda s: s.lower().removeprefix(
    "torch.") not in ("int8", "float8", "fp8", "e4m3", "float8_e4m3fn", "bfloat16", "bf16", "float16", "fp16",
                      "half")), st.integers(), st.floats(), st.sampled_from([torch.float32, torch.float64, torch.int16,
                                                                             torch.float8_e5m2, np.float16, [1]]))


@given(NOT_FORMATS)
def test_load_and_a_table_refuse_the_same_host_dtypes_listing_the_choices(folder, name):
    x = varied(8, 2)
    path, _ = saved(folder, x, "npy", "refused")
    for build in (lambda: hmgstore.load(path, "cpu", host_dtype=name, progress=False),
                  lambda: hmgstore.HybridTensor(x, "cpu", host_dtype=name)):
        with pytest.raises(ValueError, match=f"unknown stored row format .* for host_dtype=; use one of {CHOICES}"):
            build()


@pytest.mark.parametrize("name", ["int8", torch.bfloat16])
def test_a_format_for_a_file_that_is_not_float32_names_the_file(folder, name):
    path, _ = saved(folder, torch.arange(12).reshape(4, 3), "npy", "ints")
    with pytest.raises(ValueError, match="keep float32 tables; ints.npy holds torch.int64"):
        hmgstore.load(path, "cpu", host_dtype=name, progress=False)


# ---- dtypes a table cannot hold -------------------------------------------------------------------------
def _refused(dtype) -> str:
    return f"{dtype} is not a dtype hmgstore tables hold \\(float32, .*uint8, bool\\); use torch\\.(int|float)"


@pytest.mark.parametrize("dtype", HALF_SUPPORTED, ids=str)
def test_every_way_to_build_a_table_refuses_a_dtype_torch_cannot_write(folder, dtype):
    x = torch.zeros(6, 3).to(dtype)
    with pytest.raises(TypeError, match="the source table: " + _refused(dtype)):
        hmgstore.HybridTensor(x, "cpu")
    with pytest.raises(TypeError, match="HybridTensor.empty: " + _refused(dtype)):
        hmgstore.HybridTensor.empty((6, 3), dtype, "cpu")
    torch.save(x, folder / "half.pt")
    with pytest.raises(TypeError, match="half.pt: " + _refused(dtype)):
        hmgstore.load(folder / "half.pt", "cpu", progress=False)
    if dtype in (torch.uint16, torch.uint32, torch.uint64):  # numpy has these: arrays and .npy files too
        array = np.zeros((6, 3), dtype=str(dtype).removeprefix("torch."))
        with pytest.raises(TypeError, match=_refused(dtype)):
            hmgstore.HybridTensor(array, "cpu")
        np.save(folder / "half.npy", array)
        with pytest.raises(TypeError, match="half.npy: " + _refused(dtype)):
            hmgstore.load(folder / "half.npy", "cpu", progress=False)


def test_pyg_from_data_refuses_a_dtype_torch_cannot_write():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    from hmgstore.plugins import pyg as hpyg
    data = Data(x=torch.zeros(4, 2, dtype=torch.uint16), edge_index=torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(TypeError, match=_refused(torch.uint16)):
        hpyg.from_data(data, "cpu", progress=False)


@pytest.mark.parametrize("dtype", checks.TABLE_DTYPES, ids=str)
def test_every_dtype_a_table_holds_is_written_and_read(dtype):
    x = torch.arange(12).reshape(6, 2).to(dtype)
    t = hmgstore.HybridTensor(x.clone(), "cpu")
    t[[1, 4]] = x[[0, 5]]
    want = x.clone()
    want[[1, 4]] = x[[0, 5]]
    assert torch.equal(t[torch.arange(6)], want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("how", ["gather", "gather_many"])
def test_an_out_that_requires_grad_is_refused_with_the_fix(device, how):
    t = hmgstore.HybridTensor(varied(5, 3), device, gpu_rows=[1])
    out = torch.zeros(2, 3, requires_grad=True, device=t.device)
    run = (lambda o: t.gather(torch.tensor([0, 1]), out=o)) if how == "gather" else \
        (lambda o: hmgstore.gather_many([(t, [0, 1])], outs=[o]))
    with pytest.raises(ValueError, match=r"out requires grad.*pass out\.detach\(\).*or no out"):
        run(out)
    with pytest.raises(TypeError, match="out"):
        run([[0.0] * 3] * 2)
    run(out.detach())  # the same memory, outside autograd
    assert torch.equal(out.detach(), t[[0, 1]])


# ---- values written into integer tables, and integer settings -------------------------------------------
INT_TABLES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


@given(st.integers(-2**64, 2**64 - 1), st.sampled_from(INT_TABLES), st.sampled_from(["python", "numpy", "scalar"]))
def test_an_integer_written_is_stored_exactly_or_refused_naming_it(value, dtype, how):
    """A uint64 2**64 - 1 is never stored as -1 nor reported as -1: it is refused, naming 18446744073709551615."""
    if how != "python":
        np_type = np.uint64 if value >= 2**63 else np.int64 if value >= -2**63 else None
        if np_type is None:
            return  # no numpy integer holds it
        given_value = np.array([value], np_type) if how == "numpy" else np_type(value)
    else:
        given_value = value
    t = hmgstore.HybridTensor(torch.zeros(3, 1, dtype=dtype), "cpu")
    info = torch.iinfo(dtype)
    if info.min <= value <= info.max:
        t[[1]] = given_value
        assert int(t[[1]].item()) == value
        return
    with pytest.raises(ValueError, match=f"the value holds {value}, past this table's {dtype} range"):
        t[[1]] = given_value
    assert int(t[[1]].item()) == 0  # nothing written


@given(st.one_of(st.integers(1, 50).map(np.int64), st.integers(1, 50).map(np.int32), st.integers(1, 50).map(
    np.uint8), st.integers(1, 50).map(torch.tensor), st.integers(1, 50)))
def test_settings_take_numpy_and_torch_integers_as_python_ints(value):
    pipeline = hmgstore.Pipeline([], value, device="cpu", fuse=value, max_sms=value)
    assert pipeline.depth == pipeline.fuse == pipeline.max_sms == int(value)
    assert type(pipeline.depth) is type(pipeline.fuse) is int
    share = hmgstore.HybridTensor(varied(4, 2), "cpu", split=np.float32(0.5)).split_setting
    assert share is None or share.value == 0.5  # off on the CPU, where every row is read by the CPU already


@given(st.one_of(st.booleans(), st.just(np.True_), st.floats(), st.just(np.float64(2.0)), st.just(torch.tensor(2.0)),
                 st.text(max_size=3), st.integers(-5, 0), st.just(np.int64(0))))
def test_settings_refuse_bools_floats_and_counts_under_one(value):
    with pytest.raises(ValueError, match="depth is the number of batches prepared ahead, at least 1; got"):
        hmgstore.Pipeline([], value, device="cpu")
    if value != "auto":
        with pytest.raises(ValueError, match="fuse is the number of batches gathered together"):
            hmgstore.Pipeline([], device="cpu", fuse=value)


def test_a_npy_file_takes_offset_zero_as_any_integer(folder):
    path, _ = saved(folder, varied(), "npy", "offset")
    assert hmgstore.load(path, "cpu", offset=np.int64(0), progress=False).shape == (40, 6)
    with pytest.raises(ValueError, match="drop offset=False"):
        hmgstore.load(path, "cpu", offset=False, progress=False)


# ---- sizes and scores -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("1e-3GB", 10**6), ("2.5e-1KiB", 256), ("9007199254740993", 2**53 + 1),
                                         ("1E+3MB", 10**9), (np.int64(2**62 + 1), 2**62 + 1),
                                         (torch.tensor(7), 7), ("0e5GB", 0), (str(MAX_BYTES), MAX_BYTES)])
def test_sizes_are_read_exactly(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text, words", [("1e30GB", "past 9223372036854775807 bytes"), (1e300, "past"),
                                         (10**30, "past"), ("1e999999999", "past"), ("1e-12GB", "less than one byte"),
                                         ("1e-999999999GB", "less than one byte"), ("1e-3", "not a whole number"),
                                         (np.True_, "not a byte count"), (torch.tensor(2.5), "not a byte count")])
def test_sizes_that_would_be_silly_are_refused_saying_why(text, words):
    with pytest.raises(ValueError, match=words):
        parse_bytes(text)


@given(st.integers(0, 10**6), st.integers(-12, 12), st.sampled_from(["KB", "MB", "GB", "KiB", "GiB", "TB"]))
def test_a_size_in_a_unit_is_its_exact_value_rounded_down(mantissa, exponent, unit):
    text = f"{mantissa}e{exponent}{unit}"
    exact = Fraction(mantissa) * Fraction(10) ** exponent * {"KB": 10**3, "MB": 10**6, "GB": 10**9,
                                                             "KiB": 2**10, "GiB": 2**30, "TB": 10**12}[unit]
    if exact > MAX_BYTES:
        with pytest.raises(ValueError, match="past"):
            parse_bytes(text)
    elif 0 < exact < 1:
        with pytest.raises(ValueError, match="less than one byte"):
            parse_bytes(text)
    else:
        assert parse_bytes(text) == math.floor(exact)


def test_integer_scores_past_2_53_are_not_tied_across_groups():
    """``.double()`` made 2**53 and 2**53 + 1 equal: the hotter row lost to group order."""
    picked = hot_rows_under_budget({"a": torch.tensor([2**53, 5]), "b": torch.tensor([2**53 + 1])},
                                   {"a": 4, "b": 4}, 4)
    assert picked["a"].tolist() == [] and picked["b"].tolist() == [0]
    picked = hot_rows_under_budget({"a": torch.tensor([2**53 + 1]), "b": torch.tensor([2.0**53], dtype=torch.float64)},
                                   {"a": 4, "b": 4}, 4)
    assert picked["a"].tolist() == [0] and picked["b"].tolist() == []


SCORES = st.one_of(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=6).map(torch.tensor),
                   st.lists(st.integers(-2**55, 2**55), min_size=1, max_size=6).map(torch.tensor),
                   st.lists(st.floats(-1e300, 1e300), min_size=1, max_size=6).map(
                       lambda v: torch.tensor(v, dtype=torch.float64)),
                   st.lists(st.integers(-2**54, 2**54).map(float), min_size=1, max_size=6).map(
                       lambda v: torch.tensor(v, dtype=torch.float64)))
#: Where float64 stops telling integers apart: it ties the first two and rounds the third up.
NEAR_2_53 = [2**53, 2**53 + 1, 2**53 + 3]


def assert_ranked_exactly(a: torch.Tensor, b: torch.Tensor, rows: int) -> None:
    """Against Python's own comparisons of ints and floats, which are exact; ties keep group then id order."""
    picked = hot_rows_under_budget({"a": a, "b": b}, {"a": 4, "b": 4}, 4 * rows)
    values = [("a", i, Fraction(v)) for i, v in enumerate(a.tolist())] + \
             [("b", i, Fraction(v)) for i, v in enumerate(b.tolist())]
    ranked = sorted(range(len(values)), key=lambda k: (-values[k][2], k))[:rows]
    for group in ("a", "b"):
        assert sorted(picked[group].tolist()) == sorted(values[k][1] for k in ranked if values[k][0] == group)


@given(SCORES, SCORES, st.integers(0, 12))
def test_scores_of_several_groups_are_ranked_exactly(a, b, rows):
    assert_ranked_exactly(a, b, rows)


def test_scores_near_2_53_are_ranked_exactly_as_integers_and_beside_floats():
    """Every pair of short score lists there (too few cases for sampling to be sure to meet the ties)."""
    lists = [list(v) for n in (1, 2) for v in itertools.product(NEAR_2_53, repeat=n)]
    for a, b, b_floats in itertools.product(lists, lists, (False, True)):
        for rows in range(len(a) + len(b) + 1):
            assert_ranked_exactly(torch.tensor(a), torch.tensor(b, dtype=torch.float64 if b_floats else None), rows)
