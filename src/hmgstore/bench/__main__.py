"""Command line: ``python -m hmgstore.bench {gather,peer,sample,hotness,train,remote,reach} [options]``."""
from __future__ import annotations

import argparse
import logging

from . import gather, hotness, peer, reach, remote, sample, train

BENCHMARKS = {"gather": gather.run, "peer": peer.run, "sample": sample.run, "hotness": hotness.run,
              "train": train.run, "remote": remote.run, "reach": reach.run}


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it (or there is none)."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hmgstore.bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    helps = {
        "gather": (gather, "random-row gathers vs PCIe limit and baselines"),
        "peer": (peer, "gathers of rows held by other GPUs, all GPUs at once (2+ GPUs), vs peer memcpy and "
                       "index_select + copy"),
        "sample": (sample, "neighbour sampling: topology on the GPU, zero-copy from the host, cached; vs PyG's and "
                           "DGL's CPU samplers"),
        "hotness": (hotness, "cache hit ratios: pre-sampled hotness against degree order, at 1-20% of the nodes"),
        "train": (train, "GraphSAGE epochs end to end: stock PyG, all on the GPU, hmgstore from the host and with "
                         "a pre-sampled cache, each with and without the pipeline"),
        "reach": (reach, "gather rates against the distinct 2 MiB host pages a batch touches: the knee and the cost "
                         "per page, kernel and CPU path"),
        "remote": (remote, "rows fetched from other machines (torch.distributed), against all_to_all; launches "
                           "simulated machines on this host unless run under torchrun"),
    }
    for name, (module, text) in helps.items():
        module.add_arguments(sub.add_parser(name, help=text, description=module.__doc__.split("\n\n")[0],
                                            formatter_class=_Defaults))
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = BENCHMARKS[args.benchmark](args)
    print(report.pop("_table_text"))
    print(f"\nwritten under {args.out}")


if __name__ == "__main__":
    main()
