"""``python -m hmgstore.bench peer``: gathers of rows that other GPUs hold, every GPU at once.

One process drives k >= 2 GPUs of one machine. For each row size, a table
of k x ``--shard-bytes`` is spread over the GPUs by
:class:`hmgstore.ShardedTensor` (every row resident, nothing replicated,
hot order = row ids), and every GPU gathers batches of distinct random ids
into a preallocated buffer while all the others do the same. Variants, each
checked bit for bit against ``x[ids]`` (outputs poisoned with 0xFF first)
before it is timed:

- ``hmg_remote``: every id lives in another GPU's shard (drawn from the rows
  of the other shards, ``placement.rows_of("shard<s>")``).
- ``hmg_alone``: GPU 0's remote batches while the other GPUs idle.
- ``hmg_mixed``: ids uniform over the whole table (1/k of them local).
- ``index_select_copy``: without hmgstore: for each requesting GPU, every
  owner runs ``torch.index_select`` on its shard for the requested rows and
  copies the result to the requester. The requester receives the rows
  grouped by owner, not in batch order: this spares the baseline the final
  scatter a real loader would need, so it flatters the baseline.
- ``hmg_remote_gpu_ids``: ``hmg_remote`` with its ids already on each GPU
  (int32), checked by the kernel itself (``check="deferred"``): no copy of
  the ids and no read-back, what a GPU sampler feeding the gather gives it.
- ``ids_copy``: only the copy of hmgstore's ids from pinned host memory
  (see below), to show its share of the hmgstore figures.
- ``peer_memcpy``, at the start and at the end of the run: GPU i copies
  ``--copy-bytes`` from GPU i+1 (mod k), all GPUs at once (torch
  ``copy_`` between devices: a peer ``cudaMemcpyAsync``): the per-GPU
  NVLink limit the gathers are held to.

Timing (:func:`.timing.concurrent_seconds`): a round queues a few batches on
every GPU behind a start gate (:mod:`.gate`), opens it, and waits for all
GPUs; each GPU's time comes from CUDA events on its own stream. Figures are
the median of ``--reps`` rounds after warm-up, as GB/s of rows delivered into
each GPU.

hmgstore gets its ids as pinned host int32 in ``hmg_remote``/``hmg_mixed``/
``hmg_alone``: host ids are checked on the host and copied asynchronously, so
those times include that copy (4 B per row over PCIe); ``hmg_remote_gpu_ids``
leaves it out (the kernel checks GPU ids without a read-back, which would
block forever behind a closed gate). The baseline's ids wait on the owners
beforehand.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import logging
import shlex
import sys
from dataclasses import dataclass

import torch

import hmgstore

from .. import cuda
from ..cli import flags
from ..cuda import peer as cuda_peer
from ..rows.placement import Placement, parse_bytes
from .gather import hashed_buffer
from .peer_report import add_ratios, plot, table_text
from .peer_work import WARMUP, Runner, copy_work, gather_work, ids_copy_work, index_select_copy_work
from .report import write_report

log = logging.getLogger(__name__)

DEFAULT_ROW_BYTES = [128, 256, 512, 1024, 2048, 4096]
#: Bytes each GPU receives per timed round, at least (a round repeats the batch): at ~300 GB/s a
#: round lasts >= 1.7 ms, long against the skew between GPUs' starts; on 4 H200s (2026-11-21) the
#: wall time of a gated round exceeded its slowest GPU's event time by ~50 us, opening and waiting included.
ROUND_BYTES = 512 << 20
#: Batches per GPU per round, at most: bounds the commands queued behind a closed gate (index_select_copy
#: on 8 GPUs queues ~6 per owner per batch: 8 x 7 x 6 = 336 on each GPU, well inside the launch queue).
MAX_PER_ROUND = 8
#: Id sets each GPU rotates through, so that consecutive batches read different rows.
ID_SETS = 4
#: --quick: tiny sizes (see __main__.parse_args).
QUICK = ["--shard-bytes", "64MiB", "--batch-size", "20000", "--copy-bytes", "64MiB", "--reps", "3"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--row-bytes", type=flags.row_bytes, nargs="+", default=DEFAULT_ROW_BYTES,
                   help="row sizes in bytes (multiples of 4)")
    p.add_argument("--shard-bytes", type=flags.size(at_least=1), default="2GiB",
                   help="table bytes per GPU (shard size), e.g. 2GiB")
    flags.add_batch_size(p, 500_000, "distinct random ids (fewer for big rows, see --max-batch-mib)")
    p.add_argument("--max-batch-mib", type=flags.positive, default=256, help="largest batch, in MiB of rows")
    p.add_argument("--copy-bytes", type=flags.size(at_least=1), default="1GiB",
                   help="buffer size of the peer memcpy baseline")
    p.add_argument("--reps", type=flags.positive, default=20, help="timed rounds per variant")
    p.add_argument("--gpus", type=flags.natural, nargs="+", default=None,
                   help="GPU indices to use, e.g. 0 1 (default: all)")
    flags.add_seed(p)
    flags.add_no_progress(p)
    p.add_argument("--out", default="bench-out/peer", help="folder for peer.json, peer.md and peer.png")
    p.add_argument("--no-gate", action="store_true",
                   help="queue each GPU's work in turn instead of holding all behind a start gate")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks that the benchmark runs")


def check(args) -> str | None:
    """Why the options cannot run together (None: they can), said before any GPU is touched: each row size
    needs shards of at least 4 rows (:func:`sizing`)."""
    for row_bytes in args.row_bytes:
        try:
            sizing(row_bytes, 2, parse_bytes(args.shard_bytes), args.batch_size, args.max_batch_mib << 20)
        except ValueError as e:
            return str(e)
    return None


def select_gpus(requested, available: int) -> list[int]:
    """GPU indices to use: ``requested`` (None: all ``available``).

    Raises SystemExit with the reason when there is no GPU, fewer than two
    are left, one is named twice or does not exist, or more than 8 are named
    (a ShardedTensor spans at most 8).
    """
    need = "python -m hmgstore.bench peer needs 2 or more CUDA GPUs in one machine"
    if available == 0:
        raise SystemExit(f"{need}; torch sees no GPU (torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    gpus = list(range(available)) if requested is None else list(requested)
    missing = [g for g in gpus if not 0 <= g < available]
    if missing:
        raise SystemExit(f"--gpus {missing}: no such GPU; torch sees {available} (0..{available - 1})")
    if len(set(gpus)) != len(gpus):
        raise SystemExit(f"--gpus names a GPU more than once: {gpus}")
    if len(gpus) < 2:
        why = "torch sees only 1 GPU" if available == 1 else f"--gpus names only {gpus}"
        raise SystemExit(f"{need}; {why}")
    if len(gpus) > 8:
        raise SystemExit(f"a table is sharded over at most 8 GPUs; pass --gpus with 2 to 8 of the {available}")
    return gpus


@dataclass(frozen=True)
class Sizing:
    """Table and batch sizes for one row size.

    ``rows_per_shard`` rows on each of ``num_gpus`` GPUs; batches of
    ``batch`` ids; ``per_round`` batches per GPU per timed round.
    """

    row_bytes: int
    num_gpus: int
    rows_per_shard: int
    batch: int
    per_round: int

    @property
    def num_rows(self) -> int:
        return self.num_gpus * self.rows_per_shard

    @property
    def remote_rows(self) -> int:
        """Rows any one GPU can read only from its peers."""
        return (self.num_gpus - 1) * self.rows_per_shard


def sizing(row_bytes: int, num_gpus: int, shard_bytes: int, batch: int, max_batch_bytes: int,
           round_bytes: int = ROUND_BYTES) -> Sizing:
    """Sizes for one row size: shards of ``shard_bytes`` and batches of at most ``batch`` ids,
    ``max_batch_bytes`` of rows and a quarter of the remote rows (so that ids stay sparse).

    Raises ValueError for row sizes that are not positive multiples of 4 and
    shards of fewer than 4 rows.
    """
    if row_bytes <= 0 or row_bytes % 4:
        raise ValueError(f"row sizes must be positive multiples of 4 bytes, got {row_bytes}")
    rows_per_shard = shard_bytes // row_bytes
    if rows_per_shard < 4:
        raise ValueError(f"a shard of {shard_bytes} B holds fewer than 4 rows of {row_bytes} B; raise --shard-bytes")
    remote = (num_gpus - 1) * rows_per_shard
    b = max(1, min(batch, max_batch_bytes // row_bytes, remote // 4))
    per_round = max(1, min(MAX_PER_ROUND, -(-round_bytes // (b * row_bytes))))
    return Sizing(row_bytes, num_gpus, rows_per_shard, b, per_round)


# ---- ids -------------------------------------------------------------------------
@dataclass
class RemoteBatch:
    """Distinct ids held by GPUs other than the requester, in random order.

    ``ids``: int64 [B] row ids; ``owner``: int64 [B] position of the GPU whose
    shard holds each; ``slot``: int64 [B] its row within that shard. All CPU.
    """

    ids: torch.Tensor
    owner: torch.Tensor
    slot: torch.Tensor

    def grouped(self) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor, int, int]]]:
        """The same rows grouped by owner (ascending; batch order kept within a group):
        ``(ids in that order, [(owner, slots, start, end)])``, one segment per owner."""
        order = torch.argsort(self.owner, stable=True)
        slot = self.slot[order]
        segments, start = [], 0
        for owner, count in enumerate(torch.bincount(self.owner).tolist()):
            if count:
                segments.append((owner, slot[start:start + count], start, start + count))
                start += count
        return self.ids[order], segments


def remote_batch(placement: Placement, gpu: int, batch: int, generator: torch.Generator, device="cpu") -> RemoteBatch:
    """``batch`` distinct random rows that live in the shards of every GPU but ``gpu``.

    ``placement``: a sharded placement (:func:`hmgstore.rows.placement.sharded`);
    ``gpu``: position of the requesting GPU (its shard is ``shard<gpu>``).
    The random permutation runs on ``device`` with ``generator`` (a GPU makes
    short work of 10^8 candidates); the result is on the CPU. Raises
    ValueError when the other shards hold fewer than ``batch`` rows.
    """
    others = [s for s in range(placement.num_shards) if s != gpu]
    rows = [placement.rows_of(f"shard{s}") for s in others]
    sizes = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    ends = sizes.cumsum(0)
    total = int(ends[-1])
    if batch > total:
        raise ValueError(f"the other shards hold {total} rows, fewer than a batch of {batch}")
    pos = torch.randperm(total, generator=generator, device=device)[:batch].cpu()
    which = torch.searchsorted(ends, pos, right=True)  # index into others
    slot = pos - (ends - sizes)[which]
    ids = torch.empty(batch, dtype=torch.int64)
    for w, r in enumerate(rows):
        mask = which == w
        ids[mask] = r[slot[mask]]
    return RemoteBatch(ids, torch.tensor(others, dtype=torch.int64)[which], slot)


def mixed_ids(num_rows: int, batch: int, generator: torch.Generator, device="cpu") -> torch.Tensor:
    """``batch`` distinct ids uniform over the whole table (int64, CPU)."""
    return torch.randperm(num_rows, generator=generator, device=device)[:batch].cpu()


def host_ids(ids: torch.Tensor, num_rows: int, pin: bool) -> torch.Tensor:
    """Ids as a gather takes them without waiting for the GPU: int32 (int64 from 2^31 rows), host memory,
    pinned when ``pin`` (a GPU machine), so that the copy to the GPU is asynchronous."""
    ids = ids.to(torch.int32 if num_rows < 2**31 else torch.int64)
    return ids.pin_memory() if pin else ids


def _pattern(nbytes: int, seed: int, device) -> torch.Tensor:
    """``nbytes`` (a multiple of 8) of distinct non-zero words, different for every seed, as uint8."""
    n = nbytes // 8
    words = torch.arange(1, n + 1, dtype=torch.int64, device=device)
    words.add_(seed * n).mul_(-7046029254386353131)  # the golden-ratio hash of gather.hashed_buffer
    return words.view(torch.uint8)


def peer_memcpy(runner: Runner, nbytes: int) -> dict:
    """GPU g copies ``nbytes`` from GPU g+1 (mod k), every GPU at once; checked, then timed."""
    devices, k = runner.devices, len(runner.devices)
    nbytes -= nbytes % 8
    srcs = [_pattern(nbytes, j, d) for j, d in enumerate(devices)]
    dsts = [torch.empty(nbytes, dtype=torch.uint8, device=d) for d in devices]
    work = copy_work(dsts, [srcs[(g + 1) % k] for g in range(k)], runner.stream_for)
    runner.check(work, dsts, [_pattern(nbytes, (g + 1) % k, d) for g, d in enumerate(devices)], "peer_memcpy")
    result = runner.measure(work, 1, nbytes)
    log.info("peer memcpy %.0f MiB: %s GB/s per GPU", nbytes / 2**20, " ".join(f"{v:.1f}" for v in result["gbps"]))
    return result


def measure_variants(runner: Runner, x: torch.Tensor, placement: Placement, views, shards, sz: Sizing,
                     seed: int = 0) -> dict:
    """Check then time every gather variant for one row size.

    ``x``: the host table ``[N, row_bytes / 4]`` float32; ``placement``: its
    sharded placement over the runner's GPUs; ``views[g]``: the table as seen
    from GPU g (anything with ``gather(ids, out=, stream=)``); ``shards[j]``:
    shard j's rows (``x[placement.rows_of("shard<j>")]``) on GPU j, for the
    baseline.
    """
    devices, k = runner.devices, sz.num_gpus
    gens = [torch.Generator(d).manual_seed(seed + 7919 * g) for g, d in enumerate(devices)]
    remote = [[remote_batch(placement, g, sz.batch, gens[g], devices[g]) for _ in range(ID_SETS)] for g in range(k)]
    mixed = [[mixed_ids(sz.num_rows, sz.batch, gens[g], devices[g]) for _ in range(ID_SETS)] for g in range(k)]
    outs = [torch.empty((sz.batch, *x.shape[1:]), dtype=x.dtype, device=d) for d in devices]
    rows_bytes = sz.batch * sz.row_bytes * sz.per_round
    result = {}

    def variant(name, work, outs_, expected, nbytes=rows_bytes):
        runner.check(work, outs_, expected, name, items=ID_SETS)  # every id set a timed round will use
        result[name] = runner.measure(work, sz.per_round, nbytes)
        log.info("%6d B %-18s %s GB/s per GPU", sz.row_bytes, name, " ".join(f"{v:.1f}" for v in result[name]["gbps"]))

    remote_ids = [[host_ids(b.ids, sz.num_rows, runner.cuda) for b in sets] for sets in remote]
    work = gather_work(views, outs, remote_ids)
    variant("hmg_remote", work, outs, lambda i: [x[sets[i].ids] for sets in remote])
    variant("hmg_alone", work[:1], outs[:1], lambda i: [x[remote[0][i].ids]])
    gpu_ids = [[ids.to(devices[g]) for ids in sets] for g, sets in enumerate(remote_ids)]
    variant("hmg_remote_gpu_ids", gather_work(views, outs, gpu_ids), outs,
            lambda i: [x[sets[i].ids] for sets in remote])
    del gpu_ids
    mixed_host = [[host_ids(ids, sz.num_rows, runner.cuda) for ids in sets] for sets in mixed]
    variant("hmg_mixed", gather_work(views, outs, mixed_host), outs, lambda i: [x[sets[i]] for sets in mixed])
    scratch = [torch.empty(sz.batch, dtype=remote_ids[0][0].dtype, device=d) for d in devices]
    variant("ids_copy", ids_copy_work(scratch, remote_ids), scratch, lambda i: [sets[i] for sets in remote_ids],
            nbytes=sz.batch * scratch[0].element_size() * sz.per_round)
    del scratch
    grouped = [[b.grouped() for b in sets] for sets in remote]
    segments = [[[(j, slots.to(devices[j]), start, end) for j, slots, start, end in segs] for _, segs in sets]
                for sets in grouped]
    variant("index_select_copy", index_select_copy_work(shards, segments, outs, runner.stream_for), outs,
            lambda i: [x[sets[i][0]] for sets in grouped])
    return result


def run_size(runner: Runner, buf: torch.Tensor, sz: Sizing, seed: int = 0, progress: bool = False) -> dict:
    """Build the sharded table for one row size over the first bytes of ``buf`` (float32, host) and measure it;
    ``seed``: ``--seed``, ``progress``: a bar while the table is built."""
    cols = sz.row_bytes // 4
    x = buf[: sz.num_rows * cols].view(sz.num_rows, cols)
    size = {"row_bytes": sz.row_bytes, "rows_per_shard": sz.rows_per_shard, "num_rows": sz.num_rows,
            "table_bytes": sz.num_rows * sz.row_bytes, "batch": sz.batch, "batches_per_round": sz.per_round,
            "ids": "distinct, random"}
    with hmgstore.ShardedTensor(x, runner.devices, gpu_budget=sz.rows_per_shard * sz.row_bytes,
                                hot_order=torch.arange(sz.num_rows), replicate=0, progress=progress) as table:
        p = table.placement
        if p.has_host_tier:
            raise RuntimeError(f"the sharded table left rows on the host ({p}); every row must be on a GPU")
        views = [table.on(d) for d in runner.devices]
        # The baseline's shards: the same rows, gathered locally through the table (checked again below).
        shards = [views[j].gather(p.rows_of(f"shard{j}")) for j in range(sz.num_gpus)]
        size["variants"] = measure_variants(runner, x, p, views, shards, sz, seed=sz.row_bytes + seed)
        del shards
    return size


def run(args) -> dict:
    """Measure every variant at every row size on 2+ GPUs; write and return the report. Without them, exits
    saying why (a CPU has nothing to show here)."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = select_gpus(args.gpus, available)
    if any(rb <= 0 or rb % 4 for rb in args.row_bytes):
        raise SystemExit(f"--row-bytes must be positive multiples of 4, got {args.row_bytes}")

    devices = [torch.device("cuda", g) for g in gpus]
    for d in devices:
        cuda.check_device(d)
    shard_bytes, copy_bytes = parse_bytes(args.shard_bytes), parse_bytes(args.copy_bytes)
    sizes = [sizing(rb, len(gpus), shard_bytes, args.batch_size, args.max_batch_mib << 20) for rb in args.row_bytes]
    peer_access = [(i, j, cuda_peer.can_access_peer(i, j)) for i in gpus for j in gpus if i != j]
    for i, j, ok in peer_access:
        if ok:
            cuda_peer.enable_peer_access(i, j)
    runner = Runner(devices, args.reps, WARMUP, use_gate=not args.no_gate)
    report = {
        "benchmark": "peer",
        "command": "python -m hmgstore.bench " + shlex.join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "num_gpus": len(gpus), "gpus": gpus, "device_names": [torch.cuda.get_device_name(d) for d in devices],
        "torch": torch.__version__, "cuda": torch.version.cuda, "cupy": cuda.cupy().__version__,
        "driver": cuda.cupy().cuda.runtime.driverGetVersion(), "hmgstore": hmgstore.__version__,
        "peer_access": peer_access, "shard_bytes": shard_bytes, "warmup": WARMUP, "reps": args.reps,
        "peer_memcpy": {"bytes": copy_bytes}, "sizes": [], "smoke_test": bool(getattr(args, "quick", False)),
    }
    report["peer_memcpy"]["start"] = peer_memcpy(runner, copy_bytes)
    torch.cuda.empty_cache()
    buf = hashed_buffer(max(s.num_rows * s.row_bytes for s in sizes))
    for sz in sizes:
        report["sizes"].append(run_size(runner, buf, sz, args.seed, progress=not args.no_progress))
        gc.collect()
        torch.cuda.empty_cache()
    del buf
    report["peer_memcpy"]["end"] = peer_memcpy(runner, copy_bytes)
    report["start_mode"] = runner.start_mode
    write_report(report, args.out, ratios=add_ratios, text_of=table_text, plot_to=plot)
    return report
