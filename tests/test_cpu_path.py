"""The CPU gather's short path (hmgstore.gather.plan.gather_cpu, read_host): the same answers, checks and counts as
gather_many's, for every index shape, dtype, stored format and layout it takes (issue 30, item 9)."""
from __future__ import annotations

import pytest
import torch

import hmgstore
from helpers import random_table
from hmgstore.gather import plan


def _tables(x):
    yield "plain", hmgstore.HybridTensor(x, "cpu", progress=False), x
    yield "layout", hmgstore.HybridTensor(x, "cpu", layout=torch.randperm(len(x)), progress=False), x
    for fmt in ("bfloat16", "float16"):
        dtype = getattr(torch, fmt)
        yield fmt, hmgstore.HybridTensor(x, "cpu", host_dtype=dtype, progress=False), x.to(dtype).float()
    yield "int8", hmgstore.HybridTensor(x, "cpu", compress="int8", progress=False), None


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_short_path_matches_gather_many(index_dtype):
    x = random_table(300, (3, 4), torch.float32, seed=5)
    idx = torch.randint(0, 300, (7, 11), dtype=index_dtype)
    for name, table, want in _tables(x):
        got = table[idx]
        assert got.shape == (7, 11, 3, 4) and got.dtype == torch.float32, name
        assert torch.equal(got, hmgstore.gather_many([(table, idx)])[0]), name  # the general path
        if want is not None:
            assert torch.equal(got, want[idx.long()]), name
        out = torch.full((7, 11, 3, 4), float("nan"))
        assert table.gather(idx, out=out) is out and torch.equal(out, got), name
        assert table[idx[:0, :0]].shape == (0, 0, 3, 4), name


def test_short_path_checks_ids_and_out_before_reading():
    table = hmgstore.HybridTensor(torch.arange(40.0).view(10, 4), "cpu")
    with pytest.raises(IndexError, match="index 10 at position 2"):
        table[torch.tensor([1, 2, 10])]
    with pytest.raises(IndexError, match="index -1"):
        table[torch.tensor([[-1]], dtype=torch.int32)]
    with pytest.raises(ValueError, match="out must be a contiguous tensor of shape"):
        table.gather(torch.tensor([1, 2]), out=torch.empty(3, 4))
    with pytest.raises(ValueError, match="check must be one of"):
        table.gather(torch.tensor([1]), check="later")
    table.close()
    with pytest.raises(RuntimeError, match="closed"):
        table[torch.tensor([1])]


def test_short_path_counts_rows_and_time():
    table = hmgstore.HybridTensor(torch.randn(100, 8), "cpu", stats=True)
    table[torch.arange(30)]
    table[torch.arange(12).view(3, 4)]
    stats = table.stats()
    assert stats["gathers"] == 2 and stats["rows"] == 42 and stats["tiers"]["host"]["rows"] == 42
    assert stats["seconds"] > 0


def test_other_indices_take_the_general_path(monkeypatch):
    table = hmgstore.HybridTensor(torch.arange(40.0).view(10, 4), "cpu")
    calls = []
    monkeypatch.setattr(plan, "gather_cpu", lambda *a: calls.append(a))
    for index in (3, torch.tensor(3), [1, 2], slice(2, 5), torch.tensor([1, 2], dtype=torch.int16),
                  torch.zeros(10, dtype=torch.bool)):
        table[index]
    assert calls == []


# ---- the CPU sampler's relabelling without sorts (hmgstore.graph.relabel.DenseNodeSet) -------------------------
def test_dense_node_set_numbers_nodes_as_the_sorted_one():
    from hmgstore.graph.relabel import _ABSENT, DenseMaps, DenseNodeSet, SortedNodeSet

    g = torch.Generator().manual_seed(3)
    maps = DenseMaps(50)
    for _ in range(3):  # the same map, handed back clean after each batch
        seeds = torch.randint(0, 50, (8,), generator=g)  # repeats included
        dense, ref = DenseNodeSet(seeds, maps), SortedNodeSet(seeds)
        for size in (0, 1, 30, 200):
            candidates = torch.randint(0, 50, (size,), generator=g)
            assert torch.equal(dense.add(candidates), ref.add(candidates))
            assert dense.count == ref.count and torch.equal(dense.keys, ref.keys)
        dense.release()
        assert len(maps._free) == 1 and bool((maps._free[0] == _ABSENT).all())


def test_cpu_sampler_gives_the_same_batches_with_and_without_dense_maps():
    from hmgstore.bench.sample import build_graph
    from hmgstore.graph import NeighborSampler, Topology

    csc = build_graph(("power-law", 2000, 20000), 1.0, torch.device("cpu"))
    seeds = torch.randint(0, 2000, (64,), generator=torch.Generator().manual_seed(1))
    for replace in (False, True):
        topo = Topology(csc, "cpu", progress=False)
        outs = []
        for dense in (True, False):
            sampler = NeighborSampler({None: topo}, {None: 2000}, [10, 5, -1], replace=replace,
                                      generator=torch.Generator().manual_seed(7))
            assert bool(sampler._dense) is True
            if not dense:
                sampler._dense = {}  # the sorted relabelling
            outs.append(sampler.sample({None: seeds}))
        a, b = outs
        for field in ("node", "row", "col", "edge"):
            assert torch.equal(getattr(a, field)[None], getattr(b, field)[None]), (replace, field)
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


def test_disjoint_and_huge_node_types_keep_the_sorted_relabelling(monkeypatch):
    from hmgstore.graph import NeighborSampler, Topology, relabel
    from hmgstore.graph import sampler as sampler_module
    from hmgstore.graph.csc import CSC

    topo = Topology(CSC(torch.tensor([1, 0]), torch.tensor([0, 1, 2]), None, (2, 2)), "cpu")
    assert NeighborSampler({None: topo}, {None: 2}, [1], disjoint=True)._dense == {}
    monkeypatch.setattr(sampler_module, "DENSE_MAX_NODES", 1)
    assert NeighborSampler({None: topo}, {None: 2}, [1])._dense == {}
    assert relabel.DENSE_MAX_NODES == 1 << 26


def _hop_slot_by_slot(topology, seeds, k, replace, key):
    """The CPU hop as it was written before the [S, k] matrix: slot by slot, with segment ids (the reference)."""
    from hmgstore.graph import hop

    degree = topology.colptr[seeds + 1] - topology.colptr[seeds]
    counts = hop.slot_counts(degree, k, replace)
    offsets = counts.cumsum(0) - counts
    seg = torch.repeat_interleave(torch.arange(len(seeds)), counts)
    t = torch.arange(int(counts.sum())) - offsets[seg]
    index = torch.arange(len(seeds))
    if replace:
        pos = hop.draw(key, index[seg], t, degree[seg])
    else:
        pos, floyd = t.clone(), (counts < degree).nonzero().view(-1)
        if len(floyd):
            chosen = hop._floyd_cpu(key, index[floyd], counts[floyd], degree[floyd])
            pos[(counts < degree)[seg]] = chosen[chosen >= 0]
    eid = topology.colptr[seeds][seg] + pos
    return topology.row[eid].long(), eid, counts


@pytest.mark.parametrize("replace", [False, True])
def test_hop_slots_matrix_draws_what_slot_by_slot_drew(replace):
    from hmgstore.bench.sample import build_graph
    from hmgstore.graph import Topology, hop

    topo = Topology(build_graph(("power-law", 3000, 30000), 1.0, torch.device("cpu")), "cpu", progress=False)
    seeds = torch.randint(0, 3000, (500,), generator=torch.Generator().manual_seed(4))
    for k in (0, 1, 3, 15):
        got, want = hop.sample_hop(topo, seeds, k, replace, 12345 + k), _hop_slot_by_slot(topo, seeds, k, replace,
                                                                                            12345 + k)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (k, replace)
