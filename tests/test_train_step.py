"""``bench train``'s strong step (layers trimmed per hop, TF32), its ceilings, and the hottest-first host layout.

Trimming must not change what the model computes for the seeds: a batch from
hmgstore's sampler lists its nodes and edges hop by hop, so dropping the last
hops layer by layer (``trim_to_layer``) leaves the seeds' outputs as they
were. The report carries, beside each configuration, the step's own rate and
the loader's own rate, and says whether trimming and TF32 were used.
"""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.loader import NeighborLoader

import hmgstore
from helpers import assert_same, random_table
from hmgstore.bench.__main__ import parse_args
from hmgstore.bench.train import _with_caps, add_ratios, table_text
from hmgstore.bench.train_setup import SAGE, train_step, trimmable
from hmgstore.plugins.pyg import HybridNeighborSampler, from_data
from hmgstore.rows import hotness


def _loader(data, fanout, seed=0, **kwargs):
    torch.manual_seed(seed)
    sampler = HybridNeighborSampler(data, fanout, device="cpu")
    return NeighborLoader(data, fanout, neighbor_sampler=sampler, input_nodes=torch.arange(200), batch_size=64,
                          shuffle=True, **kwargs)


def test_trimmed_layers_give_the_seeds_the_same_outputs(data):
    """Every layer over every node against layers trimmed per hop: the seeds' outputs agree (float64, so only
    the order of additions differs), on several batches and fanouts; and trimming does drop work."""
    for fanout in ([5, 3], [4, 3, 2]):
        torch.manual_seed(0)
        model = SAGE([data.x.shape[1], 16, 16, 7][:len(fanout) + 1]).double().eval()
        for _i, batch in zip(range(3), _loader(data, fanout)):
            assert trimmable(batch) and len(batch.num_sampled_nodes) == len(fanout) + 1
            x = batch.x.double()
            full = model(x, batch.edge_index)[:batch.batch_size]
            trimmed = model(x, batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
            assert trimmed.shape[0] < batch.num_nodes  # the last layer ran over fewer nodes than the batch has
            torch.testing.assert_close(trimmed[:batch.batch_size], full, rtol=1e-10, atol=1e-10)


def test_trimmed_model_learns_as_the_plain_one(data):
    """Training with the trimmed step follows the plain step's losses (same seeds, same batches)."""
    losses = {}
    for trim in (False, True):
        torch.manual_seed(0)
        model = SAGE([data.x.shape[1], 32, int(data.y.max()) + 1]).double()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        losses[trim] = []
        for batch in _loader(data, [5, 3], seed=1):
            batch.x = batch.x.double()
            torch.manual_seed(2)  # dropout draws the same mask when the rows it covers are the same
            losses[trim].append(train_step(model, optimizer, batch, trim).item())
    assert len(losses[True]) > 2 and losses[True][-1] < losses[True][0]
    # dropout on the trimmed rows draws a different mask, so the losses differ slightly but must track
    assert abs(sum(losses[True]) - sum(losses[False])) / sum(losses[False]) < 0.1


def test_a_batch_without_hop_counts_trains_untrimmed(data):
    batch = next(iter(_loader(data, [5, 3])))
    batch.num_sampled_nodes = batch.num_sampled_edges = None  # what PyG's torch-sparse sampler gives
    assert not trimmable(batch)
    model = SAGE([data.x.shape[1], 16, 7])
    loss = train_step(model, torch.optim.Adam(model.parameters()), batch, trim=True)
    assert torch.isfinite(loss)


def test_train_flags_and_caps():
    args = parse_args(["train"])
    assert args.trim and args.tf32 and args.max_sms == [None] and args.host_layout == "auto"
    args = parse_args(["train", "--no-trim", "--no-tf32", "--max-sms", "auto", "none", "8", "--host-layout", "id"])
    assert not args.trim and not args.tf32 and args.max_sms == ["auto", None, 8] and args.host_layout == "id"
    assert _with_caps(["all_gpu", "cache+pipe"], ["auto", None]) == ["all_gpu", "cache+pipe@auto", "cache+pipe@none"]
    assert _with_caps(["cache+pipe"], ["auto"]) == ["cache+pipe"]
    with pytest.raises(SystemExit):
        parse_args(["train", "--max-sms", "many"])


def _report(**configs):
    return {"benchmark": "train", "device": "cpu", "gpus": 1, "date": "d", "graph": {
        "name": "g", "num_nodes": 10, "feat_dim": 4, "x_gb": 0.0, "train": 5}, "model": "m", "batch": 2, "cache": 0.2,
        "pipeline": {"depth": 2, "max_sms": ["auto"], "fuse": 1}, "trim": True, "tf32": True, "configs": {
            name: {"epoch_s": 10 / rate, "batches_per_s": rate, "split_s": {"wait": 0.001}, "trimmed": True,
                   "alone_batches_per_s": alone} for name, (rate, alone) in configs.items()}}


def test_report_ratios_against_the_ceilings():
    report = _report(**{"all_gpu+pipe": (100.0, {"step": 110.0, "loader_pipe": 200.0, "loader_main": 150.0}),
                        "cache+pipe@auto": (80.0, {"step": 110.0, "loader_pipe": 120.0}),
                        "cache+pipe@none": (90.0, {"step": 110.0, "loader_pipe": 180.0})})
    add_ratios(report)
    t = report["targets"]
    assert t["cache_vs_all_gpu"] == pytest.approx(100 / 90)  # the best cache configuration, the uncapped one
    assert t["loader_vs_step_all_gpu"] == pytest.approx(200 / 110)
    assert t["loader_vs_step_cache"] == pytest.approx(180 / 110)
    assert t["cache_epoch_s"] == pytest.approx(10 / 90)
    text = table_text(report)
    assert "layers trimmed per hop, TF32" in text and "step alone" in text and "| 180.0 |" in text
    assert "0.90x the all-GPU speed" in text
    assert "profiled run" not in text
    report["profiled"] = True  # --profile's GPU profiles slowed the cached configurations after them
    assert "profiled run (--profile)" in table_text(report)


def test_quick_reports_print_no_ratios():
    report = _report(**{"all_gpu+pipe": (100.0, {"step": 1.0, "loader_pipe": 2.0}),
                        "cache+pipe": (10.0, {"step": 1.0, "loader_pipe": 2.0})})
    report["smoke_test"] = True  # what report.header(quick=True) marks
    add_ratios(report)
    assert report["targets"] == {}
    text = table_text(report)
    assert "smoke test" in text and "target >=" not in text


def test_train_benchmark_reports_the_ceilings(tmp_path):
    out = tmp_path / "train"
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "train", "--quick", "--no-progress", "--configs",
                          "host", "host+pipe", "--max-sms", "auto", "none", "--no-trim", "--profile", "--split", "1",
                          "--out", out],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "train.json").read_text())
    assert set(report["configs"]) == {"host", "host+pipe@auto", "host+pipe@none"}
    assert report["trim"] is False and "every layer over every node" in res.stdout
    assert report["split"] == [1.0] and "read by the CPU + copy engine: 100%" in res.stdout
    for name, c in report["configs"].items():
        alone = c["alone_batches_per_s"]
        assert alone["step"] > 0 and alone["loader_main"] > 0 and c["trimmed"] is False
        assert ("loader_pipe" in alone) == ("+pipe" in name)
        assert c["gpu_time"] is None  # --timeline needs a GPU
        assert len(c["gc"]["collections"]) == 3 and c["gc"]["ms_per_batch"] >= 0  # the timed batches' collections
    assert (out / "profile-loader-host.txt").read_text().count("function calls") >= 1
    # the second cap's configuration trains on the first's loader: only the pipeline differs
    configs = report["configs"]
    assert configs["host+pipe@auto"]["build_s"] > 0 and "loader_of" not in configs["host+pipe@auto"]
    assert configs["host+pipe@none"]["loader_of"] == "host+pipe@auto" and "build_s" not in configs["host+pipe@none"]
    assert "| host+pipe@auto's |" in res.stdout


def test_collector_pauses_count_the_collections_in_the_block_only():
    """CollectorPauses: each collection in the block by generation, with the time it held the interpreter; none
    before the block or after it, none before a reset."""
    import gc

    from hmgstore.bench.timing import CollectorPauses

    gc.collect()
    with CollectorPauses() as pauses:
        gc.collect(0)
        pauses.reset()
        cycles = []
        for _ in range(20_000):  # garbage in cycles: a full collection has work to do
            a: list = []
            a.append(a)
            cycles.append(a)
        del cycles
        gc.collect()
        gc.collect(1)
    gc.collect()
    got = pauses.per_batch(4)
    assert got["collections"][2] == 1 and got["collections"][1] >= 1  # the reset dropped the first one
    assert got["full_ms"] > 0 and got["ms_per_batch"] >= got["full_ms"] / 4
    assert pauses._note not in gc.callbacks  # unregistered when the block ends


def test_cap_modes_are_cache_variants():
    from hmgstore.bench.train_configs import _with_variants, variant

    names = _with_variants(["all_gpu+pipe@16", "cache+pipe@16"], "cap", ["whole", "spread"])
    assert names == ["all_gpu+pipe@16", "cache+pipe@16/capwhole", "cache+pipe@16/capspread"]
    assert [variant(n, "cap", "whole", str) for n in names] == ["whole", "whole", "spread"]
    args = parse_args(["train", "--cap-mode", "spread"])
    assert args.cap_mode == ["spread"]
    assert parse_args(["train"]).cap_mode == [None]  # the library's (hmgstore.cuda.gather.EXCLUSIVE, its environment)


def test_cap_modes_run_as_pipelined_cache_variants_on_one_loader(tmp_path):
    """--cap-mode whole spread: the pipelined cache configuration once per mode, on one loader; the
    unpipelined one once (it has no cap); the report says whether whole SMs can be had (None on a CPU)."""
    out = tmp_path / "capq"
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "train", "--quick", "--no-progress", "--configs",
                          "cache", "cache+pipe", "--cap-mode", "whole", "spread", "--out", out],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "train.json").read_text())
    assert list(report["configs"]) == ["cache", "cache+pipe/capwhole", "cache+pipe/capspread"]
    assert report["configs"]["cache+pipe/capspread"]["loader_of"] == "cache+pipe/capwhole"
    assert report["cap_mode"] == ["whole", "spread"] and report["whole_sm_launch"] is None
    assert report["labels_on_gpu"] is False


def test_labels_on_gpu_asks_from_data_for_whole_labels_in_the_cache_only(monkeypatch):
    """build_loader passes gpu_whole=("y",) to from_data for the cache configuration under --labels-on-gpu, and
    nothing for host (or without the flag)."""
    import hmgstore.plugins.pyg as hpyg
    from hmgstore.bench.train_setup import build_graph, build_loader

    asked, real = [], hpyg.from_data
    monkeypatch.setattr(hpyg, "from_data", lambda *a, **k: asked.append(k.get("gpu_whole")) or real(*a, **k))
    data, csc, train, _, _ = build_graph("synthetic:2K", 8)
    hot = SimpleNamespace(features={None: torch.rand(data.num_nodes)}, topology={None: torch.rand(data.num_nodes)})
    for flag, base, want in ((["--labels-on-gpu"], "cache", ("y",)), (["--labels-on-gpu"], "host", ()),
                             ([], "cache", ())):
        args = parse_args(["train", "--quick", "--no-progress", *flag])
        built = build_loader(base, data, csc, train, torch.device("cpu"), args, hot)
        built.stores[0].close()
        built.sampler.close()
        assert asked[-1] == want, (flag, base)


def test_labels_on_gpu_builds_the_cache_with_its_labels_whole(tmp_path):
    """--labels-on-gpu: the cache's loader is built with gpu_whole=("y",) (on a CPU: no GPU tier, the same rows),
    and the report and its table say so."""
    out = tmp_path / "lq"
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "train", "--quick", "--no-progress", "--configs",
                          "cache+pipe", "--labels-on-gpu", "--out", out], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "train.json").read_text())["labels_on_gpu"] is True
    assert "labels whole on the GPU" in res.stdout


def test_the_phase_timer_puts_back_what_it_wrapped():
    """A loader timed without the pipeline, then used again, is timed through one wrapper, not two."""
    from hmgstore.bench.train_alone import PhaseTimer

    class Loader:
        def filter_fn(self, x):
            return x + 1

    loader, timer = Loader(), PhaseTimer(torch.device("cpu"))
    timer.wrap(loader, "filter_fn", "gather")
    assert loader.filter_fn(1) == 2 and "filter_fn" in vars(loader) and timer.seconds["gather"] > 0
    timer.unwrap()
    assert "filter_fn" not in vars(loader) and loader.filter_fn(1) == 2
    own = loader.filter_fn = lambda x: x * 10  # an instance's own attribute is put back as it was
    timer.wrap(loader, "filter_fn", "gather")
    timer.unwrap()
    assert loader.filter_fn is own


def test_a_kept_loader_is_built_once_per_key_and_closed_on_change():
    """Kept: the same key gives the same loader, built once; another key closes the kept one's stores and
    sampler before building its own; close() closes the last."""
    from hmgstore.bench.train import Kept
    from hmgstore.bench.train_setup import Built

    closed = []

    class Closing:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    made = []

    def make(name):
        made.append(name)
        return Built(f"loader {name}", None, (Closing(f"store {name}"), None), Closing(f"sampler {name}"), 1.0)

    kept = Kept()
    first, by = kept.get(("cache", 1.0), "cache+pipe@16", lambda: make("a"))
    again, by_again = kept.get(("cache", 1.0), "cache+pipe@none", lambda: make("b"))
    assert again is first and by == by_again == "cache+pipe@16" and made == ["a"] and closed == []
    other, by = kept.get(("all_gpu", None), "all_gpu+pipe", lambda: make("c"))
    assert other.loader == "loader c" and by == "all_gpu+pipe" and closed == ["store a", "sampler a"]
    kept.keep_only(("all_gpu", None))  # the same key: kept
    assert closed == ["store a", "sampler a"]
    kept.keep_only(None)  # a producer configuration: nothing kept
    assert closed == ["store a", "sampler a", "store c", "sampler c"] and kept.built is None
    kept.close()  # nothing left to close
    assert len(closed) == 4


def test_kernel_names_lose_their_argument_lists_only():
    """Names are cut at the "(" of their trailing argument list, not at one inside their namespaces or template
    arguments: torch's kernels in an anonymous namespace, or templated on a lambda, keep names apart."""
    from hmgstore.bench.timeline import short_name

    assert short_name("void hmg_gather(long long const*, int, long long, long long*, int)") == "hmg_gather"
    assert short_name("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, 2>(float*, long)") \
        == "at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, 2>"
    assert short_name("void k<f(int)>(int (*)(int), float)") == "k<f(int)>"
    assert short_name("sm90_xmma_gemm_f32f32") == "sm90_xmma_gemm_f32f32" and short_name("") == ""


def test_timeline_splits_gpu_work_by_stream():
    """The step's streams against the loader's: summed times, the time both ran at once, the GPU's busy and
    idle time, from a chrome trace's GPU events (other events ignored); the loader's time by kernel name, and
    the step's kernels that grew beside it."""
    from hmgstore.bench.timeline import gpu_intervals, intersection, per_batch, split_by_stream, union

    def kernel(stream, ts, dur, cat="kernel", name="void step_k<float>(float*, int)"):
        return {"ph": "X", "cat": cat, "ts": ts, "dur": dur, "name": name, "args": {"stream": stream}}

    trace = {"traceEvents": [kernel(7, 0, 10), kernel(7, 10, 5, name="other"),
                             kernel(20, 12, 6, "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)"),
                             kernel(21, 30, 4, name="void gather(int)"),
                             {"ph": "X", "cat": "cuda_runtime", "ts": 0, "dur": 50, "args": {}},
                             {"ph": "i", "cat": "kernel", "ts": 1, "args": {"stream": 7}}]}
    work = gpu_intervals(trace)
    assert work == [(7, 0.0, 10.0, "step_k<float>"), (7, 10.0, 15.0, "other"),
                    (20, 12.0, 18.0, "Memcpy HtoD (Pinned -> Device)"), (21, 30.0, 34.0, "gather")]
    assert union([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]
    assert intersection([(0, 3), (5, 9)], [(2, 6), (8, 20)]) == 1 + 1 + 1
    m = split_by_stream(work, {7})
    assert m == {"wall": 34.0, "step": 15.0, "loader": 10.0, "overlap": 3.0, "busy": 22.0, "idle": 12.0}
    assert m["busy"] == m["step"] + m["loader"] - m["overlap"] and m["wall"] == m["busy"] + m["idle"]
    alone = [(7, 100.0, 108.0, "step_k<float>"), (7, 120.0, 124.0, "step_k<float>"), (7, 130.0, 132.0, "other")]
    b = per_batch(alone, 2, work, 2)  # microseconds over 2 batches -> milliseconds a batch
    assert b["step_ms"] == pytest.approx(0.0075) and b["step_alone_ms"] == pytest.approx(0.007)
    assert b["idle_ms"] == pytest.approx(0.006) and b["step_streams"] == [7] and b["batches"] == 2
    assert list(b["loader_kernels"]) == ["Memcpy HtoD (Pinned -> Device)", "gather"]  # the largest first
    assert b["loader_kernels"]["gather"] == pytest.approx(0.002)
    # "other" grew (0.001 -> 0.0025 ms a batch); step_k shrank (0.006 -> 0.005): not listed
    assert b["step_grown"] == {"other": pytest.approx([0.001, 0.0025])}
    assert per_batch([], 1, work, 1)["step_ms"] == 0.0  # no step streams: everything is the loader's
    assert split_by_stream([], {7})["wall"] == 0.0


def test_the_table_shows_gpu_time_and_kept_loaders():
    report = _report(**{"all_gpu+pipe": (100.0, {"step": 110.0, "loader_pipe": 200.0}),
                        "cache+pipe@16": (90.0, {"step": 110.0, "loader_pipe": 150.0}),
                        "cache+pipe@none": (95.0, {"step": 110.0, "loader_pipe": 150.0})})
    report["configs"]["cache+pipe@16"]["gpu_time"] = {"step_ms": 7.5, "step_alone_ms": 6.9, "loader_ms": 3.25,
                                                      "overlap_ms": 1.0, "idle_ms": 0.5}
    report["configs"]["cache+pipe@none"]["loader_of"] = "cache+pipe@16"
    text = table_text(report)
    assert "GPU ms a batch: step 7.50 (alone 6.90), loader 3.25, both at once 1.00, idle 0.50" in text
    assert "| cache+pipe@16's |" in text


def test_hotness_layout_orders_the_host_tier_and_gathers_the_same(data):
    """layout='hotness': the host tier hottest first; gathers still return x[idx] exactly. 'auto' on a CPU
    (no GPU tier) and None keep id order; a bad layout name is refused."""
    hot = torch.rand(data.num_nodes, generator=torch.Generator().manual_seed(3))
    data = data.clone()
    data.x = random_table(data.num_nodes, (8,), torch.float32, seed=4)
    stores = {}
    for layout in ("hotness", "auto", None):
        fs, _ = from_data(data, device="cpu", gpu_budget="1KB", hotness=hot, layout=layout, progress=False)
        stores[layout] = fs
    table = stores["hotness"].table(None, "x")
    assert torch.equal(table.layout, hotness.order_by_score(hot))
    assert stores["auto"].table(None, "x").layout is None and stores[None].table(None, "x").layout is None
    idx = torch.randint(0, data.num_nodes, (300,), generator=torch.Generator().manual_seed(5))
    assert_same(table[idx], data.x[idx])
    assert_same(stores["hotness"].table(None, "y")[idx], data.y[idx])
    with pytest.raises(ValueError, match="layout is a permutation"):
        from_data(data, device="cpu", layout="hottest", progress=False)
    with pytest.raises(ValueError, match="needs hotness"):
        from_data(data, device="cpu", layout="hotness", progress=False)


@pytest.mark.gpu
def test_auto_layout_on_a_copied_cached_table_is_hottest_first(data, cuda_device):
    """On a GPU, a compressed (hence copied) table with GPU rows is laid out hottest first by default, and its
    gathers return what the same table in id order returns, bit for bit."""
    data = data.clone()
    data.x = random_table(data.num_nodes, (64,), torch.float32, seed=6)
    hot = torch.rand(data.num_nodes, generator=torch.Generator().manual_seed(7))
    budget = data.num_nodes * 64 // 4  # about a quarter of the int8 rows
    auto, _ = from_data(data, device=cuda_device, gpu_budget=budget, hotness=hot, compress="int8", progress=False)
    plain, _ = from_data(data, device=cuda_device, gpu_budget=budget, hotness=hot, compress="int8", layout=None,
                         progress=False)
    assert torch.equal(auto.table(None, "x").layout, hotness.order_by_score(hot))
    assert plain.table(None, "x").layout is None and auto.table(None, "y").layout is None  # y is not copied
    idx = torch.randint(0, data.num_nodes, (5000,), device=cuda_device)
    assert_same(auto.table(None, "x")[idx], plain.table(None, "x")[idx])
    assert_same(auto.table(None, "y")[idx].cpu(), data.y[idx.cpu()])


def test_several_split_shares_make_one_cache_configuration_each():
    from hmgstore.bench.train_configs import _with_variants, base_of, variant

    assert base_of("cache+pipe@none/split1.0") == "cache" and base_of("all_gpu+pipe") == "all_gpu"
    configs = ["all_gpu+pipe@none", "cache+pipe@none", "cache+pipe@4"]
    assert _with_variants(configs, "split", [None]) == configs
    assert _with_variants(configs, "split", [1.0]) == configs
    assert _with_variants(configs, "split", [None, 1.0]) == ["all_gpu+pipe@none", "cache+pipe@none/split0",
                                                   "cache+pipe@none/split1.0", "cache+pipe@4/split0",
                                                   "cache+pipe@4/split1.0"]
    both = _with_variants(_with_variants(["all_gpu", "cache"], "topo", [0.2, 1.0]), "split", [None, 1.0])
    assert both == ["all_gpu", "cache/topo0.2/split0", "cache/topo0.2/split1.0", "cache/topo1.0/split0",
                    "cache/topo1.0/split1.0"]
    assert variant("cache/topo0.2/split1.0", "topo", None) == 0.2
    assert variant("cache/topo0.2/split1.0", "split", None) == 1.0
    assert variant("cache+pipe", "topo", 0.15) == 0.15


def keyword_of_each_call(monkeypatch, module, name: str, keyword: str) -> list:
    """``module.name`` still called, the value of its ``keyword`` argument at each call kept in the list."""
    seen, real = [], getattr(module, name)

    def recording(*args, **kwargs):
        seen.append(kwargs.get(keyword))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


def test_topology_cache_sets_the_samplers_gpu_budget_apart_from_the_features(tmp_path, monkeypatch):
    """--topology-cache: each value a cache configuration of its own, and the sampler built with that share of
    the topology's bytes as its GPU budget while the features keep --cache."""
    import hmgstore.plugins.pyg as pyg
    from hmgstore.bench import train

    budgets = keyword_of_each_call(monkeypatch, pyg, "HybridNeighborSampler", "gpu_budget")
    args = parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "--cache", "0.1", "--topology-cache",
                       "0.5", "1", "--out", str(tmp_path)])
    report = train.run(args)
    assert list(report["configs"]) == ["cache/topo0.5", "cache/topo1.0"]
    assert [c["topology_cache"] for c in report["configs"].values()] == [0.5, 1.0]
    assert report["topology_cache"] == [0.5, 1.0]
    edges = budgets[1:]  # the first sampler is the pre-sampling one, with no budget
    assert budgets[0] is None and edges[1] == pytest.approx(2 * edges[0], abs=1)
    assert "cache/topo0.5" in (tmp_path / "train.md").read_text()


def test_split_threads_name_cache_configurations_and_reach_the_table(tmp_path, monkeypatch):
    """--split-threads: each value a cache configuration of its own (name/thrN), recorded, and handed to the
    features' table with the split."""
    from hmgstore.bench import train

    calls = []
    real = hmgstore.HybridTensor.set_split
    monkeypatch.setattr(hmgstore.HybridTensor, "set_split",
                        lambda self, split, threads=None: calls.append((split, threads)) or real(self, split, threads))
    args = parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "--split", "1.0", "--split-threads",
                       "2", "1", "--out", str(tmp_path)])
    report = train.run(args)
    assert list(report["configs"]) == ["cache/thr2", "cache/thr1"]
    assert [c["split_threads"] for c in report["configs"].values()] == [2, 1]
    assert (1.0, 2) in calls and (1.0, 1) in calls and report["split_threads"] == [2, 1]
    for config in report["configs"].values():  # each configuration counts its loader's and step's torch calls
        assert config["torch_calls"]["loader"] > 10 and config["torch_calls"]["step"] > 10
    assert "torch calls a batch: loader" in (tmp_path / "train.md").read_text()


def test_each_configuration_builds_after_the_last_ones_tables_are_freed(tmp_path, monkeypatch):
    """PyG's loader refers to itself (a bound method), so a configuration's stores and tables go only in a
    garbage collection: run() collects after each, before the next one builds (a papers-shaped table held 17 GB
    of host memory into the next configuration without it)."""
    import weakref

    from hmgstore.bench import train

    tables, alive = [], []
    real = train.build_loader

    def build_loader(*args, **kwargs):
        alive.append([t() is not None for t in tables])
        built = real(*args, **kwargs)
        tables.append(weakref.ref(built.stores[0].table(None, "x")))
        return built

    monkeypatch.setattr(train, "build_loader", build_loader)
    train.run(parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "host", "cache+pipe", "--out",
                          str(tmp_path)]))
    assert alive == [[], [False], [False, False]]


def test_capped_rows_and_cap_modes_reach_the_gathers_and_a_producer(tmp_path, monkeypatch):
    """--capped-rows all remote: each pipelined cache configuration once per value (name/rowsV) on one loader
    (the setting is read at each launch), run with the setting and the producer's environment variable set;
    afterwards both are as before. --cap-mode reaches a producer through its environment alike."""
    from hmgstore.bench import train
    from hmgstore.cuda import gather

    seen, real = [], train._run_config

    def run_config(config, *args, **kwargs):
        seen.append((config, gather.CAPPED_ROWS, os.environ.get("HMGSTORE_CAPPED_ROWS"),
                     os.environ.get("HMGSTORE_WHOLE_SMS")))
        return real(config, *args, **kwargs)

    monkeypatch.setattr(train, "_run_config", run_config)
    monkeypatch.delenv("HMGSTORE_CAPPED_ROWS", raising=False)
    report = train.run(parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "cache+pipe",
                                   "--capped-rows", "all", "remote", "--out", str(tmp_path)]))
    assert list(report["configs"]) == ["cache", "cache+pipe/rowsall", "cache+pipe/rowsremote"]
    assert report["configs"]["cache+pipe/rowsremote"]["loader_of"] == "cache+pipe/rowsall"
    assert [s[:3] for s in seen] == [("cache", "all", "all"), ("cache+pipe/rowsall", "all", "all"),  # the others
                                     ("cache+pipe/rowsremote", "remote", "remote")]  # under the first
    assert report["capped_rows"] == ["all", "remote"] and report["cap_mode"] == ["spread"]
    assert {s[3] for s in seen} == {None}  # no --cap-mode: the environment's (a user's export) left alone
    assert gather.CAPPED_ROWS == "all" and "HMGSTORE_CAPPED_ROWS" not in os.environ
    seen.clear()
    monkeypatch.delenv("HMGSTORE_WHOLE_SMS", raising=False)
    report = train.run(parse_args(["train", "--quick", "--no-progress", "--configs", "cache+proc", "--cap-mode",
                                   "whole", "spread", "--out", str(tmp_path)]))
    assert [(s[0], s[3]) for s in seen] == [
        ("cache+proc/capwhole", "1"), ("cache+proc/capspread", "0")]  # a producer's cap mode: its environment
    assert gather.EXCLUSIVE is False and "HMGSTORE_WHOLE_SMS" not in os.environ
    assert train.run(parse_args(["train", "--quick", "--no-progress", "--configs", "cache+pipe", "--out",
                                 str(tmp_path)]))["capped_rows"] == "all"  # the library's, where none is given


def test_sampler_stream_values_build_a_loader_each_and_leave_the_setting_as_it_was(tmp_path, monkeypatch):
    """--sampler-stream on off: the pipelined cache configuration once per value (name/streamV), the others
    under the first value, each with a loader
    whose sampler was built under that value (a sampler reads it once, when built), and the producer's
    environment variable set alike; afterwards both are as before."""
    from hmgstore.bench import train
    from hmgstore.graph import sampling_stream

    seen, real = [], sampling_stream.StreamUse.__init__

    def init(self, device):
        seen.append((sampling_stream.OWN_STREAM, os.environ.get("HMGSTORE_SAMPLER_STREAM")))
        real(self, device)

    monkeypatch.setattr(sampling_stream.StreamUse, "__init__", init)
    monkeypatch.delenv("HMGSTORE_SAMPLER_STREAM", raising=False)
    report = train.run(parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "cache+pipe",
                                   "--sampler-stream", "on", "off", "--max-sms", "4", "none", "--out", str(tmp_path)]))
    # grouped by stream value: one loader build each, the caps' configurations reusing it
    assert list(report["configs"]) == ["cache", "cache+pipe@4/streamon", "cache+pipe@none/streamon",
                                       "cache+pipe@4/streamoff", "cache+pipe@none/streamoff"]
    assert report["configs"]["cache+pipe@none/streamon"]["loader_of"] == "cache+pipe@4/streamon"
    assert "loader_of" not in report["configs"]["cache+pipe@4/streamoff"]  # built again: not the other's sampler
    assert not any(c["sampler_stream"] for c in report["configs"].values())  # a CPU sampler uses no stream
    assert (True, "1") in seen and (False, "0") in seen and report["sampler_stream"] == ["on", "off"]
    assert sampling_stream.OWN_STREAM is False and "HMGSTORE_SAMPLER_STREAM" not in os.environ


def test_split_threads_without_a_split_is_refused(tmp_path):
    from hmgstore.bench import train

    args = parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "--split-threads", "2", "--out",
                       str(tmp_path)])
    with pytest.raises(ValueError, match="give --split too"):
        train.run(args)


def test_torch_calls_counts_top_level_calls_only():
    from hmgstore.bench.train_alone import torch_calls

    x = torch.ones(3)
    assert torch_calls(lambda: torch.ones(3).add(1).sum(), reps=4) == 3  # the inner work of each is not counted
    assert torch_calls(lambda: (x.shape, x.dtype), reps=2) == 0  # attribute reads hand no GIL over
    assert torch_calls(lambda: torch.nn.functional.relu(x), reps=1) == 1
    from hmgstore.bench.train_alone import counted_calls

    assert counted_calls(lambda: x.add(torch.ones(2)), "loader", reps=1) is None  # shapes differ: warned, no count
    assert not torch._C._is_torch_function_mode_enabled()  # the counting mode is gone after the error too


def test_hollow_graph_keeps_the_sizes_a_producer_configuration_reads():
    from torch_geometric.data import Data

    from hmgstore.bench.train_configs import _hollow

    data = Data(x=random_table(50, (7,), torch.float32, seed=1), y=torch.arange(50), num_nodes=50)
    hollow = _hollow(data)
    assert hollow.x.shape == (0, 7) and hollow.x.dtype == torch.float32 and hollow.num_nodes == 50
    assert hollow.x.untyped_storage().nbytes() == 0 and hollow.y.untyped_storage().nbytes() == 0


def test_overlap_and_repeat_flags_name_their_configurations():
    """--repeat 2: the list twice, interleaved, the second pass named /run2; a variant's value read back."""
    from hmgstore.bench import train

    assert train._repeated(["a", "b"], 2) == ["a", "b", "a/run2", "b/run2"]
    assert train.variant("cache+pipe/overlapoff/run2", "overlap", "auto", str) == "off"


def test_ratios_find_configurations_with_variants_and_modes():
    """Suffixed names (``cache/topo1.0``, ``cache+proc@none/run2``) still count as their base and mode in the
    targets: the best cache configuration is the fastest of every variant, the producer's issue ratio finds its
    configuration however it is named."""
    report = _report(**{"all_gpu+pipe@none": (100.0, {"step": 110.0, "loader_pipe": 200.0}),
                        "cache/topo1.0": (95.0, {"step": 110.0}),
                        "cache+proc@none/topo1.0": (90.0, {"step": 110.0})})
    report["configs"]["cache+proc@none/topo1.0"].update(producer_batches_per_s=270.0, split_s={"train_issue": 0.004})
    report["configs"]["all_gpu+pipe@none"]["split_s"] = {"train_issue": 0.008}
    add_ratios(report)
    t = report["targets"]
    assert t["cache_vs_all_gpu"] == pytest.approx(100 / 95)  # cache/topo1.0, which the old name check missed
    assert t["proc_issue_vs_all_gpu"] == pytest.approx(0.5) and t["producer_vs_trainer"] == pytest.approx(3.0)


def test_variants_apply_where_they_mean_something(monkeypatch, tmp_path):
    """--overlap-reads names pipelined cache configurations only; producer-only tails are found under caps (the
    graph is then dropped); the pipeline gets the overlap setting the name says; --repeat must be >= 1."""
    import hmgstore
    from hmgstore.bench import train
    from hmgstore.bench.train_configs import _mode

    assert [_mode(c) for c in ("cache", "cache+pipe@4/run2", "cache+proc@none/topo1.0")] == ["", "pipe", "proc"]
    seen = keyword_of_each_call(monkeypatch, hmgstore, "Pipeline", "overlap_reads")
    report = train.run(parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "cache+pipe",
                                   "--overlap-reads", "on", "off", "--out", str(tmp_path)]))
    assert list(report["configs"]) == ["cache", "cache+pipe/overlapon", "cache+pipe/overlapoff"]
    assert [c["overlap_reads"] for c in report["configs"].values()] == [None, "on", "off"]
    assert seen == [True, False] and report["overlap_reads"] == ["on", "off"] and report["repeat"] == 1
    with pytest.raises(SystemExit):
        parse_args(["train", "--repeat", "0"])


@pytest.mark.gpu
def test_timeline_on_a_gpu_puts_the_step_and_the_loader_apart(tmp_path, cuda_device):
    """--timeline: each pipelined configuration reports a batch's GPU milliseconds; the step's streams are
    found (its kernels counted), the loader's kernels too, and busy + idle spans the window."""
    out = tmp_path / "train"
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "train", "--quick", "--no-progress", "--configs",
                          "all_gpu+pipe", "cache+pipe", "--timeline", "3", "--out", out],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "train.json").read_text())
    for name in ("all_gpu+pipe", "cache+pipe"):
        g = report["configs"][name]["gpu_time"]
        assert g["batches"] == 3 and g["step_streams"], g
        assert g["step_ms"] > 0 and g["step_alone_ms"] > 0 and g["loader_ms"] > 0, g
        assert g["wall_ms"] == pytest.approx(g["busy_ms"] + g["idle_ms"])
        assert g["busy_ms"] <= g["step_ms"] + g["loader_ms"] - g["overlap_ms"] + 1e-6, g
    assert "GPU ms a batch: step" in res.stdout


def test_disturbed_configurations_are_marked_and_left_out_of_the_ratios():
    """A configuration whose step alone ran off the run's median (rate, or issue time) is marked disturbed and
    not taken as a best; the committed papers-shaped run of 2026-11-27 has one such row (its step alone at
    128.5 b/s, issued in 7.7 ms, against ~144 b/s and 5.2 ms)."""
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks/results/strong-step-papers-split-timeline-h100.json"
    report = json.loads(path.read_text())
    add_ratios(report)
    flagged = {n for n, c in report["configs"].items() if c.get("disturbed")}
    assert flagged == {"cache+pipe@8/split1.0"}
    assert report["targets"]["cache_vs_all_gpu"] == pytest.approx(
        report["configs"]["cache+pipe@8/split0"]["epoch_s"] / report["configs"]["all_gpu+pipe@none"]["epoch_s"])
    text = table_text(report)
    assert "| cache+pipe@8/split1.0 (disturbed) |" in text and "left out of the ratios" in text
    # a disturbed row is never the best, even when it is the fastest
    fast = _report(**{"all_gpu+pipe": (100.0, {"step": 140.0, "loader_pipe": 300.0}),
                      "cache+pipe@8": (90.0, {"step": 141.0, "loader_pipe": 200.0}),
                      "cache+pipe@16": (99.0, {"step": 100.0, "loader_pipe": 900.0})})
    add_ratios(fast)
    assert fast["configs"]["cache+pipe@16"]["disturbed"] and not fast["configs"]["cache+pipe@8"]["disturbed"]
    assert fast["targets"]["cache_vs_all_gpu"] == pytest.approx(100 / 90)
    assert fast["targets"]["loader_vs_step_cache"] == pytest.approx(200 / 141)


def test_step_pages_probe_builds_a_papers_shaped_batch_and_runs_quick():
    """benchmarks/probes/probe_step_pages.py: its synthetic batch is laid out hop by hop as the sampler's
    (each hop's edges point from that hop's new nodes, or earlier ones, to the hop's frontier), so the step
    trims it; --quick runs (on a CPU: the step once, exit 0; on a GPU: tiny sizes, bit-exact gathers)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks/probes/probe_step_pages.py"
    spec = importlib.util.spec_from_file_location("probe_step_pages", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    b = probe.papers_batch("cpu", seeds=8, fanout=(4, 3))
    assert b.num_sampled_nodes[0] == 8 and len(b.num_sampled_edges) == 2 and trimmable(b)
    assert b.edge_index.shape[1] == sum(b.num_sampled_edges) == 8 * 4 + b.num_sampled_nodes[1] * 3
    assert int(b.edge_index.max()) < b.num_nodes == sum(b.num_sampled_nodes)
    hop1 = b.edge_index[:, 32:]  # the second hop's edges end at the first hop's new nodes
    assert bool(((hop1[1] >= 8) & (hop1[1] < 8 + b.num_sampled_nodes[1])).all())
    assert bool((b.edge_index[1, :32] < 8).all())
    res = subprocess.run([sys.executable, str(path), "--quick"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    if "no CUDA device" not in res.stderr:  # a GPU machine: the tiny run's report
        assert json.loads(res.stdout)["exact"] is True


def test_the_table_puts_the_host_bound_beside_the_loaders_own_rate():
    report = _report(**{"all_gpu+pipe": (100.0, {"step": 110.0, "loader_pipe": 200.0}),
                        "cache+pipe": (90.0, {"step": 110.0, "loader_pipe": 150.0, "loader_main": 140.0})})
    assert "host reads allow" not in table_text(report)  # no estimate: no line
    report["configs"]["cache+pipe"]["host_bound"] = {"batches_per_s": 171.4, "by": "bytes"}
    text = table_text(report)
    assert "host reads allow at most (hmgstore.host_bound): cache+pipe 171 batches/s (bytes-bound; loader alone 150)" \
        in text
