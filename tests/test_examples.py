"""The examples run end to end: examples/pyg_graphsage.py, dgl_graphsage.py and multi_gpu_pyg.py.

- minimal_pyg.py and minimal_dgl.py: at most 60 lines, hmgstore's lines marked, trained on the CPU here;
- pyg_graphsage.py on the CPU: synthetic graph, each --features mode, half-width host rows, OGB files;
- dgl_graphsage.py on a small synthetic graph (CPU);
- multi_gpu_pyg.py under torchrun: two CPU processes (gloo) here, every GPU
  where there are several (``gpu``, ``multigpu``).

PyG's CPU sampler needs torch_sparse (without pyg-lib): the PyG examples skip without it.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import write_fake_products

HAS_PYG_SAMPLER = any(importlib.util.find_spec(m) is not None for m in ("pyg_lib", "torch_sparse"))

pytestmark = pytest.mark.filterwarnings("ignore:Using 'NeighborSampler' without a 'pyg-lib'")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PYG_EXAMPLE = EXAMPLES / "pyg_graphsage.py"
PYG_SMALL = ["--num-nodes", "2000", "--feat-dim", "16", "--hidden", "32", "--fanout", "5,5", "--batch-size", "256",
             "--epochs", "2", "--max-batches", "3", "--no-progress", "--device", "cpu"]
DGL_EXAMPLE = EXAMPLES / "dgl_graphsage.py"
# --lr 0.01: at the example's default rate, 2 epochs end at 0.07-0.09 test accuracy, from run to run (DGL's
# sampling is not reproducible), so close to chance (0.0625) that a check could not tell training from none.
DGL_SMALL = ["--num-nodes", "3000", "--epochs", "2", "--fanout", "5,5,5", "--hidden", "32", "--batch-size",
             "512", "--lr", "0.01", "--no-progress"]
MULTI_EXAMPLE = EXAMPLES / "multi_gpu_pyg.py"
MULTI_SMALL = ["--num-nodes", "3000", "--feat-dim", "16", "--hidden", "32", "--fanout", "5,5", "--batch-size", "128",
               "--epochs", "2", "--max-batches", "4", "--lr", "0.01", "--no-progress"]
# Seconds after which a run counts as hung. The runs take 5-20 s alone; on a loaded 2-core machine (another test
# run beside this one) several times that, so the limit is far above it: only a hang reaches it.
HANG = 600
# Sharing, NCCL's NVLink multicast off: a program using it can take a shared host's GPUs out of service.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# ---- examples/pyg_graphsage.py --------------------------------------------------------------
@pytest.fixture(scope="module")
def pyg_example():
    pytest.importorskip("torch_sparse")
    spec = importlib.util.spec_from_file_location("pyg_graphsage", PYG_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ids spelled out: a bare "gpu" id would count as the gpu marker's keyword and skip the test
@pytest.mark.parametrize("features, sampler", [
    ("hmgstore", "hmgstore"), ("cpu", "hmgstore"),
    pytest.param("hmgstore", "pyg", marks=pytest.mark.skipif(not HAS_PYG_SAMPLER, reason="needs torch-sparse")),
    pytest.param("cpu", "pyg", marks=pytest.mark.skipif(not HAS_PYG_SAMPLER, reason="needs torch-sparse")),
    pytest.param("gpu", "hmgstore", marks=pytest.mark.gpu)], ids=lambda f: f"{f}")
def test_synthetic_each_mode(pyg_example, tmp_path, features, sampler):
    out = tmp_path / "result.json"
    device = ["--device", "cuda"] if features == "gpu" else []  # PYG_SMALL says cpu; the last --device wins
    result = pyg_example.main([*PYG_SMALL, *device, "--dataset", "synthetic", "--features", features,
                               "--sampler", sampler, "--json", str(out)])
    assert result["sampler"] == sampler and result["features"] == features
    assert json.loads(out.read_text())["test_acc"] == result["test_acc"] > 0.2  # 16 classes: chance is 0.06
    assert result["dataset"]["name"] == "synthetic" and len(result["epochs"]) == 2
    epoch = result["epochs"][0]
    assert epoch["batches"] == 3 and all(epoch[k] >= 0 for k in ("sampling_s", "gather_s", "train_s"))
    assert epoch["sampling_s"] + epoch["gather_s"] + epoch["train_s"] <= epoch["seconds"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_features_on_a_gpu_need_one(pyg_example):
    with pytest.raises(SystemExit, match="there is none here"):
        pyg_example.main([*PYG_SMALL, "--dataset", "synthetic", "--features", "gpu"])


def test_same_seed_same_accuracy_whatever_serves_the_features(pyg_example):
    accuracies = {pyg_example.main([*PYG_SMALL, "--dataset", "synthetic", "--features", f])["test_acc"]
                  for f in ("hmgstore", "cpu")}
    assert len(accuracies) == 1


def test_half_width_host_rows(pyg_example, tmp_path):
    out = tmp_path / "result.json"
    result = pyg_example.main([*PYG_SMALL, "--dataset", "synthetic", "--host-dtype", "bfloat16", "--json", str(out)])
    assert json.loads(out.read_text())["host_dtype"] == result["host_dtype"] == "bfloat16"
    assert [e["batches"] for e in result["epochs"]] == [3, 3]
    assert all(math.isfinite(e["loss"]) for e in result["epochs"])
    assert result["test_acc"] > 0.2  # 16 classes: chance is 0.06
    with pytest.raises(SystemExit, match="--features hmgstore"):  # stock PyG reads data.x as it is
        pyg_example.main([*PYG_SMALL, "--dataset", "synthetic", "--features", "cpu", "--host-dtype", "float16"])


def test_ogb_files_then_fallback_then_error(pyg_example, tmp_path, capsys):
    pytest.importorskip("ogb")
    write_fake_products(tmp_path)
    result = pyg_example.main([*PYG_SMALL, "--batch-size", "8", "--dataset-root", str(tmp_path), "--dataset", "auto"])
    assert result["dataset"]["name"] == "ogbn-products" and result["dataset"]["num_nodes"] == 60
    empty = str(tmp_path / "empty")
    result = pyg_example.main([*PYG_SMALL, "--dataset-root", empty])
    assert result["dataset"]["name"] == "synthetic" and "using the synthetic graph" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="never downloads"):
        pyg_example.main([*PYG_SMALL, "--dataset-root", empty, "--dataset", "ogbn-papers100M"])


def test_batches_from_a_producer_process(tmp_path):
    """--pipeline producer: the training batches made by hmgstore.Producer, run as a user runs the script."""
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(PYG_EXAMPLE), *PYG_SMALL, "--dataset", "synthetic", "--pipeline",
                           "producer", "--json", str(out)], capture_output=True, text=True, timeout=HANG)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["pipeline"] is True and [e["batches"] for e in result["epochs"]] == [3, 3]
    assert result["test_acc"] > 0.2  # 16 classes: chance is 0.06
    assert "wait" in done.stdout


def test_trimmed_model_gives_the_seeds_the_untrimmed_logits(pyg_example, small_graph):
    """trim_to_layer with the counts hmgstore's sampler returns: the seeds' logits do not change."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    stores = from_data(Data(x=small_graph.x, y=small_graph.y, edge_index=small_graph.edge_index), device="cpu")
    loader = NeighborLoader(stores, [5, 5, 5], neighbor_sampler=HybridNeighborSampler(stores, [5, 5, 5]),
                            input_nodes=small_graph.train_idx, batch_size=128)
    batch = next(iter(loader))
    assert len(batch.num_sampled_nodes) == 4 and len(batch.num_sampled_edges) == 3
    torch.manual_seed(0)
    model = pyg_example.SAGE(small_graph.x.shape[1], 32, 4, 3).eval()
    trimmed = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    model.trim = False
    full = model(batch.x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    assert trimmed.shape[0] < full.shape[0]  # the outer hop's nodes were dropped at the last layer
    assert torch.allclose(trimmed[:batch.batch_size], full[:batch.batch_size], atol=1e-5)


def test_layer_wise_inference_over_all_nodes_is_the_full_graph_forward(pyg_example, tmp_path):
    out = tmp_path / "result.json"
    result = pyg_example.main([*PYG_SMALL, "--dataset", "synthetic", "--inference-batch-size", "512",
                               "--json", str(out)])
    inference = json.loads(out.read_text())["inference"]
    assert inference == result["inference"] and inference["test_acc"] > 0.2 and inference["seconds"] > 0
    assert result["trim"] and result["tf32"]
    assert pyg_example.main([*PYG_SMALL, "--dataset", "synthetic", "--no-inference", "--no-trim",
                             "--no-tf32"])["inference"] is None
    # the pass itself: every node's logits equal one full-graph forward (all neighbours, mean aggregation)
    from torch_geometric.data import Data

    from hmgstore import data as datasets
    from hmgstore.plugins.pyg import from_data

    graph = datasets.synthetic(num_nodes=1500, avg_degree=6, feat_dim=8, num_classes=4, seed=2)
    args = pyg_example.parse_args([*PYG_SMALL, "--inference-batch-size", "400"])
    stores = from_data(Data(x=graph.x, y=graph.y, edge_index=graph.edge_index), device="cpu")
    sampler = pyg_example.HybridNeighborSampler(stores, [5], device="cpu")
    loader = pyg_example.inference_loader(args, stores, graph, {"neighbor_sampler": sampler})
    torch.manual_seed(0)
    model = pyg_example.SAGE(8, 16, 4, 2).eval()
    with torch.no_grad():
        assert torch.allclose(model.inference(None, loader, torch.device("cpu")), model(graph.x, graph.edge_index),
                              atol=1e-5)


# ---- examples/dgl_graphsage.py --------------------------------------------------------------
def dgl_run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DGL_EXAMPLE), *DGL_SMALL, *args], capture_output=True, text=True,
                          timeout=HANG)


def test_example_trains_from_hmgstore():
    done = dgl_run("--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert "features from hmgstore" in done.stdout
    accuracy = float(done.stdout.split("test accuracy")[1].split()[0])
    assert accuracy > 0.2  # 16 classes: chance is 0.06 (0.32-0.42 in 6 runs)
    assert "seed nodes/s" in done.stdout
    inferred = float(done.stdout.split("layer-wise inference over all 3,000 nodes: test accuracy")[1].split()[0])
    assert inferred > 1 / 16  # the layer-wise pass read g.ndata["feat"] after attach


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, the answer depends on the DGL build")
def test_example_refuses_cuda_without_a_cuda_build_of_dgl():
    done = dgl_run("--device", "cuda")
    assert done.returncode == 2 and "CUDA build of DGL" in done.stderr


# ---- examples/multi_gpu_pyg.py under torchrun -------------------------------------------------
def torchrun(nproc: int, args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the example as ``python -m torch.distributed.run --standalone``; kill every rank on a hang."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **NO_MULTICAST, **(env or {})}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(MULTI_EXAMPLE), *args]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: torchrun and the ranks it starts
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s (a hang?)\n{out}\n{err}") from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def check_result(result: dict, world: int) -> None:
    """What every run must show: each rank present, finite losses, disjoint training slices, timings that add up
    (sampling, gather and train phases; or, pipelined, the training and the waits for batches)."""
    assert result["world_size"] == world
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    num_train = int(0.6 * result["dataset"]["num_nodes"])  # datasets.synthetic: 60% train
    assert sum(r["train_ids"] for r in ranks) <= num_train
    assert len({r["train_ids"] for r in ranks}) == 1, "every rank needs as many steps as the others (DDP)"
    for r in ranks:
        assert len(r["epochs"]) == 2
        for epoch in r["epochs"]:
            assert math.isfinite(epoch["loss"])
            assert epoch["seeds_on_several_ranks"] == 0, "two ranks trained on the same ids in one epoch"
            assert 0 < epoch["seeds"] <= r["train_ids"]
            phases = ("train_s", "wait_s") if result["pipeline"] else ("sampling_s", "gather_s", "train_s")
            assert all(epoch[k] >= 0 for k in phases)
            assert sum(epoch[k] for k in phases) <= epoch["seconds"]
    total = result["aggregate"]
    assert [e["batches"] for e in total["epochs"]] == [sum(r["epochs"][k]["batches"] for r in ranks)
                                                         for k in range(2)]
    assert total["steady_batches_per_s"] > 0 and total["steady_train_ms_per_batch"] > 0
    assert result["test_acc"] > 0.2  # 16 classes: chance is 0.06


def test_two_cpu_processes(tmp_path, no_leaks):
    """hmgstore's sampler on each rank: no torch-sparse or pyg-lib needed (a shim hides torch-sparse here)."""
    out = tmp_path / "result.json"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "torch_sparse.py").write_text("raise ImportError('torch_sparse hidden by the test')\n")
    done = torchrun(2, [*MULTI_SMALL, "--json", str(out)], timeout=HANG,
                    env={"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(shim)})  # gloo
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["backend"] == "gloo"
    check_result(result, world=2)
    assert all(e["batches"] == 4 for r in result["ranks"] for e in r["epochs"])  # --max-batches
    assert not result["pipeline"] and "torch_sparse" not in done.stderr
    assert "2 ranks (gloo)" in done.stdout and "rank 1 (cpu)" in done.stdout


def test_says_how_to_start_it_without_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, str(MULTI_EXAMPLE), *MULTI_SMALL], env=env, capture_output=True, text=True,
                          timeout=HANG)
    assert done.returncode != 0
    assert "torchrun --standalone --nproc-per-node" in done.stderr


@pytest.mark.gpu
@pytest.mark.multigpu
def test_every_gpu_of_the_node(tmp_path, no_leaks):
    """Every GPU: a 100 MB table, 20 MB per GPU (5 MB of it replicated), so each tier serves rows; sampling on
    each GPU, pipelined."""
    world = torch.cuda.device_count()
    out = tmp_path / "result.json"
    args = ["--num-nodes", "200000", "--feat-dim", "128", "--gpu-budget", "20MB", "--replicate", "5MB",
            "--fanout", "10,5", "--batch-size", "512", "--epochs", "2", "--max-batches", "20", "--lr", "0.01",
            "--no-progress", "--json", str(out)]
    done = torchrun(world, args, timeout=HANG)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["backend"] == "nccl" and result["pipeline"]
    check_result(result, world=world)
    assert len({r["device"] for r in result["ranks"]}) == world, "one GPU per rank"
    rows = result["placement_rows"]
    assert list(rows) == ["replica", *(f"shard{s}" for s in range(world)), "host"]
    assert all(n > 0 for n in rows.values()), rows


# ---- examples/minimal_pyg.py and minimal_dgl.py: a user's script, hmgstore's lines marked ---------------------
@pytest.mark.parametrize("script", ["minimal_pyg.py", "minimal_dgl.py"])
def test_minimal_example_is_short_marked_and_trains(script):
    if script == "minimal_pyg.py":
        pytest.importorskip("torch_geometric")
    else:
        pytest.importorskip("hmgstore.plugins.dgl")
    source = (EXAMPLES / script).read_text()
    assert len(source.splitlines()) <= 60
    marked = [line for line in source.splitlines() if re.match(r"\s*[\w(].*  # hmgstore:", line)]  # code lines
    assert len(marked) >= 4, marked
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=HANG,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:3]] == ["epoch 0", "epoch 1", "epoch 2"]
    accuracy = float(done.stdout.split("test accuracy")[1].split()[0])
    assert accuracy > 0.5  # 8 classes: chance is 0.125 (0.98 here)


def _example_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_timer_refuses_the_pipelines_thread():
    """Its synchronisations in a pipeline's thread would hold each batch until the step is done (and under DDP
    until every rank's all-reduce is): the loader would never overlap."""
    import threading

    example = _example_module(PYG_EXAMPLE, "pyg_graphsage_timer")
    timer = example.StepTimer(torch.device("cpu"))
    with timer("train"):
        pass
    errors = []

    def other():
        try:
            with timer("filter"):
                pass
        except RuntimeError as err:
            errors.append(str(err))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert errors and "pipelined loader must not be watched" in errors[0]


def test_a_pipelined_run_leaves_the_loaders_filter_untimed(tmp_path):
    example = _example_module(PYG_EXAMPLE, "pyg_graphsage_pipelined")
    out = str(tmp_path / "r.json")
    result = example.main([*PYG_SMALL, "--dataset", "synthetic", "--pipeline", "on", "--json", out])
    assert result["pipeline"] and result["epochs"][0]["batches"] == 3  # the timer raised in the pipeline thread before
