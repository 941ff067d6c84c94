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
