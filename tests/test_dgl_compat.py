"""Classic DGL 2.1 on a newer torch: importing the plugin stubs dgl.graphbolt, and only that.

The subprocess tests start fresh interpreters, because whether ``import dgl``
works is decided once per process.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hmgstore.plugins import dgl as hdgl  # noqa: F401  (imports dgl, stubbing graphbolt if needed)
from hmgstore.plugins.dgl import _compat as _dgl_compat

# isort: split
import dgl  # noqa: E402

STUBBED = _dgl_compat.graphbolt_unavailable_reason() is not None


def _run_script(tmp_path, source: str) -> subprocess.CompletedProcess:
    # A file, not `python -c`: spawned DataLoader workers re-import the main
    # script, which is what makes them import hmgstore.plugins.dgl before dgl.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_fresh_interpreter_imports_plugin_then_uses_dgl_with_spawned_workers(tmp_path):
    done = _run_script(tmp_path, """
        import logging
        import sys
        import torch
        logging.basicConfig(level=logging.INFO)  # the stub notice is INFO: shown only to those who ask
        import hmgstore.plugins.dgl as hdgl  # before dgl: this is the documented order
        import dgl
        from hmgstore import data as datasets

        if __name__ == "__main__":
            data = datasets.synthetic(num_nodes=600, avg_degree=5, feat_dim=8, num_classes=3, seed=2)
            g = dgl.graph(tuple(data.edge_index), num_nodes=data.num_nodes)
            hdgl.attach(g, {"feat": data.x})
            sampler = dgl.dataloading.NeighborSampler([4, 4], prefetch_node_feats=["feat"])
            loader = dgl.dataloading.DataLoader(g, data.train_idx, sampler, batch_size=200, num_workers=1,
                                                multiprocessing_context="spawn")
            for input_nodes, _, blocks in loader:
                assert torch.equal(blocks[0].srcdata["feat"], data.x[input_nodes])
            print("OK", type(sys.modules["dgl.graphbolt"]).__name__)
        """)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout
    if STUBBED:
        assert "GraphboltUnavailable" in done.stdout
        assert done.stderr.count("replaced dgl.graphbolt by a stub") == 1  # a log record, main process only


@pytest.mark.skipif(not STUBBED, reason="GraphBolt loads here: plain `import dgl` works")
def test_plugin_recovers_after_a_failed_import_dgl(tmp_path):
    done = _run_script(tmp_path, """
        try:
            import dgl
        except Exception as err:
            print("plain import failed:", type(err).__name__)
        import hmgstore.plugins.dgl
        import dgl
        g = dgl.rand_graph(50, 200)
        frontier = dgl.sampling.sample_neighbors(g, [0, 1, 2], 3)
        print("OK", frontier.num_edges() <= 9)
        """)
    assert done.returncode == 0, done.stderr
    assert "plain import failed" in done.stdout and "OK True" in done.stdout


@pytest.mark.skipif(not STUBBED, reason="GraphBolt loads here: nothing is stubbed")
def test_only_graphbolt_is_replaced_and_it_explains_itself():
    stub = sys.modules["dgl.graphbolt"]
    assert isinstance(stub, _dgl_compat.GraphboltUnavailable)
    assert dgl.graphbolt is stub
    with pytest.raises(AttributeError, match="unavailable"):
        dgl.graphbolt.ItemSampler  # noqa: B018
    # dgl.distributed asks isinstance(graph, gb.FusedCSCSamplingGraph) of classic partitions
    assert not isinstance(dgl.graph(([0], [1])), dgl.graphbolt.FusedCSCSamplingGraph)
    assert not any(isinstance(m, _dgl_compat.GraphboltUnavailable)
                   for name, m in list(sys.modules.items()) if name != "dgl.graphbolt")


def test_import_dgl_leaves_an_imported_dgl_alone():
    modules = dict(sys.modules)
    assert _dgl_compat.import_dgl() is dgl
    assert sys.modules.keys() == modules.keys()


def test_graphbolt_reason_names_the_missing_library(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "9.9.9+cpu")
    assert "libgraphbolt_pytorch_9.9.9" in _dgl_compat.graphbolt_unavailable_reason()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_dgl_supports_cuda_is_false_without_a_gpu():
    assert hdgl.dgl_supports_cuda() is False
