"""Contracts of the adapters' public names: every line of their Raises sections, with hostile inputs.

Each case is a call a user could make by mistake; the property is the documented error (TypeError for the
wrong kind, ValueError for a wrong value, IndexError for ids out of range) or the exact result.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from hmgstore.graph import CSC
from hmgstore.plugins.pyg import CSCGraphStore, to_csc

NODES = 6
FEW = settings(max_examples=40, deadline=None)


# ---- to_csc and CSCGraphStore: edge indices, sizes, layouts --------------------------------------------
@FEW
@given(st.lists(st.tuples(st.integers(-2, NODES + 2), st.integers(-2, NODES + 2)), max_size=8),
       st.one_of(st.none(), st.tuples(st.integers(-2, NODES + 2), st.integers(-2, NODES + 2))))
def test_to_csc_keeps_every_edge_or_refuses_by_the_rule(edges, size):
    edge_index = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t()
    if size is not None and min(size) < 0:
        with pytest.raises(ValueError, match=r"size\[\d\] must be at least 0"):
            to_csc(edge_index, "coo", size)
        return
    bound = size or (max((s for s, _ in edges), default=-1) + 1, max((d for _, d in edges), default=-1) + 1)
    if any(not (0 <= s < bound[0] and 0 <= d < bound[1]) for s, d in edges):
        with pytest.raises(IndexError, match=r"edge_index\[[01]\] holds a node id outside"):
            to_csc(edge_index, "coo", size)
        return
    csc = to_csc(edge_index, "coo", size)
    assert csc.size == bound
    assert sorted(zip(*(t.tolist() for t in csc.coo_in_given_order()))) == sorted(edges)
    assert csc.colptr.numel() == bound[1] + 1


@pytest.mark.parametrize("edge_index, error, message", [
    (torch.zeros(3, 4, dtype=torch.int64), ValueError, r"shape \[2, num_edges\], got \(3, 4\)"),
    (torch.zeros(2, 2, 2, dtype=torch.int64), ValueError, r"shape \[2, num_edges\], got \(2, 2, 2\)"),
    (torch.arange(4), ValueError, r"shape \[2, num_edges\]"),
    (torch.zeros(2, 3), TypeError, r"integer node ids.*float32"),
    (np.zeros((2, 3)), TypeError, r"integer node ids.*float64"),
    (torch.zeros(2, 3, dtype=torch.bool), TypeError, "integer node ids"),
    ((torch.tensor([[0, 1]]), torch.tensor([[1, 0]])), ValueError, r"1-D"),
    ((torch.tensor([0, 1]), torch.tensor([1])), ValueError, r"differ in length"),
    ([[0, 1], [1, 0], [2, 2]], TypeError, r"pair of 1-D tensors"),
    (None, TypeError, r"pair of 1-D tensors"),
])
def test_to_csc_refuses_malformed_coo(edge_index, error, message):
    with pytest.raises(error, match=message):
        to_csc(edge_index, "coo")


@pytest.mark.parametrize("size, error, message", [
    ((3.5, 3), TypeError, r"size\[0\] takes an integer, got 3.5"),
    ((3, 3.0), TypeError, r"size\[1\] takes an integer"),
    ((True, 3), TypeError, r"size\[0\].*bool"),
    ((3, -1), ValueError, r"size\[1\] must be at least 0"),
    ((3, 3, 3), ValueError, r"pair of node counts; got 3 values"),
    (3, TypeError, "pair of node counts"),
    ("ab", TypeError, "pair of node counts"),
])
def test_to_csc_refuses_sizes_that_are_not_node_counts(size, error, message):
    with pytest.raises(error, match=message):
        to_csc(torch.tensor([[0, 1], [1, 2]]), "coo", size)


def test_a_node_id_past_the_node_count_names_the_argument_of_each_entry_point():
    """from_data and from_tensors take no size=: the message names what each of them takes."""
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import from_data, from_tensors

    edges = torch.tensor([[0, 150], [1, 2]])
    for build in (lambda: from_data(Data(x=torch.randn(100, 2), edge_index=edges, num_nodes=100)),
                  lambda: from_tensors(edge_index=edges, x=torch.randn(100, 2))):
        with pytest.raises(IndexError, match=r"outside \[0, 100\).*num_nodes= to from_tensors, data.num_nodes"):
            build()


def test_a_csc_or_csr_pair_given_the_wrong_way_round_is_told_its_order():
    row, colptr = torch.tensor([1, 0, 2]), torch.tensor([0, 1, 3])
    with pytest.raises(ValueError, match=r"the pair is \(row, colptr\), in that order"):
        to_csc((colptr, row), "csc")
    with pytest.raises(ValueError, match=r"the pair is \(rowptr, col\), in that order"):
        to_csc((row, colptr), "csr")
    assert to_csc((row, colptr), "csc").row.tolist() == [1, 0, 2]  # the right order builds


def test_to_csc_refuses_sizes_that_disagree_with_the_tensors():
    with pytest.raises(IndexError, match=r"edge_index\[0\] holds a node id outside \[0, 2\)"):
        to_csc(torch.tensor([[2, 0], [0, 1]]), "coo", (2, 5))
    with pytest.raises(ValueError, match=r"colptr has 3 entries for 4 destination"):
        to_csc((torch.tensor([0, 1]), torch.tensor([0, 1, 2])), "csc", (2, 4))
    with pytest.raises(ValueError, match=r"rowptr has 3 entries for 1 source"):
        to_csc((torch.tensor([0, 1, 2]), torch.tensor([1, 0])), "csr", (1, 2))
    with pytest.raises(IndexError, match=r"row holds a node id outside \[0, 1\)"):
        to_csc((torch.tensor([0, 1]), torch.tensor([0, 1, 2])), "csc", (1, 2))
    with pytest.raises(ValueError, match=r"colptr never decreases"):
        to_csc((torch.tensor([0, 1]), torch.tensor([0, 2, 1, 2])), "csc")


@pytest.mark.parametrize("layout, error", [("dense", ValueError), ("sparse", ValueError), (3, TypeError),
                                           (None, TypeError)])
def test_to_csc_takes_three_layouts(layout, error):
    with pytest.raises(error, match=r"layout.*'coo', 'csr', 'csc'"):
        to_csc(torch.tensor([[0], [1]]), layout)


def test_to_csc_checks_is_sorted():
    with pytest.raises(TypeError, match="is_sorted is True or False"):
        to_csc(torch.tensor([[0], [1]]), "coo", is_sorted="yes")
    with pytest.raises(ValueError, match="is_sorted=True does not apply to CSR"):
        to_csc((torch.tensor([0, 1, 2]), torch.tensor([1, 0])), "csr", is_sorted=True)
    with pytest.raises(ValueError, match="not sorted by destination"):
        to_csc(torch.tensor([[0, 1], [1, 0]]), "coo", is_sorted=True)


def test_to_csc_takes_empty_graphs_of_any_size():
    empty = torch.empty(2, 0, dtype=torch.int64)
    assert to_csc(empty, "coo").size == (0, 0)
    csc = to_csc(empty, "coo", (4, 3))
    assert csc.size == (4, 3) and csc.colptr.tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="must be at least 0"):  # an empty graph does not excuse a negative size
        to_csc(empty, "coo", (-1, -1))


def test_csc_checks_its_lengths():
    row, colptr = torch.tensor([1, 0]), torch.tensor([0, 1, 2])
    assert CSC(row, colptr, None, (np.int64(2), 2)).size == (2, 2)
    with pytest.raises(ValueError, match=r"colptr has 3 entries; it needs 4"):
        CSC(row, colptr, None, (2, 3))
    with pytest.raises(ValueError, match=r"perm holds 1 edge ids for 2 edges"):
        CSC(row, colptr, torch.tensor([0]), (2, 2))
    with pytest.raises(TypeError, match=r"size\[0\] takes an integer"):
        CSC(row, colptr, None, (2.0, 2))
    with pytest.raises(TypeError, match=r"size\[0\] takes an integer"):
        CSC(row, colptr, None, (None, 2))
    with pytest.raises(ValueError, match="at least 0"):
        CSC(row, colptr, None, (-2, 2))


def test_the_graph_store_refuses_by_name():
    store = CSCGraphStore()
    edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match=r"^put_edge_index\(\).*'layuot'; did you mean 'layout'"):
        store.put_edge_index(edge_index, edge_type=None, layuot="coo", size=(3, 3))
    with pytest.raises(ValueError, match=r"size\[0\] must be at least 0"):
        store.put_edge_index(edge_index, edge_type=None, layout="coo", size=(-1, 3))
    with pytest.raises(ValueError, match="dense"):
        store.put_edge_index(edge_index, edge_type=None, layout="dense", size=(3, 3))
    with pytest.raises(TypeError, match="integer node ids"):
        store.put_edge_index(edge_index.float(), edge_type=None, layout="coo", size=(3, 3))
    with pytest.raises(IndexError, match=r"outside \[0, 2\)"):
        store.put_edge_index(edge_index, edge_type=None, layout="coo", size=(2, 2))
    with pytest.raises(TypeError, match="put_csc takes an hmgstore.graph.CSC"):
        store.put_csc((edge_index[0], torch.tensor([0, 1, 2])))
    with pytest.raises(KeyError, match="holds no edges"):
        store.csc()
    store.put_edge_index(edge_index, edge_type=None, layout="coo", size=(3, 3))
    with pytest.raises(ValueError, match="homogeneous.*or heterogeneous"):
        store.put_edge_index(edge_index, edge_type=("a", "to", "b"), layout="coo", size=(3, 3))
    with pytest.raises(ValueError, match="homogeneous.*or heterogeneous"):
        store.put_csc(store.edges(None), ("a", "to", "b"))
    with pytest.raises(KeyError, match="no edges of type 'a'"):
        store.edges("a")
    hetero = CSCGraphStore()
    hetero.put_edge_index(edge_index, edge_type=("a", "to", "b"), layout="coo", size=(3, 3))
    with pytest.raises(ValueError, match=r"edge types \[\('b', 'to', 'a'\)\] are not in the graph store"):
        hetero.csc([("b", "to", "a")])


# ---- ResidentTensor, resident, pyg_sampler_available -----------------------------------------------------
def test_resident_takes_tensors_only_and_keeps_host_tensors_as_they_are():
    from hmgstore.plugins.pyg import ResidentTensor, pyg_sampler_available, resident

    host = torch.arange(4)
    assert resident(host) is host
    for bad in (np.arange(4), [1, 2], None):
        with pytest.raises(TypeError, match="resident takes a torch.Tensor"):
            resident(bad)
    marked = host.as_subclass(ResidentTensor)
    assert marked.pin_memory() is marked and marked.pin_memory("cuda") is marked  # never raises, on any device
    assert isinstance(pyg_sampler_available(), bool)


# ---- EqualBatches and ClusterNeighborSampler -----------------------------------------------------------------
@FEW
@given(st.one_of(st.integers(-3, 12), st.floats(0, 5), st.booleans()), st.integers(1, 4),
       st.one_of(st.integers(-2, 12), st.floats(0, 5)))
def test_equal_batches_cover_every_position_or_refuse(n, batch_size, num_batches):
    from hmgstore.plugins.pyg import EqualBatches

    def refusal(value, name):  # the arguments are checked in order: n, then num_batches
        if type(value) is not int:
            return TypeError, f"{name} takes an integer"
        return (ValueError, f"{name} must be at least 0") if value < 0 else None

    expected = refusal(n, "n") or refusal(num_batches, "num_batches")
    if expected:
        with pytest.raises(expected[0], match=expected[1]):
            EqualBatches(n, batch_size, num_batches)
    elif num_batches * batch_size < n:
        with pytest.raises(ValueError, match=r"hold \d+ of the \d+ positions; pass at least"):
            EqualBatches(n, batch_size, num_batches)
    else:
        batches = list(EqualBatches(n, batch_size, num_batches, shuffle=True, seed=3))
        assert len(batches) == num_batches and sorted(sum(batches, [])) == list(range(n))


def test_equal_batches_seed_and_epoch_are_integers():
    from hmgstore.plugins.pyg import EqualBatches

    with pytest.raises(TypeError, match="seed takes an integer"):
        EqualBatches(4, 2, 2, shuffle=True, seed=1.5)
    with pytest.raises(TypeError, match="epoch takes an integer"):
        EqualBatches(4, 2, 2).set_epoch(1.5)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        EqualBatches(4, 0, 2)


@pytest.fixture(scope="module")
def small_csc():
    return to_csc(torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]), "coo", (5, 5))


def test_cluster_neighbor_sampler_checks_its_arguments(small_csc):
    from torch_geometric.sampler import NodeSamplerInput

    from hmgstore.plugins.pyg import ClusterNeighborSampler

    sampler = ClusterNeighborSampler(small_csc, [2, 2], device="cpu")
    out = sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0, 3])))
    assert out.node[:2].tolist() == [0, 3]
    with pytest.raises(TypeError, match="replace is True or False"):
        ClusterNeighborSampler(small_csc, [2], replace="yes")
    with pytest.raises(TypeError, match="generator is a torch.Generator"):
        ClusterNeighborSampler(small_csc, [2], generator=7)
    with pytest.raises(TypeError, match=r"topology is a Partition .* or a CSC"):
        ClusterNeighborSampler(torch.tensor([[0], [1]]), [2])
    with pytest.raises(TypeError, match=r"num_neighbors\[0\] is 1.5"):
        ClusterNeighborSampler(small_csc, [1.5])
    with pytest.raises(ValueError, match=r"num_neighbors\[0\]"):
        ClusterNeighborSampler(small_csc, [-3])
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'replce'"):
        ClusterNeighborSampler(small_csc, [2], replce=True)
    with pytest.raises(IndexError):
        sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0, 5])))
    with pytest.raises(NotImplementedError, match="temporal"):
        sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0]), time=torch.tensor([1])))
    with pytest.raises(NotImplementedError, match="around nodes only"):
        sampler.sample_from_edges(None)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees no CUDA GPU"):
            ClusterNeighborSampler(small_csc, [2], device="cuda")


def test_cluster_neighbor_sampler_refuses_loader_workers(small_csc, monkeypatch):
    from torch_geometric.sampler import NodeSamplerInput

    from hmgstore.plugins.pyg import ClusterNeighborSampler

    sampler = ClusterNeighborSampler(small_csc, [2], device="cpu")
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    with pytest.raises(RuntimeError, match="num_workers=0"):
        sampler.sample_from_nodes(NodeSamplerInput(None, torch.tensor([0])))


# ---- EdgeFeatures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def edge_stores():
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import from_data

    g = hmgstore.data.synthetic(40, 4, 4, seed=1)
    data = Data(x=g.x, edge_index=g.edge_index, edge_attr=torch.randn(g.edge_index.shape[1], 2))
    return from_data(data, "cpu", gpu_budget=None)


def test_edge_features_refuse_what_cannot_serve_them(edge_stores):
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import EdgeFeatures, HybridFeatureStore, edge_features

    feature_store, graph_store = edge_stores
    assert callable(EdgeFeatures(edge_stores))
    with pytest.raises(TypeError, match=r"\(feature_store, graph_store\) pair"):
        EdgeFeatures(feature_store)
    with pytest.raises(TypeError, match="not dict"):
        EdgeFeatures(({}, graph_store))
    with pytest.raises(TypeError, match="transform is the caller's own loader hook"):
        EdgeFeatures(edge_stores, transform="x")
    with pytest.raises(TypeError, match="transform_sampler_output is the caller's own loader hook"):
        edge_features(edge_stores, transform_sampler_output=3)
    with pytest.raises(TypeError, match=r"^edge_features\(\) got an unexpected keyword argument 'tranform'"):
        edge_features(edge_stores, tranform=None)
    with pytest.raises(ValueError, match="holds no edge attributes"):
        EdgeFeatures((HybridFeatureStore("cpu"), graph_store))
    with pytest.raises(KeyError, match="no edges of type None"):
        EdgeFeatures((feature_store, CSCGraphStore()))
    with pytest.raises(ValueError, match="the batch has no e_id"):
        EdgeFeatures(edge_stores)(Data(x=torch.zeros(2, 1)))


# ---- DGL: fetches, tables that disagree with the graph, graphs changed after attach --------------------------
ROWS = 10


@pytest.fixture(scope="module")
def hdgl():
    return pytest.importorskip("hmgstore.plugins.dgl", reason="needs DGL (pip install 'dgl==2.1.0')")


def dgl_graph(hdgl, rows: int = ROWS, attach: bool = True):
    import dgl

    graph = dgl.graph((torch.arange(rows - 1), torch.arange(1, rows)), num_nodes=rows)
    if attach:
        hdgl.attach(graph, {"feat": torch.arange(2.0 * rows).reshape(rows, 2)},
                    edata={"w": torch.arange(rows - 1.0)[:, None]}, device="cpu")
    return graph


@FEW
@given(st.lists(st.integers(-3, ROWS + 3), max_size=6), st.sampled_from([torch.int32, torch.int64]))
def test_fetch_returns_the_rows_or_refuses_ids_out_of_range(hdgl, ids, dtype):
    storage = dgl_graph(hdgl).get_node_storage("feat")
    index = torch.tensor(ids, dtype=dtype)
    if all(0 <= i < ROWS for i in ids):
        assert storage.fetch(index, "cpu").wait().tolist() == [[2.0 * i, 2.0 * i + 1] for i in ids]
    else:
        bad = next(i for i in ids if not 0 <= i < ROWS)
        with pytest.raises(IndexError, match=rf"^fetch: index {bad} .*table of {ROWS} rows"):
            storage.fetch(index, "cpu")


def test_fetch_refuses_ids_of_another_kind_or_rank(hdgl):
    storage = dgl_graph(hdgl).get_node_storage("feat")
    for ids, error, message in [
        (torch.tensor([1.0]), TypeError, "integer node ids.*float32"),
        (torch.tensor([True]), TypeError, "integer node ids.*bool"),
        ([1, 2], TypeError, "tensor of node ids, got list"),
        (np.array([1, 2]), TypeError, "tensor of node ids, got ndarray"),
        (torch.tensor([[1, 2]]), ValueError, r"1-D node ids \[n\], got shape \(1, 2\)"),
        (torch.tensor(1), ValueError, r"1-D node ids \[n\], got shape \(\)"),
    ]:
        with pytest.raises(error, match=message):
            storage.fetch(ids, "cpu")
    assert storage.fetch(torch.tensor([], dtype=torch.int64), "cpu").wait().shape == (0, 2)


def test_fetch_refuses_options_that_cannot_apply(hdgl):
    storage = dgl_graph(hdgl).get_node_storage("feat")
    ids = torch.tensor([1])
    with pytest.raises(TypeError, match="pin_memory is True, False or None, got 'yes'"):
        storage.fetch(ids, "cpu", "yes")
    with pytest.raises(TypeError, match=r"^fetch\(\) got an unexpected keyword argument 'pin_memroy'; did you mean"):
        storage.fetch(ids, "cpu", pin_memroy=True)
    assert storage.fetch(ids, "cpu", None, some_dgl_option=1).wait().shape == (1, 2)  # DGL's own: ignored
    with pytest.raises(ValueError, match="live on 'cpu' or 'cuda'"):
        storage.fetch(ids, "meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees no CUDA GPU"):
            storage.fetch(ids, "cuda")


def test_a_bad_fetch_fails_alone(hdgl):
    storage = dgl_graph(hdgl).get_node_storage("feat")
    good = storage.fetch(torch.tensor([2]), "cpu")
    with pytest.raises(IndexError):
        storage.fetch(torch.tensor([ROWS]), "cpu")
    assert good.wait().tolist() == [[4.0, 5.0]]  # its batch was not poisoned by the refused one


def test_pending_fetch_and_storage_take_hmgstore_tables_only(hdgl):
    table = hmgstore.HybridTensor(torch.zeros(3, 2), "cpu")
    assert hdgl.PendingFetch(table, torch.tensor([2]), "cpu").wait().shape == (1, 2)
    with pytest.raises(TypeError, match="PendingFetch reads an hmgstore table"):
        hdgl.PendingFetch(torch.zeros(3, 2), torch.tensor([2]), "cpu")
    with pytest.raises(TypeError, match="HybridFeatureStorage wraps an hmgstore table"):
        hdgl.HybridFeatureStorage(torch.zeros(3, 2))
    table.close()
    with pytest.raises(RuntimeError):
        hdgl.HybridFeatureStorage(table).fetch(torch.tensor([0]), "cpu").wait()
    assert isinstance(hdgl.dgl_supports_cuda(), bool)


def test_attach_refuses_tables_whose_rows_disagree_with_the_graph(hdgl):
    graph = dgl_graph(hdgl, attach=False)
    with pytest.raises(ValueError, match=rf"'feat'.*has {ROWS + 1} rows; the graph has {ROWS} nodes"):
        hdgl.attach(graph, {"feat": torch.zeros(ROWS + 1, 2)}, device="cpu")
    with pytest.raises(ValueError, match=rf"edge feature 'w'.*has {ROWS} rows; the graph has {ROWS - 1} edges"):
        hdgl.attach(graph, edata={"w": torch.zeros(ROWS, 1)}, device="cpu")
    assert type(graph) is not hdgl.HybridDGLGraph  # nothing changed


@pytest.mark.parametrize("change", ["remove then add nodes", "remove then add edges", "add nodes"])
def test_a_graph_renumbered_after_attach_is_refused_even_at_the_same_size(hdgl, change):
    graph = dgl_graph(hdgl)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if change == "remove then add nodes":
            graph.remove_nodes(torch.tensor([0]))
            graph.add_nodes(1)  # as many nodes as rows again, but node 0 is the old node 1
        elif change == "remove then add edges":
            graph.remove_edges(torch.tensor([0]))
            graph.add_edges(torch.tensor([0]), torch.tensor([5]))
        else:
            graph.add_nodes(2)
    if change != "remove then add edges":
        with pytest.raises(ValueError, match=r"node feature 'feat'.*attach\(g, \.\.\.\) again|"
                                             r"12 nodes now.*'feat'.*10 rows"):
            graph.get_node_storage("feat")
    else:
        assert graph.get_node_storage("feat").fetch(torch.tensor([1]), "cpu").wait().tolist() == [[2.0, 3.0]]
    if change != "add nodes":
        with pytest.raises(ValueError, match=r"(renumbered the edges|edges now).*edge feature 'w'.*attach"):
            graph.get_edge_storage("w")
        with pytest.raises(ValueError, match=r"(renumbered the edges|edges now).*edge feature 'w'.*attach"):
            graph.edata["w"]  # the whole-table view is refused alike
    if change != "remove then add edges":
        with pytest.raises(ValueError, match=r"node feature 'feat'"):
            graph.ndata["feat"]
    rows = graph.num_nodes()
    hdgl.attach(graph, {"feat": torch.ones(rows, 2)}, device="cpu")  # attached again: served again
    assert graph.get_node_storage("feat").fetch(torch.tensor([0]), "cpu").wait().tolist() == [[1.0, 1.0]]
    assert graph.ndata["feat"].shape == (rows, 2)


def test_removing_nothing_keeps_the_features(hdgl):
    graph = dgl_graph(hdgl)
    graph.remove_nodes(torch.tensor([], dtype=torch.int64))
    graph.remove_edges(torch.tensor([], dtype=torch.int64))
    assert graph.get_node_storage("feat").fetch(torch.tensor([1]), "cpu").wait().tolist() == [[2.0, 3.0]]
    assert graph.get_edge_storage("w").fetch(torch.tensor([1]), "cpu").wait().tolist() == [[1.0]]


def test_the_graph_refuses_what_it_cannot_serve(hdgl):
    import dgl

    graph = dgl_graph(hdgl)
    with pytest.raises(KeyError, match="nokey"):
        graph.get_node_storage("nokey")
    with pytest.raises(dgl.DGLError, match="nope"):
        graph.get_node_storage("feat", "nope")
    graph._gpu_caches = {"node": {("feat", "_N"): None}, "edge": {("w", None): None}}  # what DGL's gpu_cache sets
    with pytest.raises(ValueError, match="'feat' is served by hmgstore.*gpu_cache"):
        graph.get_node_storage("feat")
    with pytest.raises(ValueError, match="'w' is served by hmgstore.*gpu_cache"):
        graph.get_edge_storage("w")


@pytest.mark.parametrize("kind", ["bfloat16", "layout"])
def test_ndata_of_a_decoded_table_shows_later_writes(hdgl, kind):
    """g.ndata[key] of a table whose host tier is not its rows (a stored format, a layout) is a copy, kept
    until the table is written."""
    import dgl

    x = torch.arange(12.0).reshape(6, 2)
    opts = {"compress": "bfloat16"} if kind == "bfloat16" else {"layout": torch.tensor([5, 4, 3, 2, 1, 0])}
    table = hmgstore.HybridTensor(x.clone(), "cpu", **opts)
    graph = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])), num_nodes=6)
    graph = hdgl.attach(graph, {"feat": table}) or graph
    assert torch.equal(graph.ndata["feat"], x)
    table[[0]] = torch.tensor([[100.0, 200.0]])
    assert graph.ndata["feat"][0].tolist() == [100.0, 200.0] and torch.equal(graph.ndata["feat"][1:], x[1:])
