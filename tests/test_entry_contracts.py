"""Entry points held to their contracts where a hostile probe found them loose:

- a table write takes every integer id dtype a gather takes (int32 ids indexed the host rows raw);
- a graph store's sums over edge types (in-degree, expected draws) refuse node counts that disagree, naming the
  fix, as the sampler does;
- the partition command refuses options of the graph source it does not read, instead of ignoring them;
- a partition's folder gets the mode a folder made there gets, or the one it replaces (not 0700);
- ``from_tensors`` takes the host-memory options ``from_data`` takes, never as node attributes;
- a host tier already stored is refused where the shape and dtype given do not describe it;
- a write takes a value shaped as torch's ``x[ids] = value`` takes it, for ids of any shape; numpy ids of the other
  byte order, and numpy uint8 ids, are ids in gathers, writes and hot orders.
"""
import os
import stat

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
from hmgstore.cli import partition as partition_cli
from hmgstore.plugins.pyg import CSCGraphStore, from_tensors

ID_DTYPES = [torch.int64, torch.int32, torch.int16, torch.uint8]


@pytest.mark.parametrize("dtype", ID_DTYPES)
@pytest.mark.parametrize("layout", [False, True], ids=["no-layout", "layout"])
@given(picks=st.lists(st.integers(0, 19), min_size=0, max_size=8, unique=True), as_numpy=st.booleans())
def test_a_write_with_ids_of_any_integer_dtype_lands_where_a_gather_reads(dtype, layout, picks, as_numpy):
    x = torch.arange(40.0).reshape(20, 2) + 0.5
    table = hmgstore.HybridTensor(x.clone(), "cpu", layout=torch.randperm(20) if layout else None, progress=False)
    ids = torch.tensor(picks, dtype=dtype)
    rows = -torch.arange(2.0 * len(picks)).reshape(-1, 2) - 1
    if dtype == torch.uint8 and not as_numpy:  # torch reads it as a mask, numpy as ids: refused
        with pytest.raises(TypeError, match="ambiguous"):
            table[ids] = rows
        return
    table[ids.numpy() if as_numpy else ids] = rows
    want = x.clone()
    want[ids.long()] = rows
    assert torch.equal(table[torch.arange(20)], want)


def test_a_write_of_one_int32_id_as_a_0d_tensor():
    table = hmgstore.HybridTensor(torch.ones(4, 2), "cpu")
    table[torch.tensor(2, dtype=torch.int32)] = torch.tensor([7.0, 8.0])
    assert table[torch.tensor([2])].tolist() == [[7.0, 8.0]]


def _disagreeing_store() -> CSCGraphStore:
    store = CSCGraphStore()
    store.put_edge_index(torch.tensor([[0, 1, 2], [5, 1, 0]]), edge_type=("a", "r1", "b"), layout="coo")
    store.put_edge_index(torch.tensor([[0, 1], [3, 1]]), edge_type=("a", "r2", "b"), layout="coo", size=(10, 4))
    return store


@pytest.mark.parametrize("ask", ["in_degree", "expected_draws"])
def test_sums_over_edge_types_refuse_node_counts_that_disagree_naming_the_fix(ask):
    with pytest.raises(ValueError, match=r"disagree on the number of 'a' nodes.*pass size="):
        getattr(_disagreeing_store(), ask)()


def test_sums_over_edge_types_that_agree_add_up():
    store = CSCGraphStore()
    store.put_edge_index(torch.tensor([[0, 1, 2], [3, 1, 0]]), edge_type=("a", "r1", "b"), layout="coo",
                         size=(10, 4))
    store.put_edge_index(torch.tensor([[0, 1], [3, 1]]), edge_type=("a", "r2", "b"), layout="coo", size=(10, 4))
    assert store.in_degree()["b"].tolist() == [1, 2, 0, 2]
    assert store.expected_draws()["a"].shape == (10,)


@pytest.mark.parametrize("argv, named", [
    (["--synthetic", "50", "--name", "ogbn-arxiv"], "--name goes only with --ogb"),
    (["--ogb", "ROOT", "--seed", "3"], "--seed goes only with --synthetic"),
    (["--ogb", "ROOT", "--feat-dim", "8", "--avg-degree", "4"], "--feat-dim, --avg-degree go only with --synthetic"),
])
def test_the_partition_command_refuses_options_of_the_other_graph_source(tmp_path, capsys, argv, named):
    argv = [a if a != "ROOT" else str(tmp_path / "ogb") for a in argv]
    with pytest.raises(SystemExit) as exit_:
        partition_cli.main([str(tmp_path / "parts"), "--parts", "2", "--no-progress", *argv])
    assert exit_.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "parts").exists()


def test_a_partition_folder_gets_the_umask_mode_and_keeps_the_mode_it_replaces(tmp_path):
    old_umask = os.umask(0o022)
    try:
        fresh, shared = tmp_path / "fresh", tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o2775)
        (shared / "old").write_text("old parts")
        partition_cli.main([str(fresh), "--parts", "2", "--synthetic", "60", "--no-progress"])
        partition_cli.main([str(shared), "--parts", "2", "--synthetic", "60", "--no-progress", "--overwrite"])
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o755
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2775 and not (shared / "old").exists()


def test_from_tensors_takes_the_host_options_of_from_data():
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    x, perm = torch.rand(4, 8) + 0.5, torch.tensor([2, 0, 3, 1])
    store, _ = from_tensors(edge_index=edge_index, x=x, y=torch.arange(4), layout=perm, gpu_budget=None,
                            progress=False)
    assert {a.attr_name for a in store.get_all_tensor_attrs()} == {"x", "y"}  # no node attribute "layout"
    table = store.table(None, "x")
    assert torch.equal(table.layout, perm) and torch.equal(table[torch.arange(4)], x)
    packed, _ = from_tensors(edge_index=edge_index, x=x, compress="int8", gpu_budget=None, progress=False)
    assert packed.table(None, "x").host_format is not None
    ids = torch.tensor([3, 0])
    assert np.allclose(packed.table(None, "x")[ids].numpy(), x[ids].numpy(), atol=2 / 127)


def test_partitions_take_a_path_of_any_form_and_refuse_what_is_not_one(tmp_path):
    from hmgstore.distributed import PartitionBook, load_partition, partition

    x = torch.rand(40, 3) + 0.5
    edges = torch.randint(0, 40, (2, 120))
    out = os.fsencode(tmp_path / "parts")  # bytes, as os.listdir(bytes) hands them out
    partition({"x": x}, edges, PartitionBook.range(40, 2), out, progress=False)
    part = load_partition(out, 1, progress=False)
    assert torch.equal(part.features["x"][torch.arange(20)], x[20:])
    book = PartitionBook.range(40, 2)
    book.save(os.fsencode(tmp_path / "book.pt"))
    assert PartitionBook.load(str(tmp_path / "book.pt")) == book
    for call in (lambda: partition({"x": x}, edges, book, 5, progress=False), lambda: load_partition(None, 0),
                 lambda: book.save(["book.pt"])):
        with pytest.raises(TypeError, match=r"as a path \(str, bytes or os.PathLike\), got"):
            call()


def test_the_partition_command_names_an_assignment_file_whose_npy_header_is_damaged(tmp_path, capsys):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros(60, dtype=np.int64))
    path.write_bytes(path.read_bytes().replace(b"(60,)", b" 60,)"))  # numpy's tokenizer error, not a ValueError
    with pytest.raises(SystemExit) as exit_:
        partition_cli.main([str(tmp_path / "o"), "--parts", "2", "--synthetic", "60", "--by", str(path),
                            "--no-progress"])
    assert exit_.value.code == 2 and "a.npy is not an assignment file" in capsys.readouterr().err


@given(rows=st.integers(1, 12), cols=st.integers(1, 6), shape=st.lists(st.integers(0, 24), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64]))
def test_a_stored_host_tier_is_described_by_its_shape_and_dtype_or_refused(rows, cols, shape, dtype):
    """``over_host_tier`` with a ``shape``/``dtype`` that do not describe the host tier (fewer or more rows, rows
    cut or joined, a dtype no 16-bit format reads) is refused with a ValueError saying so, never read as other
    rows; one that does gives the tier's rows."""
    host = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)
    shape, stored = tuple(shape), host.to(dtype)
    read_as = dtype if dtype == torch.int64 else torch.float32  # bfloat16: its 16-bit format; float64: none
    fits = shape == (rows, cols) and dtype != torch.float64
    try:
        table = hmgstore.HybridTensor.over_host_tier(stored, "cpu", read_as, shape=shape)
    except ValueError as err:
        assert not fits and ("host tier" in str(err))
        return
    assert fits and torch.equal(table[torch.arange(rows)], stored.to(read_as))


@given(picks=st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True), square=st.booleans(),
       like_gather=st.booleans())
def test_a_write_takes_what_torch_takes_for_ids_of_any_shape(picks, square, like_gather):
    """``t[ids] = value`` with ids of any shape: a value shaped as ``t[ids]`` is (torch's rule) or one row per id
    lands where torch's ``x[ids] = value`` puts it."""
    x = torch.arange(24.0).reshape(12, 2) + 0.5
    ids = torch.tensor(picks)
    if square and len(picks) % 2 == 0:
        ids = ids.view(2, -1)
    value = -torch.arange(ids.numel() * 2.0).reshape(*ids.shape, 2)
    value = value if like_gather else value.reshape(-1, 2)
    table, want = hmgstore.HybridTensor(x.clone(), "cpu"), x.clone()
    table[ids] = value
    want[ids.reshape(-1)] = value.reshape(-1, 2)
    assert torch.equal(table.dense(), want)


@pytest.mark.parametrize("byte_order", ["<", ">"])
def test_numpy_ids_of_either_byte_order_and_uint8_are_ids_everywhere(byte_order):
    """numpy ids in the other byte order (torch refuses them) and numpy uint8 ids (a torch uint8 tensor is a mask)
    read as ids in a gather, a write and a hot order alike."""
    x = torch.arange(20.0).reshape(10, 2)
    ids = np.array([3, 1, 7], dtype=byte_order + "i8")
    table = hmgstore.HybridTensor(x.clone(), "cpu")
    assert torch.equal(table[ids], x[[3, 1, 7]])
    table[ids] = torch.zeros(3, 2)
    assert table.dense()[[3, 1, 7]].abs().sum() == 0
    for order in (ids, ids.astype(np.uint8)):
        hot = hmgstore.HybridTensor(x, "cpu", gpu_budget=0, hot_order=order)
        assert torch.equal(hot[ids], x[[3, 1, 7]])


def test_a_value_on_the_meta_device_is_refused_as_no_rows():
    table = hmgstore.HybridTensor(torch.zeros(4, 2), "cpu")
    with pytest.raises(TypeError, match="'meta' device holds no numbers"):
        table[[0]] = torch.empty(1, 2, device="meta")
    assert table.dense().abs().sum() == 0
