"""``python -m hmgstore.bench``: a value that cannot apply is refused as it is parsed.

Each benchmark's flags take their types from :mod:`hmgstore.cli.flags`: a
count of 0, a share outside [0, 1], a nan or inf size, an unreadable byte
size or graph spec ends the command at once with argparse's message (exit
code 2, the flag, the value and what the flag takes), never after the
set-up or in a traceback. Options that each parse but cannot run together
(``--replicate`` over ``--gpu-budget``, shards too small for a row size)
are refused the same way by the benchmark's ``check``. The examples' flags:
test_cli_arguments_examples.py.
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys

import pytest
import torch

from hmgstore.bench.__main__ import parse_args
from hmgstore.cli import flags

#: (command line, flag and value the message must name)
REFUSED = [
    (["gather", "--row-bytes", "0"], "--row-bytes", "0"),
    (["gather", "--row-bytes", "128", "-4"], "--row-bytes", "-4"),
    (["gather", "--row-bytes", "6"], "--row-bytes", "6"),
    (["gather", "--sweep-row-bytes", "0"], "--sweep-row-bytes", "0"),
    (["gather", "--table-gib", "nan"], "--table-gib", "nan"),
    (["gather", "--table-gib", "-1"], "--table-gib", "-1"),
    (["gather", "--table-gib", "inf"], "--table-gib", "inf"),
    (["gather", "--sweep-gb", "2", "nan"], "--sweep-gb", "nan"),
    (["gather", "--sweep-gb", "-2"], "--sweep-gb", "-2"),
    (["gather", "--big-table-gb", "nan"], "--big-table-gb", "nan"),
    (["gather", "--reps", "0"], "--reps", "0"),
    (["gather", "--slow-reps", "0"], "--slow-reps", "0"),
    (["gather", "--split-threads", "0"], "--split-threads", "0"),
    (["gather", "--seed", "-1"], "--seed", "-1"),
    (["gather", "--seed", str(2**64)], "--seed", str(2**64)),
    (["sample", "--graphs", "0:0"], "--graphs", "0:0"),
    (["sample", "--graphs", "1K:0"], "--graphs", "1K:0"),
    (["sample", "--graphs", "synthetic:0"], "--graphs", "synthetic:0"),
    (["sample", "--graphs", "synthetic:abc"], "--graphs", "synthetic:abc"),
    (["sample", "--graphs", "1.2.3:10"], "--graphs", "1.2.3"),
    (["sample", "--batches", "0"], "--batches", "0"),
    (["sample", "--slow-batches", "0"], "--slow-batches", "0"),
    (["sample", "--cache", "1.5"], "--cache", "1.5"),
    (["sample", "--cache", "-0.1"], "--cache", "-0.1"),
    (["sample", "--cache", "nan"], "--cache", "nan"),
    (["sample", "--skew", "inf"], "--skew", "inf"),
    (["sample", "--skew", "-1"], "--skew", "-1"),
    (["train", "--graph", "synthetic:abc"], "--graph", "synthetic:abc"),
    (["train", "--graph", "synthetic:0"], "--graph", "synthetic:0"),
    (["train", "--graph", "papers:1M"], "--graph", "papers:1M"),
    (["train", "--graph", "papers:0:10"], "--graph", "papers:0:10"),
    (["train", "--graph", "cora"], "--graph", "cora"),
    (["train", "--depth", "0"], "--depth", "0"),
    (["train", "--batches", "0"], "--batches", "0"),
    (["train", "--stock-batches", "0"], "--stock-batches", "0"),
    (["train", "--feat-dim", "0"], "--feat-dim", "0"),
    (["train", "--cache", "2"], "--cache", "2"),
    (["train", "--topology-cache", "nan"], "--topology-cache", "nan"),
    (["train", "--split", "0.5", "-1"], "--split", "-1"),
    (["train", "--max-sms", "0"], "--max-sms", "0"),
    (["train", "--max-sms", "auto", "-3"], "--max-sms", "-3"),
    (["train", "--timeline", "-1"], "--timeline", "-1"),
    (["train", "--sm-percent", "0"], "--sm-percent", "0"),
    (["train", "--sm-percent", "101"], "--sm-percent", "101"),
    (["train", "--fuse", "0"], "--fuse", "0"),
    (["peer", "--row-bytes", "3"], "--row-bytes", "3"),
    (["peer", "--shard-bytes", "2XB"], "--shard-bytes", "2XB"),
    (["peer", "--shard-bytes", "0"], "--shard-bytes", "0"),
    (["peer", "--copy-bytes", "nan"], "--copy-bytes", "nan"),
    (["peer", "--max-batch-mib", "0"], "--max-batch-mib", "0"),
    (["peer", "--reps", "0"], "--reps", "0"),
    (["peer", "--gpus", "0", "-1"], "--gpus", "-1"),
    (["scale", "--graph", "synthetic:abc"], "--graph", "synthetic:abc"),
    (["scale", "--graph", "papers:0:0"], "--graph", "papers:0:0"),
    (["scale", "--num-nodes", "0"], "--num-nodes", "0"),
    (["scale", "--feat-dim", "0"], "--feat-dim", "0"),
    (["scale", "--hidden", "-1"], "--hidden", "-1"),
    (["scale", "--gpu-budget", "2XB"], "--gpu-budget", "2XB"),
    (["scale", "--replicate=-1GB"], "--replicate", "-1GB"),
    (["scale", "--one-gpu-budget", "lots"], "--one-gpu-budget", "lots"),
    (["scale", "--topology-budget", "most"], "--topology-budget", "most"),
    (["scale", "--epochs", "1"], "--epochs", "1"),
    (["scale", "--max-sms", "0"], "--max-sms", "0"),
]


def refusal(argv, capsys) -> str:
    """argparse's message for ``argv``, after checking that it exits as a bad command line does (code 2)."""
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, flag, value", REFUSED, ids=[" ".join(argv) for argv, _, _ in REFUSED])
def test_a_value_that_cannot_apply_is_refused_as_it_is_parsed(argv, flag, value, capsys):
    message = refusal(argv, capsys)
    assert f"python -m hmgstore.bench {argv[0]}: error: argument {flag}" in message, message
    assert value in message and "must be" in message, message


@pytest.mark.parametrize("argv, flag, value", [
    (["scale", "--gpu-budget", "1GB", "--replicate", "2GB"], "--replicate", "2GB"),
    (["scale", "--one-gpu-budget", "100MB"], "--one-gpu-budget", "100MB"),  # --replicate's default: 256MB
    (["peer", "--shard-bytes", "1KB", "--row-bytes", "512"], "--shard-bytes", "1000 B"),
])
def test_options_that_cannot_run_together_are_refused_before_the_run(argv, flag, value, capsys):
    message = refusal(argv, capsys)
    assert f"python -m hmgstore.bench {argv[0]}: error:" in message and flag in message and value in message


def test_values_at_the_edges_of_what_applies_still_parse():
    args = parse_args(["sample", "--cache", "0", "--skew", "0", "--graphs", "synthetic:16", "1:1", "20K:200K"])
    assert args.cache == 0 and args.skew == 0
    assert args.graphs == [("synthetic", 16), ("power-law", 1, 1), ("power-law", 20_000, 200_000)]
    args = parse_args(["train", "--cache", "1", "--graph", "papers:1K:10K", "--max-sms", "auto", "none", "4",
                       "--sm-percent", "100", "--timeline", "0", "--split", "0", "1"])
    assert args.graph == "papers:1K:10K" and args.max_sms == ["auto", None, 4] and args.split == [0.0, 1.0]
    assert parse_args(["train", "--graph", "products"]).graph == "products"
    args = parse_args(["gather", "--row-bytes", "4", "--big-table-gb", "0", "--seed", str(2**64 - 1)])
    assert args.row_bytes == [4] and args.sweep_gb == [] and args.seed == 2**64 - 1
    args = parse_args(["scale", "--graph", "papers:1K:10K", "--max-sms", "None", "--topology-budget", "ALL",
                       "--gpu-budget", "0", "--replicate", "0", "--epochs", "2"])
    # kept as written for the example's own command line; a word in the case the example compares
    assert args.max_sms == "None" and args.topology_budget == "all" and args.gpu_budget == "0"
    assert parse_args(["peer", "--shard-bytes", "64MiB"]).shard_bytes == "64MiB"


def test_the_command_exits_with_the_message_and_no_traceback():
    """As a user runs it: the refusal comes before anything is built."""
    done = subprocess.run([sys.executable, "-m", "hmgstore.bench", "train", "--depth", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "argument --depth: must be a positive whole number, got 0" in done.stderr


# ---- the types of hmgstore.cli.flags ------------------------------------------------------------------------
@pytest.mark.parametrize("kind, bad", [
    (flags.share, ["nan", "inf", "-inf", "1.0001", "-1e-9", "x", ""]),
    (flags.positive_real, ["nan", "inf", "0", "-0.5", "1e999"]),
    (flags.non_negative_real, ["nan", "inf", "-1"]),
    (flags.positive_count, ["0", "0.1", "abc", "-5", "1.2.3"]),
    (flags.synthetic_nodes, ["15", "0", "x"]),
    (flags.row_bytes, ["0", "-4", "2", "6", "4.0"]),
    (flags.seed, ["-1", str(2**64), "1.5"]),
    (flags.natural, ["-1", "x"]),
    (flags.whole(1, 100), ["0", "101", "50.5"]),
    (flags.sm_cap, ["0", "-1", "1.5", "all"]),
    (flags.size("auto", "none"), ["2XB", "-1GB", "nan", "inf", "1e-12GB", "2.5", "autos"]),
    (flags.size(at_least=1), ["0", "0GB"]),
    (flags.graph("synthetic:NODES", "NODES:EDGES"), ["synthetic", "synthetic:15", "1:2:3", "x:10", "10:", ":"]),
    (flags.device_name, ["gpu", "mps", "cuda:x", ""]),
])
def test_each_type_refuses_what_cannot_apply_with_what_it_takes(kind, bad):
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="must be"):
            kind(text)


def test_each_type_reads_what_it_takes():
    assert flags.share("0") == 0 and flags.share("1") == 1 and flags.positive_real("1e-3") == 1e-3
    assert flags.positive_count("1.6B") == 1_600_000_000 and flags.synthetic_nodes("16") == 16
    assert flags.whole(2)("2") == 2 and flags.natural("0") == 0 and flags.seed("0") == 0
    assert flags.sm_cap("NONE") is None and flags.sm_cap("auto") == "auto" and flags.sm_cap("8") == 8
    assert flags.size("auto")("AUTO") == "auto" and flags.size()("1.5e9") == "1.5e9" and flags.size()("0") == "0"
    assert flags.as_written(flags.sm_cap)("None") == "None"
    assert flags.graph("synthetic", "papers:NODES:EDGES")("papers:111M:1.6B") == "papers:111M:1.6B"
    assert flags.device("cpu") == torch.device("cpu") and flags.device_name("cuda:1") == torch.device("cuda", 1)
    assert math.isclose(flags.non_negative_real("0.25"), 0.25)


def test_a_gpu_this_machine_lacks_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(argparse.ArgumentTypeError, match="torch sees no GPU here.*use cpu"):
        flags.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(argparse.ArgumentTypeError, match="has 2 GPU.*cuda:0 to cuda:1"):
        flags.device("cuda:2")
    assert flags.device("cuda:1") == torch.device("cuda", 1)
