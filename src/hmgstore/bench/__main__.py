"""Command line: ``python -m hmgstore.bench {gather} [options]``."""
from __future__ import annotations

import argparse
import logging

from . import gather


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hmgstore.bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    gather.add_arguments(sub.add_parser("gather", help="random-row gathers vs PCIe limit and baselines"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = {"gather": gather.run}[args.benchmark](args)
    print(report.pop("_table_text"))
    print(f"\nwritten under {args.out}")


if __name__ == "__main__":
    main()
