"""Command line: ``python -m hmgstore.bench {gather,sample,train,peer,scale} [options]``.

The benchmarks a user runs on their own machine (research probes live in the
repository's ``benchmarks/``, whose ``benchmarks/research`` runner reuses this
command line through :class:`Suite`). Every benchmark shares the flags of
:mod:`hmgstore.cli.flags` (``--batch-size``, ``--fanout``, ``--seed``,
``--no-progress``). A benchmark module may hold two lists of options, written
as on the command line: ``CPU``, its sizes for a machine without a GPU, and
``QUICK``, the tiny sizes of ``--quick``. :func:`parse_args` gives them to
every option the command line leaves out (``QUICK`` over ``CPU``), so that
``--quick --table-gib 0.5`` keeps its 0.5.
"""
from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from . import gather, peer, sample, scale, train

BENCHMARKS = {"gather": gather, "sample": sample, "train": train, "peer": peer, "scale": scale}
# argparse %-formats these help texts: a percent sign is written %%
HELPS = {
    "gather": "random-row gathers vs PCIe limit and baselines",
    "sample": "neighbour sampling: topology on the GPU, zero-copy from the host, cached; vs PyG's and "
              "DGL's CPU samplers",
    "train": "GraphSAGE epochs end to end: stock PyG, all on the GPU, hmgstore from the host and with "
             "a pre-sampled cache, each with and without the pipeline",
    "peer": "gathers of rows held by other GPUs, all GPUs at once (2+ GPUs), vs peer memcpy and "
            "index_select + copy",
    "scale": "GraphSAGE batches/s on 1 and N GPUs (examples/multi_gpu_pyg.py under torchrun): the speed-up "
             "and the efficiency per GPU",
}


@dataclass(frozen=True)
class Suite:
    """A command of several benchmarks: its name as typed (``prog``), its modules by name, one help line each.

    A module offers ``add_arguments(parser)`` and ``run(args) -> report`` (a dict whose ``"_table_text"`` is
    printed), and may offer ``CPU`` and ``QUICK`` (see :func:`parse_args`) and ``check(args) -> str | None``: why
    options that each parse cannot run together, refused as a bad command line.
    """

    prog: str
    benchmarks: dict[str, ModuleType]
    helps: dict[str, str]
    description: str = ""


USER = Suite("python -m hmgstore.bench", BENCHMARKS, HELPS, (__doc__ or "").split("\n\n")[0])


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it (or there is none, or it is a flag's False)."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser(*, defaults: bool = True, suite: Suite = USER) -> argparse.ArgumentParser:
    """The parser of every benchmark of ``suite``. ``defaults=False``: options left out are left out of the
    namespace too (how :func:`parse_args` tells what the command line wrote)."""
    parser = argparse.ArgumentParser(prog=suite.prog, description=suite.description)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, text in suite.helps.items():
        module = suite.benchmarks[name]
        p = sub.add_parser(name, help=text, description=(module.__doc__ or "").split("\n\n")[0],
                           formatter_class=_Defaults)
        module.add_arguments(p)
        p.epilog = _epilog(p, module)
        if not defaults:
            for action in p._actions:
                action.default = argparse.SUPPRESS
    return parser


def _epilog(parser: argparse.ArgumentParser, module) -> str | None:
    """The help's last lines: the module's ``CPU`` and ``QUICK`` options, as :func:`parse_args` applies them."""
    takes_values = {o for a in parser._actions if a.nargs != 0 for o in a.option_strings}

    def shown(options: list[str]) -> str:  # an option given no values is an empty list: say so
        return " ".join(f"{o} (none)" if o in takes_values and (i + 1 == len(options)
                                                                 or options[i + 1].startswith("--")) else o
                        for i, o in enumerate(options))

    lines = []
    if getattr(module, "CPU", None):
        lines.append(f"Without a GPU, options not given are: {shown(module.CPU)}.")
    if getattr(module, "QUICK", None):
        lines.append(f"With --quick, options not given are: {shown(module.QUICK)}.")
    return " ".join(lines) or None


def parse_args(argv=None, suite: Suite = USER) -> argparse.Namespace:
    """The options of a benchmark's command line ``argv`` (None: ``sys.argv[1:]``) in ``suite``.

    Options it leaves out take the benchmark's ``QUICK`` values (with
    ``--quick``), else its ``CPU`` values (on a machine without a GPU), else
    their defaults. Exits with argparse's message on a bad command line: a
    value refused by its flag's type (:mod:`hmgstore.cli.flags`), or options
    refused together by the benchmark's ``check``.
    """
    args = build_parser(suite=suite).parse_args(argv)
    module = suite.benchmarks[args.benchmark]
    written = _written(argv, suite)
    fill = []
    if not torch.cuda.is_available():
        fill.append(getattr(module, "CPU", []))
    if getattr(args, "quick", False):
        fill.append(getattr(module, "QUICK", []))
    for options in fill:
        values = build_parser(suite=suite).parse_args([args.benchmark, *options])
        for name in _written([args.benchmark, *options], suite) - written:
            setattr(args, name, getattr(values, name))
    problem = module.check(args) if hasattr(module, "check") else None
    if problem is not None:  # argparse's exit and message, as for a value refused on its own
        _subparser(build_parser(suite=suite), args.benchmark).error(problem)
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _written(argv, suite: Suite) -> set[str]:
    """Names (dests) of the options that the command line ``argv`` writes, whatever their values."""
    return set(vars(build_parser(defaults=False, suite=suite).parse_args(argv))) - {"benchmark"}


def main(argv=None, suite: Suite = USER) -> None:
    """Run the benchmark that ``argv`` (None: ``sys.argv[1:]``) names in ``suite``; print its table and where
    its files went. Exits with argparse's message on a bad command line."""
    args = parse_args(argv, suite)
    out = getattr(args, "out", None)
    if out is not None and os.path.exists(out) and not os.path.isdir(out):  # before the run, not after it
        build_parser(suite=suite).error(f"--out {out} is a file; the results go into a folder: name another")
    # The benchmarks' own progress lines; the library's INFO logs (a DGL stub, a split's measured share) are
    # not the reader's business here, its warnings are.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for module in suite.benchmarks.values():
        logging.getLogger(module.__name__.rpartition(".")[0]).setLevel(logging.INFO)
    if hasattr(args, "seed"):
        torch.manual_seed(args.seed)
    report = suite.benchmarks[args.benchmark].run(args)
    print(report.pop("_table_text"))
    print(f"\nwritten under {args.out}")


if __name__ == "__main__":
    main()
