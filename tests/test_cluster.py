"""Graphs partitioned over several machines: books, parts on disk, and ClusterTensor gathers.

Books and parts are tested in this process. Gathers start real ranks
(tests/cluster_worker.py) with tests/test_distributed.py's ``launch``: two
simulated machines of two ranks each on this host (``HMGSTORE_NODE_ID``),
over gloo on the CPU;
the ``multigpu`` tests run one machine per GPU over NCCL.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import test_distributed
import torch
from cluster_worker import NODES, graph

import hmgstore
from hmgstore.cli.partition import main as partition_command
from hmgstore.distributed import PartitionBook, load_partition, part_of, partition
from hmgstore.distributed.cluster import group_machines
from hmgstore.distributed.partition_book import hash_ids
from hmgstore.graph import ptr2index
from hmgstore.graph.csc import CSC, to_csc

WORKER = Path(__file__).with_name("cluster_worker.py")


def launch(scenario: str, world: int, tmp_path: Path, **kwargs):
    """test_distributed's launch, running cluster_worker.py."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(test_distributed, "WORKER", WORKER)
        return test_distributed.launch(scenario, world, tmp_path, **kwargs)


def two_machines(rank: int) -> int:
    return rank % 2


def crossed_machines(rank: int) -> int:
    """Machine 0 is ranks 0 and 3, machine 1 ranks 1 and 2: the counterparts of local rank 1 (ranks 3 and 2)
    sit in their group in the other order than their machines."""
    return 0 if rank in (0, 3) else 1


# ---- books ------------------------------------------------------------------------------------------------
def books(num_nodes: int, machines: int) -> list[PartitionBook]:
    g = torch.Generator().manual_seed(4)
    return [PartitionBook.range(num_nodes, machines), PartitionBook.hash(num_nodes, machines),
            PartitionBook.from_assignment(torch.randint(0, machines, (num_nodes,), generator=g), machines)]


@pytest.mark.parametrize("num_nodes,machines", [(1000, 3), (7, 4), (2, 5), (0, 2), (10, 1)])
def test_books_map_every_node_to_one_row_of_one_machine(num_nodes, machines):
    for book in books(num_nodes, machines):
        ids = torch.arange(num_nodes)
        owner, local = book.owner(ids), book.local(ids)
        assert local.dtype == torch.int64 and owner.shape == ids.shape
        assert sum(book.sizes) == num_nodes and len(book.sizes) == machines
        for m in range(machines):
            nodes = book.nodes_of(m)
            assert nodes.dtype == torch.int64 and len(nodes) == book.sizes[m]
            assert torch.equal(nodes, ids[owner == m])  # increasing global ids
            assert torch.equal(local[nodes], torch.arange(len(nodes)))
        shuffled = torch.randperm(num_nodes)
        assert torch.equal(book.owner(shuffled), owner[shuffled]) and torch.equal(book.local(shuffled), local[shuffled])


def test_range_book_is_contiguous_and_near_equal():
    book = PartitionBook.range(10, 3)
    assert book.sizes == (3, 3, 4)
    assert book.owner(torch.arange(10)).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert book.nodes_of(2).tolist() == [6, 7, 8, 9]


def reference_hash(v: int) -> int:
    """hash_ids in plain Python integers: what every process, device and release must compute."""
    m = 0xFFFFFFFF
    x = (v ^ (v >> 32)) & m
    x = (((x >> 16) ^ x) * 0x45D9F3B) & m
    x = (((x >> 16) ^ x) * 0x45D9F3B) & m
    return (x >> 16) ^ x


def test_hash_book_is_fixed_and_spreads_evenly():
    ids = torch.cat([torch.arange(50), torch.randint(0, 2**62, (200,)), torch.tensor([2**63 - 1])])
    assert hash_ids(ids).tolist() == [reference_hash(v) for v in ids.tolist()]
    book = PartitionBook.hash(100_000, 8)
    assert torch.equal(book.owner(ids[:50]), torch.tensor([reference_hash(v) % 8 for v in range(50)]))
    assert max(book.sizes) - min(book.sizes) < 0.05 * 100_000 / 8


def test_assignment_book_stores_compact_tensors():
    book = PartitionBook.from_assignment(np.array([2, 0, 0, 1, 2, 2]))
    assert book.num_machines == 3 and book.sizes == (2, 1, 3)
    assert book.local(torch.arange(6)).tolist() == [0, 0, 1, 0, 1, 2]
    assert book._host["assignment"].dtype == torch.int16 and book._host["local"].dtype == torch.int32


def test_book_errors():
    with pytest.raises(ValueError, match="node 2 is assigned to machine 5"):
        PartitionBook.from_assignment([0, 1, 5, 1], num_machines=2)
    with pytest.raises(ValueError, match="node 1 is assigned to machine -1"):
        PartitionBook.from_assignment([0, -1])
    with pytest.raises(ValueError, match="4 entries for a graph of 5 nodes"):
        PartitionBook.from_assignment([0, 1, 1, 0], num_nodes=5)
    with pytest.raises(TypeError, match="integer"):
        PartitionBook.from_assignment([0.0, 1.0])
    with pytest.raises(ValueError, match="1-D"):
        PartitionBook.from_assignment([[0, 1]])
    with pytest.raises(ValueError, match="num_machines"):
        PartitionBook.range(10, 0)
    book = PartitionBook.hash(10, 2)
    with pytest.raises(IndexError, match="index 10 at position 1"):
        book.owner(torch.tensor([3, 10]))
    with pytest.raises(IndexError, match="-1"):
        book.local(torch.tensor([-1]))
    with pytest.raises(ValueError, match="machine 2"):
        book.nodes_of(2)


def test_books_save_load_and_signatures(tmp_path):
    for book in books(500, 3):
        book.save(tmp_path / "book.pt")
        again = PartitionBook.load(tmp_path / "book.pt")
        assert again == book and again.signature() == book.signature() and again.kind == book.kind
        assert torch.equal(again.local(torch.arange(500)), book.local(torch.arange(500)))
    a, b = books(500, 3)[2], PartitionBook.from_assignment(torch.zeros(500, dtype=torch.int64), 3)
    assert a.signature() != b.signature() and PartitionBook.range(500, 3) != PartitionBook.hash(500, 3)
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a partition book"):
        PartitionBook.load(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError):
        PartitionBook.load(tmp_path / "missing.pt")


# ---- parts on disk ----------------------------------------------------------------------------------------
def check_parts(out_dir, book: PartitionBook, features: dict, edge_index: torch.Tensor) -> None:
    """Each part's rows are the full table's rows of its nodes; the parts' edges are the graph's. ``out_dir``:
    the parts' folder, or a function of the machine giving its Partition."""
    edges = []
    for m in range(book.num_machines):
        part = out_dir(m) if callable(out_dir) else load_partition(out_dir, m, "cpu", progress=False)
        assert part.book == book and torch.equal(part.nodes, book.nodes_of(m))
        for name, table in features.items():
            assert torch.equal(part.features[name][:], torch.as_tensor(table)[part.nodes]), (m, name)
        assert part.colptr.dtype == part.row.dtype == torch.int64 and len(part.colptr) == len(part.nodes) + 1
        edges.append(torch.stack([part.row, part.nodes[ptr2index(part.colptr, len(part.row))]]))
        part.close()
    got, want = torch.cat(edges, 1), torch.as_tensor(edge_index)
    assert got.shape == want.shape

    def multiset(e):
        return (e[0] * (book.num_nodes + 1) + e[1]).sort().values

    assert torch.equal(multiset(got), multiset(want))


@pytest.mark.parametrize("which", [0, 1, 2])
def test_partition_round_trip(tmp_path, which, no_leaks):
    g, features = graph()
    book = books(NODES, 3)[which]
    folders = partition(features, g.edge_index, book, tmp_path, progress=False)
    assert [f.name for f in folders] == ["part0", "part1", "part2"]
    check_parts(tmp_path, book, features, g.edge_index)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_part_of_a_graph_in_memory(which, no_leaks):
    g, features = graph()
    book = books(NODES, 3)[which]
    check_parts(lambda m: part_of(features, g.edge_index, book, m, "cpu", progress=False), book, features,
                g.edge_index)
    part = part_of({"h": features["x"].bfloat16()}, g.edge_index, book, 0, progress=False)  # no .npy file needed
    assert torch.equal(part.features["h"][:], features["x"].bfloat16()[part.nodes])
    part.close()
    with pytest.raises(ValueError, match="machine 3 is not one of the book's 3"):
        part_of(features, g.edge_index, book, 3)
    with pytest.raises(ValueError, match="rows for a book"):
        part_of(g.x[:10], g.edge_index, book, 0)


def test_partition_command_synthetic_and_assignment_file(tmp_path):
    partition_command([str(tmp_path / "hash"), "--parts", "2", "--by", "hash", "--synthetic", "400",
                       "--feat-dim", "4", "--no-progress"])
    g = hmgstore.data.synthetic(400, 10, 4, seed=0)
    check_parts(tmp_path / "hash", PartitionBook.hash(400, 2), {"x": g.x, "y": g.y}, g.edge_index)
    assert torch.equal(torch.from_numpy(np.load(tmp_path / "hash" / "split" / "train.npy")), g.train_idx)
    assignment = torch.randint(0, 3, (400,))
    np.savetxt(tmp_path / "graph.part.3", assignment.numpy(), fmt="%d")  # as gpmetis writes it
    partition_command([str(tmp_path / "metis"), "--parts", "3", "--by", str(tmp_path / "graph.part.3"),
                       "--synthetic", "400", "--feat-dim", "4", "--no-progress"])
    check_parts(tmp_path / "metis", PartitionBook.from_assignment(assignment, 3), {"x": g.x}, g.edge_index)


def test_partition_command_reads_an_ogb_folder(tmp_path):
    pytest.importorskip("ogb")
    from helpers import write_fake_products

    written = write_fake_products(tmp_path / "ogb")
    partition_command([str(tmp_path / "parts"), "--parts", "2", "--ogb", str(tmp_path / "ogb"), "--no-progress"])
    edges = torch.from_numpy(written["edges"].T)
    both_ways = torch.cat([edges, edges.flip(0)], 1)  # ogb adds the inverse edges of undirected datasets
    book = PartitionBook.range(len(written["feats"]), 2)
    check_parts(tmp_path / "parts", book, {"x": written["feats"], "y": written["labels"]}, both_ways)


def test_partition_command_names_a_bad_ogb_folder_as_a_usage_error(tmp_path, capsys):
    pytest.importorskip("ogb")
    from helpers import write_fake_products

    write_fake_products(tmp_path / "ogb")
    labels = tmp_path / "ogb" / "ogbn_products" / "raw" / "node-label.csv.gz"
    pd = pytest.importorskip("pandas")
    pd.DataFrame([[2.5]] * 5).to_csv(labels, header=False, index=False, compression="gzip")  # 5 labels, not whole
    with pytest.raises(SystemExit) as exit_info:
        partition_command([str(tmp_path / "parts"), "--parts", "2", "--ogb", str(tmp_path / "ogb"), "--no-progress"])
    assert exit_info.value.code == 2
    assert "--ogb" in capsys.readouterr().err and not (tmp_path / "parts").exists()
    with pytest.raises(SystemExit):
        partition_command([str(tmp_path / "p2"), "--parts", "2", "--ogb", str(tmp_path / "none"), "--no-progress"])
    assert "--ogb" in capsys.readouterr().err


def test_partition_errors(tmp_path):
    g, features = graph()
    with pytest.raises(ValueError, match="3000 rows for a book of 10 nodes"):
        partition(features, g.edge_index, PartitionBook.range(10, 2), tmp_path)
    with pytest.raises(ValueError, match="bfloat16"):
        partition({"x": g.x.bfloat16()}, g.edge_index, PartitionBook.range(NODES, 2), tmp_path)
    with pytest.raises(FileNotFoundError, match="no part 4"):
        load_partition(tmp_path, 4)
    csc = to_csc(g.edge_index, "coo", size=(NODES, NODES))
    bad = CSC(csc.row.clone(), csc.colptr, None, csc.size)
    bad.row[5] = NODES + 2  # a source beyond the book, in a CSC given as is
    with pytest.raises(IndexError, match=f"index {NODES + 2} at position 5"):
        partition(features, bad, PartitionBook.range(NODES, 2), tmp_path / "bad")


# ---- gathers over real ranks (gloo) ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """The worker's graph cut into two machines by each kind of book."""
    out = tmp_path_factory.mktemp("parts")
    g, features = graph()
    for book in books(NODES, 2):
        partition(features, g.edge_index, book, out / book.kind, progress=False)
    return out


def run_ranks(scenario: str, world: int, parts: Path, tmp_path: Path, **kwargs):
    for kind in ("range", "hash", "assignment"):
        (tmp_path / kind).symlink_to(parts / kind)
    return launch(scenario, world, tmp_path, **kwargs)


def test_cluster_gathers_are_bit_exact(parts, tmp_path, no_leaks):
    codes, reports, errs = run_ranks("gather", 4, parts, tmp_path, node_of=crossed_machines)
    assert codes == [0] * 4, errs
    for rank, r in reports.items():
        assert r["machines"] == [[0, 3], [1, 2]] and r["machine"] == crossed_machines(rank)
        for kind in ("range", "hash", "assignment"):
            assert all(r[kind].values()), (rank, kind, r[kind])
        assert r["sharded_local"] and "machine=1 of 2" in reports[1]["repr"]


def test_ranks_that_disagree_or_stall_are_told_which(parts, tmp_path, no_leaks):
    codes, reports, errs = run_ranks("disagree", 4, parts, tmp_path, node_of=two_machines)
    assert codes == [0] * 4, errs
    for r in reports.values():
        assert "rank 3 has a different book than rank 0" in r["book_error"], r
        assert "rank 2 (machine 0) holds 10 local rows, its partition has 1500" in r["rows_error"], r
    for rank in (0, 1):  # counterparts that gathered different tables
        assert f"rank {1 - rank} called gather_many with other tables" in reports[rank]["call_error"]
    # rank 3 came 3.5 s late: rank 2 gave up after the exchange timeout (2 s)
    assert "exchange of rank 2" in reports[2]["call_error"] and 1.8 < reports[2]["seconds"] < 3.4, reports[2]
    assert reports[3]["call_error"]


def test_samplers_that_disagree_and_sampling_beside_a_gather_are_told(parts, tmp_path, no_leaks):
    codes, reports, errs = run_ranks("mixed_calls", 4, parts, tmp_path, node_of=two_machines)
    assert codes == [0] * 4, errs
    for r in reports.values():
        assert "rank 3 has a different fanouts than rank 0" in r["sampler_error"], r
    assert "ValueError: rank 1 did not sample hop 0" in reports[0]["call_error"], reports[0]  # rank 0 sampled
    assert "ValueError: rank 0 called gather_many with other tables" in reports[1]["call_error"], reports[1]
    assert reports[2]["call_error"] is None and reports[3]["call_error"] is None  # the others went on


def test_dgl_loader_per_rank_over_cluster_features(parts, tmp_path, no_leaks):
    pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")
    codes, reports, errs = run_ranks("dgl", 4, parts, tmp_path, node_of=two_machines)
    assert codes == [0] * 4, errs
    for r in reports.values():
        assert r["exact"] and r["batches"] == 5, r


def test_a_part_shared_once_per_machine(parts, tmp_path, no_leaks):
    codes, reports, errs = run_ranks("shared_part", 4, parts, tmp_path, node_of=two_machines)
    assert codes == [0] * 4, errs
    for r in reports.values():
        assert r["part_exact"] and r["sees_first_rank_write"] and r["rows_exact"] and r["mixed_parts_refused"], r


def test_machines_must_run_as_many_ranks():
    assert group_machines([[0, 2], [1, 3], [0, 2], [1, 3]]) == [[0, 2], [1, 3]]
    assert group_machines([[1, 2], [0, 3], [0, 3], [1, 2]]) == [[0, 3], [1, 2]]  # numbered by lowest rank
    with pytest.raises(ValueError, match=r"same number of ranks.*machine 0: ranks \[0, 2\]; machine 1: ranks \[1\]"):
        group_machines([[0, 2], [1], [0, 2]])


def test_killed_rank_makes_the_others_raise(parts, tmp_path, no_leaks):
    start = time.monotonic()
    codes, reports, errs = run_ranks("kill", 4, parts, tmp_path, node_of=two_machines, timeout=60)
    assert codes[3] == -9
    for rank in (0, 1, 2):
        assert codes[rank] == 0, errs[rank]
        r = reports[rank]
        assert r["error"] and "rank 3" in r["error"], (rank, r)
        assert r["seconds"] < 10 and r["later_error"], (rank, r)
    assert time.monotonic() - start < 45


# ---- one machine per GPU (NCCL) ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.multigpu
def test_cluster_gathers_over_nccl(parts, tmp_path, no_leaks):
    codes, reports, errs = run_ranks("gather", 2, parts, tmp_path, device="cuda", node_of=lambda rank: rank,
                                     timeout=300)
    assert codes == [0, 0], errs
    for rank, r in reports.items():
        assert r["machines"] == [[0], [1]]
        for kind in ("range", "hash", "assignment"):
            assert all(r[kind].values()), (rank, kind, r[kind])
        assert r["sharded_local"]


@pytest.mark.gpu
@pytest.mark.multigpu
def test_killed_rank_over_nccl(parts, tmp_path, no_leaks):
    codes, reports, errs = run_ranks("kill", 2, parts, tmp_path, device="cuda", node_of=lambda rank: rank,
                                     env={"EXCHANGE_TIMEOUT": "10"}, timeout=120)
    assert codes[1] == -9
    assert codes[0] != 0 or reports[0]["error"], errs[0][-3000:]  # raised, or ended by NCCL's watchdog


# ---- sampling over machines, and PyG loaders per rank (gloo) ----------------------------------------------
def test_distributed_sampling_and_pyg_loader(parts, tmp_path, no_leaks):
    """Partitioned sampling equals the single-machine sampler draw for draw (so: edges exist, counts are
    min(fanout, degree), seeds come first); a loose uniformity check; a NeighborLoader per rank gets the full
    table's rows and as many batches as the other ranks."""
    codes, reports, errs = run_ranks("sample", 4, parts, tmp_path, node_of=two_machines, pyg=True)
    assert codes == [0] * 4, errs
    for rank, r in reports.items():
        assert all(r["sample"].values()), (rank, r["sample"])
        # Fused per hop: header, requests, answers (counts and neighbours together); a hop that takes every
        # neighbour sends its counts before its neighbours.
        assert r["rounds"] == [6] * 6 and r["rounds_replace"] == [6] * 6 and r["rounds_all"] == [7] * 6, r
        assert r["rounds_wide"] == [7] * 6, r  # a fanout of 40: counts before neighbours, not 41 padded slots
        assert r["uniform_outside"] == 0 and 8 <= r["hub_degree"] <= 16
        # 1200 draws over ~12 neighbours: each expected ~100 times (sd ~10); 40% off is 4 sigma
        assert r["uniform_max_rel_dev"] < 0.4 and r["uniform_chi2_per_df"] < 3, r
        loader = r["loader"]
        assert loader["equal"] and loader["seeds"] == loader["want_seeds"], loader
    assert len({r["loader"]["batches"] for r in reports.values()}) == 1
    assert sum(r["loader"]["empty"] for r in reports.values()) > 0  # uneven ranks were padded


@pytest.mark.gpu
def test_distributed_sampling_with_owners_on_the_gpu(parts, tmp_path, no_leaks):
    """Each machine samples its part with the GPU sampler's kernels for every requester (the exchange over
    gloo): still draw for draw the single-machine sampler's batches, and uniform."""
    codes, reports, errs = run_ranks("sample", 4, parts, tmp_path, node_of=two_machines,
                                     env={"HMGSTORE_OWNER_DEVICE": "cuda"}, timeout=300)
    assert codes == [0] * 4, errs
    for rank, r in reports.items():
        assert r["owners_on"].startswith("cuda"), r
        assert all(r["sample"].values()), (rank, r["sample"])
        assert r["uniform_outside"] == 0 and r["uniform_max_rel_dev"] < 0.4 and r["uniform_chi2_per_df"] < 3, r
