"""examples/pyg_graphsage.py runs end to end on the CPU: synthetic graph, each --features mode, OGB files."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch_sparse")
pytest.importorskip("ogb")

from test_pyg_ogb import write_fake_products  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pyg_graphsage.py"
SMALL = ["--num-nodes", "2000", "--feat-dim", "16", "--hidden", "32", "--fanout", "5,5", "--batch-size", "256",
         "--epochs", "2", "--max-batches", "3", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("pyg_graphsage", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ids spelled out: a bare "gpu" id would count as the gpu marker's keyword and skip the test
@pytest.mark.parametrize("features", ["hmgstore", "cpu", "gpu"], ids=lambda f: f"features={f}")
def test_synthetic_each_mode(example, tmp_path, features):
    out = tmp_path / "result.json"
    result = example.main([*SMALL, "--dataset", "synthetic", "--features", features, "--json", str(out)])
    assert json.loads(out.read_text())["test_acc"] == result["test_acc"] > 0.2  # 16 classes: chance is 0.06
    assert result["dataset"]["name"] == "synthetic" and len(result["epochs"]) == 2
    epoch = result["epochs"][0]
    assert epoch["batches"] == 3 and all(epoch[k] >= 0 for k in ("sampling_s", "gather_s", "train_s"))
    assert epoch["sampling_s"] + epoch["gather_s"] + epoch["train_s"] <= epoch["seconds"]


def test_same_seed_same_accuracy_whatever_serves_the_features(example):
    accuracies = {example.main([*SMALL, "--dataset", "synthetic", "--features", f])["test_acc"]
                  for f in ("hmgstore", "cpu")}
    assert len(accuracies) == 1


def test_ogb_files_then_fallback_then_error(example, tmp_path, capsys):
    write_fake_products(tmp_path)
    result = example.main([*SMALL, "--batch-size", "8", "--dataset-root", str(tmp_path), "--dataset", "auto"])
    assert result["dataset"]["name"] == "ogbn-products" and result["dataset"]["num_nodes"] == 60
    empty = str(tmp_path / "empty")
    result = example.main([*SMALL, "--dataset-root", empty])
    assert result["dataset"]["name"] == "synthetic" and "using the synthetic graph" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="never downloads"):
        example.main([*SMALL, "--dataset-root", empty, "--dataset", "ogbn-papers100M"])
