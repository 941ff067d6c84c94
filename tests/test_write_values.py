"""What a table write ``t[ids] = value`` stores, or how it refuses (:func:`hmgstore.rows.writes.rows_to_write`).

Python numbers (and lists of them) are read at the table's precision, as
torch's own ``x[ids] = v`` reads them; a number the table cannot hold (NaN
into integers, a float past an integer or float range, a complex into a real
table) is refused, never stored wrapped, cut or as garbage; lists follow
the rule of the tensor they stand for; every other value is refused with
what a write takes. Each property compares with torch's ``x[ids] = v`` on a
plain tensor of the same dtype: the same stored value, or an error where
torch stores a value that is not the one written.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
INTEGERS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
DTYPES = FLOATS + INTEGERS + [torch.bool]
#: Python numbers a write may hold, the edges of every dtype's range among them.
EDGES = [0.1, 1e300, -1e300, 1e-50, 1e20, 65504.0, 65520.0, 3.5e38, 127.5, -128.5, 255.5, -0.5, 2.0**63, -2.0**63,
         2**63 - 1, -2**63, 70000, -129, 256]
#: The edges float64 holds exactly: a list of them is read as float64 and rounded once, as each alone is.
EXACT_EDGES = [edge for edge in EDGES if not isinstance(edge, int) or abs(edge) <= 2**53]
NUMBERS = st.one_of(st.floats(), st.integers(-2**63, 2**63 - 1), st.booleans(), st.complex_numbers(),
                    st.sampled_from(EDGES))


def _table(dtype, rows=3):
    return hmgstore.HybridTensor(torch.zeros(rows, 2, dtype=dtype), "cpu")


def _write(dtype, value):
    """(what torch's x[[1]] = value stores or the error it raises, what the table stores or the error it raises),
    the table checked unchanged after an error."""
    x = torch.zeros(3, 2, dtype=dtype)
    try:
        x[[1]] = value
        want = x[1]
    except (TypeError, ValueError, RuntimeError) as err:
        want = err
    table = _table(dtype)
    try:
        table[[1]] = value
        got = table[[1]][0]
    except (TypeError, ValueError) as err:
        got = err
        assert not bool((table.dense() != 0).any())
    return want, got


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _past_range(value, dtype) -> bool:
    """True where ``value`` is not a number of ``dtype``: torch stores something else (wrapped, inf, garbage)."""
    if isinstance(value, complex):
        return not dtype.is_complex or any(_past_range(part, dtype) for part in (value.real, value.imag))
    if dtype == torch.bool or isinstance(value, bool):
        return False
    if dtype.is_floating_point or dtype.is_complex:
        return torch.finfo(dtype).max < abs(value) < math.inf
    info = torch.iinfo(dtype)
    return not (math.isfinite(value) and info.min <= value <= info.max)


# ---- Python numbers, property against torch ---------------------------------------------------------------
@given(st.sampled_from(DTYPES), NUMBERS)
def test_a_python_number_is_stored_as_torch_stores_it_or_refused(dtype, value):
    """Where torch refuses, the table refuses; where torch stores the number's value, the table stores the same;
    the table refuses (and only then) where torch would store something else: past the range, or a complex
    number's real part."""
    want, got = _write(dtype, value)
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"torch refuses {value!r} into {dtype} ({want}); the table stored {got}"
    elif isinstance(got, Exception):
        assert _past_range(value, dtype), f"{value!r} into {dtype}: torch stores {want}, the table refused: {got}"
    else:
        assert not _past_range(value, dtype), f"{value!r} into {dtype} was stored as {got}"
        _same(got, want)


@given(st.sampled_from(DTYPES), NUMBERS, st.sampled_from([np.float64, np.float32, np.int64, np.uint8, np.bool_]))
def test_a_numpy_number_is_stored_as_the_python_number_it_holds(dtype, value, np_type):
    """np.float32(nan) into an integer table is refused as float('nan') is, never stored as INT_MIN."""
    if isinstance(value, complex):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's own overflow warnings while building the scalar
        try:
            number = np_type(value)
        except (OverflowError, ValueError):
            return  # numpy holds no such scalar
    _, got = _write(dtype, number)
    _, want = _write(dtype, number.item())
    assert type(got) is type(want)
    if isinstance(got, torch.Tensor):
        _same(got, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("value", [0.1, 1e300, 1e-50, -2.2250738585072014e-308, [[0.1, 1e300]], (1e-50, 0.3),
                                   [[1, 0.1]]])
def test_python_floats_keep_a_float64_tables_precision(dtype, value):
    """0.1 reads back as 0.1, 1e300 as 1e300 (not inf), 1e-50 as 1e-50 (not 0): never through float32."""
    table = _table(dtype)
    table[[1]] = value
    want = torch.zeros(3, 2, dtype=dtype)
    want[[1]] = torch.tensor(value, dtype=dtype)
    assert torch.equal(table.dense(), want)


@pytest.mark.parametrize("dtype", INTEGERS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float32("nan"), np.float64("inf")])
def test_nan_and_infinities_into_an_integer_table_are_refused(dtype, value):
    table = _table(dtype)
    with pytest.raises(ValueError, match=f"the value holds -?(nan|inf); {dtype} rows hold no NaN or infinities"):
        table[[1]] = value
    assert not bool((table.dense() != 0).any())


@pytest.mark.parametrize(("dtype", "value", "low", "high"), [
    (torch.uint8, 300.7, 0, 255), (torch.uint8, -1.5, 0, 255), (torch.uint8, -0.5, 0, 255),
    (torch.uint8, 255.5, 0, 255), (torch.int8, 127.5, -128, 127), (torch.int16, 1e20, -32768, 32767),
    (torch.int32, -3e9, -2**31, 2**31 - 1), (torch.int64, 2.0**63, -2**63, 2**63 - 1),
    (torch.int64, 1e20, -2**63, 2**63 - 1)])
def test_a_float_past_an_integer_range_is_refused_naming_it(dtype, value, low, high):
    table = _table(dtype)
    with pytest.raises(ValueError, match=re.escape(f"the value holds {value}, past this table's {dtype} range "
                                                   f"[{low}, {high}]")):
        table[[1]] = value
    assert not bool((table.dense() != 0).any())


@pytest.mark.parametrize("dtype", INTEGERS)
def test_a_float_in_an_integer_range_is_truncated_toward_zero_as_torch_does(dtype):
    for value in (2.7, 0.1, 1e-50, 127.0, -2.7, -0.9):
        if value < 0 and dtype == torch.uint8:
            continue
        table, x = _table(dtype), torch.zeros(3, 2, dtype=dtype)
        table[[1]] = value
        x[[1]] = value
        assert torch.equal(table.dense(), x) and int(table[[1]][0, 0]) == int(value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.complex64])
def test_a_finite_number_past_a_float_range_is_refused_not_stored_as_inf(dtype):
    top = torch.finfo(dtype).max
    for value in (1e300, -1e300, 2**1100, [[1.0, 1e300]], [10**400, 1]):
        table = _table(dtype)
        with pytest.raises(ValueError, match=re.escape(f"past this table's {dtype} range [-{top}, {top}]")):
            table[[1]] = value
        assert not bool((table.dense() != 0).any())
    table = _table(dtype)
    table[[1]] = [[float("inf"), float("-inf")]]  # infinities are numbers a float table holds
    assert table[[1]].abs().tolist() == [[math.inf, math.inf]]


# ---- lists and tuples follow the tensor rule -------------------------------------------------------------
@given(st.sampled_from(DTYPES), st.lists(st.one_of(st.floats(), st.integers(-2**53, 2**53), st.booleans(),
                                                 st.sampled_from(EXACT_EDGES)), min_size=1, max_size=3))
def test_a_list_is_stored_as_its_numbers_are_or_refused_for_its_kind(dtype, numbers):
    """A list holding a float is refused by an integer or bool table (as a float tensor is), one holding an int
    by a bool table; otherwise each number is stored as it is when written alone, and the list is refused where
    one of them is."""
    kind = torch.as_tensor(numbers).dtype
    table = _table(dtype, rows=len(numbers))
    if not torch.can_cast(kind, dtype):
        with pytest.raises(TypeError, match=f"value would be cut to this table's {dtype} rows"):
            table[[0]] = [numbers, numbers]
        return
    alone = [_write(dtype, number)[1] for number in numbers]
    refused = [got for got in alone if isinstance(got, Exception)]
    if refused:
        with pytest.raises(ValueError, match="past this table's"):
            table[torch.arange(len(numbers))] = [[number] * 2 for number in numbers]
        return
    table[torch.arange(len(numbers))] = [[number] * 2 for number in numbers]
    _same(table.dense(), torch.stack(alone))


@pytest.mark.parametrize("dtype", INTEGERS + [torch.bool])
@pytest.mark.parametrize("value", [[[1.5, 1]], [[1.0, 2.0]], (0.5, 1), [[1, 2.5]], np.array([[1.5, 1]], dtype=object)])
def test_a_list_of_floats_into_an_integer_table_is_refused_as_the_tensor_is(dtype, value):
    table = _table(dtype)
    with pytest.raises(TypeError, match=rf"torch.float\d+ value would be cut to this table's {dtype} rows"):
        table[[1]] = value
    with pytest.raises(TypeError, match="would be cut"):
        table[[1]] = torch.tensor(np.asarray(value, dtype=np.float64))
    assert not bool((table.dense() != 0).any())


@pytest.mark.parametrize("dtype", INTEGERS)
def test_a_list_of_integers_is_written_or_refused_naming_the_first_past_the_range(dtype):
    info = torch.iinfo(dtype)
    table = _table(dtype)
    table[[0, 2]] = [[info.min, info.max], [True, -0 if info.min == 0 else -1]]
    assert table.dense()[[0, 2]].tolist() == [[info.min, info.max], [1, 0 if info.min == 0 else -1]]
    for past in (info.max + 1, info.min - 1, 2**64, -2**70):
        with pytest.raises(ValueError, match=f"the value holds {past}, past this table's {dtype} range"):
            table[[1]] = [[0, past]]
    assert table.dense()[1].tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool])
@pytest.mark.parametrize("value", [1 + 2j, complex(0, 0), [[1 + 2j, 0]], np.complex64(1j)])
def test_a_complex_number_into_a_real_table_is_refused_not_cut_to_its_real_part(dtype, value):
    table = _table(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not stored with a warning
        with pytest.raises(TypeError, match="complex"):
            table[[1]] = value
    assert not bool((table.dense() != 0).any())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_empty_list_has_no_kind_to_refuse(dtype):
    table = _table(dtype)
    for value in ([], [[]]):
        with pytest.raises(ValueError, match="does not broadcast"):  # its shape, not its kind, is what is wrong
            table[[1]] = value


# ---- values that are not rows -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [None, "1.5", b"\x01", object(), {1: 2}, {1, 2}, [None, 1.0], [[1, 2], [3]],
                                   ["a", "b"], [torch.ones(2), torch.ones(2)], np.array(["a", "b"]),
                                   np.array([1.0, 2.0], dtype=np.longdouble), np.longdouble(1.5), np.str_("a")])
def test_a_value_that_is_not_rows_is_refused_saying_what_a_write_takes(value):
    if isinstance(value, np.ndarray) and value.dtype == np.longdouble and np.longdouble == np.float64:
        pytest.skip("here a long double is a float64, which torch holds")
    table = _table(torch.float32)
    with pytest.raises(TypeError, match="a write takes rows as a tensor, a numpy array, a number or a nested list"):
        table[[1]] = value
    assert not bool((table.dense() != 0).any())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int32, torch.int64, torch.complex128])
@pytest.mark.parametrize("how", ["big-endian", "reversed", "reversed columns", "big-endian reversed"])
def test_an_array_in_another_byte_order_or_with_negative_strides_is_written_as_its_values(dtype, how):
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    values = np.arange(1, 7, dtype=np_dtype).reshape(3, 2) * 3
    array = values.astype(np_dtype.newbyteorder(">")) if "big" in how else values
    array = array[::-1] if how.endswith("reversed") else array[:, ::-1] if "columns" in how else array
    table = _table(dtype)
    table[[2, 1, 0]] = array
    assert table[[2, 1, 0]].tolist() == np.asarray(array, dtype=np_dtype).tolist()


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_a_broadcast_array_is_written_as_the_rows_it_stands_for():
    row = np.arange(2.0)
    table = _table(torch.float64, rows=4)
    table[[0, 1, 2, 3]] = np.broadcast_to(row, (4, 2))
    table[[3]] = np.broadcast_to(np.float64(7.0), (1, 2))[::-1]
    assert table.dense().tolist() == [[0.0, 1.0]] * 3 + [[7.0, 7.0]]


def test_float_tensors_into_an_integer_table_are_still_refused_and_integers_still_range_checked():
    table = _table(torch.int16)
    for value in (torch.tensor([[1.5, 2.0]]), np.array([[1.0, 2.0]]), torch.tensor([[float("nan"), 0.0]])):
        with pytest.raises(TypeError, match="would be cut to this table's torch.int16"):
            table[[1]] = value
    with pytest.raises(ValueError, match="the value holds 18446744073709551615, past this table's torch.int16"):
        table[[1]] = np.array([[2**64 - 1, 0]], dtype=np.uint64)
    table[[1]] = np.array([[7, -7]], dtype=">i8")
    assert table.dense().tolist() == [[0, 0], [7, -7], [0, 0]]


@pytest.mark.parametrize("view", ["numpy", "from_numpy", "torch"])
def test_rows_in_the_tables_own_memory_are_refused_however_they_are_viewed(view):
    """A value over the table's own bytes (a numpy view, a tensor from it, a torch view) is refused: copied row
    after row, row 2 would receive row 1 already overwritten (torch's own check would see the torch view only)."""
    x = torch.arange(20.0).reshape(5, 4)
    table = hmgstore.HybridTensor(x)
    value = {"numpy": lambda: x.numpy()[0:2], "from_numpy": lambda: torch.from_numpy(x.numpy()[0:2]),
             "torch": lambda: x[0:2]}[view]()
    with pytest.raises(RuntimeError, match="share memory with the table"):
        table[[1, 2]] = value
    assert torch.equal(x, torch.arange(20.0).reshape(5, 4))  # nothing written
    table[[1, 2]] = value.clone() if view != "numpy" else value.copy()
    assert table[[1, 2]].tolist() == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


def test_values_beside_a_strided_tables_rows_are_written_and_values_over_them_refused():
    """A table over a column slice or every other row: a value in the bytes between its rows is not the table's
    (written, as torch writes it); one over a row is refused."""
    big = torch.arange(48.0).reshape(6, 8)
    table = hmgstore.HybridTensor(big[:, :4])
    table[[1]] = big.numpy()[0:1, 4:]  # row 0's other columns
    assert table[[1]].tolist() == [[4.0, 5.0, 6.0, 7.0]]
    with pytest.raises(RuntimeError, match="share memory with the table"):
        table[[1]] = big.numpy()[0:1, 2:6]  # half of it in row 0
    rows = torch.arange(48.0).reshape(6, 8)
    every_other = hmgstore.HybridTensor(rows[::2])
    every_other[[1]] = rows.numpy()[1:2]  # a row between the table's
    assert every_other[[1]].tolist() == [list(range(8, 16))]
    with pytest.raises(RuntimeError, match="share memory with the table"):
        every_other[[0]] = rows.numpy()[4:5]  # the table's row 2


def test_a_lazy_conjugate_or_negative_view_is_refused_as_a_source():
    """x.conj() and torch's negative views keep the unconjugated values in memory, which a kernel reads: refused
    with the fix (CPU gathers resolved them; GPU ones would not)."""
    c = torch.complex(torch.ones(3, 2), torch.arange(6.0).reshape(3, 2))
    with pytest.raises(ValueError, match=r"lazy conjugate view.*resolve_conj\(\)"):
        hmgstore.HybridTensor(c.conj())
    with pytest.raises(ValueError, match="lazy negative view"):
        hmgstore.HybridTensor(torch._neg_view(torch.arange(6.0).reshape(3, 2)))
    assert torch.equal(hmgstore.HybridTensor(c.conj().resolve_conj())[[2]], c.conj()[[2]])
