"""Command line: ``python -m hmgstore.bench {gather,peer,sample,hotness,train,scale,remote,reach} [options]``.

Every benchmark shares the flags of :mod:`hmgstore.cli.flags` (``--batch-size``,
``--fanout``, ``--seed``, ``--no-progress``). A benchmark module may hold two
lists of options, written as on the command line: ``CPU``, its sizes for a
machine without a GPU, and ``QUICK``, the tiny sizes of ``--quick``.
:func:`parse_args` gives them to every option the command line leaves out
(``QUICK`` over ``CPU``), so that ``--quick --table-gib 0.5`` keeps its 0.5.
"""
from __future__ import annotations

import argparse
import logging

import torch

from . import gather, hotness, peer, reach, remote, sample, scale, train

BENCHMARKS = {"gather": gather, "peer": peer, "sample": sample, "hotness": hotness, "train": train,
              "scale": scale, "remote": remote, "reach": reach}


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it (or there is none, or it is a flag's False)."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser(*, defaults: bool = True) -> argparse.ArgumentParser:
    """The parser of every benchmark. ``defaults=False``: options left out are left out of the namespace too
    (how :func:`parse_args` tells what the command line wrote)."""
    parser = argparse.ArgumentParser(prog="python -m hmgstore.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="benchmark", required=True)
    # argparse %-formats these help texts: a percent sign is written %%
    helps = {
        "gather": "random-row gathers vs PCIe limit and baselines",
        "peer": "gathers of rows held by other GPUs, all GPUs at once (2+ GPUs), vs peer memcpy and "
                "index_select + copy",
        "sample": "neighbour sampling: topology on the GPU, zero-copy from the host, cached; vs PyG's and "
                  "DGL's CPU samplers",
        "hotness": "cache hit ratios: pre-sampled hotness against degree order, at 1-20%% of the nodes",
        "train": "GraphSAGE epochs end to end: stock PyG, all on the GPU, hmgstore from the host and with "
                 "a pre-sampled cache, each with and without the pipeline",
        "scale": "GraphSAGE batches/s on 1 and N GPUs (examples/multi_gpu_pyg.py under torchrun): the speed-up "
                 "and the efficiency per GPU",
        "reach": "gather rates against the distinct 2 MiB host pages a batch touches: the knee and the cost "
                 "per page, kernel and CPU path",
        "remote": "rows fetched from other machines (torch.distributed), against all_to_all; launches "
                  "simulated machines on this host unless run under torchrun",
    }
    for name, text in helps.items():
        module = BENCHMARKS[name]
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


def parse_args(argv=None) -> argparse.Namespace:
    """The options of a benchmark's command line ``argv`` (None: ``sys.argv[1:]``).

    Options it leaves out take the benchmark's ``QUICK`` values (with
    ``--quick``), else its ``CPU`` values (on a machine without a GPU), else
    their defaults. Exits with argparse's message on a bad command line.
    """
    args = build_parser().parse_args(argv)
    module = BENCHMARKS[args.benchmark]
    written = _written(argv)
    fill = []
    if not torch.cuda.is_available():
        fill.append(getattr(module, "CPU", []))
    if getattr(args, "quick", False):
        fill.append(getattr(module, "QUICK", []))
    for options in fill:
        values = build_parser().parse_args([args.benchmark, *options])
        for name in _written([args.benchmark, *options]) - written:
            setattr(args, name, getattr(values, name))
    return args


def _written(argv) -> set[str]:
    """Names (dests) of the options that the command line ``argv`` writes, whatever their values."""
    return set(vars(build_parser(defaults=False).parse_args(argv))) - {"benchmark"}


def main(argv=None) -> None:
    args = parse_args(argv)
    # The benchmarks' own progress lines; the library's INFO logs (a DGL stub, a split's measured share) are
    # not the reader's business here, its warnings are.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("hmgstore.bench").setLevel(logging.INFO)
    if hasattr(args, "seed"):
        torch.manual_seed(args.seed)
    report = BENCHMARKS[args.benchmark].run(args)
    print(report.pop("_table_text"))
    print(f"\nwritten under {args.out}")


if __name__ == "__main__":
    main()
