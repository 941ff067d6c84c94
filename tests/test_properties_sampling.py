"""Property tests of CPU neighbour sampling on random small graphs (repeated edges, self loops, isolated nodes):
every sampled edge is one of the graph's, without replacement a seed gets exactly ``min(k, degree)`` distinct edges,
``-1`` takes every edge once, zero-weight edges are drawn only once every positive one is taken, temporal samples
never reach past a seed's time, the same generator gives the same sample, and induced subgraphs equal a brute-force
reference.

References are brute-force loops over the COO edge list. The hypothesis profile is the suite's ("ci") from
conftest.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hmgstore.graph import NeighborSampler, Topology, sample_hop, to_csc
from hmgstore.graph.induced import induced_edges
from hmgstore.graph.temporal import sort_by_time

# A share of the loaded profile's cases (tests/conftest.py): a few dozen in make test, 20x more under
# HYPOTHESIS_PROFILE=long.
FAST = settings(max_examples=max(1, settings.default.max_examples * 5 // 6), deadline=None)


@st.composite
def graphs(draw, max_nodes=12, max_edges=40):
    """(n, src, dst): COO edges with repeats and self loops; nodes past the last edge's ids stay isolated."""
    n = draw(st.integers(1, max_nodes))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=max_edges))
    if edges and draw(st.booleans()):
        edges += edges[: draw(st.integers(1, len(edges)))]  # repeated edges
    src = torch.tensor([e[0] for e in edges], dtype=torch.int64)
    dst = torch.tensor([e[1] for e in edges], dtype=torch.int64)
    return n, src, dst


def _topology(n, src, dst, **kw):
    csc = to_csc(torch.stack([src, dst]) if len(src) else torch.empty(2, 0, dtype=torch.int64), "coo", size=(n, n))
    return csc, Topology(csc, "cpu", progress=False, **kw)


def _given_ids(csc, positions: torch.Tensor) -> list:
    """CSC positions -> the edge ids the caller gave (the COO order)."""
    return (positions if csc.perm is None else csc.perm[positions]).tolist()


def _per_seed(seeds: list, counts: torch.Tensor, values: torch.Tensor) -> list:
    bounds = np.concatenate([[0], np.cumsum(counts.tolist())]).astype(int)
    assert len(counts) == len(seeds) and bounds[-1] == len(values)
    return [values[bounds[i]:bounds[i + 1]].tolist() for i in range(len(seeds))]


def _in_edges(src, dst, node: int) -> list:
    """Given edge ids whose destination is ``node``."""
    return [e for e in range(len(dst)) if int(dst[e]) == node]


# ---- one hop -----------------------------------------------------------------------------------------------------
@FAST
@given(graphs(), st.integers(-1, 6), st.booleans(), st.data())
def test_a_hop_draws_real_edges_and_min_k_degree_distinct_ones(graph, k, replace, data):
    n, src, dst = graph
    csc, topo = _topology(n, src, dst)
    seeds = data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n))  # repeats allowed
    key = data.draw(st.integers())
    if key < -2**63:  # documented: refused (larger keys are read as their low 64 bits)
        with pytest.raises(ValueError, match="key must be at least"):
            sample_hop(topo, torch.tensor(seeds, dtype=torch.int64), k, replace, key)
        return
    nbr, eid, counts = sample_hop(topo, torch.tensor(seeds, dtype=torch.int64), k, replace, key)
    for seed, nbrs, positions in zip(seeds, _per_seed(seeds, counts, nbr), _per_seed(seeds, counts, eid)):
        own = _in_edges(src, dst, seed)
        given_ids = _given_ids(csc, torch.tensor(positions, dtype=torch.int64))
        assert set(given_ids) <= set(own)  # every drawn edge ends at its seed
        assert nbrs == [int(src[e]) for e in given_ids]  # and its neighbour is that edge's source
        if k == -1:
            continue  # see the test below
        if replace:
            assert len(given_ids) == (k if own else 0)
        else:
            assert len(given_ids) == min(k, len(own)) and len(set(given_ids)) == len(given_ids)


@FAST
@given(graphs(), st.data())
def test_fanout_minus_one_takes_every_edge_once_with_or_without_replacement(graph, data):
    n, src, dst = graph
    csc, topo = _topology(n, src, dst)
    seeds = data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n))
    replace = data.draw(st.booleans())  # sample_hop: -1 is every neighbour once, whatever replace
    nbr, eid, counts = sample_hop(topo, torch.tensor(seeds, dtype=torch.int64), -1, replace, 7)
    for seed, positions in zip(seeds, _per_seed(seeds, counts, eid)):
        assert sorted(_given_ids(csc, torch.tensor(positions, dtype=torch.int64))) == _in_edges(src, dst, seed)


@FAST
@given(graphs(), st.integers(-1, 6), st.booleans(), st.data())
def test_zero_weight_edges_are_drawn_only_after_every_positive_one(graph, k, replace, data):
    n, src, dst = graph
    weights = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]), min_size=len(src), max_size=len(src)))
    weight = torch.tensor(weights, dtype=torch.float32)
    csc, topo = _topology(n, src, dst, weight=weight)
    seeds = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    key = data.draw(st.integers(min_value=-2**63))  # keys below are refused (the hop test checks that)
    nbr, eid, counts = sample_hop(topo, torch.tensor(seeds, dtype=torch.int64), k, replace, key)
    for seed, positions in zip(seeds, _per_seed(seeds, counts, eid)):
        given_ids = _given_ids(csc, torch.tensor(positions, dtype=torch.int64))
        own = _in_edges(src, dst, seed)
        assert set(given_ids) <= set(own)
        if k == -1:
            continue  # every neighbour, zero weights included, is what -1 asks for
        positive = [e for e in own if weights[e] > 0]
        if replace:  # k draws in proportion to the weights; a node whose weights are all 0 draws uniformly
            assert len(given_ids) == (k if own else 0)
            if positive:
                assert all(weights[e] > 0 for e in given_ids)
            continue
        # without replacement: min(k, deg) distinct edges; a zero weight only once every positive one is taken
        assert len(set(given_ids)) == len(given_ids) == min(k, len(own))
        if len(own) > k:
            taken_positive = [e for e in given_ids if weights[e] > 0]
            assert len(taken_positive) == min(k, len(positive))


@FAST
@given(graphs(), st.integers(-1, 5), st.sampled_from(["node", "edge"]), st.data())
def test_temporal_hops_never_reach_past_the_seed_time(graph, k, by, data):
    n, src, dst = graph
    csc = to_csc(torch.stack([src, dst]) if len(src) else torch.empty(2, 0, dtype=torch.int64), "coo", size=(n, n))
    if by == "node":
        node_time = torch.tensor(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), dtype=torch.int64)
        csc = sort_by_time(csc, node_time=node_time)
        topo = Topology(csc, "cpu", progress=False, src_time=node_time)
        time_of = [int(node_time[int(s)]) for s in src]
    else:
        edge_time = torch.tensor(data.draw(st.lists(st.integers(0, 9), min_size=len(src), max_size=len(src))),
                                 dtype=torch.int64)
        csc = sort_by_time(csc, edge_time=edge_time)
        topo = Topology(csc, "cpu", progress=False, edge_time=edge_time)
        time_of = edge_time.tolist()
    seeds = data.draw(st.lists(st.integers(0, n - 1), max_size=n))
    times = data.draw(st.lists(st.integers(-1, 10), min_size=len(seeds), max_size=len(seeds)))
    strategy = data.draw(st.sampled_from(["uniform", "last"]))
    nbr, eid, counts = sample_hop(topo, torch.tensor(seeds, dtype=torch.int64), k, False, 3,
                                  seed_time=torch.tensor(times, dtype=torch.int64), strategy=strategy)
    for seed, t, positions in zip(seeds, times, _per_seed(seeds, counts, eid)):
        given_ids = _given_ids(csc, torch.tensor(positions, dtype=torch.int64))
        allowed = [e for e in _in_edges(src, dst, seed) if time_of[e] <= t]
        assert set(given_ids) <= set(allowed) and len(set(given_ids)) == len(given_ids)
        assert len(given_ids) == (len(allowed) if k == -1 else min(k, len(allowed)))
        if strategy == "last" and k >= 0:  # the k latest of the window: none left out is later than one taken
            left = [time_of[e] for e in allowed if e not in given_ids]
            assert not left or not given_ids or max(left) <= min(time_of[e] for e in given_ids)


# ---- several hops ------------------------------------------------------------------------------------------------
def _edge_set(src, dst) -> set:
    return set(zip(src.tolist(), dst.tolist()))


@FAST
@given(graphs(), st.lists(st.integers(-1, 4), min_size=1, max_size=3), st.booleans(), st.booleans(), st.data())
def test_a_sampler_batch_holds_real_edges_and_repeats_under_the_same_generator(graph, fanout, replace, disjoint,
                                                                               data):
    n, src, dst = graph
    csc, topo = _topology(n, src, dst)
    seeds = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)), dtype=torch.int64)
    seed = data.draw(st.integers(0, 2**32))

    def run():
        sampler = NeighborSampler({None: topo}, {None: n}, fanout, replace=replace, disjoint=disjoint,
                                  generator=torch.Generator().manual_seed(seed))
        return sampler.sample({None: seeds.clone()})

    out, again = run(), run()
    node, row, col, edge = out.node[None], out.row[None], out.col[None], out.edge[None]
    assert node[:len(seeds)].tolist() == seeds.tolist()
    edges = _edge_set(src, dst)
    assert all((int(node[r]), int(node[c])) in edges for r, c in zip(row, col))
    if edge is not None:  # the CSC positions are those very edges
        assert csc.row[edge].tolist() == node[row].tolist()
        assert csc.col()[edge].tolist() == node[col].tolist()
        if not replace:  # a destination's edges of one hop are distinct
            pairs = list(zip(col.tolist(), edge.tolist()))
            assert len(set(pairs)) == len(pairs)
    if not disjoint:
        assert len(set(node.tolist())) == len(node)
    for name in ("node", "row", "col", "edge"):
        a, b = getattr(out, name)[None], getattr(again, name)[None]
        assert (a is None and b is None) or torch.equal(a, b)
    assert out.num_sampled_nodes == again.num_sampled_nodes and out.num_sampled_edges == again.num_sampled_edges


@FAST
@given(graphs(), st.data())
def test_induced_edges_equal_a_brute_force_subgraph(graph, data):
    n, src, dst = graph
    csc, topo = _topology(n, src, dst)
    nodes = data.draw(st.lists(st.integers(0, n - 1), max_size=n + 3))  # repeated ids, as PyG keeps repeated seeds
    ids = torch.tensor(nodes, dtype=torch.int64)
    row, col, edge = induced_edges(topo, ids, ids)
    first = {}
    for pos, v in enumerate(nodes):
        first.setdefault(v, pos)
    # As PyG's (torch-sparse's) induced subgraph: every position of an id gets its in-edges, a source is its first
    want = sorted((first[int(src[e])], pos, e) for pos, v in enumerate(nodes) for e in range(len(src))
                  if int(dst[e]) == v and int(src[e]) in first)
    got = sorted(zip(row.tolist(), col.tolist(), _given_ids(csc, edge)))
    assert got == want


@FAST
@given(graphs(), st.data())
def test_to_csc_keeps_its_own_offsets_and_ids(graph, data):
    """A CSC built from the caller's arrays must not change when the caller edits them afterwards."""
    n, src, dst = graph
    csc = to_csc(torch.stack([src, dst]) if len(src) else torch.empty(2, 0, dtype=torch.int64), "coo", size=(n, n))
    row_np, colptr_np = csc.row.numpy().copy(), csc.colptr.numpy().copy()
    as_numpy = data.draw(st.booleans())
    given_row = row_np if as_numpy else torch.from_numpy(row_np)
    given_colptr = colptr_np if as_numpy else torch.from_numpy(colptr_np)
    built = to_csc((given_row, given_colptr), "csc", size=(n, n))
    want_colptr = built.colptr.clone()
    colptr_np[:] = colptr_np[::-1].copy() + 1  # the caller reuses its buffer
    assert torch.equal(built.colptr, want_colptr)
