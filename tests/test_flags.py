"""One vocabulary of flags (hmgstore.cli.flags) across the examples and ``python -m hmgstore.bench``.

Every example's and every benchmark's parser is built (not run) and checked: the batch size is
``--batch-size``, ``--no-progress`` and ``--seed`` exist, every fanout defaults to ``flags.DEFAULT_FANOUT``
(from the seeds outwards), and the old names (``--batch``, ``--max-steps``) are aliases only.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from hmgstore.cli import flags

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["pyg_graphsage", "multi_gpu_pyg", "multi_node_pyg", "dgl_graphsage"]


class _Built(Exception):
    def __init__(self, parser):
        self.parser = parser


def example_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser an example builds, caught at its parse_args (the example itself never runs)."""
    if name == "dgl_graphsage":
        pytest.importorskip("hmgstore.plugins.dgl")
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def caught(parser, *args, **kwargs):
        raise _Built(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    monkeypatch.setattr(sys, "argv", [name])
    with pytest.raises(_Built) as built:
        (getattr(module, "parse_args", None) or module.main)()
    return built.value.parser


def bench_parsers() -> dict:
    from hmgstore.bench.__main__ import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options(parser) -> dict:
    """First (primary) option string -> action."""
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


def check(parser, where: str, batch: bool = True) -> None:
    found = options(parser)
    every = {s for a in parser._actions for s in a.option_strings}
    assert "--no-progress" in every, f"{where}: no --no-progress"
    if batch:
        assert "--batch-size" in found, f"{where}: the batch size is not --batch-size"
    assert "--batch" not in found and "--max-steps" not in found, f"{where}: an old name is primary"
    if "--fanout" in found:
        assert found["--fanout"].default == flags.parse_fanout(flags.DEFAULT_FANOUT), f"{where}: fanout default"


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_share_the_vocabulary(name, monkeypatch):
    parser = example_parser(name, monkeypatch)
    check(parser, f"examples/{name}.py")
    assert "--seed" in options(parser) and "--fanout" in options(parser)


def test_benchmarks_share_the_vocabulary():
    for name, parser in bench_parsers().items():
        check(parser, f"bench {name}")
        if name != "reach":
            assert "--seed" in options(parser), f"bench {name}: no --seed"


def test_old_names_still_parse():
    p = argparse.ArgumentParser()
    flags.add_batch_size(p, 10)
    flags.add_max_batches(p)
    args = p.parse_args(["--batch", "7", "--max-steps", "3"])
    assert args.batch_size == 7 and args.max_batches == 3
    with pytest.raises(SystemExit):
        p.parse_args(["--batch-size", "0"])
