"""What a topology and a sampler hold of their inputs: their own checked copies, so that the caller's later
edits never change a batch, and inputs that would silently change one are refused when the sampler is built.

Properties (hypothesis): a sampler whose node times, edge times, weights or neighbour ids the caller edits in
place after building it samples exactly what a sampler built on a clone of the untouched inputs samples (same
draws). Refused: neighbour ids out of range by the time the topology copies them (an int32 cast would wrap
``2**32 + 2`` to ``2``), a perm that is no permutation of the edges, positive weights that float32 holds as 0,
seeds that are not 1-D. Also: a homogeneous ``LinkNeighborLoader`` with node-level times samples, and a
node-time sampler given a seed out of range raises the sampler's own IndexError.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hmgstore.graph import CSC, NeighborSampler, Topology, to_csc
from hmgstore.graph.csc import edge_weight_in_csc_order
from hmgstore.graph.temporal import sort_by_time

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader  # noqa: E402
from torch_geometric.sampler import NodeSamplerInput  # noqa: E402

from hmgstore.plugins.pyg import CSCGraphStore, HybridNeighborSampler, from_tensors  # noqa: E402

FAST = settings(max_examples=30, deadline=None)


@st.composite
def graphs(draw, max_nodes=12, max_edges=40):
    """``(n, edge_index)``: a random directed graph of 1 to ``max_nodes`` nodes."""
    n = draw(st.integers(1, max_nodes))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=1, max_size=max_edges))
    return n, torch.tensor(edges, dtype=torch.int64).t().contiguous()


def edits(draw, tensor: torch.Tensor, values) -> None:
    """Overwrite some entries of ``tensor`` in place with values drawn from ``values``."""
    positions = draw(st.lists(st.integers(0, tensor.numel() - 1), min_size=1, max_size=tensor.numel()))
    for at in positions:
        tensor.view(-1)[at] = draw(values)


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_same_samples(a, b) -> None:
    for name in ("node", "row", "col", "edge", "batch"):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name
        else:
            assert (x is None and y is None) or torch.equal(x, y), name


def sample_nodes(sampler, seeds, time=None):
    return sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds, time=time))


# ---- times -----------------------------------------------------------------------------------------------
def test_link_loader_with_node_times_samples_no_later_neighbour():
    torch.manual_seed(0)
    n, ei = 20, torch.randint(0, 20, (2, 60))
    d = Data(x=torch.randn(n, 2), edge_index=ei, time=torch.randint(0, 100, (n,)))
    sampler = HybridNeighborSampler(d, [2, 2], time_attr="time", progress=False)
    for neg in (None, "binary"):
        loader = LinkNeighborLoader(d, [2, 2], neighbor_sampler=sampler, edge_label_index=ei[:, :10],
                                    edge_label_time=torch.full((10,), 40), time_attr="time", batch_size=5,
                                    neg_sampling=neg)
        batches = list(loader)
        assert len(batches) == 2
        for b in batches:
            assert bool((d.time[b.n_id[b.edge_index[0]]] <= 40).all())


@FAST
@given(graphs(), st.data())
def test_node_times_edited_after_building_change_no_batch(graph, data):
    n, ei = graph
    times = torch.tensor(data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)))
    d = Data(x=torch.zeros(n, 1), edge_index=ei, time=times)
    held = HybridNeighborSampler(d, [2, 2], time_attr="time", generator=generator(), progress=False)
    fresh = HybridNeighborSampler(d.clone(), [2, 2], time_attr="time", generator=generator(), progress=False)
    edits(data.draw, d.time, st.integers(-100, 100))
    seeds = torch.arange(n)
    seed_time = torch.full((n,), 25)
    assert_same_samples(sample_nodes(held, seeds, seed_time), sample_nodes(fresh, seeds, seed_time))
    assert_same_samples(sample_nodes(held, seeds), sample_nodes(fresh, seeds))  # the seeds' own node times


@FAST
@given(graphs(), st.sampled_from(["node", "edge"]), st.data())
def test_topology_times_edited_after_building_change_no_batch(graph, level, data):
    n, ei = graph
    size = n if level == "node" else ei.shape[1]
    times = torch.tensor(data.draw(st.lists(st.integers(0, 50), min_size=size, max_size=size)))
    keyword = "src_time" if level == "node" else "edge_time"
    csc = sort_by_time(to_csc(ei, "coo", (n, n)), **{"node_time" if level == "node" else "edge_time": times})
    plain = CSC(csc.row, csc.colptr, None, csc.size)  # no perm: times in CSC order, kept as given before
    given_times = times if level == "node" else times[csc.perm].clone()
    held = Topology(plain, "cpu", progress=False, **{keyword: given_times})
    fresh = Topology(plain, "cpu", progress=False, **{keyword: given_times.clone()})
    edits(data.draw, given_times, st.integers(-100, 100))
    seeds, seed_time = {None: torch.arange(n)}, {None: torch.full((n,), 25)}
    a = NeighborSampler({None: held}, {None: n}, [-1, 2], generator=generator()).sample(seeds, seed_time)
    b = NeighborSampler({None: fresh}, {None: n}, [-1, 2], generator=generator()).sample(seeds, seed_time)
    assert_same_samples(a, b)


# ---- weights ---------------------------------------------------------------------------------------------
@FAST
@given(graphs(), st.data())
def test_weights_edited_after_building_change_no_batch(graph, data):
    n, ei = graph
    csc = to_csc(ei[:, ei[1].argsort(stable=True)], "coo", (n, n), is_sorted=True)  # no perm
    weight = torch.tensor(data.draw(st.lists(st.floats(0.5, 4.0), min_size=csc.num_edges,
                                             max_size=csc.num_edges)), dtype=torch.float32)
    held = Topology(csc, "cpu", weight=weight, progress=False)
    fresh = Topology(csc, "cpu", weight=weight.clone(), progress=False)
    edits(data.draw, weight, st.sampled_from([0.0, 1e6, -5.0, float("nan")]))
    assert torch.equal(held.weight, fresh.weight)
    seeds = {None: torch.arange(n).repeat(20)}
    a = NeighborSampler({None: held}, {None: n}, [2], generator=generator()).sample(seeds)
    b = NeighborSampler({None: fresh}, {None: n}, [2], generator=generator()).sample(seeds)
    assert_same_samples(a, b)


def test_weights_through_a_sorted_graph_store_are_copied():
    ei = torch.tensor([[1, 2, 3, 4], [0, 0, 0, 0]])
    store = CSCGraphStore()
    store.put_edge_index(ei, edge_type=None, layout="coo", size=(5, 5), is_sorted=True)
    weight = torch.ones(4)
    topology = Topology(store.edges(None), "cpu", weight=weight, progress=False)
    weight[0] = float("nan")
    assert topology.weight.tolist() == [1.0] * 4


@FAST
@given(st.floats(min_value=1e-300, max_value=2.0 ** -151), st.integers(0, 3))
def test_positive_weights_float32_holds_as_zero_are_refused(tiny, at):
    csc = CSC(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 4, 4, 4, 4, 4]), None, (5, 5))
    weight = torch.ones(4, dtype=torch.float64)
    weight[at] = tiny
    with pytest.raises(ValueError, match=f"edge weight {at} is .*positive, but 0 once stored as float32.*multiply "
                                         "every weight by the same number"):
        edge_weight_in_csc_order(weight, csc)


def test_small_weights_float32_holds_are_kept():
    csc = CSC(torch.tensor([1, 2]), torch.tensor([0, 2, 2, 2]), None, (3, 3))
    got = edge_weight_in_csc_order(torch.tensor([1e-44, 0.0], dtype=torch.float64), csc)
    assert got[0] > 0 and got[1] == 0


# ---- neighbour ids ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [2**32 + 2, 2**31, -1, 4])
def test_ids_edited_out_of_range_after_the_csc_are_refused(bad):
    row = torch.tensor([1, 2, 3, 0, 0])
    csc = CSC(row, torch.tensor([0, 1, 2, 3, 5]), None, (4, 4))
    row[3] = bad  # the CSC keeps the caller's row: checked when it was built, edited since
    with pytest.raises(IndexError, match=f"row holds source id {bad} at position 3, outside \\[0, 4\\).*rebuild"):
        Topology(csc, "cpu", progress=False)
    with pytest.raises(IndexError, match="edited after the CSC was built"):
        Topology(csc, "cpu", narrow=False, progress=False)


def test_ids_edited_out_of_range_in_a_graph_store_are_refused_by_the_sampler():
    row, colptr = torch.tensor([1, 2, 3, 0, 0]), torch.tensor([0, 1, 2, 3, 5])
    stores = from_tensors(csc=(row, colptr), x=torch.randn(4, 2), progress=False, gpu_budget=None)
    row[0] = 2**32 + 2  # documented: from_tensors keeps the ids without a copy
    with pytest.raises(IndexError, match="row holds source id 4294967298"):
        HybridNeighborSampler(stores, [-1], progress=False)


@FAST
@given(graphs(), st.sampled_from(["int32", "int64-wide", "sorted-coo"]), st.data())
def test_ids_edited_after_building_change_no_batch(graph, kind, data):
    n, ei = graph
    order = ei[1].argsort(stable=True)
    if kind == "sorted-coo":
        ei = ei[:, order].clone()
        csc = to_csc(ei, "coo", (n, n), is_sorted=True)
        row = ei[0]  # the CSC's row is a view of it
    else:
        base = to_csc(ei, "coo", (n, n))
        row = base.row.int().clone() if kind == "int32" else base.row.clone()
        csc = CSC(row, base.colptr, None, base.size)
    assert csc.row.data_ptr() == row.data_ptr()
    narrow = kind != "int64-wide"
    held = Topology(csc, "cpu", narrow=narrow, progress=False)
    fresh = Topology(CSC(csc.row.clone(), csc.colptr, None, csc.size), "cpu", narrow=narrow, progress=False)
    edits(data.draw, row, st.integers(0, n - 1))
    seeds = {None: torch.arange(n)}
    a = NeighborSampler({None: held}, {None: n}, [-1, 2], generator=generator()).sample(seeds)
    b = NeighborSampler({None: fresh}, {None: n}, [-1, 2], generator=generator()).sample(seeds)
    assert_same_samples(a, b)


# ---- perm ------------------------------------------------------------------------------------------------
@FAST
@given(st.integers(1, 8), st.data())
def test_a_topology_holds_only_a_permutation(num_edges, data):
    perm = data.draw(st.lists(st.integers(-2, num_edges + 1), min_size=num_edges, max_size=num_edges))
    csc = CSC(torch.arange(num_edges), torch.tensor([0, num_edges]), torch.tensor(perm), (num_edges, 1))
    if sorted(perm) == list(range(num_edges)):
        assert Topology(csc, "cpu", progress=False).perm.tolist() == perm
    else:
        with pytest.raises((ValueError, IndexError), match=f"perm must list each edge id 0..{num_edges - 1} once"):
            Topology(csc, "cpu", progress=False)


@pytest.mark.parametrize("perm", [[0, 1, 2, 3, 99], [0, 1, 2, 3, -5], [0, 0, 0, 0, 0]])
def test_a_sampler_refuses_a_graph_store_perm_that_is_no_permutation(perm):
    """put_csc checks the perm it is given; one edited in place afterwards is caught when a sampler is built."""
    row, colptr = torch.tensor([1, 2, 3, 0, 0]), torch.tensor([0, 1, 2, 3, 5])
    store, held = CSCGraphStore(), torch.arange(5)
    store.put_csc(CSC(row, colptr, held, (4, 4)))
    held.copy_(torch.tensor(perm))
    features, _ = from_tensors(csc=(row, colptr), x=torch.randn(4, 2), progress=False)
    with pytest.raises((ValueError, IndexError), match="perm must list each edge id 0..4 once"):
        HybridNeighborSampler((features, store), [-1], progress=False)


# ---- seeds -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seeds", [torch.arange(6).view(2, 3), np.arange(4).reshape(2, 2), [[0, 1], [2, 3]],
                                   torch.tensor(3), 3])
def test_seeds_that_are_not_1d_are_refused(seeds):
    csc = to_csc(torch.tensor([[1, 2, 3], [0, 0, 1]]), "coo", (8, 8))
    sampler = NeighborSampler({None: Topology(csc, "cpu", progress=False)}, {None: 8}, [2])
    with pytest.raises(ValueError, match=r"seeds must be a 1-D list of node ids.*got shape"):
        sampler.sample({None: seeds})


def test_a_loader_with_2d_input_nodes_is_refused():
    ei = torch.randint(0, 20, (2, 60), generator=generator())
    d = Data(x=torch.randn(20, 2), edge_index=ei)
    sampler = HybridNeighborSampler(d, [3], progress=False)
    loader = NeighborLoader(d, [3], neighbor_sampler=sampler, input_nodes=torch.arange(6).view(2, 3), batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="seeds must be a 1-D list of node ids"):
            next(iter(loader))


@pytest.mark.parametrize("seed", [10, -1, 2**40])
def test_a_node_time_sampler_checks_seeds_before_reading_their_times(seed):
    ei = torch.randint(0, 10, (2, 40), generator=generator())
    d = Data(x=torch.randn(10, 2), edge_index=ei, time=torch.randint(0, 100, (10,), generator=generator()))
    sampler = HybridNeighborSampler(d, [2], time_attr="time", progress=False)
    with pytest.raises(IndexError, match=f"index {seed} at position 1 is out of range for a table of 10 rows"):
        sample_nodes(sampler, torch.tensor([3, seed]))


@pytest.mark.parametrize("perm", [[0, 1, 2, 3, 99], [0, 1, 1, 2, 3], [-5, 0, 1, 2, 3]])
def test_a_graph_store_refuses_a_csc_whose_perm_is_not_a_permutation(perm):
    """PyG's own sampler (a NeighborLoader over the store pair without hmgstore's sampler) reads the store's
    perm as batches' e_id: put_csc checks it as the sampler's topology does."""
    from hmgstore.graph import CSC
    from hmgstore.plugins.pyg import CSCGraphStore

    row, colptr = torch.tensor([1, 2, 0, 3, 1]), torch.tensor([0, 2, 3, 4, 5])
    store = CSCGraphStore()
    with pytest.raises((ValueError, IndexError), match="perm must list each edge id"):
        store.put_csc(CSC(row, colptr, torch.tensor(perm), (4, 4)))
    assert store.get_all_edge_attrs() == []
