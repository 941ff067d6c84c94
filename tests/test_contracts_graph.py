"""Contracts of the graph layer's public names and the top-level ones they feed: CSC and its offsets, the
sampler, its batches and its hotness, the data generators, placements, sharded tables and producers.

Generated hostile inputs (hypothesis): offsets that fall or end elsewhere, ids past the node range, sizes
that are floats, bools or negative, fanouts of 0, -2 and 2**31, no seeds, empty graphs, orders that are no
permutation, counts of the wrong length or NaN. Each property is the exact result (against a simple
reference) or the documented error, never a crash, a hang or uninitialised memory.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from hmgstore.data import NodeGraph, power_law_csc
from hmgstore.graph import (
    CSC,
    Hotness,
    NeighborSampler,
    Sample,
    Topology,
    hit_ratio,
    index2ptr,
    ptr2index,
    sample_hop,
    stable_sort,
    to_csc,
)
from hmgstore.graph.csc import edge_weight_in_csc_order
from hmgstore.rows.formats import get as get_format

FAST = settings(max_examples=40, deadline=None)
NOT_INTEGERS = st.sampled_from([2.5, 2.0, True, "3", None, np.float32(1.0)])


@st.composite
def graphs(draw, max_nodes=10):
    """``(n, csc)``: a random graph of ``n`` nodes (0 included) and its edges."""
    n = draw(st.integers(0, max_nodes))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=30)) if n else []
    return n, to_csc(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t(), "coo", size=(n, n))


def offsets_of(counts):
    return torch.tensor([0, *np.cumsum(counts).tolist()], dtype=torch.int64)


# ---- CSC, index2ptr, ptr2index, stable_sort ----------------------------------------------------------------
@FAST
@given(st.lists(st.integers(0, 4), max_size=8), st.data())
def test_csc_takes_exactly_well_formed_offsets_and_ids(counts, data):
    colptr, num_edges = offsets_of(counts), sum(counts)
    num_src = data.draw(st.integers(0, 6))
    row = torch.tensor(data.draw(st.lists(st.integers(-1, 6), min_size=num_edges, max_size=num_edges)),
                       dtype=torch.int64)
    if num_edges == 0 or (row.min() >= 0 and row.max() < num_src):
        csc = CSC(row, colptr, None, (num_src, len(counts)))
        assert csc.in_degree().tolist() == counts
        assert csc.col().tolist() == [v for v, c in enumerate(counts) for _ in range(c)]
    else:
        with pytest.raises(IndexError, match="row holds a source id outside"):
            CSC(row, colptr, None, (num_src, len(counts)))
    if num_edges:  # offsets that fall, end elsewhere or start elsewhere
        with pytest.raises(ValueError, match="colptr must end at the number of edges"):
            CSC(row[:-1], colptr, None, (7, len(counts)))
        if len(counts) > 1:  # a rise past the end: the same ends, one fall
            falling = colptr.clone()
            falling[1] = num_edges + 1
            with pytest.raises(ValueError, match="colptr never decreases"):
                CSC(row, falling, None, (7, len(counts)))
        with pytest.raises(ValueError, match="colptr must start at 0"):
            CSC(row, colptr + 1, None, (7, len(counts)))
    with pytest.raises(ValueError, match="colptr has .* entries; it needs"):
        CSC(row, colptr, None, (7, len(counts) + 1))


def test_csc_refuses_what_is_not_its_fields():
    row, colptr = torch.tensor([0, 1]), torch.tensor([0, 2])
    with pytest.raises(TypeError, match="CSC's row is a 1-D integer tensor"):
        CSC([0, 1], colptr, None, (2, 1))
    with pytest.raises(TypeError, match="row holds torch.float32"):
        CSC(row.float(), colptr, None, (2, 1))
    with pytest.raises(TypeError, match="colptr holds torch.bool"):
        CSC(row, torch.tensor([False, True]), None, (2, 1))
    with pytest.raises(TypeError, match=r"size\[0\] takes an integer"):
        CSC(row, colptr, None, (2.0, 1))
    with pytest.raises(TypeError, match="size is a tuple of sizes"):
        CSC(row, colptr, None, 2)
    with pytest.raises(ValueError, match="size is \\(num_src, num_dst\\)"):
        CSC(row, colptr, None, (2, 1, 1))
    with pytest.raises(ValueError, match=r"size\[1\] must be at least 0"):
        CSC(row, colptr, None, (2, -1))
    with pytest.raises(ValueError, match="row must be 1-D"):
        CSC(row.reshape(1, 2), colptr, None, (2, 1))
    with pytest.raises(ValueError, match="perm holds 1 edge ids for 2 edges"):
        CSC(row, colptr, torch.tensor([0]), (2, 1))
    assert CSC(torch.empty(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), None, (0, 0)).num_edges == 0


@FAST
@given(st.integers(1, 8), st.data())
def test_a_csc_inverts_only_a_permutation(num_edges, data):
    perm = data.draw(st.lists(st.integers(0, num_edges - 1), min_size=num_edges, max_size=num_edges))
    csc = CSC(torch.arange(num_edges), torch.tensor([0, num_edges]), torch.tensor(perm), (num_edges, 1))
    if sorted(perm) == list(range(num_edges)):
        row, _ = csc.coo_in_given_order()
        assert row[torch.tensor(perm)].tolist() == list(range(num_edges))
    else:
        with pytest.raises(ValueError, match="perm lists every row once"):
            csc.coo_in_given_order()


@FAST
@given(st.integers(0, 6), st.lists(st.integers(-1, 7), max_size=10))
def test_index2ptr_counts_sorted_ids_in_range(size, ids):
    index = torch.tensor(ids, dtype=torch.int64)
    if ids != sorted(ids):
        with pytest.raises(ValueError, match="index must be sorted"):
            index2ptr(index, size)
    elif ids and (ids[0] < 0 or ids[-1] >= size):
        with pytest.raises(IndexError, match="index: index"):
            index2ptr(index, size)
    else:
        ptr = index2ptr(index, size)
        assert ptr.tolist() == [sum(i < v for i in ids) for v in range(size + 1)]
        assert ptr2index(ptr, len(ids)).tolist() == ids == ptr2index(ptr).tolist()


@given(NOT_INTEGERS)
def test_index2ptr_and_stable_sort_take_integer_sizes(size):
    with pytest.raises(TypeError, match="size takes an integer"):
        index2ptr(torch.tensor([0]), size)
    with pytest.raises(TypeError, match="num_dst takes an integer"):
        stable_sort(torch.tensor([0]), size)


def test_index2ptr_and_stable_sort_take_1d_integer_ids():
    for call, name in ((index2ptr, "index"), (stable_sort, "col")):
        with pytest.raises(TypeError, match=f"{name} holds torch.float32"):
            call(torch.tensor([0.0, 1.0]), 3)
        with pytest.raises(ValueError, match=f"{name} must be 1-D"):
            call(torch.zeros(2, 2, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="size must be at least 0"):
        index2ptr(torch.tensor([0]), -1)


@FAST
@given(st.lists(st.integers(-2, 4), max_size=8), st.one_of(st.none(), st.integers(0, 12)))
def test_ptr2index_takes_offsets_and_their_true_size(ptr, output_size):
    tensor = torch.tensor(ptr, dtype=torch.int64)
    ok = bool(ptr) and ptr[0] == 0 and all(b >= a for a, b in zip(ptr, ptr[1:]))
    if ok and output_size in (None, ptr[-1]):
        assert ptr2index(tensor, output_size).tolist() == [v for v in range(len(ptr) - 1)
                                                          for _ in range(ptr[v + 1] - ptr[v])]
    else:  # falling offsets, a wrong start or size: refused, never a wrong-length array of what memory held
        with pytest.raises(ValueError, match="ptr"):
            ptr2index(tensor, output_size)
    with pytest.raises(TypeError, match="output_size takes an integer"):
        ptr2index(torch.tensor([0, 1]), 1.0)
    with pytest.raises(TypeError, match="ptr holds torch.float64"):
        ptr2index(torch.tensor([0.0, 1.0], dtype=torch.float64))


@FAST
@given(st.integers(0, 5), st.lists(st.integers(-1, 6), max_size=10))
def test_stable_sort_keeps_ties_in_order_and_refuses_ids_out_of_range(num_dst, ids):
    col = torch.tensor(ids, dtype=torch.int64)
    if all(0 <= i < num_dst for i in ids):
        values, perm = stable_sort(col, num_dst)
        assert perm.tolist() == sorted(range(len(ids)), key=lambda k: ids[k])
        assert values.tolist() == sorted(ids)
    else:
        with pytest.raises(IndexError, match="col: index"):
            stable_sort(col, num_dst)


# ---- sample_hop ----------------------------------------------------------------------------------------------
@FAST
@given(graphs(), st.sampled_from([-1, 0, 1, 3, 2**31]), st.booleans(), st.data())
def test_sample_hop_gives_min_k_degree_neighbours(graph, k, replace, data):
    n, csc = graph
    topo = Topology(csc, "cpu", progress=False)
    seeds = torch.tensor(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n)), dtype=torch.int64)
    if replace and k == 2**31:
        k = 5  # with replacement a seed gets k draws: the output itself is k per seed
    nbr, eid, counts = sample_hop(topo, seeds, k, replace, 7)
    degree = csc.colptr.diff()[seeds] if len(seeds) else torch.zeros(0, dtype=torch.int64)
    want = degree if k < 0 else (torch.where(degree > 0, k, 0) if replace else degree.clamp(max=k))
    assert torch.equal(counts, want)
    assert len(nbr) == len(eid) == int(counts.sum())
    owner = torch.arange(len(seeds)).repeat_interleave(counts)
    assert bool(((eid >= csc.colptr[seeds[owner]]) & (eid < csc.colptr[seeds[owner] + 1])).all())
    assert torch.equal(nbr, csc.row[eid])


def test_sample_hop_refuses_bad_arguments_by_name():
    csc = to_csc(torch.tensor([[0, 1, 2], [1, 1, 0]]), "coo", size=(3, 3))
    topo = Topology(csc, "cpu", progress=False)
    seeds = torch.tensor([0, 1])
    with pytest.raises(TypeError, match="samples a hmgstore.graph.Topology"):
        sample_hop(csc, seeds, 2, False, 0)
    for k in (2.5, True, "2"):
        with pytest.raises(TypeError, match="k takes an integer"):
            sample_hop(topo, seeds, k, False, 0)
    with pytest.raises(ValueError, match="k must be at least -1"):
        sample_hop(topo, seeds, -2, False, 0)
    with pytest.raises(TypeError, match="replace is a bool"):
        sample_hop(topo, seeds, 2, 1, 0)
    with pytest.raises(TypeError, match="key takes an integer"):
        sample_hop(topo, seeds, 2, False, 1.5)
    with pytest.raises(TypeError, match="key is an integer or a one-element integer tensor"):
        sample_hop(topo, seeds, 2, False, torch.tensor([1.5]))
    with pytest.raises(TypeError, match="seeds holds torch.float32"):
        sample_hop(topo, seeds.float(), 2, False, 0)
    with pytest.raises(ValueError, match="seeds must be 1-D"):
        sample_hop(topo, seeds.reshape(2, 1), 2, False, 0)
    with pytest.raises(IndexError, match="seeds: index 3 at position 1"):
        sample_hop(topo, torch.tensor([0, 3]), 2, False, 0)
    with pytest.raises(ValueError, match="index holds 1 ids for 2 seeds"):
        sample_hop(topo, seeds, 2, False, 0, index=torch.tensor([0]))
    with pytest.raises(ValueError, match="seed_time and strategy='last' apply to a temporal topology only"):
        sample_hop(topo, seeds, 2, False, 0, seed_time=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="seed_time and strategy='last' apply to a temporal topology only"):
        sample_hop(topo, seeds, 2, False, 0, strategy="last")
    with pytest.raises(ValueError, match="strategy is one of"):
        sample_hop(topo, seeds, 2, False, 0, strategy="newest")
    timed = Topology(csc, "cpu", progress=False, edge_time=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="this topology is temporal"):
        sample_hop(timed, seeds, 2, False, 0)
    with pytest.raises(ValueError, match="seed_time holds 1 times for 2 seeds"):
        sample_hop(timed, seeds, 2, False, 0, seed_time=torch.tensor([1]))
    assert sample_hop(timed, seeds, 2, False, 0, seed_time=torch.tensor([1, 1]))[2].tolist() == [1, 2]
    assert torch.equal(sample_hop(topo, seeds, 2, False, torch.tensor(7))[1], sample_hop(topo, seeds, 2, False, 7)[1])
    topo.close()
    with pytest.raises(RuntimeError, match="closed"):
        sample_hop(topo, seeds, 2, False, 0)


# ---- NeighborSampler -----------------------------------------------------------------------------------------
def _sampler(n=4, **kw):
    csc = to_csc(torch.tensor([[0, 1, 2, 3], [1, 1, 0, 2]]), "coo", size=(n, n))
    return NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: n}, [2, 2], **kw)


@FAST
@given(graphs(), st.lists(st.sampled_from([-1, 0, 2, 2**31]), min_size=1, max_size=3), st.data())
def test_a_sampler_batch_is_consistent_with_its_graph(graph, fanout, data):
    n, csc = graph
    sampler = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: n}, fanout,
                              generator=torch.Generator().manual_seed(1))
    seeds = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n, unique=True)) if n else []
    out = sampler.sample({None: torch.tensor(seeds, dtype=torch.int64)})
    node, row, col = out.node[None], out.row[None], out.col[None]
    assert node[:len(seeds)].tolist() == seeds and len(set(node.tolist())) == len(node)
    edges = set(zip(csc.row.tolist(), csc.col().tolist()))
    assert all((int(node[r]), int(node[c])) in edges for r, c in zip(row, col))  # every sampled edge is real
    assert sum(out.num_sampled_nodes[None]) == len(node) and sum(out.num_sampled_edges[None]) == len(row)


def test_a_sampler_refuses_bad_arguments_by_name():
    csc = to_csc(torch.tensor([[0, 1], [1, 0]]), "coo", size=(2, 2))
    topo = Topology(csc, "cpu", progress=False)
    with pytest.raises(TypeError, match="topologies is a dict"):
        NeighborSampler([topo], {None: 2}, [2])
    with pytest.raises(TypeError, match="num_nodes is a dict"):
        NeighborSampler({None: topo}, 2, [2])
    with pytest.raises(TypeError, match=r"topologies\[None\] is a hmgstore.graph.Topology"):
        NeighborSampler({None: csc}, {None: 2}, [2])
    with pytest.raises(TypeError, match=r"num_nodes\[None\] takes an integer"):
        NeighborSampler({None: topo}, {None: 2.0}, [2])
    with pytest.raises(ValueError, match=r"num_nodes\[None\] must be at least 0"):
        NeighborSampler({None: topo}, {None: -1}, [2])
    with pytest.raises(ValueError, match="joins 2 -> 2 nodes, but the node types have 3"):
        NeighborSampler({None: topo}, {None: 3}, [2])
    with pytest.raises(ValueError, match="which num_nodes does not count"):
        NeighborSampler({("a", "to", "b"): topo}, {"a": 2}, [2])
    with pytest.raises(ValueError, match="at least one edge type"):
        NeighborSampler({}, {None: 2}, [2])
    for fanout, error in ((2, TypeError), ([1.5], TypeError), ([True], TypeError), ([-2], ValueError)):
        with pytest.raises(error, match="num_neighbors"):
            NeighborSampler({None: topo}, {None: 2}, fanout)
    with pytest.raises(ValueError, match="names edge types"):
        NeighborSampler({None: topo}, {None: 2}, {"x": [2]})
    for flag in ("replace", "disjoint", "cuda_graphs", "labor"):
        with pytest.raises(TypeError, match=f"{flag} is a bool"):
            NeighborSampler({None: topo}, {None: 2}, [2], **{flag: "yes"})
    with pytest.raises(TypeError, match="generator is a torch.Generator"):
        NeighborSampler({None: topo}, {None: 2}, [2], generator=0)
    with pytest.raises(ValueError, match="dedup is 'sort' or, on a GPU, 'hash'"):
        NeighborSampler({None: topo}, {None: 2}, [2], dedup="hash")
    with pytest.raises(ValueError, match="temporal_strategy is one of"):
        NeighborSampler({None: topo}, {None: 2}, [2], temporal_strategy="newest")
    with pytest.raises(ValueError, match="temporal_strategy='last' applies to topologies with times"):
        NeighborSampler({None: topo}, {None: 2}, [2], temporal_strategy="last")
    with pytest.raises(ValueError, match="LABOR sampling is defined here without replacement"):
        NeighborSampler({None: topo}, {None: 2}, [2], labor=True, replace=True)
    with pytest.raises(ValueError, match="both weights and times"):
        both = Topology(csc, "cpu", progress=False, weight=torch.ones(2), edge_time=torch.zeros(2, dtype=torch.int64))
        NeighborSampler({None: both}, {None: 2}, [2])


def test_a_sampler_refuses_bad_seeds_before_sampling():
    sampler = _sampler()
    with pytest.raises(TypeError, match="seeds is a dict node type -> ids"):
        sampler.sample(torch.tensor([0]))
    with pytest.raises(KeyError, match="no node type 'paper'"):
        sampler.sample({"paper": [0]})
    with pytest.raises(TypeError, match="integer"):
        sampler.sample({None: torch.tensor([0.5])})
    with pytest.raises(IndexError, match="index 4 at position 0"):
        sampler.sample({None: [4]})
    with pytest.raises(ValueError, match="seed times were given, but no edge type has times"):
        sampler.sample({None: [0]}, seed_time={None: [1]})
    timed = Topology(to_csc(torch.tensor([[0], [1]]), "coo", size=(2, 2)), "cpu", progress=False,
                     edge_time=torch.zeros(1, dtype=torch.int64))
    temporal = NeighborSampler({None: timed}, {None: 2}, [1])
    with pytest.raises(ValueError, match="temporal sampling needs each seed's time"):
        temporal.sample({None: [1]})
    with pytest.raises(ValueError, match="seed_time holds 2 times for 1 seeds"):
        temporal.sample({None: [1]}, seed_time={None: [0, 0]})
    sampler.close()
    with pytest.raises(RuntimeError, match="closed"):
        sampler.sample({None: [0]})


# ---- Sample and Hotness: what their constructors check --------------------------------------------------------
def _sample(**changes):
    fields = dict(node={None: torch.tensor([0, 1])}, row={None: torch.tensor([1])}, col={None: torch.tensor([0])},
                  edge={None: torch.tensor([0])}, batch=None, num_sampled_nodes={None: [1, 1]},
                  num_sampled_edges={None: [1]})
    return Sample(**{**fields, **changes})


def test_a_sample_checks_its_shape():
    assert _sample().node[None].tolist() == [0, 1]
    assert _sample(edge={None: None}).edge[None] is None  # the distributed sampler keeps no edge ids
    with pytest.raises(TypeError, match="Sample's row is a dict keyed by edge type"):
        _sample(row=[torch.tensor([1])])
    with pytest.raises(TypeError, match=r"Sample's node\[None\] is a 1-D tensor"):
        _sample(node={None: [0, 1]})
    with pytest.raises(TypeError, match=r"num_sampled_nodes\[None\]\[0\] takes an integer"):
        _sample(num_sampled_nodes={None: [1.0, 1]})
    with pytest.raises(ValueError, match="row, col, edge must have the same keys"):
        _sample(col={"x": torch.tensor([0])})
    with pytest.raises(ValueError, match="node, num_sampled_nodes must have the same keys"):
        _sample(num_sampled_nodes={"x": [2]})
    with pytest.raises(ValueError, match="row, col and edge differ in length"):
        _sample(col={None: torch.tensor([0, 0])})
    with pytest.raises(ValueError, match="num_sampled_nodes sums to 3 for 2 nodes"):
        _sample(num_sampled_nodes={None: [1, 2]})
    with pytest.raises(ValueError, match="num_sampled_edges sums to 2 for 1 edges"):
        _sample(num_sampled_edges={None: [1, 1]})
    with pytest.raises(ValueError, match="batch holds 1 entries for 2 nodes"):
        _sample(batch={None: torch.tensor([0])})


@FAST
@given(st.integers(0, 6), st.integers(0, 6), st.integers(-2, 3))
def test_hotness_checks_its_counts(n_features, n_topology, batches):
    features, topology = {None: torch.ones(n_features, dtype=torch.int64)}, {None: torch.ones(n_topology,
                                                                                           dtype=torch.int64)}
    if batches < 0:
        with pytest.raises(ValueError, match="batches must be at least 0"):
            Hotness(features, topology, batches)
    elif n_features != n_topology:
        with pytest.raises(ValueError, match="feature counts and .* topology counts"):
            Hotness(features, topology, batches)
    else:
        assert Hotness(features, topology, batches).batches == batches
    with pytest.raises(TypeError, match="Hotness.features is a dict"):
        Hotness(torch.ones(2), topology, 0)
    with pytest.raises(TypeError, match=r"Hotness.topology\[None\] is an integer tensor"):
        Hotness(features, {None: torch.ones(n_features)}, 0)
    with pytest.raises(TypeError, match="batches takes an integer"):
        Hotness(features, features, 1.5)
    with pytest.raises(ValueError, match="holds a negative count"):
        Hotness({None: torch.tensor([-1])}, {None: torch.tensor([0])}, 0)
    with pytest.raises(ValueError, match="count other node types"):
        Hotness(features, {"x": features[None]}, 0)
    with pytest.raises(ValueError, match="is 1-D"):
        Hotness({None: torch.ones(1, 1, dtype=torch.int64)}, {None: torch.ones(1, 1, dtype=torch.int64)}, 0)


@FAST
@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=8), st.data())
def test_hit_ratio_is_the_cached_share(counts, data):
    cached = data.draw(st.lists(st.integers(0, max(len(counts) - 1, 0)), max_size=len(counts), unique=True)) \
        if counts else []
    want = sum(counts[c] for c in cached) / sum(counts) if sum(counts) else 0.0
    got = hit_ratio(torch.tensor(counts, dtype=torch.float64), torch.tensor(cached, dtype=torch.int64))
    assert 0.0 <= got <= 1.0 and got == pytest.approx(want)
    assert hit_ratio(torch.tensor([1, 1]), [0]) == 0.5  # integer counts; float ones are never truncated:
    assert hit_ratio(torch.tensor([0.5, 0.25]), [0]) == pytest.approx(2 / 3)


def test_hit_ratio_refuses_bad_counts_and_ids():
    with pytest.raises(ValueError, match="counts.*NaN"):
        hit_ratio(torch.tensor([1.0, float("nan")]), [0])
    for bad in ([1.0, float("inf")], [1, -1]):
        with pytest.raises(ValueError, match="finite and 0 or more"):
            hit_ratio(torch.tensor(bad), [0])
    with pytest.raises(ValueError, match="counts is 1-D"):
        hit_ratio(torch.ones(2, 2), [0])
    with pytest.raises(TypeError, match="counts is one real score per row"):
        hit_ratio(torch.ones(2, dtype=torch.complex64), [0])
    with pytest.raises(TypeError, match="cached is row ids"):
        hit_ratio(torch.ones(2), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="cached lists row 0 more than once"):
        hit_ratio(torch.ones(2), [0, 0])
    with pytest.raises(ValueError, match="cached must be 1-D"):
        hit_ratio(torch.ones(2), torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(IndexError, match="cached: index 2"):
        hit_ratio(torch.ones(2), [2])


# ---- data: NodeGraph, power_law_csc ----------------------------------------------------------------------------
def _node_graph(**changes):
    fields = dict(edge_index=torch.tensor([[0, 1], [1, 2]]), x=torch.zeros(3, 2), y=torch.tensor([0, 1, -1]),
                  train_idx=torch.tensor([0]), val_idx=torch.tensor([1]), test_idx=torch.tensor([2]), num_classes=2)
    return NodeGraph(**{**fields, **changes})


def test_a_node_graph_checks_its_fields():
    assert _node_graph().num_nodes == 3
    with pytest.raises(TypeError, match="NodeGraph.x is a tensor"):
        _node_graph(x=np.zeros((3, 2)))
    with pytest.raises(TypeError, match="num_classes takes an integer"):
        _node_graph(num_classes=2.0)
    with pytest.raises(ValueError, match="num_classes must be at least 1"):
        _node_graph(num_classes=0)
    with pytest.raises(TypeError, match="edge_index.*ids are integers"):
        _node_graph(edge_index=torch.tensor([[0.0], [1.0]]))
    with pytest.raises(TypeError, match="y holds torch.float32"):
        _node_graph(y=torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="edge_index is \\[2, num_edges\\]"):
        _node_graph(edge_index=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="NodeGraph.x is \\[num_nodes, feature_dim\\]"):
        _node_graph(x=torch.zeros(3))
    with pytest.raises(ValueError, match="y holds 2 labels for 3 nodes"):
        _node_graph(y=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="y must be 1-D"):
        _node_graph(y=torch.zeros(3, 1, dtype=torch.int64))
    for label in (2, -2):
        with pytest.raises(ValueError, match=f"holds the label {label}"):
            _node_graph(y=torch.tensor([0, label, 1]))
    with pytest.raises(ValueError, match="train_idx must be 1-D"):
        _node_graph(train_idx=torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(IndexError, match=r"edge_index\[1\]: index 3"):
        _node_graph(edge_index=torch.tensor([[0], [3]]))
    with pytest.raises(IndexError, match="test_idx: index -1"):
        _node_graph(test_idx=torch.tensor([-1]))


@FAST
@given(st.integers(0, 40), st.integers(0, 300), st.floats(0, 60), st.one_of(st.none(), st.floats(0, 4)),
       st.integers(0, 2**64 - 1))
def test_power_law_graphs_have_the_size_asked_for(num_nodes, num_edges, skew, source_skew, seed):
    if num_edges and not num_nodes:
        with pytest.raises(ValueError, match="edges need nodes"):
            power_law_csc(num_nodes, num_edges, skew)
        return
    csc = power_law_csc(num_nodes, num_edges, skew, seed=seed, source_skew=source_skew)
    assert csc.size == (num_nodes, num_nodes) and csc.colptr.tolist()[-1] == num_edges == csc.num_edges
    assert bool((csc.colptr.diff() >= 0).all()) and (num_edges == 0 or 0 <= int(csc.row.min()) <= int(
        csc.row.max()) < num_nodes)
    again = power_law_csc(num_nodes, num_edges, skew, seed=seed, source_skew=source_skew)
    assert torch.equal(csc.row, again.row) and torch.equal(csc.colptr, again.colptr)


def test_power_law_refuses_bad_sizes_by_name():
    for name, args in (("num_nodes", (2.0, 1, 1.0)), ("num_edges", (2, True, 1.0)), ("seed", (2, 1, 1.0, 0.5))):
        with pytest.raises(TypeError, match=f"{name} takes an integer"):
            power_law_csc(*args)
    with pytest.raises(ValueError, match="num_edges must be at least 0"):
        power_law_csc(2, -1, 1.0)
    with pytest.raises(ValueError, match="seed is under 2\\*\\*64"):
        power_law_csc(2, 1, 1.0, seed=2**64)
    with pytest.raises(ValueError, match="seed must be at least 0"):
        power_law_csc(2, 1, 1.0, seed=-1)
    for skew, error in (("1", TypeError), (True, TypeError), (float("nan"), ValueError), (float("inf"), ValueError),
                        (-1.0, ValueError)):
        with pytest.raises(error, match="skew"):
            power_law_csc(4, 4, skew)
        with pytest.raises(error, match="source_skew"):
            power_law_csc(4, 4, 1.0, source_skew=skew)


# ---- Tier, Placement -------------------------------------------------------------------------------------------
def test_a_tier_checks_its_fields():
    assert hmgstore.Tier("gpu", 0, 2, torch.tensor([3, 1], dtype=torch.int32)).rows.dtype == torch.int64
    assert hmgstore.Tier("host", 2, 5, stored=get_format("bfloat16")).size == 3
    with pytest.raises(TypeError, match="a tier's name is a string"):
        hmgstore.Tier(0, 0, 1)
    with pytest.raises(ValueError, match="a tier is called"):
        hmgstore.Tier("disk", 0, 1)
    for field, value in (("start", 1.0), ("end", True), ("base", "0"), ("pitch", None)):
        kw = {"start": 0, "end": 0, field: value}
        with pytest.raises(TypeError, match=f"Tier.{field} takes an integer"):
            hmgstore.Tier("host", **kw)
    with pytest.raises(ValueError, match="Tier.pitch must be at least 0"):
        hmgstore.Tier("host", 0, 1, pitch=-4)
    with pytest.raises(ValueError, match="ends \\(1\\) before it starts \\(2\\)"):
        hmgstore.Tier("host", 2, 1)
    with pytest.raises(ValueError, match="the host tier has no rows"):
        hmgstore.Tier("host", 0, 1, torch.tensor([0]))
    with pytest.raises(ValueError, match="the host tier has no rows"):
        hmgstore.Tier("shard0", 0, 1)
    with pytest.raises(TypeError, match="rows is an integer tensor"):
        hmgstore.Tier("gpu", 0, 1, [0])
    with pytest.raises(TypeError, match="rows holds torch.float32"):
        hmgstore.Tier("gpu", 0, 1, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="rows must be 1-D"):
        hmgstore.Tier("gpu", 0, 1, torch.tensor([[0]]))
    with pytest.raises(ValueError, match="spans 2 new ids but lists 1 rows"):
        hmgstore.Tier("gpu", 0, 2, torch.tensor([0]))
    with pytest.raises(TypeError, match="stored is a hmgstore.rows.formats.Format"):
        hmgstore.Tier("host", 0, 1, stored="bfloat16")


@FAST
@given(st.integers(0, 8), st.data())
def test_a_placement_maps_every_row_once(n, data):
    gpu = data.draw(st.lists(st.integers(-1, n), max_size=n + 1))
    host = data.draw(st.booleans())
    tiers = [hmgstore.Tier("gpu", 0, len(gpu), torch.tensor(gpu, dtype=torch.int64))] if gpu else []
    if host:
        tiers.append(hmgstore.Tier("host", len(gpu), len(gpu) + n))
    valid = all(0 <= r < n for r in gpu)
    once = len(set(gpu)) == len(gpu)
    if not valid:
        with pytest.raises(IndexError, match="tier 'gpu': index"):
            hmgstore.Placement(n, tiers)
    elif not once:
        with pytest.raises(ValueError, match="a row is listed twice"):
            hmgstore.Placement(n, tiers)
    elif not host and len(gpu) != n:
        with pytest.raises(ValueError, match="without a host tier the resident tiers hold every row"):
            hmgstore.Placement(n, tiers)
    else:
        p = hmgstore.Placement(n, tiers)
        new = p.new_of_old()
        if new is not None:  # every old row has one new id, each in a tier that holds it
            assert sorted(new.tolist()) == sorted(set(new.tolist())) and len(new) == n
            for old, k in enumerate(new.tolist()):
                tier = next(t for t in p.tiers if t.start <= k < t.end)
                assert (tier.rows[k - tier.start] if tier.rows is not None else k - tier.start) == old


def test_a_placement_refuses_bad_tiers_and_layouts():
    gpu, host = hmgstore.Tier("gpu", 0, 1, torch.tensor([0])), hmgstore.Tier("host", 1, 4)
    assert hmgstore.Placement(3, [gpu, host], torch.tensor([2, 0, 1])).tiers == (gpu, host)
    with pytest.raises(TypeError, match="num_rows takes an integer"):
        hmgstore.Placement(3.0, (gpu, host))
    with pytest.raises(ValueError, match="num_rows must be at least 0"):
        hmgstore.Placement(-1, ())
    with pytest.raises(TypeError, match="tiers are hmgstore.Tier objects"):
        hmgstore.Placement(3, ("gpu", host))
    with pytest.raises(ValueError, match="names each tier once"):
        hmgstore.Placement(1, (gpu, hmgstore.Tier("gpu", 1, 2, torch.tensor([0]))))
    with pytest.raises(ValueError, match="starts at new id 2, where the tiers before it end at 1"):
        hmgstore.Placement(3, (gpu, hmgstore.Tier("host", 2, 5)))
    with pytest.raises(ValueError, match="the host tier comes last"):
        hmgstore.Placement(3, (hmgstore.Tier("host", 0, 3), hmgstore.Tier("gpu", 3, 4, torch.tensor([0]))))
    with pytest.raises(ValueError, match="the host tier comes last and holds every one of the 4 rows"):
        hmgstore.Placement(4, (gpu, host))
    with pytest.raises(ValueError, match="this placement has no host tier"):
        hmgstore.Placement(1, (gpu,), torch.tensor([0]))
    with pytest.raises(ValueError, match="host_layout lists every row once"):
        hmgstore.Placement(3, (gpu, host), torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match="host_layout holds torch.float32"):
        hmgstore.Placement(3, (gpu, host), torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(IndexError, match="host_layout: index 3"):
        hmgstore.Placement(3, (gpu, host), torch.tensor([0, 1, 3]))


# ---- ShardedTensor, Producer -----------------------------------------------------------------------------------
def test_a_sharded_table_refuses_bad_arguments_on_the_cpu_too():
    x = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    with hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hot_order=[3, 1]) as t:
        assert torch.equal(t[[3, 9]], x[[3, 9]])
    with pytest.raises(TypeError, match="cannot build a table from list"):
        hmgstore.ShardedTensor([[1.0]], ["cpu"], gpu_budget=64)
    with pytest.raises(ValueError, match="at least one dimension"):
        hmgstore.ShardedTensor(torch.zeros(()), ["cpu"], gpu_budget=64)
    for devices in ("cpu", torch.device("cpu"), 0):
        with pytest.raises(TypeError, match="devices is a list of devices"):
            hmgstore.ShardedTensor(x, devices, gpu_budget=64)
    with pytest.raises(ValueError, match="devices is empty"):
        hmgstore.ShardedTensor(x, [], gpu_budget=64)
    with pytest.raises(ValueError, match="each device may appear once"):
        hmgstore.ShardedTensor(x, ["cpu", "cpu"], gpu_budget=64)
    with pytest.raises(ValueError, match="needs gpu_budget"):
        hmgstore.ShardedTensor(x, ["cpu"])
    for budget in (-1, "lots"):
        with pytest.raises(ValueError, match="size"):
            hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=budget)
    with pytest.raises(ValueError, match="replicate .* must fit in gpu_budget"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, replicate=128)
    with pytest.raises(ValueError, match="not both"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hot_order=[0], hotness=torch.ones(10))
    with pytest.raises(TypeError, match="hot_order is row ids"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hot_order=[0.5])
    with pytest.raises(ValueError, match="hot_order lists row 1 more than once"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hot_order=[1, 1])
    with pytest.raises(IndexError, match="hot_order: index 10"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hot_order=[10])
    with pytest.raises(ValueError, match="hotness has 3 entries for 10 rows"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hotness=torch.ones(3))
    with pytest.raises(ValueError, match="is NaN"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hotness=torch.full((10,), float("nan")))
    with pytest.raises(TypeError, match="hotness is one real score per row"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, hotness=torch.ones(10, dtype=torch.complex64))
    for max_sms in (0, -1, 2.5, "auto"):
        with pytest.raises(ValueError, match="max_sms is a number of SMs"):
            hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, max_sms=max_sms)
    with pytest.raises(TypeError, match="progress is a bool"):
        hmgstore.ShardedTensor(x, ["cpu"], gpu_budget=64, progress="no")


def _loader():
    return [1, 2]


def test_a_producer_checks_its_arguments_before_starting():
    assert hmgstore.Producer(_loader, depth=1, seed=3, sm_percent=100, fuse="auto", device="cpu").process is None
    with pytest.raises(TypeError, match="make_loader is a picklable callable"):
        hmgstore.Producer([1, 2])
    for name, value in (("depth", 1.5), ("depth", True), ("seed", 0.5), ("sm_percent", 50.5), ("sm_percent", True)):
        with pytest.raises(TypeError, match=f"{name} takes an integer"):
            hmgstore.Producer(_loader, **{name: value})
    with pytest.raises(ValueError, match="depth must be at least 1"):
        hmgstore.Producer(_loader, depth=0)
    for percent in (0, 101):
        with pytest.raises(ValueError, match="sm_percent is a share of the GPU's SMs, 1 to 100"):
            hmgstore.Producer(_loader, sm_percent=percent)
    for fuse in (0, 1.5, True, "all"):
        with pytest.raises(ValueError, match="fuse is the number of batches"):
            hmgstore.Producer(_loader, fuse=fuse)
    with pytest.raises(ValueError, match="max_sms is a number of SMs"):
        hmgstore.Producer(_loader, max_sms=0)
    with pytest.raises(ValueError, match="overlap_reads is True, False or 'auto'"):
        hmgstore.Producer(_loader, overlap_reads="yes")


def test_offsets_edited_after_the_stores_are_built_do_not_reach_the_sampler():
    """The sampler reads row through its own copy of colptr: a caller's later edit (here past every edge)
    changes nothing it samples, and never makes it read outside row."""
    from torch_geometric.sampler import NodeSamplerInput

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_tensors

    row, colptr = torch.tensor([1, 2, 3, 4, 0]), torch.tensor([0, 1, 2, 3, 4, 5])
    stores = from_tensors(csc=(row, colptr), x=torch.randn(5, 2), progress=False)
    before = HybridNeighborSampler(stores, [-1])
    colptr[1], colptr[5] = 7, 10**6
    for sampler in (before, HybridNeighborSampler(stores, [-1])):
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=torch.arange(5)))
        assert sorted(out.node.tolist()) == [0, 1, 2, 3, 4] and out.row.numel() == 5


@pytest.mark.parametrize("value", [1e300, 3.5e38, -1e300, float("nan"), float("inf")])
def test_an_edge_weight_past_float32_is_named_as_given(value):
    """Weights are stored as float32: a float64 weight past its range is refused by its own value, not as
    the inf the cast would make of it; the largest float32 itself is accepted."""
    csc = to_csc(torch.tensor([[0, 1, 2], [1, 2, 0]]), "coo", (3, 3))
    weight = torch.tensor([1.0, value, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape(f"edge weight 1 is {weight[1].item()}")):
        edge_weight_in_csc_order(weight, csc)
    top = float(torch.finfo(torch.float32).max)
    stored = edge_weight_in_csc_order(np.array([1.0, top, 2.0]), csc)
    assert stored.dtype == torch.float32 and sorted(stored.tolist()) == [1.0, 2.0, top]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=120),
       st.integers(1, 6), st.integers(1, 7))
def test_expected_draws_sums_each_lists_share_per_source(n, edges, fanout, chunk):
    """expected_draws(csc, k)[u] = sum over the lists holding u of min(1, k / len(list)), whatever the chunking."""
    import importlib

    from hmgstore.graph import expected_draws
    presample_module = importlib.import_module("hmgstore.graph.presample")
    edges = [(s % n, d % n) for s, d in edges]
    csc = to_csc(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t(), "coo", size=(n, n))
    want = [0.0] * n
    for d in range(n):
        src = [s for s, dd in edges if dd == d]
        for s in src:
            want[s] += min(1.0, fanout / len(src))
    original = presample_module._DRAWS_CHUNK
    presample_module._DRAWS_CHUNK = chunk
    try:
        got = expected_draws(csc, fanout)
    finally:
        presample_module._DRAWS_CHUNK = original
    assert got.dtype == torch.float64 and got.tolist() == pytest.approx(want)
    with pytest.raises(ValueError, match="fanout"):
        expected_draws(csc, 0)


def test_the_stores_default_hotness_is_expected_draws_per_source_type():
    """from_data's default ranking: expected draws summed over the edge types out of each node type (a node
    type no edge draws from scores 0), not the in-degree, which ranks a directed graph's rows no better than
    chance."""
    pyg = pytest.importorskip("torch_geometric")
    from hmgstore.plugins.pyg import from_data
    data = pyg.data.HeteroData()
    data["a"].x, data["b"].x = torch.randn(4, 2), torch.randn(3, 2)
    data["a", "to", "b"].edge_index = torch.tensor([[0, 0, 1, 2], [0, 1, 1, 2]])
    data["b", "to", "b"].edge_index = torch.tensor([[0, 1], [2, 2]])
    _, graph_store = from_data(data, device="cpu", gpu_budget=None, progress=False)
    draws = graph_store.expected_draws()
    # a0 is in b0's and b1's lists, a1 in b1's, a2 in b2's (lists of at most 2: fanout 10 takes them whole);
    # b0 and b1 are in b2's list of the b -> b edges
    assert draws["a"].tolist() == [2.0, 1.0, 1.0, 0.0]
    assert draws["b"].tolist() == [1.0, 1.0, 0.0]
    assert set(draws) == {"a", "b"}


def test_expected_draws_checks_its_inputs():
    from hmgstore.graph import CSC, expected_draws
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(TypeError, match="to_csc"):
        expected_draws(edge_index, 5)
    csc = to_csc(edge_index, "coo", (3, 3))
    assert expected_draws(csc, 2**70).tolist() == [1.0, 1.0, 1.0]  # past every list: every edge, no overflow
    with pytest.raises(TypeError, match="one integer"):
        expected_draws(csc, torch.tensor([3]))
    row = csc.row.clone()
    mine = CSC(row, csc.colptr, None, csc.size)
    row[0] = 100  # the caller's row, edited after the CSC was built
    with pytest.raises(IndexError, match="neighbour id 100"):
        expected_draws(mine, 2)


def test_expected_draws_are_the_same_in_any_edge_order_and_on_the_gpu():
    """Fixed-point sums: the ranking of a graph's rows never depends on the order edges are added in, so the
    GPU's atomics (any order) give the CPU's answer bit for bit and from_data places the same rows every run."""
    from hmgstore.graph import expected_draws
    csc = power_law_csc(2_000, 30_000, 1.5, seed=3)
    want = expected_draws(csc, 7)
    perm = torch.randperm(csc.num_edges, generator=torch.Generator().manual_seed(0))
    shuffled = to_csc(torch.stack([csc.row.long()[perm], csc.col().long()[perm]]), "coo", csc.size)
    assert not torch.equal(shuffled.row, csc.row)  # the lists hold their neighbours in another order
    assert torch.equal(expected_draws(shuffled, 7), want)
    if torch.cuda.is_available():
        assert torch.equal(expected_draws(csc, 7, device="cuda"), want)
    assert want.dtype == torch.float64 and float(want.sum()) > 0
