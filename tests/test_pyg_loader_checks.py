"""Stock PyG loaders built over hmgstore's objects (hmgstore.plugins.pyg.loader_checks).

- options given to the loader that differ from its ``HybridNeighborSampler``'s warn (PyG drops them);
- store inputs that PyG asserts on read as with a ``Data`` (no ``input_nodes``, ``(node_type, None)``,
  a plain ``edge_label_index``), or raise hmgstore's ValueError where no meaning is clear;
- without pyg-lib and torch-sparse (hidden here through PyG's ``WITH_*`` flags: the dev venv has
  torch-sparse), the stores sample with ``HybridNeighborSampler``, and ``examples/pyg_graphsage.py
  --sampler pyg`` stops at once with one line naming ``make pyg-sampler``.

Every loader here samples with hmgstore's sampler, so no test needs torch-sparse.
"""
from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_geometric.typing
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader

from hmgstore.plugins import pyg as hpyg
from hmgstore.plugins.pyg import HybridNeighborSampler

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")


@pytest.fixture(scope="module")
def stores(data):
    return hpyg.from_data(data, device="cpu", progress=False)


@pytest.fixture(scope="module")
def hetero_stores(hetero):
    return hpyg.from_data(hetero, device="cpu", progress=False)


@pytest.fixture
def no_pyg_sampler(monkeypatch):
    """PyG as it is without pyg-lib and torch-sparse: its NeighborSampler raises ImportError at the first batch."""
    monkeypatch.setattr(torch_geometric.typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(torch_geometric.typing, "WITH_TORCH_SPARSE", False)


def _ours(record) -> list[str]:
    return [str(w.message) for w in record if "neighbor_sampler's" in str(w.message)]


# ---- item 4: loader options a custom sampler never sees ---------------------------------------------
def test_loader_options_that_differ_from_the_sampler_warn(stores, small_graph):
    sampler = HybridNeighborSampler(stores, [10, 5], device="cpu", progress=False)
    with pytest.warns(UserWarning, match=r"num_neighbors=\[2\] \(the sampler's: \[10, 5\]\), replace=True "
                                         r"\(the sampler's: False\), disjoint=True") as record:
        loader = NeighborLoader(stores, [2], neighbor_sampler=sampler, input_nodes=small_graph.train_idx,
                                batch_size=64, replace=True, disjoint=True)
    assert record[0].filename == __file__  # the warning points at the caller's line
    assert len(next(iter(loader)).num_sampled_nodes) == 3  # the sampler's two hops, as the warning says


def test_options_the_sampler_shares_do_not_warn(stores, data, hetero_stores, small_graph):
    sampler = HybridNeighborSampler(stores, [10, 5], replace=True, device="cpu", progress=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        NeighborLoader(stores, [10, 5], neighbor_sampler=sampler, input_nodes=small_graph.train_idx, replace=True)
        NeighborLoader(stores, [10, 5], neighbor_sampler=sampler, input_nodes=small_graph.train_idx)  # defaults
        het = HybridNeighborSampler(hetero_stores, [3, 2], device="cpu", progress=False)
        per_type = {et: [3, 2] for et in het.edge_types}  # a dict equal to the sampler's list
        NeighborLoader(hetero_stores, per_type, neighbor_sampler=het, input_nodes="paper")
    assert _ours(record) == []


def test_a_custom_sampler_over_a_data_warns_too(data):
    sampler = HybridNeighborSampler(data, [4], device="cpu", progress=False)
    with pytest.warns(UserWarning, match=r"LinkNeighborLoader: .*subgraph_type='bidirectional'"):
        LinkNeighborLoader(data, [4], neighbor_sampler=sampler, subgraph_type="bidirectional",
                           edge_label_index=data.edge_index[:, :10], batch_size=4)


# ---- item 5: store inputs PyG asserts on ------------------------------------------------------------
def test_no_input_nodes_means_every_node_as_with_a_data(stores, data):
    sampler = HybridNeighborSampler(stores, [3], device="cpu", progress=False)
    loader = NeighborLoader(stores, [3], neighbor_sampler=sampler, batch_size=500)  # PyG: AssertionError
    assert len(loader) == math.ceil(data.num_nodes / 500)
    batch = next(iter(loader))
    assert torch.equal(batch.x, data.x[batch.n_id])
    ids = NeighborLoader(stores, [3], neighbor_sampler=sampler, input_nodes=(None, torch.arange(10)), batch_size=4)
    assert len(ids) == 3  # (None, ids) on homogeneous stores is ids


def test_hetero_inputs(hetero_stores, hetero):
    sampler = HybridNeighborSampler(hetero_stores, [3], device="cpu", progress=False)
    with pytest.raises(ValueError, match=r"heterogeneous stores needs input_nodes: a node type .*'author', "
                                         r"'paper'"):
        NeighborLoader(hetero_stores, [3], neighbor_sampler=sampler, batch_size=64)
    # ("paper", None): PyG's store path passes None on as the node type ("query None"); it means every paper
    loader = NeighborLoader(hetero_stores, [3], neighbor_sampler=sampler, input_nodes=("paper", None),
                            batch_size=512)
    assert len(loader) == math.ceil(hetero["paper"].num_nodes / 512)
    batch = next(iter(loader))
    assert torch.equal(batch["paper"].x, hetero["paper"].x[batch["paper"].n_id])


def _batches(stores, input_nodes, node_type=None):
    """Every batch's seeds, sampled nodes and features, from a fresh sampler with the same draws."""
    torch.manual_seed(0)
    sampler = HybridNeighborSampler(stores, [3], device="cpu", progress=False)
    loader = NeighborLoader(stores, [3], neighbor_sampler=sampler, input_nodes=input_nodes, batch_size=16)
    out = []
    for batch in loader:
        part = batch if node_type is None else batch[node_type]
        out.append((part.n_id.tolist(), part.x, batch[node_type].input_id if node_type else batch.input_id))
    return out


def _same(ours, theirs) -> bool:
    return len(ours) == len(theirs) and all(a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
                                            for a, b in zip(ours, theirs))


def test_input_nodes_as_numpy_lists_and_ranges_give_the_batches_of_a_tensor(stores):
    """PyG's Data path reads non-tensor ids with torch.tensor(ids); its store path failed on them (``cannot
    unpack non-iterable NoneType``, or an AssertionError for a list)."""
    ids = np.array([3, 17, 40, 41, 99, 250, 7, 1999, 0, 12] * 4)
    expected = _batches(stores, torch.from_numpy(ids))
    for given in (ids, ids.astype(np.int32), ids.astype(np.uint16), ids.tolist(), [3, 17]):
        assert _same(_batches(stores, given), expected if len(given) > 2 else _batches(stores, torch.tensor(given)))
    assert _same(_batches(stores, range(5, 60, 3)), _batches(stores, torch.arange(5, 60, 3)))
    assert _same(_batches(stores, (None, ids)), expected)


def test_a_numpy_bool_mask_is_a_mask_as_a_torch_one_is(stores, hetero_stores, data, hetero):
    mask = np.zeros(data.num_nodes, dtype=bool)
    mask[[5, 9, 300, 1200]] = True
    assert _same(_batches(stores, mask), _batches(stores, torch.from_numpy(mask)))
    assert _batches(stores, mask)[0][0][:4] == [5, 9, 300, 1200]  # PyG's Data path: ids 0 and 1
    papers = np.zeros(hetero["paper"].num_nodes, dtype=bool)
    papers[[2, 8]] = True
    ours = _batches(hetero_stores, ("paper", papers), "paper")
    assert _same(ours, _batches(hetero_stores, ("paper", torch.from_numpy(papers)), "paper"))
    assert ours[0][0][:2] == [2, 8]
    with pytest.raises(ValueError, match=r"input_nodes is a bool mask of shape \(10,\); a mask holds one entry "
                                         rf"per node, \({data.num_nodes},\)"):
        NeighborLoader(stores, [3], input_nodes=np.ones(10, dtype=bool), batch_size=4)


def test_input_nodes_hetero_numpy_ids(hetero_stores):
    ids = np.arange(0, 90, 3)
    assert _same(_batches(hetero_stores, ("paper", ids), "paper"),
                 _batches(hetero_stores, ("paper", torch.from_numpy(ids)), "paper"))


def test_bad_input_nodes_are_refused_when_the_loader_is_built(stores, hetero_stores, data, hetero):
    sampler = HybridNeighborSampler(stores, [3], device="cpu", progress=False)
    with pytest.raises(TypeError, match="input_nodes holds float64 values; ids are integers"):
        NeighborLoader(stores, [3], neighbor_sampler=sampler, input_nodes=np.array([1.0, 2.5]))  # PyG: truncated
    with pytest.raises(IndexError, match=rf"input_nodes: index {data.num_nodes} at position 1 is out of range"):
        NeighborLoader(stores, [3], neighbor_sampler=sampler, input_nodes=np.array([1, data.num_nodes]))
    with pytest.raises(ValueError, match=r"input_nodes must be 1-D"):
        NeighborLoader(stores, [3], neighbor_sampler=sampler, input_nodes=np.ones((2, 2), dtype=np.int64))
    het = HybridNeighborSampler(hetero_stores, [3], device="cpu", progress=False)
    with pytest.raises(ValueError, match=r"input_nodes=ids names no node type.*pass \(node type, ids\)"):
        NeighborLoader(hetero_stores, [3], neighbor_sampler=het, input_nodes=np.arange(4))
    with pytest.raises(ValueError, match=r"node type 'papers', which these stores do not hold; they hold "
                                         r"\['author', 'paper'\]"):
        NeighborLoader(hetero_stores, [3], neighbor_sampler=het, input_nodes=("papers", np.arange(4)))
    with pytest.raises(IndexError, match=r"input_nodes of 'paper': index -1 at position 0"):
        NeighborLoader(hetero_stores, [3], neighbor_sampler=het, input_nodes=("paper", [-1]))


def test_link_loader_takes_a_plain_edge_label_index_on_homogeneous_stores(stores, data):
    sampler = HybridNeighborSampler(stores, [3], device="cpu", progress=False)
    label_index = data.edge_index[:, :40]
    loader = LinkNeighborLoader(stores, [3], neighbor_sampler=sampler, edge_label_index=label_index, batch_size=8)
    batch = next(iter(loader))  # PyG: AssertionError (it wants (None, label_index))
    assert torch.equal(batch.n_id[batch.edge_label_index], label_index[:, :8])
    every = LinkNeighborLoader(stores, [3], neighbor_sampler=sampler, batch_size=1000)  # None: every edge
    assert len(every) == math.ceil(data.num_edges / 1000)
    batch = next(iter(every))
    assert torch.equal(batch.n_id[batch.edge_label_index], data.edge_index[:, :1000])


def test_link_loader_on_hetero_stores_needs_an_edge_type(hetero_stores, hetero):
    sampler = HybridNeighborSampler(hetero_stores, [3], device="cpu", progress=False)
    writes = ("author", "writes", "paper")
    with pytest.raises(ValueError, match=r"edge_label_index=\(edge type, \[2, E\] tensor\)"):
        LinkNeighborLoader(hetero_stores, [3], neighbor_sampler=sampler,
                           edge_label_index=hetero[writes].edge_index[:, :10], batch_size=4)
    loader = LinkNeighborLoader(hetero_stores, [3], neighbor_sampler=sampler,
                                edge_label_index=(writes, hetero[writes].edge_index[:, :10]), batch_size=4)
    assert len(loader) == 3


def test_an_edge_label_index_out_of_range_is_named_with_its_edge(stores, data, hetero_stores, hetero):
    """An end of a labelled edge past the graph's nodes: IndexError naming edge_label_index, the side and the
    edge's column, not a position among the batch's de-duplicated seeds and negatives."""
    sampler = HybridNeighborSampler(stores, [3], device="cpu", progress=False)
    n = data.num_nodes
    label_index = data.edge_index[:, :12].clone()
    label_index[1, 9] = n + 5
    loader = LinkNeighborLoader(stores, [3], neighbor_sampler=sampler, edge_label_index=label_index, batch_size=4,
                                shuffle=False)
    batches = iter(loader)
    next(batches), next(batches)  # edges 0..7 are good
    with pytest.raises(IndexError, match=rf"edge_label_index: the destination of edge 9 is node {n + 5}, out of "
                                         rf"range for {n} nodes \(valid ids are 0..{n - 1}\)"):
        next(batches)
    writes = ("author", "writes", "paper")
    authors = hetero["author"].num_nodes
    bad = hetero[writes].edge_index[:, :6].clone()
    bad[0, 2] = -1
    sampler = HybridNeighborSampler(hetero_stores, [3], device="cpu", progress=False)
    loader = LinkNeighborLoader(hetero_stores, [3], neighbor_sampler=sampler, edge_label_index=(writes, bad),
                                batch_size=6)
    with pytest.raises(IndexError, match=rf"the source of edge 2 is node -1, out of range for {authors} nodes of "
                                         "type 'author'"):
        next(iter(loader))


# ---- item 3: PyG's own sampler missing ------------------------------------------------------------------
def test_without_pyg_sampler_the_stores_sample_with_hmgstores(no_pyg_sampler, stores, data, small_graph):
    with pytest.warns(UserWarning, match="neither is installed: run `make pyg-sampler`"):
        loader = NeighborLoader(stores, [5, 5], input_nodes=small_graph.train_idx, batch_size=64, replace=True)
    assert isinstance(loader.node_sampler, HybridNeighborSampler) and loader.node_sampler.replace
    batch = next(iter(loader))  # PyG: ImportError: 'NeighborSampler' requires either 'pyg-lib' or 'torch-sparse'
    assert torch.equal(batch.x, data.x[batch.n_id]) and batch.batch_size == 64
    with pytest.warns(UserWarning, match="make pyg-sampler"):
        link = LinkNeighborLoader(stores, [5], edge_label_index=(None, data.edge_index[:, :20]), batch_size=8,
                                  neg_sampling_ratio=1.0)
    assert next(iter(link)).edge_label.numel() == 16


def test_without_pyg_sampler_induced_samples_with_hmgstores(no_pyg_sampler, stores, small_graph):
    with pytest.warns(UserWarning, match="make pyg-sampler"):
        loader = NeighborLoader(stores, [5], input_nodes=small_graph.train_idx, subgraph_type="induced",
                                batch_size=64)
    assert loader.node_sampler.subgraph_type.value == "induced"
    batch = next(iter(loader))
    assert "num_sampled_edges" not in batch and batch.edge_index.shape[1] > 0  # induced: no edges per hop


def test_the_example_says_how_to_get_pyg_sampler(no_pyg_sampler, capsys):
    path = Path(__file__).resolve().parents[1] / "examples" / "pyg_graphsage.py"
    spec = importlib.util.spec_from_file_location("pyg_graphsage_no_sampler", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for features in ("hmgstore", "cpu"):
        with pytest.raises(SystemExit) as stop:
            example.main(["--features", features, "--sampler", "pyg", "--num-nodes", "500", "--no-progress",
                          "--device", "cpu"])
        message = str(stop.value.code)
        assert "make pyg-sampler" in message and "\n" not in message


def test_importing_the_adapter_leaves_pygs_loaders_alone_until_hmgstore_objects_are_built():
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from torch_geometric.data import Data\n"
        "from torch_geometric.loader import LinkNeighborLoader, NeighborLoader\n"
        "import hmgstore.plugins.pyg as hpyg\n"
        "loaders = (NeighborLoader, LinkNeighborLoader)\n"
        "wrapped = lambda: [hasattr(c.__init__, '__hmgstore_original__') for c in loaders]\n"
        "assert wrapped() == [False, False], wrapped()\n"
        "hpyg.HybridNeighborSampler(Data(edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=3), [2])\n"
        "assert wrapped() == [True, True], wrapped()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
