"""``python -m hmgstore.bench gather``: random-row gathers, hmgstore against its baselines.

For each row size, one table of at least ``--table-gib`` and at least 8
batches' worth of rows (one buffer of hashed data viewed at every row size),
and batches of ``--batch-size`` distinct uniformly random ids, rotated among a few
id sets. Distinct, because a real mini-batch's node ids are distinct, and
because repeated ids would be served from L2 and inflate the figures (500k
draws with replacement from a 2 GiB table of 4 KiB rows repeat 39% of rows);
at least 8 batches of rows, so that sorted ids do not degenerate into a
sequential scan. Figures are GB/s of useful bytes (rows x row
size), and each is also given as a ratio to the pinned host-to-device memcpy
rate measured at the start of the same run (the PCIe limit). Variants:

- ``hmg_host``: HybridTensor, every row in host memory pinned in place (the
  benchmark's buffer: 4 KiB pages), CUDA ids.
- ``hmg_owned``, ``hmg_owned_cuda``: the same rows copied into host memory
  hmgstore owns: 2 MiB pages (``copy=True, backing="hugepage"``: mmap with
  MADV_HUGEPAGE, registered) or cudaHostAlloc (``copy=True``, the default
  for GPU tables). Their ``setup_seconds`` (copy and page-locking) are
  reported too.
- ``hmg_bf16``: half-width host rows (``host_dtype=torch.bfloat16``, owned
  memory), widened to float32 by the kernel; GB/s of float32 rows delivered.
- ``hmg_host_sync``: ``hmg_host`` with ``check="sync"``: the read-back the
  default deferred check of GPU ids leaves out.
- ``hmg_split``: the split gather (``split="auto"``, owned memory, CPU
  ids, ``--split-threads`` torch threads): the CPU reads the cost model's
  share of the rows while the kernel reads the rest. Beside it, on the same table and
  ids, each path alone: ``split_kernel`` (share 0: the kernel, CPU ids) and
  ``split_cpu`` (share 1: the CPU's reads and the copy). Its target is
  0.85x the sum of those two (``split_vs_sum``), and never below the better.
- ``hmg_gpu``: HybridTensor, every row in its GPU tier, CUDA ids.
- ``pageable``: ``x[idx].to("cuda")``, the plain-PyTorch way.
- ``cpu_pinned``: ``torch.index_select`` into a pinned buffer (all CPU
  threads) then an async copy: the usual CPU-gather baseline.
- ``gpu_index_select``: ``index_select`` on a copy of the table in GPU
  memory: the in-GPU ceiling the GPU tier is held to.

The table-size sweep (``--sweep-gb``, at ``--sweep-row-bytes``; host
variants only) measures how the host tier's rate falls as the table
outgrows the GPU's reach over host pages. Without a GPU, only what a CPU
can show runs, at smaller sizes: hmgstore's host tables read by its CPU
path (pinned in place, owned, bf16) against ``torch.index_select`` into a
new tensor (``cpu_index_select``: what ``x[idx]`` and ``table[idx]`` both
return), and ``hmg_host_out`` (``table.gather(idx, out=buffer)``) against
``cpu_pinned`` (``index_select`` into one reused buffer). The two pairs
differ by the new tensor's page faults: on a 2-core VM with 4 KiB pages,
a fresh 200 MB output costs 3-4x the gather itself at 4 KiB rows
(benchmarks/results/cpu-path-cpu.md).
"""
from __future__ import annotations

import argparse
import gc
import logging
import time
from typing import Any

import torch

import hmgstore

from .. import cuda
from ..cli import flags
from ..gather.cpu_share import batch_class
from ..memory import owned
from .report import header, write_report
from .timing import h2d_limit_gbps, median_seconds

log = logging.getLogger(__name__)

DEFAULT_ROW_BYTES = [64, 128, 256, 512, 1024, 2048, 4096]
ALL_VARIANTS = ("hmg_host", "hmg_host_sync", "hmg_owned", "hmg_owned_cuda", "hmg_bf16", "hmg_split", "hmg_gpu",
                "gpu_index_select", "pageable", "cpu_pinned", "hmg_host_out", "cpu_index_select")
SWEEP_VARIANTS = ("hmg_host", "hmg_owned", "hmg_owned_cuda", "hmg_bf16", "hmg_split", "cpu_pinned")


#: Sizes for a machine without a GPU (see __main__.parse_args): the GPU sizes need ~20 GB of RAM and minutes there.
CPU = ["--row-bytes", "128", "512", "4096", "--batch-size", "50000", "--table-gib", "0.125"]
#: --quick: tiny sizes, to check that the benchmark runs.
QUICK = ["--table-gib", "0.00390625", "--batch-size", "2000", "--sweep-gb", "--reps", "3", "--slow-reps", "2"]
#: Tables hold at least this many batches of rows (see the module docstring).
MIN_BATCHES = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--row-bytes", type=flags.row_bytes, nargs="+", default=DEFAULT_ROW_BYTES,
                   help="row sizes in bytes, multiples of 4")
    flags.add_batch_size(p, 500_000, "distinct random ids")
    p.add_argument("--table-gib", type=flags.positive_real, default=2.0,
                   help=f"size of the table at every row size, GiB; a table holds at least {MIN_BATCHES} batches "
                        "of rows, so big rows and big batches make it larger (the output says so)")
    p.add_argument("--sweep-gb", type=flags.positive_real, nargs="*", default=[2, 8, 40],
                   help="table sizes of the size sweep, GB (none: skip it)")
    # the sweep's one big table, as commands recorded before the sweep wrote it (0: none)
    p.add_argument("--big-table-gb", dest="sweep_gb", type=_one_table, help=argparse.SUPPRESS)
    p.add_argument("--sweep-row-bytes", type=flags.row_bytes, nargs="+", default=[128, 512],
                   help="row sizes of the size sweep")
    p.add_argument("--variants", nargs="+", default=None, choices=ALL_VARIANTS,
                   help="run only these variants (default: all; the sweep runs the host ones among them)")
    p.add_argument("--split-threads", type=flags.positive, default=None,
                   help="torch threads while timing the split gather (default: torch's own setting)")
    p.add_argument("--reps", type=flags.positive, default=20, help="timed repeats of GPU variants")
    p.add_argument("--slow-reps", type=flags.positive, default=5, help="timed repeats of variants that involve the CPU")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/gather", help="folder for gather.json, .md and .png")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def _one_table(text: str) -> list[float]:
    gb = flags.non_negative_real(text)
    return [gb] if gb > 0 else []


def hashed_buffer(nbytes: int) -> torch.Tensor:
    """A CPU float32 tensor of ``nbytes // 8 * 2`` elements whose every 8-byte word differs (a cheap hash of its
    position): rows viewed from it are never all zeros, so a gather that returns wrong rows cannot pass its check.

    The benchmarks' and the probes' one source of table data (``benchmarks/probes/``); ``nbytes`` < 8 gives an
    empty tensor.
    """
    buf = torch.empty(nbytes // 8 * 2, dtype=torch.float32)
    words = buf.view(torch.int64)
    torch.arange(words.numel(), out=words)
    words.mul_(-7046029254386353131)  # golden-ratio hash: every word differs
    return buf


def distinct_ids(num_rows: int, batch: int, sets: int, device, seed: int = 0) -> list[torch.Tensor]:
    """``sets`` batches of ``batch`` distinct random ids in ``[0, num_rows)`` (int64, on ``device``), the same for
    the same ``seed`` (``--seed``). With ``batch > num_rows`` each set holds all ``num_rows`` ids, shuffled."""
    g = torch.Generator(device).manual_seed(1234 + seed)  # 1234: the ids of the results recorded before --seed
    return [torch.randperm(num_rows, generator=g, device=device)[:batch] for _ in range(sets)]


def table_bytes(row_bytes: int, table_gib: float, batch: int) -> int:
    """Bytes of the table for one row size: ``table_gib`` GiB in whole rows, and at least MIN_BATCHES batches of
    ``batch`` rows."""
    return max(int(table_gib * 2**30) // row_bytes, MIN_BATCHES * batch) * row_bytes


def _check(got: torch.Tensor, table: torch.Tensor, idx: torch.Tensor, name: str) -> None:
    if not torch.equal(got.cpu().view(torch.int32), table[idx.cpu()].view(torch.int32)):
        raise AssertionError(f"{name} returned wrong rows: the benchmark refuses to time a wrong result")


def run_size(buf: torch.Tensor, buf_gpu: torch.Tensor | None, row_bytes: int, nbytes: int, args, device,
             variants) -> dict:
    """Time every variant on the first ``nbytes`` of ``buf`` (float32, host) viewed as rows of ``row_bytes``."""
    cols = row_bytes // 4
    x = buf[: nbytes // row_bytes * cols].view(-1, cols)
    n = x.shape[0]
    ids_dev = distinct_ids(n, args.batch_size, 4, device, args.seed)
    ids_cpu = [i.cpu() for i in ids_dev]
    useful = args.batch_size * row_bytes
    cuda = device.type == "cuda"
    result = {"row_bytes": row_bytes, "table_bytes": n * row_bytes, "num_rows": n, "batch": args.batch_size,
              "ids": "distinct, uniform", "variants": {}}

    def timed(name, fn, wall, reps):
        fn(0)  # compile / first touch outside the timing
        med, times = median_seconds(fn, reps=reps, warmup=2, wall=wall, device=device)
        result["variants"][name] = {"seconds": med, "gbps": useful / med / 1e9, "times": times}
        log.info("%6d B %-17s %8.2f GB/s", row_bytes, name, useful / med / 1e9)

    host_tables: dict[str, dict[str, Any]] = {
        "hmg_host": {}, "hmg_host_sync": {}, "hmg_owned": {"copy": True, "backing": "hugepage"},
        "hmg_owned_cuda": {"copy": True, "backing": "cuda"}, "hmg_bf16": {"host_dtype": torch.bfloat16}}
    for name, kwargs in host_tables.items():
        if name not in variants or (not cuda and name in ("hmg_owned_cuda", "hmg_host_sync")):
            continue
        if name == "hmg_bf16":  # the hashed bits hold values past bfloat16's range, which it refuses: clear each
            x.view(torch.int32).bitwise_and_(~(1 << 30))  # float's top exponent bit (|x| < 2; the rest as it was)
        start = time.perf_counter()
        table = hmgstore.HybridTensor(x, device, progress=not args.no_progress, **kwargs)
        setup = time.perf_counter() - start
        want = x.bfloat16().float() if name == "hmg_bf16" else x
        _check(table[ids_dev[0]], want, ids_dev[0], name)
        check = "sync" if name == "hmg_host_sync" else "deferred"
        timed(name, lambda i: table.gather(ids_dev[i % 4], check=check), False, args.reps)
        result["variants"][name]["setup_seconds"] = setup
        table.close()
        del table
        gc.collect()
    if "hmg_host_out" in variants and not cuda:  # into one reused buffer, as cpu_pinned's index_select
        table = hmgstore.HybridTensor(x, device, progress=not args.no_progress)
        reused = torch.empty((args.batch_size, cols), dtype=x.dtype)
        _check(table.gather(ids_cpu[0], out=reused), x, ids_cpu[0], "hmg_host_out")
        timed("hmg_host_out", lambda i: table.gather(ids_cpu[i % 4], out=reused), True, args.slow_reps)
        table.close()
        del table
    if "hmg_split" in variants and cuda:
        _split_variants(x, ids_cpu, device, args, timed, result)
    if "hmg_gpu" in variants and cuda:
        table = hmgstore.HybridTensor(x, device, gpu_rows=torch.arange(n), progress=not args.no_progress)
        _check(table[ids_dev[0]], x, ids_dev[0], "hmg_gpu")
        timed("hmg_gpu", lambda i: table[ids_dev[i % 4]], False, args.reps)
        table.close()
        del table
        torch.cuda.empty_cache()
    if "gpu_index_select" in variants and buf_gpu is not None:
        xg = buf_gpu[: n * cols].view(n, cols)
        timed("gpu_index_select", lambda i: xg.index_select(0, ids_dev[i % 4]), False, args.reps)
    if "pageable" in variants and cuda:
        timed("pageable", lambda i: x[ids_cpu[i % 4]].to(device), True, args.slow_reps)
    if "cpu_pinned" in variants:
        staging = torch.empty((args.batch_size, cols), dtype=x.dtype, pin_memory=cuda)

        def cpu_pinned(i):
            torch.index_select(x, 0, ids_cpu[i % 4], out=staging)
            return staging.to(device, non_blocking=True) if cuda else staging

        timed("cpu_pinned", cpu_pinned, True, args.slow_reps)
    if "cpu_index_select" in variants and not cuda:  # a new tensor per batch, as x[idx] and table[idx] return
        timed("cpu_index_select", lambda i: torch.index_select(x, 0, ids_cpu[i % 4]), True, args.slow_reps)
    gc.collect()
    return result


def _split_variants(x, ids_cpu, device, args, timed, result) -> None:
    """``hmg_split`` with its model's share, and each path alone (``split_kernel``, ``split_cpu``), one table."""
    threads = torch.get_num_threads()
    torch.set_num_threads(args.split_threads or threads)
    try:
        start = time.perf_counter()
        table = hmgstore.HybridTensor(x, device, progress=not args.no_progress, copy=True, split="auto")
        setup = time.perf_counter() - start
        for name, setting in (("hmg_split", "auto"), ("split_kernel", None), ("split_cpu", 1.0)):
            table.set_split(setting)
            _check(table[ids_cpu[0]], x, ids_cpu[0], name)  # "auto": the first batch measures the model
            timed(name, lambda i: table[ids_cpu[i % 4]], True, args.slow_reps)
            if setting == "auto":  # the measured share, and the batches a busy machine left to the kernel
                setting = table.split_setting  # None where the table reads no host rows
                share = setting.shares.get(batch_class(len(ids_cpu[0])), 0.0) if setting is not None else 0.0
                skipped = table.split_skipped
        result["variants"]["hmg_split"].update(setup_seconds=setup, share=share, threads=torch.get_num_threads(),
                                               split_skipped=skipped)
        table.close()
        del table
    finally:
        torch.set_num_threads(threads)
    gc.collect()


def run(args) -> dict:
    """Time every variant at every row size (then the sweep, on a GPU); write and return the report."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    report = {
        **header("gather", device, quick=getattr(args, "quick", False)),
        "cpu_threads": torch.get_num_threads(), "table_gib": args.table_gib, "batch": args.batch_size,
        "min_batches": MIN_BATCHES,
        "sizes": [], "sweep": [], "transparent_huge_pages": owned.transparent_huge_pages(),
    }
    if device.type == "cuda":
        report["cupy"] = cuda.cupy().__version__
        report["h2d_limit_gbps"] = h2d_limit_gbps(device)
    chosen = args.variants or ALL_VARIANTS
    if any(rb % 4 for rb in (*args.row_bytes, *args.sweep_row_bytes)):
        raise SystemExit(f"row sizes must be multiples of 4, got {args.row_bytes} and {args.sweep_row_bytes}")
    sizes = {rb: table_bytes(rb, args.table_gib, args.batch_size) for rb in args.row_bytes}
    buf = hashed_buffer(max(sizes.values()))
    buf_gpu = buf.to(device) if device.type == "cuda" else None
    for row_bytes, nbytes in sizes.items():
        report["sizes"].append(run_size(buf, buf_gpu, row_bytes, nbytes, args, device, chosen))
    del buf, buf_gpu
    torch.cuda.empty_cache() if device.type == "cuda" else None
    gc.collect()
    for gb in (args.sweep_gb if device.type == "cuda" else []):
        big = hashed_buffer(int(gb * 1e9))
        for row_bytes in args.sweep_row_bytes:
            nbytes = big.numel() * 4 // row_bytes * row_bytes
            report["sweep"].append(run_size(big, None, row_bytes, nbytes, args, device,
                                          [v for v in SWEEP_VARIANTS if v in chosen]))
            write_report(report, args.out)  # a long sweep leaves its figures behind as it goes
        del big
        gc.collect()
    if device.type == "cuda":
        report["h2d_limit_gbps_end"] = h2d_limit_gbps(device)
    write_report(report, args.out)
    return report
