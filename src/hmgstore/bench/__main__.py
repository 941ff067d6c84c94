"""Command line: ``python -m hmgstore.bench {gather,peer,sample,train} [options]``."""
from __future__ import annotations

import argparse
import logging

from . import gather, peer, sample, train

BENCHMARKS = {"gather": gather.run, "peer": peer.run, "sample": sample.run, "train": train.run}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hmgstore.bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    gather.add_arguments(sub.add_parser("gather", help="random-row gathers vs PCIe limit and baselines"))
    peer.add_arguments(sub.add_parser("peer", help="gathers of rows held by other GPUs, all GPUs at once "
                                                    "(2+ GPUs), vs peer memcpy and index_select + copy"))
    train.add_arguments(sub.add_parser("train", help="GraphSAGE epochs end to end: stock PyG, all on the GPU, "
                                                      "hmgstore from the host and with a pre-sampled cache, "
                                                      "each with and without the pipeline"))
    sample.add_arguments(sub.add_parser("sample", help="neighbour sampling: topology on the GPU, zero-copy from "
                                                        "the host, cached; vs PyG's and DGL's CPU samplers"))
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = BENCHMARKS[args.benchmark](args)
    print(report.pop("_table_text"))
    print(f"\nwritten under {args.out}")


if __name__ == "__main__":
    main()
