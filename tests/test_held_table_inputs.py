"""A table holds its own copy of what it reads later: a caller's ``layout`` edited after the table is built never
moves the table's rows (the map of ids to host rows is built on first read), whatever the layout's type and
whatever path the table took (constructor, over_host_tier, pickling, the PyG store); a property (hypothesis)
draws layouts of every type, edits of every kind and every format. And a write never stores a
finite number as infinity: a float64 past float32's largest is refused as a Python float is."""
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
from hmgstore import HybridTensor

N = 60


def table_and_layout(kind):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(N, 4, generator=g) + 0.5
    perm = torch.randperm(N, generator=g)
    layout = perm.numpy().copy() if kind == "numpy" else perm
    if kind == "over_host_tier":  # a host tier already stored in layout order
        return x, layout, HybridTensor.over_host_tier(x[perm].clone(), "cpu", torch.float32, layout=layout,
                                                      progress=False)
    return x, layout, HybridTensor(x, "cpu", layout=layout, progress=False)


@pytest.mark.parametrize("kind", ["tensor", "numpy", "over_host_tier"])
def test_editing_the_layout_after_the_build_moves_no_row(kind):
    x, layout, table = table_and_layout(kind)
    layout[:] = np.roll(layout, 1) if kind == "numpy" else torch.roll(layout, 1)  # still a permutation
    ids = torch.arange(N)
    assert torch.equal(table[ids], x)
    assert torch.equal(pickle.loads(pickle.dumps(table))[ids], x)  # a copy rebuilt from the table's own layout
    layout[:2] = layout[2]  # no longer a permutation: rows never read through it
    assert torch.equal(table[ids.flip(0)], x.flip(0))


def test_the_pyg_store_layout_is_held_too():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import from_data

    x = torch.rand(N, 4) + 0.5
    perm = torch.randperm(N)
    fs, _ = from_data(Data(x=x, edge_index=torch.randint(0, N, (2, 4 * N))), layout=perm, progress=False)
    perm.copy_(torch.roll(perm, 1))
    assert torch.equal(fs[None, "x"][torch.arange(N)], x)


@pytest.mark.parametrize("value", [torch.tensor([1e39, 1.0, 2.0, 3.0], dtype=torch.float64),
                                   np.array([1.0, -1e300, 0.5, 0.25])])
def test_a_float64_past_float32s_range_is_refused(value):
    x = torch.rand(5, 4) + 0.5
    table = HybridTensor(x.clone(), "cpu")
    with pytest.raises(ValueError, match=r"past this table's torch.float32 range"):
        table[1] = value
    assert torch.equal(table[torch.arange(5)], x)  # nothing written
    table[1] = torch.tensor([1e30, 1.0, 2.0, float("inf")], dtype=torch.float64)  # in range, or inf as given
    assert torch.equal(table[1], torch.tensor([1e30, 1.0, 2.0, float("inf")]))


def test_an_integer_past_float16s_range_is_refused():
    table = HybridTensor(torch.rand(5, 4).half() + 0.5, "cpu")
    with pytest.raises(ValueError, match=r"70000.*past this table's torch.float16 range"):
        table[1] = torch.tensor([70000, 1, 2, 3])
    table[1] = torch.tensor([65504, 1, 2, 3])
    assert table[1].tolist() == [65504.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@given(value=st.floats(allow_nan=False, allow_infinity=False, width=64)
       | st.sampled_from([65504.0, 65510.5, 65519.99, 65520.0, 3.3895e38, 3.40282357e38, 3.4028235e38]),
       python=st.booleans())
def test_a_float_a_table_of_that_width_rounds_down_is_stored_and_one_it_rounds_to_inf_refused(dtype, value, python):
    """The test is torch's own conversion: a number past the largest by less than half a step is stored as the
    largest (as a compress= format of that width stores it), one that would become inf is refused."""
    table = HybridTensor(torch.ones(3, 2, dtype=dtype), "cpu")
    wanted = torch.tensor([value, 1.0], dtype=torch.float64).to(dtype)
    if bool(wanted.isinf().any()):
        with pytest.raises(ValueError, match=f"past this table's {dtype} range.*stored as inf"):
            table[1] = value if python else torch.tensor([value, 1.0], dtype=torch.float64)
        assert bool((table.dense() == 1).all())  # nothing written
    else:
        table[1] = value if python else torch.tensor([value, 1.0], dtype=torch.float64)
        assert torch.equal(table[1], wanted if not python else wanted[:1].expand(2))


def test_float16_rows_store_a_number_past_65504_that_rounds_down_as_a_float16_format_does():
    native = HybridTensor(torch.ones(2, 2).half(), "cpu")
    native[0] = torch.tensor([65510.5, 65519.0], dtype=torch.float64)
    packed = HybridTensor(torch.ones(2, 2), "cpu", compress="float16")
    packed[0] = torch.tensor([65510.5, 65519.0])
    assert native[0].tolist() == packed[0].tolist() == [65504.0, 65504.0]


def test_public_load_keeps_its_layout_copy(tmp_path):
    x = torch.rand(N, 4) + 0.5
    np.save(tmp_path / "x.npy", x.numpy())
    perm = torch.randperm(N)
    table = hmgstore.load(tmp_path / "x.npy", "cpu", layout=perm, progress=False)
    perm.copy_(torch.roll(perm, 1))
    assert torch.equal(table[torch.arange(N)], x)


@st.composite
def layouts_and_edits(draw):
    """A table's rows, a layout (int64 or int32 tensor, or a numpy array) and in-place edits of that layout."""
    n = draw(st.integers(1, 40))
    perm = torch.tensor(draw(st.permutations(range(n))), dtype=torch.int64)
    kind = draw(st.sampled_from(["int64", "int32", "numpy"]))
    layout = perm.numpy().copy() if kind == "numpy" else perm.to(getattr(torch, kind))
    edits = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(-n, 2 * n)), min_size=1, max_size=n))
    return n, layout, edits, draw(st.sampled_from([None, "int8", "bfloat16"]))


@given(layouts_and_edits(), st.integers(0, 2**31))
def test_no_edit_of_a_layout_after_the_build_reaches_a_read(case, seed):
    # Any edit, into another permutation or none at all (repeats, ids out of range): the table reads as one
    # built from the untouched layout, in every format.
    n, layout, edits, compress = case
    x = torch.rand(n, 3, generator=torch.Generator().manual_seed(seed)) + 0.5
    pristine = HybridTensor(x, "cpu", layout=layout.copy() if isinstance(layout, np.ndarray) else layout.clone(),
                            compress=compress, progress=False)
    table = HybridTensor(x, "cpu", layout=layout, compress=compress, progress=False)
    for at, value in edits:
        layout[at] = value
    ids = torch.randint(0, n, (2 * n,), generator=torch.Generator().manual_seed(seed + 1))
    expected = pristine[ids]
    assert torch.equal(table[ids], expected) and torch.equal(pickle.loads(pickle.dumps(table))[ids], expected)
    if compress is None:
        assert torch.equal(expected, x[ids])
