"""benchmarks/probes/probe_cooperative.py: its counts of the rows each GPU reads alone and once per node."""
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import torch

PATH = Path(__file__).parent.parent / "benchmarks/probes/probe_cooperative.py"


def _probe():
    spec = importlib.util.spec_from_file_location("probe_cooperative", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SameNodes:
    """A sampler stand-in: every batch reaches nodes 0-9, whatever its seeds."""

    def sample(self, seeds):
        return SimpleNamespace(node={None: torch.arange(10)})


def test_rows_shared_by_two_gpus_are_counted_once_per_node_and_owned_by_id_mod_gpus():
    probe = _probe()
    args = SimpleNamespace(gpus=[1, 2], steps=3, cache=[0.0, 0.75], batch=10)
    ranks = 19 - torch.arange(20)  # id 19 hottest: with 75% of 20 rows cached, ids 0-4 miss
    counts = probe.count(SameNodes(), torch.arange(40), ranks, args)
    assert counts[1][0.0] == {"rows_alone_per_step": 10, "rows_node_per_step": 10, "nvlink_rows_per_step": 0,
                              "saving": 1.0}
    assert counts[2][0.0] == {"rows_alone_per_step": 20, "rows_node_per_step": 10, "nvlink_rows_per_step": 10,
                              "saving": 2.0}
    # misses 0-4 on both GPUs: GPU 0 asks for the odd ones (1, 3) from GPU 1, GPU 1 for 0, 2, 4
    assert counts[2][0.75] == {"rows_alone_per_step": 10, "rows_node_per_step": 5, "nvlink_rows_per_step": 5,
                               "saving": 2.0}


def test_the_probe_runs_on_a_small_graph(capsys):
    assert _probe().main(["--quick"]) == 0
    report = json.loads(capsys.readouterr().out)
    for graph in report["graphs"].values():
        for gpus, by_cache in graph["counts"].items():
            for v in by_cache.values():
                assert v["rows_node_per_step"] <= v["rows_alone_per_step"]
                assert (v["saving"] == 1.0) == (gpus == "1") and v["nvlink_rows_per_step"] < v["rows_alone_per_step"]
