"""Command line: ``python -m hmgstore.cli.partition OUT_DIR --parts N [--by range|hash|FILE] GRAPH``.

Cuts a graph into one part per machine (see
:mod:`hmgstore.distributed.parts` for what each part holds), for
:func:`hmgstore.distributed.load_partition` and
:class:`hmgstore.distributed.ClusterTensor`. The graph is an OGB node
dataset already on disk (``--ogb ROOT [--name ogbn-products]``; never
downloaded) or a synthetic one (``--synthetic NODES``). Node attributes
``x`` (features) and ``y`` (labels) are written per part; the official
split goes to ``OUT_DIR/split/{train,val,test}.npy`` as global ids.
``--by`` is ``range`` (contiguous id ranges), ``hash`` or a file with one
machine per node (``.npy``, ``.pt``, or text with one number a line, as
METIS's ``gpmetis`` writes).

Everything is written into a new folder beside OUT_DIR, then renamed into
place: OUT_DIR ends with the old parts or the new ones, never a mix. An
OUT_DIR that holds anything is refused unless ``--overwrite``, which
replaces it and everything in it, but never one that holds the folder the
command runs in (an empty OUT_DIR, as an unset variable gives, or ``.``) or
its inputs (the ``--by`` file, the ``--ogb`` root).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch

from ..data import synthetic
from ..distributed.partition_book import PartitionBook
from ..distributed.parts import partition
from ..distributed.replace import check_target
from ..table.file_args import NPY_HEADER_ERRORS
from ..table.files import load_torch_file
from . import flags

log = logging.getLogger(__name__)

def read_assignment(path) -> torch.Tensor:
    """One machine per node from ``path``: ``.npy``, ``.pt`` (a tensor) or text, one integer a line.
    Raises FileNotFoundError, or ValueError naming the file when it cannot be read or holds no tensor."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no assignment file at {path}")
    if path.suffix in (".pt", ".pth"):
        obj = load_torch_file(path, "an assignment")
        if not isinstance(obj, torch.Tensor):
            raise ValueError(f"{path} holds a {type(obj).__name__}; an assignment file holds one tensor")
        return obj
    try:
        if path.suffix == ".npy":
            return torch.from_numpy(np.load(path, allow_pickle=False))
        return torch.from_numpy(np.loadtxt(path, dtype=np.int64, ndmin=1))
    except (*NPY_HEADER_ERRORS, OSError) as err:  # numpy's header parser raises tokenize's error too
        raise ValueError(f"{path} is not an assignment file (one integer machine per node): {err}") from err


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser (its ``--help``). Raises nothing; the parser exits with status 2 on a bad
    command line."""
    p = argparse.ArgumentParser(prog="python -m hmgstore.cli.partition", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path, help="folder to write part0 ... part{N-1} and split/ into")
    p.add_argument("--parts", type=int, required=True, help="number of machines")
    p.add_argument("--by", default="range", help="range (default), hash, or a file of one machine per node")
    graph = p.add_mutually_exclusive_group(required=True)
    graph.add_argument("--ogb", type=Path, metavar="ROOT", help="folder holding an OGB node dataset")
    graph.add_argument("--synthetic", type=flags.synthetic_nodes, metavar="NODES",
                       help="a synthetic community graph of NODES nodes")
    p.add_argument("--name", default=None, help="with --ogb: the dataset (default: ogbn-products)")
    p.add_argument("--feat-dim", type=int, default=None, help="with --synthetic: features per node (default: 128)")
    p.add_argument("--avg-degree", type=int, default=None, help="with --synthetic: edges per node (default: 10)")
    p.add_argument("--seed", type=flags.seed, default=None, help="with --synthetic: random seed (default: 0)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT_DIR and everything in it if it holds "
                   "anything (default: refuse)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


#: Options of one graph source, with their defaults: given with the other source they would be ignored.
_OGB_ONLY = {"name": "ogbn-products"}
_SYNTHETIC_ONLY = {"feat_dim": 128, "avg_degree": 10, "seed": 0}


def _source_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the options of the graph source not chosen (a usage error naming them), then set the defaults of
    the chosen one's."""
    ogb = args.ogb is not None
    theirs, mine = (_SYNTHETIC_ONLY, _OGB_ONLY) if ogb else (_OGB_ONLY, _SYNTHETIC_ONLY)
    given = ["--" + name.replace("_", "-") for name in theirs if getattr(args, name) is not None]
    if given:
        parser.error(f"{', '.join(given)} {'go' if len(given) > 1 else 'goes'} only with "
                     f"{'--synthetic' if ogb else '--ogb'}; this command reads "
                     f"{'--ogb' if ogb else '--synthetic'}: leave {'them' if len(given) > 1 else 'it'} out")
    for name, default in mine.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def main(argv=None) -> None:
    """Run the command on ``argv`` (default: the process's arguments).

    Raises:
        SystemExit: status 2 with a usage error naming the flag for a bad command line: an OUT_DIR that is a
            file or holds anything without ``--overwrite``, a ``--by`` that is no method and no file,
            ``--parts`` under 1, an option of the other graph source (``--name`` with ``--synthetic``;
            ``--feat-dim``, ``--avg-degree``, ``--seed`` with ``--ogb``), a synthetic graph's sizes, an
            assignment file that does not fit the graph, an OGB folder that is missing or whose files disagree
            (the reader's error), a dataset whose split or edges do not fit its nodes.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    _source_options(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    progress = not args.no_progress
    if not str(args.out_dir).strip() or str(args.out_dir) == ".":  # "" is what an unset shell variable gives
        parser.error("OUT_DIR is empty or '.': name a folder of the parts' own to write into")
    if args.by not in ("range", "hash") and not Path(args.by).is_file():  # before building the graph
        parser.error(f"--by {args.by}: no such assignment file; --by is 'range', 'hash' (lower case) or the path "
                     "of a .npy/.pt/text file with each node's machine")
    inputs = [args.ogb, None if args.by in ("range", "hash") else Path(args.by)]  # never deleted by --overwrite
    try:  # before building the graph
        check_target(args.out_dir, args.overwrite, inputs)
    except NotADirectoryError as err:
        parser.error(f"OUT_DIR {args.out_dir}: {err}; name a folder to write the parts into")
    except FileExistsError as err:
        parser.error(str(err))
    if args.ogb is not None:
        from ..data.ogb import load_node_dataset

        try:
            g = load_node_dataset(args.ogb, args.name, owned_memory=False, progress=progress)
        except (FileNotFoundError, ValueError) as err:  # a missing or inconsistent dataset: the flag's fault
            parser.error(f"--ogb {args.ogb} --name {args.name}: {err}")
    else:
        try:
            g = synthetic(args.synthetic, args.avg_degree, args.feat_dim, seed=args.seed)
        except ValueError as err:
            parser.error(f"--synthetic {args.synthetic} --avg-degree {args.avg_degree} --feat-dim {args.feat_dim}: "
                         f"{err}")
    try:
        if args.by in ("range", "hash"):
            book = getattr(PartitionBook, args.by)(g.num_nodes, args.parts)
        else:
            book = PartitionBook.from_assignment(read_assignment(args.by), args.parts, g.num_nodes)
    except (TypeError, ValueError) as err:
        parser.error(f"--parts {args.parts} --by {args.by}: {err}")
    if args.parts > g.num_nodes:  # accepted (a book may have empty parts), but rarely meant: each part is 6 files
        log.warning("--parts %d is more than the graph's %d nodes: %d parts will be empty", args.parts, g.num_nodes,
                    args.parts - g.num_nodes)
    split = {"train": g.train_idx, "val": g.val_idx, "test": g.test_idx}
    try:  # the split, features and edges are checked against the book's nodes before anything is written
        folders = partition({"x": g.x, "y": g.y}, g.edge_index, book, args.out_dir, split=split,
                            overwrite=args.overwrite, progress=progress, keep=inputs)
    except FileExistsError as err:  # filled while the graph was built
        parser.error(str(err))
    except (TypeError, ValueError, IndexError) as err:  # the dataset's split or edges do not fit its nodes
        parser.error(f"{args.ogb or 'the synthetic graph'}: {err}")
    log.info("%s: %d nodes, %d edges in %d parts of %s nodes under %s", book.kind, g.num_nodes,
                 g.edge_index.shape[1], len(folders), list(book.sizes), args.out_dir)


if __name__ == "__main__":
    main()
