"""gpu_budget="auto" (issue 30, item 12): parsed on every device, the lesser of what a table needs and
hotness.AUTO_SHARE of the GPU's free memory on a GPU (torch.cuda.mem_get_info mocked here), nothing on a CPU; the
default of from_data and HybridNeighborSampler."""
from __future__ import annotations

import inspect

import pytest
import torch

import hmgstore
from hmgstore.graph import CSC, Topology
from hmgstore.rows import hotness, placement


@pytest.mark.parametrize("text", ["auto", "AUTO", " Auto "])
def test_auto_parses_in_any_case(text):
    assert hotness.parse_budget(text) == "auto"
    assert hotness.parse_budget("2GB") == 2 * 10**9 and hotness.parse_budget(None) is None


def test_auto_is_no_gpu_tier_on_a_cpu():
    assert hotness.resolve_budget("auto", 10**9, "cpu") == 0
    assert hotness.resolve_budget(None, 10**9, "cpu") is None
    assert hotness.resolve_budget("1MB", 10**9, "cpu") == 10**6


def test_auto_is_the_lesser_of_the_table_and_the_share_of_free_memory(monkeypatch):
    free = 10 * 2**30
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: asked.append(device) or (free, 80 * 2**30))
    share = int(hotness.AUTO_SHARE * free)
    assert hotness.AUTO_SHARE == 0.5
    assert hotness.resolve_budget("auto", 5 * 10**6, "cuda:1") == 5 * 10**6  # a small table: all of it
    assert hotness.resolve_budget("auto", 100 * 2**30, "cuda:1") == share  # a large one: half of what is free
    assert asked == [torch.device("cuda", 1)] * 2
    free = 0
    assert hotness.resolve_budget("auto", 100, "cuda") == 0


def test_a_typo_fails_on_every_device():
    for budget in ("autox", "16XB", "aut0"):
        with pytest.raises(ValueError, match="cannot read"):
            hotness.resolve_budget(budget, 100, "cpu")
        with pytest.raises(ValueError, match="cannot read"):
            hmgstore.HybridTensor(torch.zeros(4, 2), "cpu", gpu_budget=budget)
        with pytest.raises(ValueError, match="cannot read"):
            Topology(CSC(torch.tensor([1, 0]), torch.tensor([0, 1, 2]), None, (2, 2)), "cpu", gpu_budget=budget)


def test_tables_and_topologies_take_auto_on_a_cpu():
    t = hmgstore.HybridTensor(torch.arange(12.0).view(6, 2), "cpu", gpu_budget="auto")
    assert t.num_gpu_rows == 0 and torch.equal(t[[5, 0]], torch.tensor([[10.0, 11.0], [0.0, 1.0]]))
    topo = Topology(CSC(torch.tensor([1, 0]), torch.tensor([0, 1, 2]), None, (2, 2)), "cpu", gpu_budget="auto")
    assert topo.gpu_edges == 0


def test_placement_rule_on_a_gpu_takes_the_rows_that_fit(monkeypatch):
    """for_table's rows under "auto" on a GPU (placement only: no CUDA memory is touched)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, 10**6))  # share: 500 bytes
    p = placement.for_table(100, 10, torch.device("cuda", 0), gpu_budget="auto")  # needs 1000: 50 rows fit
    assert p.num_gpu_rows == 50
    p = placement.for_table(20, 10, torch.device("cuda", 0), gpu_budget="auto")  # needs 200: all of it
    assert p.num_gpu_rows == 20


def test_store_and_sampler_default_to_auto():
    pytest.importorskip("torch_geometric")
    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data, from_tensors

    for function in (from_data, from_tensors, HybridNeighborSampler.__init__):
        assert inspect.signature(function).parameters["gpu_budget"].default == "auto"


def test_pyg_budgets_resolve_auto_once_over_edge_types(monkeypatch):
    pytest.importorskip("torch_geometric")
    from hmgstore.plugins.pyg.sampler import _budgets

    edges = {"a": CSC(torch.tensor([0, 0, 0]), torch.tensor([0, 3]), None, (1, 1)),
             "b": CSC(torch.tensor([0]), torch.tensor([0, 1]), None, (1, 1))}
    assert _budgets("auto", edges, torch.device("cpu")) == {"a": 0, "b": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**9, 10**10))
    assert _budgets("auto", edges, torch.device("cuda", 0)) == {"a": 24, "b": 8}  # 8 bytes per edge, in all
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (16, 10**10))  # share: 8 bytes
    assert _budgets("auto", edges, torch.device("cuda", 0)) == {"a": 6, "b": 2}


def _example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "pyg_graphsage.py"
    spec = importlib.util.spec_from_file_location("pyg_graphsage_budgets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_defaults_to_auto_and_says_what_it_chose():
    pytest.importorskip("torch_geometric")
    from types import SimpleNamespace

    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    example = _example()
    args = example.parse_args([])
    assert args.gpu_budget == "auto" and args.topology_budget is None
    held = {"features": (5_000_000, 5_000_000), "topology": (200_000, 400_000)}
    line = example.gpu_memory_line(held, args, torch.device("cuda", 0))
    assert "features 5.0 of 5.0 MB, topology 0.2 of 0.4 MB" in line
    assert "--gpu-budget auto" in line and "--topology-budget auto" in line and "half the GPU memory free" in line
    line = example.gpu_memory_line(held, args, torch.device("cpu"))
    assert line == "graph in GPU memory: none (no GPU here: features 5.0 MB and topology 0.4 MB read from host memory)"
    # what a CPU build holds: every byte, none of it on a GPU
    data = Data(x=torch.randn(50, 4), edge_index=torch.randint(0, 50, (2, 200)))
    stores = from_data(data, device="cpu", progress=False)
    sampler = HybridNeighborSampler(stores, [2], device="cpu")
    held = example.graph_gpu_memory(SimpleNamespace(data=stores), sampler)
    assert held == {"features": (0, 50 * 4 * 4), "topology": (0, 200 * 4)}
