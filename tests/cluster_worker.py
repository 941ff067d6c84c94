"""One rank of a test of graphs partitioned over machines (run by tests/test_cluster.py).

Usage: python cluster_worker.py SCENARIO OUT_DIR, with the environment
tests/test_distributed.py's ``launch`` sets (RANK, WORLD_SIZE, MASTER_*,
HMGSTORE_NODE_ID per simulated machine, HMGSTORE_TEST_DEVICE); the rest is
tests/distributed_worker.py's ``main``. The parts
are in OUT_DIR/{range,hash,assignment}/, written by the test from
:func:`graph`; each rank writes OUT_DIR/rank{R}.json with what it saw.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import distributed_worker
import torch
import torch.distributed as dist
from distributed_worker import _write

import hmgstore
import hmgstore.distributed as hd
from hmgstore.data import synthetic
from hmgstore.distributed import cluster as cluster_module

NODES, FEAT_DIM = 3_000, 12


def graph():
    """The full graph every part comes from, and its attributes: three dtypes, rows of 48, 8 and 6 bytes."""
    g = synthetic(num_nodes=NODES, avg_degree=5, feat_dim=FEAT_DIM, num_classes=4, seed=11)
    return g, {"x": g.x, "y": g.y, "h": g.x[:, :3].half().contiguous()}


def device() -> torch.device:
    if os.environ.get("HMGSTORE_TEST_DEVICE") == "cuda":  # one GPU per rank, whatever the simulated machines
        torch.cuda.set_device(int(os.environ["RANK"]) % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build(kind: str):
    """This machine's part of ``kind``, as ClusterTensors by attribute name."""
    part = hd.load_partition(os.path.join(sys.argv[2], kind), hd.this_cluster().machine, device(), progress=False)
    return part, {name: hd.ClusterTensor(table, part.book) for name, table in part.features.items()}


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    got = got.cpu()
    return got.shape == want.shape and got.dtype == want.dtype and torch.equal(
        got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def scenario_gather(report):
    """Bit-exact rows for every book kind: random ids with duplicates, empty, all local, all remote,
    int32/numpy/2-D ids, several attributes fused, a bad id (on every rank, then on one), a sharded local table."""
    _, full = graph()
    cluster, rank = hd.this_cluster(), dist.get_rank()
    report["machines"], report["machine"] = cluster.machines, cluster.machine
    g = torch.Generator().manual_seed(100 + rank)
    for kind in ("range", "hash", "assignment"):
        part, t = build(kind)
        x, y, h = t["x"], t["y"], t["h"]
        mine = part.book.nodes_of(cluster.machine)
        others = torch.cat([part.book.nodes_of(m) for m in range(cluster.num_machines) if m != cluster.machine])
        ids = torch.randint(0, NODES, (500 + 37 * rank,), generator=g)  # every rank its own length; duplicates
        checks = {
            "random": same(x[ids], full["x"][ids]),
            "random_on_device": same(x[ids.to(x.device)], full["x"][ids]),
            "empty_on_rank1": same(x[ids[:0] if rank == 1 else ids], full["x"][ids[:0] if rank == 1 else ids]),
            "all_empty": same(x[torch.empty(0, dtype=torch.int64)], full["x"][:0]),
        }
        local_ids = mine[torch.randint(0, len(mine), (300,), generator=g)]
        remote_ids = others[torch.randint(0, len(others), (300,), generator=g)]
        checks["all_local"] = same(x[local_ids], full["x"][local_ids])
        checks["all_remote"] = same(x[remote_ids], full["x"][remote_ids])
        checks["int32_2d"] = same(y[ids[:400].view(20, 20).int()], full["y"][ids[:400]].view(20, 20))
        checks["numpy"] = same(h[ids.numpy()], full["h"][ids])
        other = torch.randint(0, NODES, (123,), generator=g)
        got = hd.gather_many([(x, ids), (y, ids), (h, other), (x, other)])
        checks["fused"] = all(same(a, b) for a, b in zip(
            got, (full["x"][ids], full["y"][ids], full["h"][other], full["x"][other])))
        try:
            x[torch.tensor([5, NODES + 7])]
            checks["bad_id_raised"] = False
        except IndexError as err:
            checks["bad_id_raised"] = str(NODES + 7) in str(err) and "position 1" in str(err)
        checks["after_bad_id"] = same(x[ids], full["x"][ids])  # nothing was sent: the rounds are still in step
        try:  # rank 0's ids alone are refused: it says so in the first round, its counterpart raises with it
            got = x[torch.tensor([5, NODES + 7]) if rank == 0 else ids]
            checks["one_refused"] = rank != 0 and same(got, full["x"][ids])  # a rank that exchanges with others
        except IndexError as err:
            checks["one_refused"] = rank == 0 and str(NODES + 7) in str(err)
        except ValueError as err:
            checks["one_refused"] = rank != 0 and "rank 0 refused its ids" in str(err)
        checks["after_one_refused"] = same(x[ids], full["x"][ids])  # every rank raised in one call: in step
        report[kind] = checks
        for table in t.values():
            table.close()
        part.close()
    report["repr"] = repr(x)
    report["sharded_local"] = _sharded_local(full, g)


def _sharded_local(full, g) -> bool:
    """A ClusterTensor over the node's sharded view (shard) of the machine's partition rows."""
    part = hd.load_partition(os.path.join(sys.argv[2], "hash"), hd.this_cluster().machine, "cpu", progress=False)
    rows = part.features["x"].source
    local = hd.shard(hd.share_on_node(rows, progress=False), gpu_budget=rows.nbytes // 2,
                     hot_order=torch.arange(len(rows)), device=device(), progress=False)
    x = hd.ClusterTensor(local, part.book)
    ids = torch.randint(0, NODES, (700,), generator=g)
    exact = same(x[ids], full["x"][ids])
    x.close()
    local.close()
    part.close()
    return exact


def scenario_disagree(report):
    """Rank 3 builds from another book, then rank 2 from the wrong rows; then ranks 0 and 1 gather other
    tables than each other, while rank 3 stops gathering for longer than the exchange timeout (2 s)."""
    _, full = graph()
    cluster_module.EXCHANGE_TIMEOUT = datetime.timedelta(seconds=2)
    rank = dist.get_rank()
    part = hd.load_partition(os.path.join(sys.argv[2], "hash" if rank == 3 else "range"), hd.this_cluster().machine,
                             device(), progress=False)
    try:
        hd.ClusterTensor(part.features["x"], part.book)
    except ValueError as err:
        report["book_error"] = str(err)
    part.close()
    part = hd.load_partition(os.path.join(sys.argv[2], "range"), hd.this_cluster().machine, device(), progress=False)
    try:
        hd.ClusterTensor(hmgstore.HybridTensor(full["x"][:10], device()) if rank == 2 else part.features["x"],
                         part.book)
    except ValueError as err:
        report["rows_error"] = str(err)
    x = hd.ClusterTensor(part.features["x"], part.book)
    y = hd.ClusterTensor(part.features["y"], part.book)
    ids = torch.arange(0, NODES, 7)
    if rank == 3:
        time.sleep(3.5)
    start = time.monotonic()
    try:
        (y if rank == 1 else x)[ids]
        report["call_error"] = None
    except (ValueError, hd.PeerLostError) as err:
        report["call_error"] = str(err)
    report["seconds"] = time.monotonic() - start
    x.close()
    y.close()
    part.close()


def scenario_mixed_calls(report):
    """Rank 3 builds a sampler with another fanout (every rank is told); then rank 0 samples while its
    counterpart, rank 1, gathers (both are told), while ranks 2 and 3 sample together as they should."""
    rank, cluster = dist.get_rank(), hd.this_cluster()
    part = hd.load_partition(os.path.join(sys.argv[2], "hash"), cluster.machine, "cpu", progress=False)
    try:
        hd.DistributedNeighborSampler(part, [4, 2] if rank == 3 else [4, 3])
    except ValueError as err:
        report["sampler_error"] = str(err)
    sampler = hd.DistributedNeighborSampler(part, [4, 3], generator=torch.Generator().manual_seed(rank))
    x = hd.ClusterTensor(part.features["x"], part.book)
    seeds = torch.arange(rank, NODES, 97)
    try:
        x[seeds] if rank == 1 else sampler.sample(seeds)
        report["call_error"] = None
    except (ValueError, hd.PeerLostError) as err:
        report["call_error"] = f"{type(err).__name__}: {err}"
    x.close()
    part.close()


def scenario_dgl(report):
    """A stock DGL DataLoader per rank over the whole topology, its features from a ClusterTensor: every
    batch's rows equal the full table's (each rank runs the same number of batches, as it must)."""
    from hmgstore.plugins.dgl import attach

    # isort: split
    import dgl

    g_full, full = graph()
    rank, cluster = dist.get_rank(), hd.this_cluster()
    part = hd.load_partition(os.path.join(sys.argv[2], "hash"), cluster.machine, "cpu", progress=False)
    x = hd.ClusterTensor(part.features["x"], part.book)
    y = hd.ClusterTensor(part.features["y"], part.book)
    g = attach(dgl.graph((g_full.edge_index[0], g_full.edge_index[1]), num_nodes=NODES), {"feat": x, "label": y})
    seeds = torch.arange(rank, NODES, 4)[:600]  # the same count on every rank: the same number of batches
    sampler = dgl.dataloading.NeighborSampler([4, 3], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(g, seeds, sampler, batch_size=128, shuffle=True)
    exact, batches = True, 0
    for input_nodes, output_nodes, blocks in loader:
        exact &= torch.equal(blocks[0].srcdata["feat"], full["x"][input_nodes])
        exact &= torch.equal(blocks[-1].dstdata["label"], full["y"][output_nodes])
        batches += 1
    report.update(exact=bool(exact), batches=batches)
    x.close()
    y.close()
    part.close()


def scenario_shared_part(report):
    """Each machine's part read once into shared memory (share=True): a write by the machine's first rank is
    seen by its second, and remote rows stay exact; ranks of one machine asking for different parts are refused."""
    _, full = graph()
    rank, cluster = dist.get_rank(), hd.this_cluster()
    part = hd.load_partition(os.path.join(sys.argv[2], "range"), cluster.machine, "cpu", share=True, progress=False)
    x = part.features["x"].source
    mine = part.nodes
    private = hd.load_partition(os.path.join(sys.argv[2], "range"), cluster.machine, "cpu", progress=False)
    report["part_exact"] = torch.equal(x, full["x"][mine]) and torch.equal(part.row, private.row) and \
        torch.equal(part.colptr, private.colptr)
    private.close()
    sentinel = 4242.0 + cluster.machine
    dist.barrier()  # every rank has compared before the first rank writes
    if cluster.local_rank == 0:
        x[0, 0] = sentinel
    dist.barrier()
    report["sees_first_rank_write"] = float(x[0, 0]) == sentinel
    dist.barrier()
    if cluster.local_rank == 0:
        x[0, 0] = full["x"][mine[0], 0]
    dist.barrier()
    t = hd.ClusterTensor(part.features["x"], part.book)
    ids = torch.randint(0, NODES, (500,), generator=torch.Generator().manual_seed(rank))
    report["rows_exact"] = torch.equal(t[ids], full["x"][ids])
    t.close()
    part.close()
    other = (cluster.machine + cluster.local_rank) % cluster.num_machines  # the ranks of a machine ask for two parts
    try:
        hd.load_partition(os.path.join(sys.argv[2], "range"), other, "cpu", share=True, progress=False).close()
        report["mixed_parts_refused"] = False  # one of them got the other's rows under its part's name
    except ValueError as err:
        report["mixed_parts_refused"] = "asked for different shared tables" in str(err)


def scenario_kill(report):
    """The last rank kills itself between gathers; the others keep gathering and must raise."""
    cluster_module.EXCHANGE_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("EXCHANGE_TIMEOUT", "20")))
    part, t = build("range")
    ids = torch.randint(0, NODES, (1000,))
    t["x"][ids]
    if dist.get_rank() == dist.get_world_size() - 1:
        _write(report)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        while time.monotonic() - start < 60:
            t["x"][ids]
        report["error"] = None
    except hd.PeerLostError as err:
        report["error"] = str(err)
        report["seconds"] = time.monotonic() - start
    try:
        t["x"][ids]
    except hd.PeerLostError as err:
        report["later_error"] = str(err)
    for table in t.values():
        table.close()
    part.close()


def _draw_for_draw(sampler, csc, fanout, replace, rank, edges, degree) -> tuple[dict, list[int]]:
    """Six batches of ``sampler`` (one empty on rank 1) against the single-machine sampler over the whole CSC
    with the same generator: equal, edges exist, per-hop counts, seeds first. Also returns the
    ``all_to_all_single`` rounds each batch took."""
    from hmgstore.graph import NeighborSampler, Topology

    single = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: NODES}, fanout, replace=replace,
                             generator=torch.Generator().manual_seed(rank))
    checks = {"equal": True, "edges_exist": True, "counts": True, "seeds_first": True}
    g_ids = torch.Generator().manual_seed(50 + rank)
    rounds, all_to_all = [], dist.all_to_all_single

    def counted(*args, **kwargs):
        rounds[-1] += 1
        return all_to_all(*args, **kwargs)

    for step in range(6):
        n = 0 if (step == 2 and rank == 1) else 40 + 9 * rank  # an empty batch on one rank
        seeds = torch.randint(0, NODES, (n,), generator=g_ids)
        rounds.append(0)
        dist.all_to_all_single = counted
        try:
            got = sampler.sample(seeds)
        finally:
            dist.all_to_all_single = all_to_all
        want = single.sample({None: seeds})
        node, row, col = got.node[None], got.row[None], got.col[None]
        checks["equal"] &= all(torch.equal(a[None], b[None]) for a, b in
                               ((got.node, want.node), (got.row, want.row), (got.col, want.col))) and \
            got.num_sampled_nodes == want.num_sampled_nodes and got.num_sampled_edges == want.num_sampled_edges
        checks["seeds_first"] &= torch.equal(node[:n], seeds)
        checks["edges_exist"] &= all((s, d) in edges for s, d in zip(node[row].tolist(), node[col].tolist()))
        per_seed = torch.bincount(col, minlength=len(node))
        bounds = [0, *torch.tensor(got.num_sampled_nodes[None]).cumsum(0).tolist()]
        for hop, k in enumerate(fanout):
            lo, hi = bounds[hop], bounds[hop + 1]
            want_counts = degree[node[lo:hi]]
            if k >= 0:
                want_counts = torch.where(want_counts > 0, k, 0) if replace else want_counts.clamp(max=k)
            checks["counts"] &= torch.equal(per_seed[lo:hi], want_counts)
    return checks, rounds


def scenario_sample(report):
    """Partitioned sampling (hash book) equals the single-machine sampler over the whole CSC with the same
    generator, batch for batch; edges exist, counts are min(fanout, degree); replicated mode too; a loose
    uniformity check on the neighbours of one node; then a PyG loader per rank over ClusterFeatureStore."""
    from hmgstore.graph import NeighborSampler, Topology, to_csc

    g, full = graph()
    rank, cluster = dist.get_rank(), hd.this_cluster()
    csc = to_csc(g.edge_index, "coo", size=(NODES, NODES))
    part = hd.load_partition(os.path.join(sys.argv[2], "hash"), cluster.machine, "cpu", progress=False)
    fanout = [4, 3]
    owners = os.environ.get("HMGSTORE_OWNER_DEVICE")  # where each machine samples its part (default: the CPU)
    sampler = hd.DistributedNeighborSampler(part, fanout, generator=torch.Generator().manual_seed(rank),
                                            device=owners)
    report["owners_on"] = str(sampler._owned.device) if sampler._owned is not None else "cpu"
    edges = set(zip(g.edge_index[0].tolist(), g.edge_index[1].tolist()))
    degree = csc.colptr.diff()
    checks, report["rounds"] = _draw_for_draw(sampler, csc, fanout, False, rank, edges, degree)
    sampler.close()
    # Every neighbour in one hop, or more than PADDED_FANOUT_MAX (counts, then neighbours), and draws with
    # replacement.
    for fanouts, replace, name in (([-1, 2], False, "all"), ([3, 2], True, "replace"), ([40, 2], False, "wide")):
        other = hd.DistributedNeighborSampler(part, fanouts, replace=replace, device=owners,
                                              generator=torch.Generator().manual_seed(rank))
        more, report[f"rounds_{name}"] = _draw_for_draw(other, csc, fanouts, replace, rank, edges, degree)
        checks.update({f"{key}_{name}": value for key, value in more.items()})
        other.close()
    # Uniformity: the in-neighbours of a node of degree ~12, sampled 3 at a time, 400 times (collectively).
    hub = int((degree - 12).abs().argmin())
    hub_sampler = hd.DistributedNeighborSampler(part, [3], generator=torch.Generator().manual_seed(7 + rank),
                                                device=owners)
    hits = torch.zeros(NODES)
    for _ in range(400):
        s = hub_sampler.sample(torch.tensor([hub]))
        hits.index_add_(0, s.node[None][s.row[None]], torch.ones(len(s.row[None])))
    nbrs = csc.row[csc.colptr[hub]:csc.colptr[hub + 1]]
    expected = torch.bincount(nbrs, minlength=NODES).float() * 3 * 400 / int(degree[hub])
    listed = expected > 0
    report["uniform_max_rel_dev"] = float(((hits[listed] - expected[listed]).abs() / expected[listed]).max())
    report["uniform_chi2_per_df"] = float(((hits[listed] - expected[listed]) ** 2 / expected[listed]).sum()
                                          / max(1, int(listed.sum()) - 1))
    report["uniform_outside"] = float(hits[~listed].sum())
    report["hub_degree"] = int(degree[hub])
    replicated = hd.DistributedNeighborSampler(csc, fanout, generator=torch.Generator().manual_seed(3))
    again = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: NODES}, fanout,
                            generator=torch.Generator().manual_seed(3))
    seeds = torch.arange(rank, NODES, 97)
    a, b = replicated.sample(seeds), again.sample({None: seeds})
    checks["replicated"] = torch.equal(a.node[None], b.node[None]) and torch.equal(a.row[None], b.row[None])
    report["sample"] = checks
    hub_sampler.close()
    replicated.close()
    report["loader"] = _pyg_loader(part, full) if not owners else None
    part.close()


def _pyg_loader(part, full) -> dict:
    """A stock NeighborLoader per rank over ClusterFeatureStore + ClusterNeighborSampler, seeds of uneven
    length per rank (padded to equal batch counts): features and labels equal the full tables' rows."""
    from hmgstore.plugins.pyg import (
        ClusterFeatureStore,
        ClusterNeighborSampler,
        cluster_loader,
    )

    rank = dist.get_rank()
    tables = {name: hd.ClusterTensor(t, part.book) for name, t in part.features.items() if name in ("x", "y")}
    store = ClusterFeatureStore(tables)
    sampler = ClusterNeighborSampler(part, [3, 2])
    seeds = torch.arange(rank, NODES, 29 + 7 * rank)
    loader = cluster_loader(store, sampler, seeds, batch_size=16, shuffle=True)
    out = {"batches": 0, "equal": True, "seeds": 0, "empty": 0}
    for batch in loader:
        out["batches"] += 1
        out["empty"] += batch.batch_size == 0
        out["seeds"] += batch.batch_size
        out["equal"] &= torch.equal(batch.x, full["x"][batch.n_id]) and torch.equal(batch.y, full["y"][batch.n_id])
        out["equal"] &= batch.edge_index.shape[0] == 2 and (batch.edge_index.numel() == 0 or
                                                            int(batch.edge_index.max()) < len(batch.n_id))
    out["want_seeds"] = len(seeds)
    ids = (torch.arange(NODES) * 7 + rank) % NODES  # a numpy index too, as PyG's IndexType allows
    out["equal"] &= torch.equal(store.get_tensor(None, "x", ids.numpy()), full["x"][ids])
    for t in tables.values():
        t.close()
    return out


if __name__ == "__main__":  # distributed_worker's main runs this file's scenarios, with a GPU per global rank
    distributed_worker.device = device
    vars(distributed_worker).update({k: v for k, v in globals().items() if k.startswith("scenario_")})
    distributed_worker.main()
