"""``python -m hmgstore.bench``: its command line, the benchmarks on the CPU, and the peer benchmark.

The command line: every help text, the shared flags of :mod:`hmgstore.cli.flags`
on every benchmark, ``--quick`` and the CPU sizes filling only the options
not given (the commands recorded in ``benchmarks/`` are parsed in test_research.py).
Without a GPU each benchmark says so once and shows CPU figures, not
columns of ``-``. ``peer``: arguments, GPU selection, sizing, id choice, a
CPU dry run, the report. Its CUDA parts (start gate, concurrent timing, peer
copies) run only on a machine with 2+ GPUs (the ``multigpu`` test at the
end); on the CPU the same work functions run serially with ``device='cpu'``
standing for each GPU.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hmgstore
from helpers import check_no_progress_reaches_every_bar
from hmgstore import HybridTensor
from hmgstore.bench import peer, peer_report, peer_work, sample
from hmgstore.bench.__main__ import BENCHMARKS, build_parser, main, parse_args
from hmgstore.bench.gather import distinct_ids, hashed_buffer
from hmgstore.bench.report import write_report
from hmgstore.cli import flags
from hmgstore.graph import parse_fanout
from hmgstore.rows import placement
from hmgstore.rows.hotness import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU shows")


def _bench(*argv, timeout=300) -> subprocess.CompletedProcess:
    """``python -m hmgstore.bench ARGV`` in a child process; fails the test unless it exits 0."""
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", *map(str, argv)], capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _cells(text: str) -> list[str]:
    """Every cell of the markdown tables in ``text`` (header and separator rows left out)."""
    rows = [line for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [c.strip() for row in rows[1:] for c in row.strip().strip("|").split("|")
            if not any(row.startswith(h) for h in ("| table", "| graph", "| config", "| row B", "| pages"))]


def _assert_cpu_output(stdout: str) -> None:
    """Without a GPU: said once, and every cell a figure, not '-'."""
    assert stdout.count("no GPU:") == 1, stdout
    assert "-" not in _cells(stdout), stdout
    assert "H2D memcpy limit" not in stdout


# ---- the command line --------------------------------------------------------------------
def test_help_of_the_command_and_of_every_benchmark(capsys):
    """argparse %-formats help texts: a bare '%' in one ('1-20% of the nodes') crashed the top-level --help."""
    for argv in ([], *[[name] for name in BENCHMARKS]):
        with pytest.raises(SystemExit) as done:
            parse_args([*argv, "--help"])
        assert done.value.code == 0
        assert "usage: python -m hmgstore.bench" in capsys.readouterr().out
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and all(name in res.stdout for name in BENCHMARKS), res.stderr[-2000:]


def test_the_command_holds_the_user_facing_set():
    """Research benchmarks (hotness, reach, remote) run from benchmarks/research, outside the wheel."""
    assert set(BENCHMARKS) == {"gather", "sample", "train", "peer", "scale"}


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_speaks_the_shared_flags(name):
    args = parse_args([name, "--batch-size", "77"])
    assert args.batch_size == 77 and not args.no_progress
    assert parse_args([name, "--batch", "78", "--no-progress"]).batch_size == 78  # commands written before
    assert parse_args([name, "--no-progress"]).no_progress
    assert parse_args([name]).seed == 0 and parse_args([name, "--seed", "5"]).seed == 5
    if name in ("sample", "train"):
        assert parse_args([name]).fanout == parse_fanout(flags.DEFAULT_FANOUT) == [15, 10, 5]
        assert parse_args([name, "--fanout", "5,3"]).fanout == [5, 3]


def test_quick_fills_only_the_options_not_given():
    """``--quick --table-gib 0.125`` used to time 4 MiB tables: --quick overwrote what was given."""
    args = parse_args(["gather", "--quick", "--table-gib", "0.125", "--batch", "300"])
    assert args.table_gib == 0.125 and args.batch_size == 300
    assert args.reps == 3 and args.sweep_gb == []  # the rest: --quick's
    args = parse_args(["sample", "--quick", "--batch-size", "64"])
    assert args.batch_size == 64 and args.graphs == [("power-law", 20_000, 200_000)] and args.batches == 3
    args = parse_args(["train", "--quick", "--graph", "synthetic:3K"])
    assert args.graph == "synthetic:3K" and args.batch_size == 256 and args.feat_dim == 32


@no_gpu_only
def test_without_a_gpu_options_not_given_take_the_cpu_sizes():
    args = parse_args(["gather"])
    assert args.batch_size == 50_000 and args.table_gib == 0.125 and args.row_bytes == [128, 512, 4096]
    assert parse_args(["gather", "--batch-size", "1000"]).batch_size == 1000
    assert parse_args(["train"]).configs == ["stock", "host", "host+pipe"]


@pytest.mark.parametrize("name, module, attr, extra", [
    ("gather", hmgstore, "HybridTensor", ["--row-bytes", "64", "--variants", "hmg_host"]),
    ("sample", sample, "Topology", ["--variants", "hmg_cpu"]),
])
def test_no_progress_reaches_every_progress_bar(name, module, attr, extra, tmp_path, monkeypatch):
    def run(flags):
        main([name, "--quick", *flags, *extra, "--out", str(tmp_path)])

    check_no_progress_reaches_every_bar(run, module, attr, monkeypatch)


# ---- gather ----------------------------------------------------------------------------
def test_gather_benchmark_runs_on_cpu(tmp_path):
    out = tmp_path / "bench"
    res = _bench("gather", "--quick", "--row-bytes", "64", "4096", "--table-gib", 1 / 32, "--no-progress",
                 "--out", out)
    assert "| row B |" in res.stdout
    report = json.loads((out / "gather.json").read_text())
    assert [s["row_bytes"] for s in report["sizes"]] == [64, 4096]
    assert report["sizes"][0]["variants"]["hmg_host"]["gbps"] > 0
    for name in ("hmg_owned", "hmg_bf16"):  # owned memory and half-width rows, checked against x[idx] first
        assert report["sizes"][1]["variants"][name]["gbps"] > 0
        assert report["sizes"][1]["variants"][name]["setup_seconds"] >= 0
    assert report["sweep"] == []
    # the table is what --table-gib asks for, and where 8 batches of rows need more, the output says why
    assert report["sizes"][0]["table_bytes"] == 32 * 2**20 and "| 32 MiB | 64 |" in res.stdout
    assert report["sizes"][1]["table_bytes"] == 8 * 2000 * 4096 and "| 62.5 MiB | 4096 |" in res.stdout
    assert "--table-gib 0.03125 is 32 MiB; at 4096 B rows that is fewer than 8 batches of 2,000 ids" in res.stdout
    if torch.cuda.is_available():
        assert "Host memory variants" in res.stdout
    else:
        _assert_cpu_output(res.stdout)
        assert "torch.index_select" in res.stdout
    assert (out / "gather.png").stat().st_size > 0 and (out / "gather.md").is_file()


# ---- peer: arguments and GPU selection ------------------------------------------------
def test_defaults_parse():
    args = build_parser().parse_args(["peer"])
    assert args.benchmark == "peer"
    assert args.row_bytes == [128, 256, 512, 1024, 2048, 4096]
    assert parse_bytes(args.shard_bytes) == 2 * 2**30
    assert parse_bytes(args.copy_bytes) == 2**30
    assert args.batch_size == 500_000 and args.gpus is None and args.out == "bench-out/peer"
    assert not args.no_gate and not args.quick and args.reps > 1


def test_options_parse():
    args = build_parser().parse_args(["peer", "--row-bytes", "128", "4096", "--shard-bytes", "1GB", "--batch", "1000",
                                      "--reps", "3", "--gpus", "0", "2", "--out", "x/y", "--no-gate",
                                      "--max-batch-mib", "64", "--copy-bytes", "256MiB"])
    assert args.row_bytes == [128, 4096] and args.shard_bytes == "1GB" and args.batch_size == 1000
    assert args.reps == 3 and args.gpus == [0, 2] and args.out == "x/y" and args.no_gate
    assert args.max_batch_mib == 64 and parse_bytes(args.copy_bytes) == 256 * 2**20


def test_gather_still_parses():
    assert build_parser().parse_args(["gather", "--quick"]).benchmark == "gather"


def test_without_gpu_the_command_says_it_needs_two(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "peer", "--out", str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "needs 2 or more CUDA GPUs" in res.stderr and "no GPU" in res.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("requested, available, words", [
    (None, 0, ["2 or more", "no GPU"]),
    (None, 1, ["2 or more", "only 1 GPU"]),
    ([1], 4, ["2 or more", "only [1]"]),
    ([0, 0], 4, ["more than once"]),
    ([0, 5], 4, ["no such GPU", "[5]"]),
    (None, 9, ["at most 8"]),
])
def test_select_gpus_refuses(requested, available, words):
    with pytest.raises(SystemExit) as err:
        peer.select_gpus(requested, available)
    for w in words:
        assert w in str(err.value)


def test_select_gpus():
    assert peer.select_gpus(None, 4) == [0, 1, 2, 3]
    assert peer.select_gpus([3, 1], 4) == [3, 1]


# ---- sizing ------------------------------------------------------------------------
def test_sizing_defaults():
    gib = 2**30
    s = peer.sizing(128, 4, 2 * gib, 500_000, 256 << 20)
    assert s.rows_per_shard == 2 * gib // 128 and s.num_rows == 4 * s.rows_per_shard
    assert s.remote_rows == 3 * s.rows_per_shard
    assert s.batch == 500_000 and s.per_round == 8  # 64 MB batches: 8 of them reach 512 MiB
    big = peer.sizing(4096, 4, 2 * gib, 500_000, 256 << 20)
    assert big.batch == (256 << 20) // 4096 and big.batch * 4096 <= 256 << 20
    assert big.per_round == 2


def test_sizing_keeps_batches_sparse_and_checks_rows():
    s = peer.sizing(1024, 2, 1 << 20, 500_000, 256 << 20)  # 1024 rows a shard, 1024 remote
    assert s.batch == 1024 // 4
    with pytest.raises(ValueError, match="multiples of 4"):
        peer.sizing(130, 2, 1 << 20, 10, 1 << 20)
    with pytest.raises(ValueError, match="fewer than 4 rows"):
        peer.sizing(4096, 2, 8192, 10, 1 << 20)


# ---- ids ---------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["arange", "random"])
@pytest.mark.parametrize("k", [2, 3, 8])
def test_remote_batch_picks_distinct_rows_of_other_shards(order, k):
    n, rb = 1000 * k + 7, 64
    hot = torch.arange(n) if order == "arange" else torch.randperm(n, generator=torch.Generator().manual_seed(3))
    p = placement.sharded(n, hot, rb, k, 1000 * rb)
    owner_of = torch.full((n,), -1)
    for s in range(k):
        owner_of[p.rows_of(f"shard{s}")] = s
    for gpu in range(k):
        b = peer.remote_batch(p, gpu, 500, torch.Generator().manual_seed(gpu))
        assert b.ids.dtype == torch.int64 and len(b.ids) == 500 and len(torch.unique(b.ids)) == 500
        assert (owner_of[b.ids] != gpu).all() and (owner_of[b.ids] >= 0).all()
        assert torch.equal(owner_of[b.ids], b.owner)
        for s in range(k):
            m = b.owner == s
            assert torch.equal(p.rows_of(f"shard{s}")[b.slot[m]], b.ids[m])
        assert not torch.equal(b.ids, torch.sort(b.ids).values)  # random order, not sorted


def test_remote_batch_too_big():
    p = placement.sharded(40, torch.arange(40), 4, 2, 80)
    with pytest.raises(ValueError, match="fewer than a batch"):
        peer.remote_batch(p, 0, 21, torch.Generator().manual_seed(0))


def test_grouped_segments_cover_the_batch_in_owner_order():
    b = peer.RemoteBatch(ids=torch.tensor([10, 11, 12, 13, 14, 15]), owner=torch.tensor([2, 0, 2, 3, 0, 2]),
                         slot=torch.tensor([5, 6, 7, 8, 9, 1]))
    ids, segs = b.grouped()
    assert ids.tolist() == [11, 14, 10, 12, 15, 13]
    assert [(j, s.tolist(), lo, hi) for j, s, lo, hi in segs] == [
        (0, [6, 9], 0, 2), (2, [5, 7, 1], 2, 5), (3, [8], 5, 6)]


def test_mixed_and_host_ids():
    ids = peer.mixed_ids(100, 40, torch.Generator().manual_seed(1))
    assert len(torch.unique(ids)) == 40 and ids.min() >= 0 and ids.max() < 100
    h = peer.host_ids(ids, 100, pin=False)
    assert h.dtype == torch.int32 and torch.equal(h.long(), ids)
    assert peer.host_ids(ids, 2**31, pin=False).dtype == torch.int64


def test_pattern_is_distinct_non_zero_and_seeded():
    a, b = peer._pattern(1 << 12, 0, "cpu"), peer._pattern(1 << 12, 1, "cpu")
    words = a.view(torch.int64)
    assert a.dtype == torch.uint8 and a.numel() == 1 << 12
    assert (words != 0).all() and len(torch.unique(words)) == len(words)
    assert not torch.equal(a, b)


def test_hashed_buffer_words_all_differ_and_ids_are_distinct_and_seeded():
    """The probes' and benchmarks' table data: a gather returning another row than asked for must show."""
    words = hashed_buffer(8 * 1000 + 5).view(torch.int64)
    assert len(words) == 1000 and len(torch.unique(words)) == 1000 and (words[1:] != 0).all()
    assert hashed_buffer(7).numel() == 0
    a, b = distinct_ids(50, 20, 3, "cpu", seed=1), distinct_ids(50, 20, 3, "cpu", seed=1)
    assert all(torch.equal(x, y) and len(torch.unique(x)) == 20 and x.max() < 50 for x, y in zip(a, b))
    assert not torch.equal(a[0], distinct_ids(50, 20, 1, "cpu", seed=2)[0])
    assert sorted(distinct_ids(5, 9, 1, "cpu")[0].tolist()) == [0, 1, 2, 3, 4]


# ---- the whole benchmark on the CPU, each "GPU" a CPU device -----------------------
def _cpu_run(k=3, row_bytes=(64, 256)):
    runner = peer_work.Runner(["cpu"] * k, reps=2, warmup=1)
    report = {"benchmark": "peer", "command": "test", "date": "today", "num_gpus": k,
              "device_names": ["cpu"] * k, "peer_access": [(0, 1, True)], "start_mode": runner.start_mode,
              "peer_memcpy": {"bytes": 1 << 16}, "sizes": []}
    report["peer_memcpy"]["start"] = peer.peer_memcpy(runner, 1 << 16)
    buf = hashed_buffer(k * (1 << 16))
    for rb in row_bytes:
        sz = peer.sizing(rb, k, 1 << 16, 300, 1 << 20, round_bytes=1 << 16)
        cols = rb // 4
        x = buf[: sz.num_rows * cols].view(sz.num_rows, cols)
        p = placement.sharded(sz.num_rows, torch.arange(sz.num_rows), rb, k, sz.rows_per_shard * rb)
        view = HybridTensor(x, "cpu")
        shards = [x[p.rows_of(f"shard{j}")] for j in range(k)]
        variants = peer.measure_variants(runner, x, p, [view] * k, shards, sz)
        report["sizes"].append({"row_bytes": rb, "batch": sz.batch, "batches_per_round": sz.per_round,
                                "table_bytes": sz.num_rows * rb, "variants": variants})
    report["peer_memcpy"]["end"] = report["peer_memcpy"]["start"]
    return report


def test_cpu_dry_run_checks_and_times_every_variant(tmp_path):
    report = _cpu_run()
    for size in report["sizes"]:
        v = size["variants"]
        assert set(v) == {"hmg_remote", "hmg_alone", "hmg_remote_gpu_ids", "hmg_mixed", "ids_copy",
                          "index_select_copy"}
        assert len(v["hmg_remote"]["gbps"]) == 3 and len(v["hmg_alone"]["gbps"]) == 1
        assert all(g > 0 for name in v for g in v[name]["gbps"])
    out = write_report(report, tmp_path, ratios=peer_report.add_ratios, text_of=peer_report.table_text,
                       plot_to=peer_report.plot)
    saved = json.loads((out / "peer.json").read_text())
    assert saved["sizes"][0]["remote_x_memcpy"] > 0
    assert (out / "peer.md").read_text().count("\n| ") >= 3
    assert (out / "peer.png").stat().st_size > 0
    assert "| row B | batch | hmg remote GB/s mean (min) |" in report["_table_text"]


def test_check_catches_an_unwritten_or_wrong_output():
    runner = peer_work.Runner(["cpu"] * 2, reps=1, warmup=0)
    x = hashed_buffer(64 * 16).view(64, 4)
    outs = [torch.empty(8, 4), torch.empty(8, 4)]
    ids = [[torch.arange(8)], [torch.arange(8, 16)]]
    view = HybridTensor(x, "cpu")
    work = peer_work.gather_work([view, view], outs, ids)
    runner.check(work, outs, [x[:8], x[8:16]], "ok")
    lazy = [work[0], lambda k, stream: None]  # GPU 1 writes nothing: the poison stays
    with pytest.raises(AssertionError, match="GPU 1"):
        runner.check(lazy, outs, [x[:8], x[8:16]], "lazy")
    with pytest.raises(AssertionError, match="wrong bytes"):
        runner.check(work, outs, [x[:8], x[16:24]], "wrong")
    two = peer_work.gather_work([view, view], outs,
                                [[torch.arange(8), torch.arange(16, 24)], [torch.arange(8, 16)] * 2])
    runner.check(two, outs, lambda i: [x[:8] if i == 0 else x[16:24], x[8:16]], "two sets", items=2)
    with pytest.raises(AssertionError, match="GPU 0 .* item 1"):
        runner.check(two, outs, lambda i: [x[:8], x[8:16]], "second set", items=2)


def test_index_select_copy_delivers_grouped_rows_on_cpu():
    k, rb = 4, 16
    n = 4 * 50
    x = hashed_buffer(n * rb).view(n, rb // 4)
    p = placement.sharded(n, torch.randperm(n, generator=torch.Generator().manual_seed(0)), rb, k, 50 * rb)
    shards = [x[p.rows_of(f"shard{j}")] for j in range(k)]
    batches = [peer.remote_batch(p, g, 30, torch.Generator().manual_seed(g)) for g in range(k)]
    grouped = [b.grouped() for b in batches]
    outs = [torch.empty(30, rb // 4) for _ in range(k)]
    work = peer_work.index_select_copy_work(shards, [[segs] for _, segs in grouped], outs, lambda key, device: None)
    peer_work.Runner(["cpu"] * k, reps=1).check(work, outs, [x[ids] for ids, _ in grouped], "index_select_copy")


# ---- the report ---------------------------------------------------------------------
def _variant(gbps_per_gpu, nbytes=10**9):
    return peer_report.summarize(nbytes, {"seconds": [nbytes / g / 1e9 for g in gbps_per_gpu],
                                          "wall_seconds": nbytes / min(gbps_per_gpu) / 1e9})


def test_summarize_and_ratios():
    v = _variant([100.0, 50.0])
    assert v["gbps"] == pytest.approx([100.0, 50.0])
    assert v["gbps_mean"] == pytest.approx(75.0) and v["gbps_min"] == pytest.approx(50.0)
    assert v["gbps_wall"] == pytest.approx(50.0)
    report = {"peer_memcpy": {"start": _variant([300.0, 300.0])}, "sizes": [{"variants": {
        "hmg_remote": _variant([150.0, 150.0]), "index_select_copy": _variant([100.0, 100.0]),
        "hmg_alone": _variant([200.0]), "hmg_mixed": _variant([240.0, 240.0])}}, {"variants": {}}]}
    peer_report.add_ratios(report)
    s = report["sizes"][0]
    assert s["remote_x_memcpy"] == pytest.approx(0.5)
    assert s["remote_x_index_select_copy"] == pytest.approx(1.5)
    assert s["remote_x_alone"] == pytest.approx(0.75)
    assert s["mixed_x_memcpy"] == pytest.approx(0.8)
    assert report["sizes"][1]["remote_x_memcpy"] is None


def test_table_text():
    report = {"date": "2026-11-22", "num_gpus": 2, "device_names": ["NVIDIA H200", "NVIDIA H200"],
              "start_mode": "start gate", "peer_access": [(0, 1, True), (1, 0, False)],
              "peer_memcpy": {"bytes": 2**30, "start": _variant([390.0, 380.0]), "end": _variant([385.0, 381.0])},
              "sizes": [{"row_bytes": 512, "batch": 500000, "batches_per_round": 2, "variants": {
                  "hmg_remote": _variant([300.0, 290.0]), "index_select_copy": _variant([200.0, 100.0]),
                  "hmg_alone": _variant([330.0]), "hmg_mixed": _variant([400.0, 410.0]),
                  "hmg_remote_gpu_ids": _variant([360.0, 350.0]), "ids_copy": {"seconds": [40e-6, 60e-6]}}}]}
    # ids_copy's seconds are per round (2 batches): 30 us per batch on the slowest GPU
    peer_report.add_ratios(report)
    text = peer_report.table_text(report)
    assert "2 x NVIDIA H200" in text and "start gate" in text and "1.0 GiB" in text
    assert "385.0 (380.0)" in text  # memcpy mean (min) at the start
    assert "NO PEER ACCESS for 1->0" in text
    row = next(line for line in text.splitlines() if line.startswith("| 512 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # less ids: 1 GB in (1/300 s - 40 us) and (1/290 s - 60 us): 303.6 and 295.1 GB/s, mean 299.4
    assert cells == ["512", "500000", "295.0 (290.0)", "0.77", "1.97", "0.89", "299.4 (0.78)", "355.0 (350.0)",
                     "0.92", "405.0 (400.0)", "330.0", "150.0 (100.0)", "30"]


# ---- on a machine with 2+ GPUs --------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.multigpu
def test_quick_run_on_gpus(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "peer", "--quick", "--row-bytes", "128", "1024",
                          "--gpus", "0", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads((tmp_path / "peer.json").read_text())
    assert [s["row_bytes"] for s in report["sizes"]] == [128, 1024]
    assert all(g > 0 for s in report["sizes"] for g in s["variants"]["hmg_remote"]["gbps"])


def test_sample_and_train_benchmarks_run_on_cpu(tmp_path):
    for name, extra in (("sample", []), ("train", ["--configs", "host", "host+pipe", "cache", "host+proc"])):
        out = tmp_path / name
        res = _bench(name, "--quick", "--no-progress", *extra, "--out", out, timeout=600)
        report = json.loads((out / f"{name}.json").read_text())
        assert (out / f"{name}.md").is_file()
        if not torch.cuda.is_available():
            _assert_cpu_output(res.stdout)
        if name == "sample":
            variants = report["graphs"][0]["variants"]
            assert variants["hmg_cpu"]["batches_per_s"] > 0
            assert "graphbolt" not in res.stderr + res.stdout  # the DGL stub's INFO line is not the reader's business
        else:
            assert set(report["configs"]) == {"host", "host+pipe", "cache", "host+proc"}
            assert all(c["epoch_s"] > 0 for c in report["configs"].values())
            assert report["configs"]["host+proc"]["producer_batches_per_s"] > 0  # made in a producer process
            assert report["configs"]["host+proc"]["alone_batches_per_s"]["step"] > 0  # on the producer's batches
            assert "(in producer)" in res.stdout  # its own rate is in the "loader alone, as run" column
            assert report["configs"]["cache"]["feature_stats"]["rows"] > 0
            assert "requires_grad" not in res.stderr  # the loss is read as a number without autograd's warning
            if not torch.cuda.is_available():
                assert "hits" not in res.stdout  # nothing is served from GPU memory here: no column of zeros


@pytest.mark.parametrize("graphs", ["on", "off"])
def test_train_sampler_graphs_flag_reaches_the_sampler(graphs):
    from types import SimpleNamespace

    from hmgstore.bench.train_setup import build_graph, build_loader

    data, csc, train, _, _ = build_graph("synthetic:2000", 8)
    args = SimpleNamespace(fanout=[5, 3], batch_size=64, no_progress=True, compress=None, cache=0.1,
                           sampler_graphs=graphs)
    built = build_loader("host", data, csc, train, torch.device("cpu"), args, None)
    assert built.sampler.sampler.cuda_graphs is (graphs == "on")
    assert parse_args(["train", "--sampler-graphs", graphs]).sampler_graphs == graphs


@pytest.mark.parametrize("labor", [False, True])
def test_train_labor_flag_reaches_every_sampler_and_the_api_uses_the_default_hotness(labor, monkeypatch):
    from types import SimpleNamespace

    import hmgstore.plugins.pyg as pyg
    from hmgstore.bench.train_alone import counted_stats
    from hmgstore.bench.train_setup import build_graph, build_loader
    from hmgstore.graph import expected_draws

    given = {}

    def from_data(*a, **kw):
        given.update(kw)
        return real(*a, **kw)

    real = pyg.from_data
    monkeypatch.setattr(pyg, "from_data", from_data)
    data, csc, train, _, _ = build_graph("papers:4000:60000", 8)
    args = SimpleNamespace(fanout=[5, 3], batch_size=16, no_progress=True, compress=None, cache=0.5, labor=labor)
    built = build_loader("api", data, csc, train, torch.device("cpu"), args, None)
    assert built.sampler.sampler.labor is labor
    stats = counted_stats(built.stores, built.sampler, built.loader, batches=2)
    assert stats["nodes_per_batch"] > 16  # the seeds and the neighbours they sampled
    # the README's swap ranks rows as from_data does for a Data with edges (the bench's Data holds none)
    assert torch.equal(given["hotness"], expected_draws(csc))
    assert parse_args(["train", *(["--labor"] if labor else [])]).labor is labor


# ---- scale ---------------------------------------------------------------------------------
def test_scale_benchmark_runs_the_example_on_one_and_two_processes(tmp_path):
    """The multi-GPU example under torchrun on 1 and 2 processes (gloo without a GPU), and the ratios."""
    out = tmp_path / "scale"
    res = _bench("scale", "--quick", "--out", out, timeout=400)
    if not torch.cuda.is_available():
        _assert_cpu_output(res.stdout)
    report = json.loads((out / "scale.json").read_text())
    if torch.cuda.device_count() == 1:  # one GPU: the 1-GPU run only
        assert [r["gpus"] for r in report["runs"]] == [1] and report["runs"][0]["efficiency"] == 1.0
        return
    one, two = report["runs"][:2]
    assert (one["gpus"], two["gpus"]) == (1, 2 if not torch.cuda.is_available() else torch.cuda.device_count())
    assert one["x_one_gpu"] == 1.0 and one["efficiency"] == 1.0
    assert two["x_one_gpu"] == pytest.approx(two["batches_per_s"] / one["batches_per_s"])
    assert two["efficiency"] == pytest.approx(two["x_one_gpu"] / two["gpus"])
    assert two["per_gpu_batches_per_s"] == pytest.approx(two["batches_per_s"] / two["gpus"])
    assert all(r["batches_per_s"] > 0 and r["train_ms"] > 0 and 0 <= r["test_acc"] <= 1 for r in report["runs"])
    assert f"--nproc-per-node={two['gpus']}" in two["command"] and (out / f"gpus{two['gpus']}.log").is_file()
    assert "| GPUs | batches/s | per GPU | x 1 GPU | efficiency |" in (out / "scale.md").read_text()


def test_scale_benchmark_says_what_failed(tmp_path):
    bad = tmp_path / "bad_example.py"
    bad.write_text("raise SystemExit('this training script is broken on purpose')\n")
    res = subprocess.run([sys.executable, "-m", "hmgstore.bench", "scale", "--quick", "--gpus", "1", "--example",
                          str(bad), "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "the 1-GPU run failed" in res.stderr and "broken on purpose" in res.stderr
    missing = subprocess.run([sys.executable, "-m", "hmgstore.bench", "scale", "--example", str(tmp_path / "no.py")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "not found" in missing.stderr


def test_scale_gpu_counts():
    from hmgstore.bench.scale import gpu_counts

    assert gpu_counts(None, 0) == [1, 2] and gpu_counts(None, 4) == [1, 4] and gpu_counts([2, 4], 4) == [1, 2, 4]
    with pytest.raises(SystemExit, match="has 2 GPU"):
        gpu_counts([4], 2)


def test_scale_passes_its_options_to_every_run_and_keeps_the_baseline_apart(tmp_path):
    """bench scale's step, pipeline and format options reach the example; --one-gpu-budget makes the 1-GPU run an
    all-GPU float32 baseline while the others keep --gpu-budget and --compress."""
    from hmgstore.bench.__main__ import build_parser
    from hmgstore.bench.scale import _example_argv

    args = build_parser().parse_args(["scale", "--graph", "papers:1K:10K", "--gpu-budget", "5GB", "--compress", "int8",
                                      "--one-gpu-budget", "60GB", "--no-trim", "--max-sms", "12", "--pipeline", "off"])
    for n in (1, 2):
        argv = _example_argv(args, n, tmp_path / "r.json")
        value = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
        assert "--no-trim" in argv and "--no-tf32" not in argv
        assert value["--max-sms"] == "12" and value["--pipeline"] == "off"
        assert value["--gpu-budget"] == ("60GB" if n == 1 else "5GB")
        assert value.get("--compress") == (None if n == 1 else "int8")


# ---- --quick: a smoke test, with no ratios printed ------------------------------------------------
def _scale_report(quick: bool) -> dict:
    from hmgstore.bench import report as bench_report
    from hmgstore.bench.scale import _ratios

    runs = [{"gpus": g, "batches_per_s": rate, "train_ms": 5.0, "wait_ms": None, "sampling_ms": 1.0,
             "gather_ms": 1.0, "test_acc": 0.5, "command": f"torchrun --nproc-per-node={g} ...",
             "dataset": {"num_nodes": 3000, "num_edges": 30000, "feat_dim": 16, "x_gb": 0.0}}
            for g, rate in ((1, 2.0), (2, 40.8))]  # a quick run's overheads: "efficiency 10.20"
    report = {**bench_report.header("scale", torch.device("cpu"), quick=quick), "graph": "synthetic",
              "batch_size": 128, "gpu_budget": "none", "runs": runs}
    _ratios(report)
    return report


def test_quick_reports_are_smoke_tests_without_ratios():
    """``bench scale --quick`` printed an efficiency of 10.20: tiny sizes time overheads, not rates."""
    from hmgstore.bench import scale
    from hmgstore.bench.report import SMOKE_TEST_LINE

    quick, full = scale.table_text(_scale_report(True)), scale.table_text(_scale_report(False))
    assert "10.20" in full and SMOKE_TEST_LINE not in full
    assert "10.20" not in quick and "20.40" not in quick and quick.count(SMOKE_TEST_LINE) == 1
    row = next(line for line in quick.splitlines() if line.startswith("| 2 |"))
    assert row.split("|")[4:6] == [" n/a ", " n/a "]  # x 1 GPU, efficiency


def test_quick_runs_say_they_are_smoke_tests(tmp_path):
    out = tmp_path / "bench"
    res = _bench("gather", "--quick", "--row-bytes", "64", "--table-gib", 1 / 64, "--no-progress", "--out", out)
    report = json.loads((out / "gather.json").read_text())
    assert report["smoke_test"] is True
    assert res.stdout.count("smoke test (--quick)") == 1 and "n/a" in res.stdout
    assert not re.search(r"\d\.\d\dx", res.stdout)  # no "(0.52x; ...)" against index_select
    assert json.loads(json.dumps(parse_args(["gather"]).quick)) is False


def test_train_runs_the_readme_swap_beside_the_tuned_configurations_repeated(tmp_path):
    out = tmp_path / "train"
    _bench("train", "--quick", "--no-progress", "--configs", "cache+pipe", "api+pipe", "--repeat", "2",
           "--out", out, timeout=600)
    report = json.loads((out / "train.json").read_text())
    assert set(report["configs"]) == {"cache+pipe", "api+pipe", "cache+pipe/run2", "api+pipe/run2"}
    assert all(c["epoch_s"] > 0 for c in report["configs"].values())
    assert set(report["repeats"]) == {"cache+pipe", "api+pipe"}
    r = report["repeats"]["api+pipe"]
    assert r["runs"] == 2 and r["min"] <= r["median"] <= r["max"]
    assert "repeated, in alternating order" in (out / "train.md").read_text()


def test_the_readme_swap_keeps_the_pipelines_default_cap():
    from hmgstore.bench.train_configs import _with_caps

    assert _with_caps(["cache+pipe", "api+pipe", "cache"], [4, None]) == ["cache+pipe@4", "cache+pipe@none",
                                                                          "api+pipe", "cache"]


def test_repeats_give_the_median_and_spread_of_each_configuration():
    from hmgstore.bench.train_report import repeats

    report = {"configs": {"a": {"batches_per_s": 10.0}, "b": {"batches_per_s": 5.0}, "a/run2": {"batches_per_s": 14.0},
                          "a/run3": {"batches_per_s": 11.0}}}
    assert repeats(report) == {"a": {"runs": 3, "median": 11.0, "min": 10.0, "max": 14.0}}


def test_an_out_that_is_a_file_is_refused_before_the_run(tmp_path, capsys):
    from hmgstore.bench.__main__ import main

    (tmp_path / "f").write_text("kept")
    with pytest.raises(SystemExit):
        main(["gather", "--quick", "--out", str(tmp_path / "f")])
    assert "is a file" in capsys.readouterr().err and (tmp_path / "f").read_text() == "kept"


def test_a_train_run_stopped_partway_keeps_the_configurations_it_finished(tmp_path, monkeypatch):
    """A time limit that stops ``bench train`` during a configuration leaves the report of those before it."""
    import hmgstore.bench.train as train
    from hmgstore.bench.__main__ import parse_args

    real, ran = train.run_config, []

    def run_config(config, *a, **kw):
        if ran:
            raise KeyboardInterrupt  # as a time limit's signal would stop the run
        ran.append(config)
        return real(config, *a, **kw)

    monkeypatch.setattr(train, "run_config", run_config)
    out = tmp_path / "train"
    args = parse_args(["train", "--quick", "--no-progress", "--configs", "cache", "host", "cache+pipe",
                       "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        train.run(args)
    report = json.loads((out / "train.json").read_text())
    assert list(report["configs"]) == ["cache"] and report["configs"]["cache"]["epoch_s"] > 0
    assert report["configs_left"] == ["host", "cache+pipe"]
    assert "not run yet: host, cache+pipe" in (out / "train.md").read_text()
