"""The examples refuse a value that cannot apply as it is parsed, and dgl_graphsage.py takes ``--max-batches``.

``--epochs 0``, an unreadable ``--gpu-budget``, ``--device cuda`` on a
machine without a GPU and the like end each example at its command line
with argparse's message (exit code 2: the flag, the value, the fix), never
in a traceback after the graph is built. Each example's ``parse_args`` runs
in this process (nothing trains but the short DGL run of ``--max-batches``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str, monkeypatch):
    """An example's module, imported from examples/ (multi_gpu_pyg.py imports pyg_graphsage.py from there)."""
    pytest.importorskip("torch_geometric" if name != "dgl_graphsage" else "hmgstore.plugins.dgl")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"cli_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refusal(module, argv, capsys) -> str:
    """The example's message for ``argv``, after checking that it exits as a bad command line does (code 2)."""
    with pytest.raises(SystemExit) as exited:
        module.parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


#: example -> (command line, words the message must hold)
REFUSED = {
    "pyg_graphsage": [
        (["--epochs", "0"], ["--epochs", "0"]),
        (["--gpu-budget", "8XB"], ["--gpu-budget", "8XB", "'auto'", "'none'"]),
        (["--topology-budget", "most"], ["--topology-budget", "most", "'all'"]),
        (["--device", "gpu"], ["--device", "gpu", "cpu, cuda or cuda:N"]),
        (["--lr", "nan"], ["--lr", "nan"]),
        (["--num-nodes", "5"], ["--num-nodes", "5"]),
        (["--avg-degree", "0"], ["--avg-degree", "0"]),
        (["--num-workers", "-1"], ["--num-workers", "-1"]),
        (["--hidden", "0"], ["--hidden", "0"]),
    ],
    "dgl_graphsage": [
        (["--epochs", "0"], ["--epochs", "0"]),
        (["--gpu-budget", "8XB"], ["--gpu-budget", "8XB"]),
        (["--device", "gpu"], ["--device", "gpu"]),
        (["--max-batches", "0"], ["--max-batches", "0"]),
        (["--num-classes", "1"], ["--num-classes", "1"]),
        (["--num-nodes", "10"], ["--num-nodes 10", "--num-classes 16"]),
        (["--lr", "inf"], ["--lr", "inf"]),
    ],
    "multi_gpu_pyg": [
        (["--epochs", "0"], ["--epochs", "0"]),
        (["--gpu-budget", "8XB"], ["--gpu-budget", "8XB"]),
        (["--gpu-budget", "1GB", "--replicate", "2GB"], ["--replicate 2GB", "--gpu-budget 1GB"]),
        (["--topology-budget", "most"], ["--topology-budget", "most"]),
        (["--topology-replicate", "some"], ["--topology-replicate", "some"]),
        (["--max-sms", "0"], ["--max-sms", "0"]),
        (["--graph", "papers:0:10"], ["--graph", "papers:0:10"]),
        (["--num-nodes", "3"], ["--num-nodes", "3"]),
        (["--lr", "-1"], ["--lr", "-1"]),
    ],
    "multi_node_pyg": [
        (["{parts}", "--epochs", "0"], ["--epochs", "0"]),
        (["{parts}", "--lr", "nan"], ["--lr", "nan"]),
        (["{parts}/missing"], ["missing is not a folder", "hmgstore.cli.partition"]),
    ],
}
CASES = [(name, argv, words) for name, cases in REFUSED.items() for argv, words in cases]


@pytest.mark.parametrize("name, argv, words", CASES, ids=[f"{n} {' '.join(a)}" for n, a, _ in CASES])
def test_a_value_that_cannot_apply_is_refused_as_it_is_parsed(name, argv, words, monkeypatch, capsys, tmp_path):
    module = load(name, monkeypatch)
    message = refusal(module, [a.replace("{parts}", str(tmp_path)) for a in argv], capsys)
    assert "error:" in message and all(w in message for w in words), message


@pytest.mark.parametrize("name, fix", [("pyg_graphsage", "use cpu"), ("dgl_graphsage", "Use --device cpu")])
def test_cuda_without_a_gpu_is_refused_with_the_fix(name, fix, monkeypatch, capsys):
    module = load(name, monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = refusal(module, ["--device", "cuda"], capsys)
    assert "--device" in message and "cuda" in message and fix in message, message


def test_values_that_apply_still_parse(monkeypatch, tmp_path):
    pyg = load("pyg_graphsage", monkeypatch)
    args = pyg.parse_args(["--device", "cpu", "--gpu-budget", "NONE", "--topology-budget", "2GB", "--num-nodes", "2K"])
    assert args.device == torch.device("cpu") and args.gpu_budget == "none" and args.topology_budget == "2GB"
    assert args.num_nodes == 2000
    multi = load("multi_gpu_pyg", monkeypatch)
    args = multi.parse_args(["--max-sms", "None", "--graph", "papers:1K:10K", "--topology-budget", "ALL"])
    assert args.max_sms == "None" and args.graph == ("papers", 1000, 10_000) and args.topology_budget == "all"
    assert multi.parse_args(["--gpu-budget", "1GB", "--replicate", "1GB"]).replicate == "1GB"
    assert load("multi_node_pyg", monkeypatch).parse_args([str(tmp_path)]).epochs == 3


def test_the_dgl_example_stops_each_epoch_after_max_batches(monkeypatch, capsys):
    """As the PyG example does: each epoch (and each evaluation) stops after --max-batches batches."""
    dgl_example = load("dgl_graphsage", monkeypatch)
    result = dgl_example.main(["--num-nodes", "2000", "--feat-dim", "16", "--hidden", "16", "--fanout", "5,5",
                               "--batch-size", "64", "--epochs", "2", "--max-batches", "3", "--no-inference",
                               "--no-progress", "--device", "cpu"])
    assert [e["batches"] for e in result["epochs"]] == [3, 3]  # of 19 a whole epoch has (1,200 ids / 64)
    assert 0 <= result["test_acc"] <= 1 and result["inference_test_acc"] is None
    assert "training throughput" in capsys.readouterr().out
