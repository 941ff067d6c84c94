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
