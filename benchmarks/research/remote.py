"""``python benchmarks/research remote``: rows fetched from other machines, against all_to_all in the same run.

Every rank holds its machine's partition of a table (range book, one
machine's rows per partition) and gathers batches of ``--batch-size`` random
global ids through :class:`hmgstore.distributed.ClusterTensor`, all ranks at
once (gathers are collective). Variants, per row size, each rank's rows
checked bit for bit against the row function before timing:

- ``remote``: every id owned by another machine: rows GB/s delivered into
  each rank.
- ``mixed``: ids uniform over the whole graph (1/M of them local).
- ``all_to_all``: ``all_to_all_single`` of the same bytes over the same
  counterpart groups, with no ids, no gather and no scatter: the limit the
  remote rows are held to.

Then (``--what train``, :mod:`.remote_train`) GraphSAGE trains on a graph
partitioned over the machines, against one machine holding all of it, in
the same run: batches/s per rank and in all, the speed-up and the
efficiency.

A round is timed from a barrier to the slowest rank's end (CUDA: after a
synchronisation); figures are medians over ``--reps`` rounds. Without
``RANK`` in the environment the command launches ``--machines`` x
``--ranks-per-machine`` ranks on this host itself, each simulated machine
told apart by ``HMGSTORE_NODE_ID`` (CPU: gloo; with that many GPUs: NCCL,
one GPU per rank). Under ``torchrun`` on real machines, it runs as one of
the ranks: ``torchrun --nnodes 2 --nproc-per-node K benchmarks/research
remote``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hmgstore.bench.report import header, no_gpu_line, ratio_text, smoke_test_lines, write_report
from hmgstore.cli import flags

from . import PROG, remote_train

DEFAULT_ROW_BYTES = [128, 512, 1024, 4096]
#: --quick: tiny sizes (see hmgstore.bench.__main__.parse_args).
QUICK = ["--row-bytes", "128", "1024", "--machine-mib", "4", "--batch-size", "5000", "--reps", "3",
         *remote_train.QUICK]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--what", nargs="+", choices=("rows", "train"), default=["rows", "train"],
                   help="rows: remote rows against all_to_all; train: GraphSAGE batches/s against one machine")
    p.add_argument("--row-bytes", type=int, nargs="+", default=DEFAULT_ROW_BYTES, help="row sizes, multiples of 4")
    p.add_argument("--machine-mib", type=int, default=256, help="partition size per machine at every row size, MiB")
    flags.add_batch_size(p, 100_000, "ids of each rank")
    p.add_argument("--reps", type=int, default=10, help="timed rounds per variant")
    p.add_argument("--machines", type=int, default=2, help="simulated machines when launched without torchrun")
    p.add_argument("--ranks-per-machine", type=int, default=1, help="ranks per simulated machine")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where each rank's table lives (auto: a GPU per rank when there are enough)")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/remote", help="folder for remote.json and .md")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")
    remote_train.add_arguments(p)


def rows_of(ids: torch.Tensor, cols: int) -> torch.Tensor:
    """The benchmark's table, row by global id, computed: ``[len(ids), cols]`` float32 bits, never zero runs."""
    words = ids.to(torch.int64)[:, None] * 1_000_003 + torch.arange(cols, device=ids.device)[None, :]
    return (words * -7046029254386353131 >> 33).to(torch.int32).view(torch.float32)


def run(args) -> dict:
    """Launch the simulated machines, or run as one rank under torchrun; rank 0 writes the report."""
    if any(rb <= 0 or rb % 4 for rb in args.row_bytes):
        raise SystemExit(f"--row-bytes must be positive multiples of 4, got {args.row_bytes}")
    if "RANK" in os.environ:
        return _rank(args)
    return _launch(args)


def _launch(args) -> dict:
    """Start every rank of the simulated machines on this host and return rank 0's report."""
    world = args.machines * args.ranks_per_machine
    if args.machines < 2:
        raise SystemExit("--machines must be at least 2: remote rows need another machine")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "LOCAL_RANK": str(rank % args.ranks_per_machine),
               "HMGSTORE_NODE_ID": f"machine{rank // args.ranks_per_machine}"}
        runner = str(Path(__file__).resolve().parent)  # benchmarks/research: its __main__ runs this benchmark
        procs.append(subprocess.Popen([sys.executable, runner, "remote", *_argv(args)], env=env,
                                      stdout=subprocess.DEVNULL))  # rank 0's table is printed here, once
    while any(p.poll() is None for p in procs):  # once one rank fails, the others would wait for it: end them
        if any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    codes = [p.returncode for p in procs]
    if any(codes):
        raise SystemExit(f"a rank of the benchmark failed (exit codes by rank: {codes})")
    report = json.loads((out / "remote.json").read_text())
    report["_table_text"] = (out / "remote.md").read_text()
    return report


def _argv(args) -> list[str]:
    """The options of ``args`` as a command line (for ranks started from Python, not the shell)."""
    argv = ["--what", *args.what, "--row-bytes", *map(str, args.row_bytes), "--machine-mib", str(args.machine_mib),
            "--batch-size", str(args.batch_size), "--reps", str(args.reps), "--device", args.device, "--seed",
            str(args.seed), "--out", args.out, "--graph", args.graph, "--feat-dim", str(args.feat_dim), "--fanout",
            ",".join(map(str, args.fanout)), "--train-batch", str(args.train_batch), "--train-batches",
            str(args.train_batches), "--hidden", str(args.hidden)]
    return argv + (["--quick"] if args.quick else []) + (["--no-progress"] if args.no_progress else [])


def _device(args) -> torch.device:
    local = int(os.environ.get("LOCAL_RANK", 0))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    want = args.device if args.device != "auto" else ("cuda" if gpus >= int(os.environ["WORLD_SIZE"]) or (
        gpus and "HMGSTORE_NODE_ID" not in os.environ) else "cpu")
    if want == "cuda":
        if not gpus:
            raise SystemExit("--device cuda needs a GPU per rank; torch sees none")
        torch.cuda.set_device(local % gpus if "HMGSTORE_NODE_ID" not in os.environ else
                              int(os.environ["RANK"]) % gpus)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank(args) -> dict:
    import hmgstore
    import hmgstore.distributed as hd

    device = _device(args)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        cluster = hd.this_cluster()
        if cluster.num_machines < 2:
            raise SystemExit("the remote benchmark needs at least 2 machines (torchrun --nnodes 2, or "
                             "HMGSTORE_NODE_ID set apart on one host): remote rows need another machine")
        report = {**header("remote", device, quick=getattr(args, "quick", False), prog=PROG),
                  "machines": cluster.num_machines, "ranks_per_machine": len(cluster.machines[0]),
                  "batch": args.batch_size, "sizes": []}
        for row_bytes in args.row_bytes if "rows" in args.what else []:
            report["sizes"].append(_one_size(args, row_bytes, device, cluster, hmgstore, hd))
        if "train" in args.what:
            report["train"] = remote_train.run(args, device, cluster)
        if dist.get_rank() == 0:
            write_report(report, args.out, ratios=_ratios, text_of=table_text, plot_to=_no_plot)
        else:
            report["_table_text"] = f"(rank {dist.get_rank()}: rank 0 writes the report)"
        dist.barrier()
        return report
    finally:
        dist.destroy_process_group()


def _one_size(args, row_bytes: int, device, cluster, hmgstore, hd) -> dict:
    cols = row_bytes // 4
    per_machine = max((args.machine_mib << 20) // row_bytes, 4 * args.batch_size)
    num_nodes = per_machine * cluster.num_machines
    book = hd.PartitionBook.range(num_nodes, cluster.num_machines)
    mine = book.nodes_of(cluster.machine)
    local = hmgstore.HybridTensor(rows_of(mine, cols), device, progress=not args.no_progress)
    table = hd.ClusterTensor(local, book)
    g = torch.Generator().manual_seed(1000 + dist.get_rank() + args.seed)  # --seed 0: the ids recorded before it
    start = int(mine[0]) if len(mine) else 0
    others = torch.randint(0, num_nodes - len(mine), (4, args.batch_size), generator=g)
    remote = [torch.where(o >= start, o + len(mine), o) for o in others]  # skip this machine's range
    mixed = [torch.randint(0, num_nodes, (args.batch_size,), generator=g) for _ in range(4)]
    for ids in (remote[0], mixed[0]):
        if not torch.equal(table.gather(ids).cpu().view(torch.int32), rows_of(ids, cols).view(torch.int32)):
            raise AssertionError(f"remote rows differ from the table at {row_bytes} B rows")
    exchange = table.exchange  # the counterpart group the gathers use
    me, peers = exchange.ranks.index(dist.get_rank()), exchange.slots - 1
    per_peer = args.batch_size * row_bytes // peers
    send = torch.ones(per_peer * peers, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)
    splits = [0 if slot == me else per_peer for slot in range(exchange.slots)]

    def a2a(_):
        dist.all_to_all_single(recv, send, splits, splits, group=exchange.group)

    variants = {
        "remote": (_timed(lambda i: table.gather(remote[i % 4]), args.reps, device, cluster.control),
                   args.batch_size),
        "mixed": (_timed(lambda i: table.gather(mixed[i % 4]), args.reps, device, cluster.control),
                  args.batch_size * (cluster.num_machines - 1) // cluster.num_machines),
        "all_to_all": (_timed(a2a, args.reps, device, cluster.control), per_peer * peers // row_bytes),
    }
    table.close()
    local.close()
    return {"row_bytes": row_bytes, "rows_per_machine": per_machine,
            "variants": {name: {"seconds": s, "remote_rows": n, "gbps": n * row_bytes / s / 1e9}
                         for name, (s, n) in variants.items()}}


def _timed(fn, reps: int, device, control) -> float:
    """Median over rounds of the slowest rank's time for ``fn(i)``, from a common barrier; ``control``: the
    cluster's gloo group of every rank."""
    times = []
    for i in range(reps + 2):
        dist.barrier()
        start = time.perf_counter()
        fn(i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=control)  # gloo: the time is a CPU tensor
        if i >= 2:  # two rounds of warm-up
            times.append(float(slowest))
    return statistics.median(times)


def _ratios(report: dict) -> None:
    for size in report["sizes"]:
        limit = size["variants"]["all_to_all"]["gbps"]
        for v in size["variants"].values():
            v["x_all_to_all"] = v["gbps"] / limit if limit else None


def table_text(report: dict) -> str:
    """The remote report as a markdown table: GB/s per rank and ratios to all_to_all, per row size."""
    lines = [f"device: {report['device']}   machines: {report['machines']} x {report['ranks_per_machine']} ranks   "
             f"batch: {report['batch']} ids per rank   date: {report['date']}",
             *no_gpu_line(report, "every rank's table in host memory, exchanged over gloo",
                          "GPU tables and NCCL (one GPU per rank)"), *smoke_test_lines(report)]
    if report["sizes"]:
        lines += ["", "| row B | remote rows GB/s per rank (x all_to_all) | mixed ids GB/s (x all_to_all) | "
                      "all_to_all GB/s |", "|---:|---:|---:|---:|"]
    for s in report["sizes"]:
        v = s["variants"]
        lines.append(f"| {s['row_bytes']} | {v['remote']['gbps']:.2f} "
                     f"({ratio_text(report, v['remote']['x_all_to_all'])}) | {v['mixed']['gbps']:.2f} "
                     f"({ratio_text(report, v['mixed']['x_all_to_all'])}) | "
                     f"{v['all_to_all']['gbps']:.2f} |")
    if "train" in report:
        lines += ["", *remote_train.table_lines(report["train"], report)]
    return "\n".join(lines)


def _no_plot(report: dict, path) -> None:
    """No plot: the table says it all (a handful of row sizes)."""
