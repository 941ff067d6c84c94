"""Contracts of hmgstore.distributed and the partition command: each documented refusal, and the parts' records.

Every line of the "Raises:" sections of the module's public names has a
case here (or, for what only several ranks can show, in the tests named
beside it). The calls that need a process group run in this process over
a one-rank gloo group (``group``), made once for the module and torn down
after it, so that the tests before it see no group and the refusals come
before any collective. Ids, orders, counts and machines are generated
(hypothesis, the profile of tests/conftest.py).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
import hmgstore.data as datasets
import hmgstore.distributed as hd
from hmgstore.cli.partition import main as partition_command
from hmgstore.distributed import (
    ClusterTensor,
    DistributedNeighborSampler,
    Partition,
    PartitionBook,
    PeerLostError,
    load_partition,
    part_of,
    partition,
)
from hmgstore.graph.csc import to_csc
from hmgstore.rows import checks

NODES = 60
ROW = 4
GPU_SEEN = torch.cuda.is_available()
no_gpu = pytest.mark.skipif(GPU_SEEN, reason="checks the refusal of a CUDA device where torch sees no GPU")


@pytest.fixture(scope="module")
def g():
    return datasets.synthetic(NODES, 4, ROW, seed=5)


def outside(n: int):
    """Ids that are not in ``[0, n)``: negative or at least ``n``."""
    return st.one_of(st.integers(-(2**62), -1), st.integers(n, 2**62))


# ---- the shared checker added for timeouts ----------------------------------------------------------------
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**6)))
def test_seconds_accepts_finite_numbers_at_least_zero(value):
    if math.isfinite(value) and value >= 0:
        assert checks.seconds(value, "t") == float(value)
    else:
        with pytest.raises(ValueError, match="t must be a finite number of seconds >= 0"):
            checks.seconds(value, "t")


def test_seconds_refuses_other_kinds_by_name():
    import datetime

    for value in (True, "5", datetime.timedelta(seconds=3), torch.tensor(1.0), None):
        with pytest.raises(TypeError, match=r"^t takes a number of seconds"):
            checks.seconds(value, "t")
    assert checks.seconds(None, "t", allow_none=True) is None
    assert checks.seconds(np.float32(2.5), "t") == 2.5


# ---- without a process group (these run before the module's group is made) -------------------------------
def test_without_a_process_group_every_collective_entry_point_says_to_make_one(g):
    assert not dist.is_initialized()
    part = part_of({"x": g.x}, g.edge_index, PartitionBook.range(NODES, 1), 0, "cpu", progress=False)
    calls = [hd.this_node, hd.this_cluster,
             lambda: hd.shard(g.x, gpu_budget=0, hot_order=torch.arange(NODES), device="cpu", progress=False),
             lambda: ClusterTensor(part.features["x"], part.book),
             lambda: DistributedNeighborSampler(part, [2])]
    for call in calls:
        with pytest.raises(RuntimeError, match="init_process_group"):
            call()
    part.close()


# ---- a one-rank group ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def group():
    from hmgstore.distributed import cluster, node, watch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield hd.this_node()
    finally:
        if node._node is not None:  # the peer watch's thread, and the state of this group, go with it
            watch.stop(node._node)
        node._node, cluster._cluster = None, None
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def table(group, g):
    t = hd.shard(g.x, gpu_budget=0, hot_order=torch.arange(NODES), device="cpu", progress=False)
    yield t
    t.close()


# ---- shard ------------------------------------------------------------------------------------------------
def shard(x, **kwargs):
    return hd.shard(x, **{"gpu_budget": 0, "hot_order": torch.arange(len(x)), "device": "cpu", "progress": False,
                          **kwargs})


def test_shard_type_errors(group, g):
    for source in (g.x.tolist(), "x", g.x.to_sparse()):
        with pytest.raises(TypeError, match="source table|cannot build a table"):
            shard(source)
    with pytest.raises(TypeError, match="hot_order.*float"):
        shard(g.x, hot_order=torch.arange(NODES, dtype=torch.float32))
    with pytest.raises(TypeError, match="hot_order.*bool"):
        shard(g.x, hot_order=torch.ones(NODES, dtype=torch.bool))
    for timeout in ("30", True, [1]):
        with pytest.raises(TypeError, match="peer_exit_timeout takes a number of seconds or None"):
            shard(g.x, peer_exit_timeout=timeout)


def test_shard_value_errors(group, g):
    cases = [({"gpu_budget": None}, "needs gpu_budget"), ({"hot_order": None}, "needs hot_order"),
             ({"gpu_budget": "lots"}, "cannot read 'lots' as a size"), ({"replicate": "2 apples"}, "cannot read"),
             ({"gpu_budget": 100, "replicate": 200}, "replicate .* must fit in gpu_budget"),
             ({"hot_order": [3, 1, 3]}, "lists row 3 more than once"),
             ({"compress": "zip"}, "unknown stored row format 'zip'"),
             ({"device": "meta"}, "'cpu' or 'cuda' devices")]
    cases += [({"max_sms": bad}, "max_sms is a number of SMs") for bad in (0, -1, 2.5, True, "abc")]
    cases += [({"peer_exit_timeout": bad}, "peer_exit_timeout must be a finite") for bad in (-1, math.inf, math.nan)]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            shard(g.x, **kwargs)
    with pytest.raises(ValueError, match="compress='int8' encodes float32 rows; this table is torch.int64"):
        shard(g.y.view(-1, 1).long(), compress="int8")
    # Ranks that disagree: tests/test_distributed.py::test_ranks_that_disagree_are_told_which (two ranks).


def test_shard_refuses_more_than_eight_ranks_a_node(group, g, monkeypatch):
    shard_module = sys.modules["hmgstore.distributed.shard"]  # the package's name "shard" is the function
    crowded = dataclasses.replace(group, ranks=list(range(9)))  # a node of nine ranks, as this_node would say
    monkeypatch.setattr(shard_module, "this_node", lambda: crowded)
    with pytest.raises(ValueError, match="1 to 8 GPUs, not 9"):
        shard(g.x)


@given(hot=st.lists(outside(NODES), min_size=1, max_size=3))
def test_shard_refuses_hot_order_ids_out_of_range(group, g, hot):
    with pytest.raises(IndexError, match=f"hot_order.*{hot[0]}"):
        shard(g.x, hot_order=hot)


@no_gpu
def test_shard_refuses_a_cuda_device_without_a_gpu(group, g):
    with pytest.raises(RuntimeError, match="cuda|CUDA|GPU"):
        hd.shard(g.x, gpu_budget=0, hot_order=torch.arange(NODES), device="cuda", progress=False)


# ---- DistributedTensor ------------------------------------------------------------------------------------
@given(ids=st.lists(st.integers(-3, NODES + 3), max_size=8))
def test_distributed_tensor_gathers_ids_in_range_and_refuses_others(table, g, ids):
    if all(0 <= i < NODES for i in ids):
        assert torch.equal(table[ids], g.x[torch.tensor(ids, dtype=torch.int64)].view(len(ids), ROW))
    else:
        bad = next(i for i in ids if not 0 <= i < NODES)
        with pytest.raises(IndexError, match=str(bad)):
            table.gather(torch.tensor(ids))


def test_distributed_tensor_type_errors_and_close(group, g, table):
    with pytest.raises(TypeError):
        table[torch.tensor([1.0, 2.0])]
    with pytest.raises(TypeError, match="rows only"):
        table[3, 1]
    t = shard(g.x)
    for bad, error in (("5", TypeError), (None, TypeError), (-1, ValueError), (math.inf, ValueError)):
        with pytest.raises(error, match="timeout"):
            t.close(bad)
    assert torch.equal(t[[1]], g.x[[1]])  # a refused close frees nothing
    t.close(5)
    with pytest.raises(RuntimeError, match="closed"):
        t[[1]]


def test_distributed_tensor_raises_peer_lost_once_a_peer_died(group, table):
    group.lost = "rank 7 (pid 1) on this node exited without closing its hmgstore tables"
    try:
        with pytest.raises(PeerLostError, match="rank 7"):
            table.check()
        with pytest.raises(PeerLostError, match="rank 7"):
            table[[0]]
    finally:
        group.lost = None
    assert issubclass(PeerLostError, RuntimeError)


# ---- sharded_topology -------------------------------------------------------------------------------------
def test_sharded_topology_contract(group, g):
    csc = to_csc(g.edge_index, "coo", size=(NODES, NODES))
    with pytest.raises(TypeError, match="sharded_topology takes a hmgstore.graph.CSC"):
        hd.sharded_topology(g.edge_index, "cpu", gpu_budget=0)
    with pytest.raises(TypeError, match="hot_order.*float"):
        hd.sharded_topology(csc, "cpu", gpu_budget=0, hot_order=torch.arange(NODES) * 1.0)
    for kwargs in ({"gpu_budget": "lots"}, {"gpu_budget": -1}, {"gpu_budget": True}, {"replicate": -5},
                   {"replicate": "many"}, {"replicate": True}):
        with pytest.raises(ValueError, match="size|byte count"):
            hd.sharded_topology(csc, "cpu", **{"gpu_budget": 0, **kwargs})
    for order, message in (([2, 2], "more than once"), ([[0, 1]], "1-D")):
        with pytest.raises(ValueError, match=message):
            hd.sharded_topology(csc, "cpu", gpu_budget=0, hot_order=order)
    with pytest.raises(ValueError, match="weight"):
        hd.sharded_topology(csc, "cpu", gpu_budget=0, weight=torch.ones(3))
    with pytest.raises(IndexError, match=str(NODES)):
        hd.sharded_topology(csc, "cpu", gpu_budget=0, hot_order=[0, NODES])
    if not GPU_SEEN:
        with pytest.raises(RuntimeError, match="cuda|CUDA|GPU"):
            hd.sharded_topology(csc, "cuda", gpu_budget=0)
    hd.sharded_topology(csc, "cpu", gpu_budget="1MB", replicate="1KB").close()


# ---- Partition, part_of ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def part(g):
    p = part_of({"x": g.x}, g.edge_index, PartitionBook.range(NODES, 1), 0, "cpu", progress=False)
    yield p
    p.close()


def test_partition_made_by_hand_is_checked(part):
    good = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}
    assert Partition(**good).machine == 0
    colptr, row = part.colptr, part.row
    type_cases = [{"machine": 0.0}, {"machine": True}, {"book": "range"}, {"features": [part.features["x"]]},
                  {"features": {"x": torch.zeros(NODES, ROW)}}, {"colptr": colptr.int()}, {"row": row.tolist()},
                  {"row": row.float()}]
    for change in type_cases:
        with pytest.raises(TypeError, match="machine|book|features|colptr|row"):
            Partition(**{**good, **change})
    other = hmgstore.HybridTensor(torch.zeros(NODES - 1, ROW), "cpu")
    value_cases = [({"machine": -1}, "machine must be at least 0"), ({"machine": 1}, "machine 1 is not one of"),
                   ({"features": {"x": other}}, "has 59 rows; part 0 has 60"),
                   ({"colptr": colptr.view(1, -1)}, "colptr is 1-D"), ({"row": row.view(1, -1)}, "row is 1-D"),
                   ({"colptr": colptr[:-1]}, "one offset per node"), ({"row": row[:-1]}, "to len\\(row\\)"),
                   ({"colptr": colptr + 1}, "from 0")]
    for change, message in value_cases:
        with pytest.raises(ValueError, match=message):
            Partition(**{**good, **change})


@given(machine=st.one_of(st.integers(-5, 8), st.floats(-2, 5), st.booleans()))
def test_part_of_takes_a_machine_of_the_book(g, machine):
    book = PartitionBook.range(NODES, 3)
    if isinstance(machine, (bool, float)):
        with pytest.raises(TypeError, match="machine takes an integer"):
            part_of({"x": g.x}, g.edge_index, book, machine, "cpu", progress=False)
    elif not 0 <= machine < 3:
        with pytest.raises(ValueError, match="machine"):
            part_of({"x": g.x}, g.edge_index, book, machine, "cpu", progress=False)
    else:
        p = part_of({"x": g.x}, g.edge_index, book, machine, "cpu", progress=False)
        assert p.machine == machine and p.features["x"].num_rows == book.sizes[machine]
        p.close()


def test_part_of_other_refusals(g):
    book = PartitionBook.range(NODES, 2)
    with pytest.raises(TypeError, match="book must be a PartitionBook"):
        part_of({"x": g.x}, g.edge_index, "range", 0)
    with pytest.raises(ValueError, match="rows for a book"):
        part_of({"x": g.x[:5]}, g.edge_index, book, 0)
    with pytest.raises(ValueError, match="more than once"):
        part_of({"x": g.x}, g.edge_index, book, 0, "cpu", gpu_budget=10**6, hot_order=[1, 1], progress=False)
    with pytest.raises(IndexError, match=str(NODES + 1)):
        part_of({"x": g.x}, torch.tensor([[0, NODES + 1], [1, 2]]), book, 0)


# ---- partition: books, splits, and the command -------------------------------------------------------------
@given(ids=st.lists(st.one_of(st.integers(-(2**40), 2**40), st.floats(0, NODES)), max_size=5))
def test_partition_split_ids_are_node_ids_of_the_book(g, tmp_path_factory, ids):
    out = tmp_path_factory.mktemp("split") / "p"
    args = ({"x": g.x}, g.edge_index, PartitionBook.range(NODES, 2), out)
    if any(isinstance(i, float) for i in ids):
        with pytest.raises(TypeError, match="split 'train'.*non-integers"):
            partition(*args, split={"train": ids}, progress=False)
        with pytest.raises(TypeError, match="split 'train'.*float"):
            partition(*args, split={"train": torch.tensor(ids, dtype=torch.float64)}, progress=False)
    elif all(0 <= i < NODES for i in ids):
        partition(*args, split={"train": np.array(ids, dtype=np.int64)}, progress=False)
        assert np.load(out / "split" / "train.npy").tolist() == ids
        return
    else:
        bad = next(i for i in ids if not 0 <= i < NODES)
        with pytest.raises(IndexError, match=f"split 'train'.*{bad}"):
            partition(*args, split={"train": torch.tensor(ids)}, progress=False)
    assert not out.exists()


def test_partition_refusals_leave_the_folder_as_it_was(g, tmp_path):
    book = PartitionBook.range(NODES, 2)
    cases = [(TypeError, "book must be a PartitionBook", {"book": "range"}),
             (TypeError, "split is a dict", {"split": [1, 2]}),
             (ValueError, "split names become file names", {"split": {"a b": [1]}}),
             (ValueError, "must be 1-D", {"split": {"train": [[1, 2]]}}),
             (ValueError, "attribute names become file names", {"features": {"x-1": g.x}}),
             (ValueError, "attribute names become file names", {"features": {5: g.x}}),
             (ValueError, "bfloat16", {"features": {"x": g.x.bfloat16()}}),
             (TypeError, "attribute 'x'.*uint32", {"features": {"x": g.x.numpy().astype(np.uint32)}}),
             (TypeError, "overwrite is True or False", {"overwrite": "no"}),
             (TypeError, "progress is True or False", {"progress": "no"}),
             (ValueError, "rows for a book", {"features": {"x": g.x[:10]}}),
             (ValueError, "destination nodes, the book", {"edge_index": to_csc(g.edge_index, "coo",
                                                                                 size=(NODES + 1, NODES + 1))}),
             (IndexError, f"index {NODES}", {"edge_index": torch.tensor([[0, NODES]], dtype=torch.int64).T})]
    for error, message, change in cases:
        args = {"features": {"x": g.x}, "edge_index": g.edge_index, "book": book, "out_dir": tmp_path / "p",
                "progress": False, **change}
        with pytest.raises(error, match=message):
            partition(**args)
        assert not (tmp_path / "p").exists()
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "keep").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        partition({"x": g.x}, g.edge_index, book, tmp_path / "p", progress=False)
    assert (tmp_path / "p" / "keep").read_text() == "mine"


def test_partition_of_a_csc_with_int32_ids_loads_as_the_same_edges(g, tmp_path):
    """A CSC may hold its sources as int32: the parts hold them as load_partition reads them (int64), same edges."""
    csc = to_csc(g.edge_index, "coo", size=(NODES, NODES))
    narrow = dataclasses.replace(csc, row=csc.row.int()) if dataclasses.is_dataclass(csc) else csc
    assert narrow.row.dtype == torch.int32
    book = PartitionBook.range(NODES, 2)
    partition({"x": g.x}, narrow, book, tmp_path / "p", progress=False)
    edges = set()
    for m in range(2):
        part = load_partition(tmp_path / "p", m, "cpu", progress=False)
        dst = book.nodes_of(m).repeat_interleave(part.colptr.diff())
        edges |= set(zip(part.row.tolist(), dst.tolist()))
        part.close()
    assert edges == set(zip(*g.edge_index.tolist()))


def command(out: Path, *args: str) -> None:
    partition_command([str(out), "--no-progress", *args])


def test_overwrite_never_deletes_the_current_folder_or_the_runs_inputs(tmp_path, monkeypatch, capsys):
    """--overwrite replaces OUT_DIR, but not an empty or '.' OUT_DIR (an unset variable), a folder the command
    runs in, nor one that holds its --by file: refused before anything is written, every file kept."""
    work = tmp_path / "work"
    (work / "parts").mkdir(parents=True)
    (work / "mine.py").write_text("precious")
    np.save(work / "parts" / "assign.npy", np.arange(100) % 2)
    monkeypatch.chdir(work)
    for out, extra, message in (("", [], "OUT_DIR is empty or '.'"), (".", [], "OUT_DIR is empty or '.'"),
                                (str(tmp_path), [], "holds the folder this process runs in"),
                                ("parts", ["--by", "parts/assign.npy"], "holds parts/assign.npy, which this run")):
        with pytest.raises(SystemExit) as exit_:
            partition_command([out, "--no-progress", "--parts", "2", "--synthetic", "100", "--overwrite", *extra])
        assert exit_.value.code == 2 and message in capsys.readouterr().err, out
    assert (work / "mine.py").read_text() == "precious" and (work / "parts" / "assign.npy").is_file()
    g = datasets.synthetic(100, 4, 4, seed=0)
    with pytest.raises(FileExistsError, match="holds the folder this process runs in"):
        partition({"x": g.x}, g.edge_index, PartitionBook.range(100, 2), tmp_path, overwrite=True, progress=False)
    assert (work / "mine.py").read_text() == "precious"


def test_partition_command_refuses_counts_and_splits_that_do_not_fit(tmp_path, monkeypatch, capsys):
    for args, message in ((["--parts", "0", "--synthetic", "100"], "--parts 0 --by range: num_machines must be"),
                          (["--parts", "2", "--by", "hash", "--synthetic", "1"], "--synthetic: must be at least 16"),
                          (["--parts", "2", "--synthetic", "100", "--seed", "-1"], "--seed: must be a whole number"),
                          (["--parts", "2", "--synthetic", "100", "--feat-dim", "0"], "--feat-dim 0"),
                          (["--parts", "2", "--by", "Hash", "--synthetic", "100"], "--by Hash: no such assignment"),
                          (["--parts", "2", "--by", str(tmp_path / "none.npy"), "--synthetic", "100"],
                           "no such assignment file")):
        with pytest.raises(SystemExit) as exit_:
            command(tmp_path / "p", *args)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, args
        assert not (tmp_path / "p").exists()
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(SystemExit) as exit_:
        command(tmp_path / "a-file", "--parts", "2", "--synthetic", "100")
    assert exit_.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        command(tmp_path / "a-file" / "parts", "--parts", "2", "--synthetic", "100")
    assert exit_.value.code == 2 and "a-file is a file, so no folder can be made under it" in capsys.readouterr().err
    import hmgstore.cli.partition as cli

    real = cli.synthetic
    for bad, message in ((torch.tensor([3, 100]), "split 'train'.*index 100"), (torch.tensor([-1]), "index -1"),
                         (torch.tensor([1.0]), "split 'train' holds torch.float32")):
        def shifted(*a, bad=bad, **k):  # a dataset whose split names nodes it does not have
            graph = real(*a, **k)
            graph.train_idx = bad
            return graph

        monkeypatch.setattr(cli, "synthetic", shifted)
        with pytest.raises(SystemExit) as exit_:
            command(tmp_path / "p", "--parts", "2", "--synthetic", "100", "--feat-dim", "4")
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "the synthetic graph: " in err, err
        assert re.search(message, err), err
        assert not (tmp_path / "p").exists()


# ---- PartitionBook ------------------------------------------------------------------------------------------
@given(nodes=st.one_of(st.integers(-3, 50), st.floats(0, 9), st.booleans()),
       machines=st.one_of(st.integers(-2, 4), st.floats(0, 3), st.booleans()))
def test_book_counts(nodes, machines):
    kind = [isinstance(v, (bool, float)) for v in (nodes, machines)]
    for make in (PartitionBook.range, PartitionBook.hash):
        if any(kind) and ((not kind[0] and nodes < 0) or (not kind[1] and machines < 1)):
            with pytest.raises((TypeError, ValueError), match="takes an integer|must be at least"):  # either first
                make(nodes, machines)
        elif any(kind):
            with pytest.raises(TypeError, match="takes an integer"):
                make(nodes, machines)
        elif nodes < 0 or machines < 1:
            with pytest.raises(ValueError, match="num_nodes must be at least 0|num_machines must be at least 1"):
                make(nodes, machines)
        else:
            book = make(nodes, machines)
            assert sum(book.sizes) == nodes
            with pytest.raises(ValueError, match=f"machine {machines} is outside"):
                book.nodes_of(machines)
            with pytest.raises(TypeError, match="machine takes an integer"):
                book.nodes_of(0.0)
            with pytest.raises(IndexError, match=str(nodes)):
                book.owner(torch.tensor([nodes]))
            with pytest.raises(TypeError, match="integers"):
                book.local(torch.tensor([0.5]))
    # The assignment's errors and load's: tests/test_cluster.py::test_book_errors, test_books_save_load_and_signatures.


# ---- load_partition: the parts' records ---------------------------------------------------------------------
@pytest.fixture
def parts(tmp_path) -> Path:
    """A small synthetic graph cut into two equal parts by the command."""
    command(tmp_path / "parts", "--parts", "2", "--synthetic", "400", "--feat-dim", "8")
    return tmp_path / "parts"


def refused(parts: Path, machine: int, path: Path) -> str:
    with pytest.raises(ValueError) as err:
        load_partition(parts, machine, "cpu", progress=False)
    message = str(err.value)
    assert str(path) in message and "--overwrite" in message, message
    return message


def test_partition_records_each_file_and_load_partition_checks_it(parts):
    meta = json.loads((parts / "part0" / "meta.json").read_text())
    assert set(meta["files"]) == {"features/x.npy", "features/y.npy", "colptr.npy", "row.npy", "book.pt"}
    for name, record in meta["files"].items():
        assert record["size"] == (parts / "part0" / name).stat().st_size
    load_partition(parts, 0, "cpu", progress=False).close()


@pytest.mark.parametrize("name", ["features/x.npy", "features/y.npy", "row.npy", "colptr.npy", "book.pt"])
def test_a_truncated_part_file_is_refused_by_name(parts, name):
    path = parts / "part0" / name
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    assert "bytes" in refused(parts, 0, path)
    path.write_bytes(data[: len(data) // 2])
    refused(parts, 0, path)


@pytest.mark.parametrize("name", ["features/x.npy", "row.npy", "book.pt"])
def test_a_byte_flipped_in_a_sampled_page_is_refused_by_name(parts, name):
    from hmgstore.rows.file_identity import PAGE_BYTES

    path = parts / "part0" / name
    data = bytearray(path.read_bytes())
    for offset in (len(data) - 1, min(len(data) - 1, 200), max(0, len(data) - PAGE_BYTES)):  # in the sampled pages
        data[offset] ^= 0xFF
        path.write_bytes(bytes(data))
        assert "CRC-32" in refused(parts, 0, path)
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    load_partition(parts, 0, "cpu", progress=False).close()


def test_a_file_replaced_by_another_parts_file_of_the_same_size_is_refused(parts):
    for name in ("features/x.npy", "row.npy", "colptr.npy"):
        mine, theirs = parts / "part0" / name, parts / "part1" / name
        if mine.stat().st_size != theirs.stat().st_size:
            continue  # row.npy: the parts' edge counts differ
        kept = mine.read_bytes()
        mine.write_bytes(theirs.read_bytes())
        assert "CRC-32" in refused(parts, 0, mine)
        mine.write_bytes(kept)
    x0, x1 = parts / "part0" / "features" / "x.npy", parts / "part1" / "features" / "x.npy"
    assert x0.stat().st_size == x1.stat().st_size  # so the same-size replacement above was exercised


def test_parts_without_records_load_with_a_warning_and_damaged_records_are_refused(parts):
    meta_path = parts / "part1" / "meta.json"
    meta = {k: v for k, v in json.loads(meta_path.read_text()).items() if k not in ("run", "seal")}
    (parts / "partition.json").unlink()  # parts from before runs and seals, whose meta.json may lack records
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "files"}))
    with pytest.warns(UserWarning, match=r"meta\.json records no size and checksum.*--overwrite"):
        load_partition(parts, 1, "cpu", progress=False).close()
    meta_path.write_text(json.dumps({**meta, "files": {k: v for k, v in meta["files"].items() if k != "row.npy"}}))
    with pytest.raises(ValueError, match=r"records no size and checksum for row\.npy"):
        load_partition(parts, 1, "cpu", progress=False)
    meta_path.write_text(json.dumps({**meta, "files": {"row.npy": {"size": -1, "crc32": 0}}}))
    with pytest.raises(ValueError, match=r"meta\.json does not hold what partition\(\) writes"):
        load_partition(parts, 1, "cpu", progress=False)


@given(machine=st.one_of(st.integers(-3, 4), st.floats(0, 2), st.booleans()))
def test_load_partition_takes_a_machine_number(tmp_path_factory, machine):
    out = tmp_path_factory.getbasetemp() / "load_machine"
    if not out.exists():
        command(out, "--parts", "2", "--synthetic", "100", "--feat-dim", "4")
    if isinstance(machine, (bool, float)):
        with pytest.raises(TypeError, match="machine takes an integer"):
            load_partition(out, machine, "cpu", progress=False)
    elif machine < 0:
        with pytest.raises(ValueError, match="machine must be at least 0"):
            load_partition(out, machine, "cpu", progress=False)
    elif machine >= 2:
        with pytest.raises(FileNotFoundError, match=f"no part {machine}"):
            load_partition(out, machine, "cpu", progress=False)
    else:
        load_partition(out, machine, "cpu", progress=False).close()


# ---- ClusterTensor, Cluster ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster_table(group, part):
    t = ClusterTensor(part.features["x"], part.book)
    yield t
    t.close()


def test_cluster_tensor_construction_refusals(group, g, part, table):
    with pytest.raises(TypeError, match="local must be a HybridTensor or a DistributedTensor"):
        ClusterTensor(g.x, part.book)
    with pytest.raises(TypeError, match="book must be a PartitionBook"):
        ClusterTensor(part.features["x"], "range")
    short = hmgstore.HybridTensor(g.x[:10], "cpu")
    with pytest.raises(ValueError, match="rank 0 \\(machine 0\\) holds 10 local rows, its partition has 60"):
        ClusterTensor(short, part.book)
    with pytest.raises(ValueError, match="spreads the nodes over 2 machines, the job runs on 1"):
        ClusterTensor(table, PartitionBook.range(NODES, 2))
    ClusterTensor(table, part.book).close()  # a DistributedTensor is a local table too
    # Ranks that disagree: tests/test_cluster.py::test_ranks_that_disagree_or_stall_are_told_which.


@given(ids=st.lists(st.integers(-3, NODES + 3), max_size=8))
def test_cluster_tensor_gathers_ids_in_range_and_refuses_others(cluster_table, g, ids):
    if all(0 <= i < NODES for i in ids):
        assert torch.equal(cluster_table[ids], g.x[torch.tensor(ids, dtype=torch.int64)].view(len(ids), ROW))
    else:
        bad = next(i for i in ids if not 0 <= i < NODES)
        with pytest.raises(IndexError, match=str(bad)):
            cluster_table.gather(ids)


def test_cluster_tensor_type_errors_closed_and_lost(group, part, cluster_table):
    with pytest.raises(TypeError):
        cluster_table.gather(torch.tensor([0.5]))
    with pytest.raises(TypeError, match="rows only"):
        cluster_table[1, 2]
    t = ClusterTensor(part.features["x"], part.book)
    t.close()
    with pytest.raises(RuntimeError, match="closed ClusterTensor"):
        t.gather([0])
    cluster = hd.this_cluster()
    with pytest.raises(ValueError, match="'gloo' or 'nccl', got 'mpi'"):
        cluster.exchange("mpi")
    cluster.broken = "an exchange failed in this test"
    try:
        with pytest.raises(PeerLostError, match="an exchange failed in this test"):
            cluster_table.gather([0])
        with pytest.raises(PeerLostError):
            cluster.check()
    finally:
        cluster.broken = None
    assert torch.equal(cluster_table[[2]], part.features["x"][[2]])


# ---- DistributedNeighborSampler -----------------------------------------------------------------------------
class OnGpu(torch.Generator):
    """A generator that says it lives on a GPU, which this machine may not have."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_sampler_construction_refusals(group, g, part):
    csc = to_csc(g.edge_index, "coo", size=(NODES, NODES))
    type_cases = [((g.edge_index, [2]), {}, "topology is a Partition"), ((part, "15"), {}, "num_neighbors"),
                  ((part, [1.5]), {}, r"num_neighbors\[0\]"), ((part, [2]), {"replace": 1}, "replace is True or False"),
                  ((part, [2]), {"generator": 7}, "generator is a torch.Generator")]
    for args, kwargs, message in type_cases:
        with pytest.raises(TypeError, match=message):
            DistributedNeighborSampler(*args, **kwargs)
    value_cases = [((part, [-2]), {}, "0 or more"), ((part, [2]), {"generator": OnGpu()}, "CPU torch.Generator"),
                   ((part, [2]), {"gpu_budget": "1GB"}, "gpu_budget applies only.*partitioned on cpu"),
                   ((csc, [2]), {"gpu_budget": 10}, "gpu_budget applies only.*replicated"),
                   ((part, [2]), {"gpu_budget": "lots"}, "cannot read 'lots'"),
                   ((part, [2]), {"device": "meta"}, "'cpu' or 'cuda' devices")]
    for args, kwargs, message in value_cases:
        with pytest.raises(ValueError, match=message):
            DistributedNeighborSampler(*args, **kwargs)
    hand = Partition(part.machine, part.book, {}, part.colptr, part.row.clone())
    hand.row[0] = NODES + 5  # changed after it was made: the sampler checks the sources
    with pytest.raises(ValueError, match="names a neighbour outside the book"):
        DistributedNeighborSampler(hand, [2])
    # Ranks that disagree: tests/test_cluster.py::test_samplers_that_disagree_and_sampling_beside_a_gather_are_told.


@pytest.fixture(scope="module")
def samplers(group, g, part):
    csc = to_csc(g.edge_index, "coo", size=(NODES, NODES))
    both = [DistributedNeighborSampler(part, [3, 2], generator=torch.Generator().manual_seed(1)),
            DistributedNeighborSampler(csc, [3, 2], generator=torch.Generator().manual_seed(1))]
    yield both
    for s in both:
        s.close()


@given(seeds=st.lists(st.integers(-3, NODES + 3), max_size=6))
def test_sampling_takes_node_ids(samplers, seeds):
    for sampler in samplers:
        if all(0 <= s < NODES for s in seeds):
            out = sampler.sample(torch.tensor(seeds, dtype=torch.int64))
            assert out.node[None][:len(seeds)].tolist() == seeds or len(set(seeds)) < len(seeds)
        else:
            bad = next(s for s in seeds if not 0 <= s < NODES)
            with pytest.raises(IndexError, match=str(bad)):
                sampler.sample(torch.tensor(seeds))


def test_sampling_refuses_float_seeds_and_lost_counterparts(samplers):
    for sampler in samplers:
        for seeds in (torch.tensor([1.0, 2.0]), [0.5], np.array([2.0])):
            with pytest.raises(TypeError):
                sampler.sample(seeds)
    cluster = hd.this_cluster()
    cluster.broken = "an exchange failed in this test"
    try:
        with pytest.raises(PeerLostError, match="an exchange failed in this test"):
            samplers[0].sample([1])
    finally:
        cluster.broken = None


def test_a_writer_stopped_by_sigterm_leaves_no_half_written_folder_and_a_killed_ones_is_swept(tmp_path):
    """SIGTERM (timeout, Slurm) while the parts are written: the hidden folder goes and OUT_DIR stays as it was. A
    writer killed outright leaves its folder, named with its host and pid: the next run on that host removes it,
    and leaves other names (an exchange's '-old' folder, another host's writer) alone."""
    import socket
    import subprocess

    script = ("import os, signal, sys, threading, time\n"
              "from hmgstore.distributed.replace import new_folder\n"
              "threading.Thread(target=time.sleep, args=(90,)).start()  # a thread SystemExit would wait for\n"
              "with new_folder(sys.argv[1]) as new:\n"
              "    (new / 'half').write_text('x')\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], timeout=60)
    assert done.returncode == -15  # ended by the signal itself, after the cleanup
    assert not list(tmp_path.iterdir())  # neither OUT_DIR nor a hidden folder
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = [tmp_path / f".out.partial-{socket.gethostname()}-{int(dead.stdout)}-0a1b2c3d",
            tmp_path / ".out.partial-elsewhere-1-0a1b2c3d", tmp_path / ".out.partial-abc-old"]
    for folder in left:
        folder.mkdir()
    g = datasets.synthetic(100, 4, 4, seed=0)
    partition({"x": g.x}, g.edge_index, PartitionBook.range(100, 2), tmp_path / "out", progress=False)
    assert not left[0].exists() and left[1].exists() and left[2].exists()
