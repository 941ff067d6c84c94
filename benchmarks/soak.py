"""Soak test: host memory, GPU memory, open files and /dev/shm stay flat over many epochs, and batches stay exact.

Runs the training of examples/pyg_graphsage.py, built by the example's own code (``build_loaders``,
``make_train_loader``, ``SAGE``): hmgstore.Pipeline over PyG's NeighborLoader with hmgstore's stores
(``from_data``) and ``HybridNeighborSampler``, for ``--epochs`` epochs of a synthetic graph
(``hmgstore.data.synthetic``); then the same loader in ``hmgstore.Producer``'s process for
``--producer-epochs`` epochs. On a GPU the table and the topology are partly in GPU memory:
``--gpu-fraction`` of x's bytes as ``gpu_budget`` (rows hottest first by in-degree, from_data's default
``hotness``) and ``--topology-fraction`` of the topology's as the sampler's ``gpu_budget`` (lists hottest
first by degree, its default ``hot_order``). On the CPU every row and list is read from host memory.

After each epoch (``gc.collect()`` and glibc's ``malloc_trim(0)`` first) it records: this process's host RSS
(VmRSS of /proc/self/status) and the producer process's where it runs; this process's heap in use (glibc's
``mallinfo2``: live blocks, mmapped ones included); open file descriptors (/proc/<pid>/fd) of both; the
/dev/shm files that these processes hold open or mapped, or whose names carry their pid, counted and summed
(files removed but still mapped count too); GPU memory allocated and reserved by torch
(``torch.cuda.memory_allocated`` / ``memory_reserved``) and used on the whole device (``mem_get_info``, which
sees CuPy's and the producer's memory too). Recorded, not judged: the trainer's RSS before the trim, and the
whole /dev/shm folder (other programs on the machine create and remove their own files there). Each epoch one
batch, drawn at random, is checked: its ``x`` and ``y`` must equal the source's ``x[n_id]`` and ``y[n_id]``
bit for bit.

glibc's allocator: with its defaults, a batch's tensors (tens of MB) come from heaps that keep them once
freed (the mmap threshold rises to the biggest block freed), and RSS after an epoch swings with what happened
to be freed last: measured on the CPU (20k nodes, pipeline), 402-458 MiB from epoch to epoch after the trim,
while the heap in use stayed at 149 MiB to the MiB. So both processes run with a fixed mmap threshold,
``--malloc-mmap-threshold`` (``mallopt`` here, ``MALLOC_MMAP_THRESHOLD_`` for the producer): bigger blocks
are mapped and unmapped on their own, and RSS counts what is held (the same run at 1 MiB: 402-403 MiB). The
default, 128 KiB, is glibc's own starting threshold, kept from moving: at 1 MiB the 50k-node CPU soak still
rose 1-3% at four of its first nine epochs (heap in use flat), at 128 KiB it did not
(benchmarks/results/soak-cpu.md). The producer trims its heap when a pass starts and ends
(:class:`Trimmed`). 0 keeps glibc's defaults.

Pass: every judged series of each phase stays within ``--tolerance`` (1%) of its value after the phase's first
epoch (counts, below 100, must not change at all), and every check is exact. The report (JSON and a markdown
table with the device, date and exact command) goes to ``--out`` (PREFIX.json, PREFIX.md); the table is
printed. Exit status 1 when a series grew or a check failed.

Usage:
    python benchmarks/soak.py                      # a GPU: 2M nodes, 30 pipeline + 10 producer epochs
    python benchmarks/soak.py --out bench-out/soak  # the same, the report written too
    python benchmarks/soak.py --out benchmarks/results/soak-cpu   # a CPU box
    python benchmarks/soak.py --epochs 3 --producer-epochs 2 --num-nodes 2000   # a smoke test
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import importlib
import json
import os
import platform
import random
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
#: Judged series: (key, what it is). Each must stay flat after the first epoch of its phase.
JUDGED = [("rss_bytes", "host RSS, trainer"), ("heap_in_use_bytes", "heap in use, trainer"),
          ("producer_rss_bytes", "host RSS, producer"),
          ("fds", "open fds, trainer"), ("producer_fds", "open fds, producer"),
          ("shm_files", "/dev/shm files held"), ("shm_bytes", "/dev/shm bytes held"),
          ("gpu_allocated", "GPU allocated (torch)"), ("gpu_reserved", "GPU reserved (torch)"),
          ("gpu_used", "GPU used (device)")]
#: Caches that fill over the first epochs: torch's caching allocator grows its pool while batch shapes vary (the
#: H100 soak: 5.8 GB reserved after epoch 1, 6.7 GB from epoch 2, 7.4 GB from epoch 8 to 30). Judged from the end
#: of their phase's first third instead of its first epoch; a leak still shows (before the one-side-stream fix
#: the same run reserved 1 GB more every epoch, to 38 GB).
SETTLING = {"gpu_reserved", "gpu_used"}
#: Recorded, not judged: the folder is shared with every other program on the machine.
CONTEXT = [("rss_untrimmed_bytes", "host RSS, trainer, before malloc_trim"), ("shm_dir_files", "/dev/shm files, all"),
           ("shm_dir_bytes", "/dev/shm bytes, all")]


def example():
    """examples/pyg_graphsage.py as the module ``pyg_graphsage`` (importable by name, so that the producer
    process, which gets this process's sys.path, can unpickle its make_train_loader)."""
    folder = str(ROOT / "examples")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("pyg_graphsage")


def parse_args(argv=None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-nodes", type=int, default=2_000_000 if cuda else 50_000,
                   help="synthetic graph's nodes (default: 2M with a GPU, 50k without)")
    p.add_argument("--feat-dim", type=int, default=128, help="feature width (default: 128)")
    p.add_argument("--epochs", type=int, default=30, help="epochs through hmgstore.Pipeline (default: 30)")
    p.add_argument("--producer-epochs", type=int, default=10, help="epochs through hmgstore.Producer (default: 10)")
    p.add_argument("--max-batches", type=int, default=200 if cuda else 4,
                   help="batches per epoch at most (default: 200 with a GPU, 4 without)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanout", default="15,10,5")
    p.add_argument("--gpu-fraction", type=float, default=0.25, help="share of x's bytes in GPU memory (GPU only)")
    p.add_argument("--topology-fraction", type=float, default=0.25,
                   help="share of the topology's bytes in GPU memory (GPU only)")
    p.add_argument("--tolerance", type=float, default=0.01, help="allowed drift after the first epoch (0.01: 1%%)")
    p.add_argument("--malloc-mmap-threshold", type=int, default=128 << 10,
                   help="glibc's mmap threshold in both processes, bytes, fixed (default: 128 KiB; 0: glibc's "
                        "own, which moves; see the docstring)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    return p.parse_args(argv)


# ---- what is measured ------------------------------------------------------------------------------
def rss_bytes(pid="self") -> int | None:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    return None


def open_fds(pid="self") -> int | None:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return None


def shm_held(pids: list[int]) -> tuple[int, int]:
    """``(files, bytes)`` of /dev/shm that ``pids`` hold open or mapped (removed ones too) or whose names carry
    one of their pids (the CUDA driver's ``cuda.shm.<dev>.<pid hex>.<n>``, torch's ``torch_<pid>_...``)."""
    sizes: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                        st = os.stat(f"/proc/{pid}/fd/{fd}")
                        sizes[st.st_ino] = max(sizes.get(st.st_ino, 0), st.st_size)
        mapped: dict[int, int] = {}
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                    start, end = (int(a, 16) for a in fields[0].split("-"))
                    mapped[int(fields[4])] = mapped.get(int(fields[4]), 0) + end - start
        for ino, size in mapped.items():
            sizes[ino] = max(sizes.get(ino, 0), size)
    named = re.compile("|".join([rf"\.{pid:x}\.\d+$|_{pid}_" for pid in pids]))
    with contextlib.suppress(OSError):
        for entry in os.scandir("/dev/shm"):
            with contextlib.suppress(OSError):
                if named.search(entry.name):
                    st = entry.stat()
                    sizes[st.st_ino] = max(sizes.get(st.st_ino, 0), st.st_size)
    return len(sizes), sum(sizes.values())


def shm_dir() -> tuple[int, int]:
    files = size = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/dev/shm"):
            with contextlib.suppress(OSError):
                size += entry.stat().st_blocks * 512
                files += 1
    return files, size


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL("libc.so.6")  # once: each CDLL object made is kept by ctypes' caches (measured here)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def heap_in_use() -> int | None:
    """Bytes of live heap blocks of this process, mmapped ones included (glibc 2.33+'s mallinfo2)."""
    with contextlib.suppress(OSError, AttributeError):
        mallinfo2 = _libc().mallinfo2
        mallinfo2.restype = _MallInfo2
        info = mallinfo2()
        return info.uordblks + info.hblkhd
    return None


def fix_mmap_threshold(nbytes: int) -> None:
    """Blocks above ``nbytes`` mapped on their own, here (mallopt) and in processes started later (glibc reads
    MALLOC_MMAP_THRESHOLD_ at start); nothing for 0."""
    if nbytes:
        with contextlib.suppress(OSError, AttributeError):
            _libc().mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(nbytes)


def malloc_trim() -> None:
    """Give glibc's free heap memory back to the OS (every arena), so that RSS counts what is held, not what
    the allocator keeps for later; nothing where the C library is not glibc."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


def measure(device: torch.device, producer_pid: int | None = None) -> dict:
    """The figures of this moment (None where there is nothing to measure)."""
    gc.collect()
    untrimmed = rss_bytes()
    malloc_trim()
    pids = [os.getpid()] + ([producer_pid] if producer_pid else [])
    files, nbytes = shm_held(pids)
    dir_files, dir_bytes = shm_dir()
    row = {"rss_bytes": rss_bytes(), "rss_untrimmed_bytes": untrimmed, "heap_in_use_bytes": heap_in_use(),
           "producer_rss_bytes": rss_bytes(producer_pid) if producer_pid else None,
           "fds": open_fds(), "producer_fds": open_fds(producer_pid) if producer_pid else None,
           "shm_files": files, "shm_bytes": nbytes, "shm_dir_files": dir_files, "shm_dir_bytes": dir_bytes,
           "gpu_allocated": None, "gpu_reserved": None, "gpu_used": None}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        row.update(gpu_allocated=torch.cuda.memory_allocated(device),
                   gpu_reserved=torch.cuda.memory_reserved(device), gpu_used=total - free)
    return row


def exact(batch, graph) -> bool:
    """``batch.x`` and ``batch.y`` equal the source's rows ``n_id``, bit for bit."""
    n_id = batch.n_id.cpu()
    return (batch.x.dtype == graph.x.dtype and batch.y.dtype == graph.y.dtype
            and torch.equal(batch.x.cpu(), graph.x[n_id]) and torch.equal(batch.y.cpu(), graph.y[n_id]))


def drift(values: list, tolerance: float, settle: int = 1) -> dict | None:
    """How far the values after epoch ``settle`` strayed from the value after it: ``max |v - ref| / ref``; None
    where the series was not measured. Counts below 100 (fds, files) must not change at all."""
    if not values or values[0] is None:
        return None
    settle = min(max(1, settle), len(values))
    ref, later = values[settle - 1], values[settle:]
    worst = max((abs(v - ref) for v in later), default=0)
    relative = worst / ref if ref else (0.0 if worst == 0 else None)
    exact_count = ref < 100 and isinstance(ref, int)
    flat = worst == 0 if exact_count else relative is not None and relative <= tolerance
    if settle > 1:  # a settling cache must also stop rising: no new high in the last third (a slow leak shows)
        last = 2 * len(values) // 3
        flat = flat and max(values[last:], default=ref) <= max(values[settle - 1:last], default=ref)
    return {"after_epoch_1": values[0], "judged_from_epoch": settle, "reference": ref,
            "min": min(later or values), "max": max(later or values), "max_drift": relative, "flat": flat}


# ---- the run ---------------------------------------------------------------------------------------
class Trimmed:
    """The example's training loader in the producer process, its heap trimmed (:func:`malloc_trim`) when a pass
    starts and when it ends or is stopped (before the producer tells the trainer the pass is over), so that the
    producer's RSS, read after each epoch, counts what it holds."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name):  # the loader's data, for Pipeline's view of its tables
        return getattr(self.__dict__["loader"], name)

    def __iter__(self):
        gc.collect()
        malloc_trim()
        try:
            yield from self.loader
        finally:
            gc.collect()
            malloc_trim()


def make_trimmed_loader(ex_args, device) -> Trimmed:
    """Built in the producer process: the example's own ``make_train_loader``, trimmed."""
    return Trimmed(example().make_train_loader(ex_args, device))


def example_args(args, device, graph_nbytes: tuple[int, int]):
    """The example's flags for this soak; on a GPU, its table and topology budgets as byte counts."""
    ex = example()
    ex_args = ex.parse_args(["--dataset", "synthetic", "--num-nodes", str(args.num_nodes), "--feat-dim",
                             str(args.feat_dim), "--features", "hmgstore", "--sampler", "hmgstore", "--device",
                             str(device), "--batch-size", str(args.batch_size), "--fanout", args.fanout,
                             "--seed", str(args.seed), "--no-progress", "--no-inference"])
    if device.type == "cuda":
        ex_args.gpu_budget = int(args.gpu_fraction * graph_nbytes[0])
        ex_args.topology_budget = int(args.topology_fraction * graph_nbytes[1])
    return ex_args


def run_epoch(phase: str, epoch: int, batches, model, optimizer, graph, args, device, ex, rng,
              producer_pid=None) -> dict:
    """One epoch of the example's training step over ``batches``; one batch, drawn at random, checked."""
    model.train()
    total = min(args.max_batches, len(batches))
    check_at = rng.randrange(total)
    start, done, loss, checked = time.perf_counter(), 0, None, False
    it = iter(batches)
    try:
        for batch in it:
            if done == check_at:
                checked = exact(batch, graph)
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, *ex.sampled_counts(batch))[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
            done += 1
            del batch, out
            if done == total:
                break
    finally:
        if hasattr(it, "close"):  # stops the pipeline's thread, or the producer's pass, before anything is measured
            it.close()
    row = {"phase": phase, "epoch": epoch, "seconds": round(time.perf_counter() - start, 3), "batches": done,
           "loss": None if loss is None else round(loss.item(), 4), "exact": checked}
    row.update(measure(device, producer_pid))
    return row


def main(argv=None) -> dict:
    args = parse_args(argv)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    fix_mmap_threshold(args.malloc_mmap_threshold)
    try:
        return soak(args, argv)
    finally:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        if saved is not None:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved


def soak(args, argv) -> dict:
    """The soak of :func:`main`, its report."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    import hmgstore
    from hmgstore import data as datasets

    ex = example()
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # the example's default
    start = time.perf_counter()
    graph = datasets.synthetic(num_nodes=args.num_nodes, feat_dim=args.feat_dim, seed=args.seed)
    topology_bytes = (graph.num_nodes + 1) * 8 + graph.edge_index.shape[1] * 8  # int64 colptr and rows
    ex_args = example_args(args, device, (graph.x.nelement() * graph.x.element_size(), topology_bytes))
    train_loader = ex.build_loaders(ex_args, device, graph, None)[0]
    model = ex.SAGE(graph.x.shape[1], ex_args.hidden, graph.num_classes, len(ex_args.fanout)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=ex_args.lr)
    rng = random.Random(args.seed)
    rows = [dict(phase="start", epoch=0, seconds=round(time.perf_counter() - start, 3), batches=0, loss=None,
                 exact=None, **measure(device))]
    for epoch in range(1, args.epochs + 1):
        rows.append(run_epoch("pipeline", epoch, hmgstore.Pipeline(train_loader, depth=2), model, optimizer,
                              graph, args, device, ex, rng))
        print(f"pipeline epoch {epoch}: rss {rows[-1]['rss_bytes'] / 2**20:.1f} MiB, fds {rows[-1]['fds']}, "
              f"exact {rows[-1]['exact']}", file=sys.stderr, flush=True)
    if args.producer_epochs:
        with hmgstore.Producer(functools.partial(make_trimmed_loader, ex_args, device), seed=args.seed) as producer:
            for epoch in range(1, args.producer_epochs + 1):
                rows.append(run_epoch("producer", epoch, producer, model, optimizer, graph, args, device, ex, rng,
                                      producer.pid))
                print(f"producer epoch {epoch}: rss {rows[-1]['rss_bytes'] / 2**20:.1f} MiB + "
                      f"{rows[-1]['producer_rss_bytes'] / 2**20:.1f} MiB, fds {rows[-1]['fds']} + "
                      f"{rows[-1]['producer_fds']}, exact {rows[-1]['exact']}", file=sys.stderr, flush=True)
    report = summarise(args, argv, device, graph, ex_args, rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps(report, indent=2) + "\n")
        Path(f"{args.out}.md").write_text(markdown(report))
    print(markdown(report))
    return report


def summarise(args, argv, device, graph, ex_args, rows) -> dict:
    phases = {}
    for phase in ("pipeline", "producer"):
        of = [r for r in rows if r["phase"] == phase]
        if of:
            series = {key: drift([r[key] for r in of], args.tolerance, -(-len(of) // 3) if key in SETTLING else 1)
                      for key, _ in JUDGED + CONTEXT}
            phases[phase] = {"epochs": len(of), "series": {k: v for k, v in series.items() if v is not None}}
    judged = [s for p in phases.values() for k, s in p["series"].items() if k in dict(JUDGED)]
    checks = [r["exact"] for r in rows if r["phase"] != "start"]
    command = " ".join(["python", "benchmarks/soak.py", *(sys.argv[1:] if argv is None else argv)])
    return {
        "command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"),
        "torch": torch.__version__,
        "graph": {"num_nodes": graph.num_nodes, "num_edges": int(graph.edge_index.shape[1]),
                  "feat_dim": int(graph.x.shape[1])},
        "config": {"epochs": args.epochs, "producer_epochs": args.producer_epochs, "max_batches": args.max_batches,
                   "batch_size": args.batch_size, "fanout": args.fanout, "gpu_budget": ex_args.gpu_budget,
                   "topology_budget": ex_args.topology_budget, "tolerance": args.tolerance,
                   "malloc_mmap_threshold": args.malloc_mmap_threshold},
        "epochs": rows, "phases": phases,
        "exact_checks": {"passed": sum(bool(c) for c in checks), "of": len(checks)},
        "flat": all(s["flat"] for s in judged), "exact": all(checks), "passed": all(s["flat"] for s in judged)
        and all(checks),
    }


def _value(key: str, v) -> str:
    if v is None:
        return "-"
    if key.endswith("bytes") or key.startswith("gpu_"):
        return f"{v / 2**20:,.1f} MiB"
    return f"{v:,}"


def markdown(report: dict) -> str:
    lines = [f"# Soak: {report['device']}, {report['date']}", "",
             f"`{report['command']}`", "",
             f"Graph: {report['graph']['num_nodes']:,} nodes, {report['graph']['num_edges']:,} edges, "
             f"{report['graph']['feat_dim']}-d; config: {json.dumps(report['config'])}. Exact checks "
             f"(one batch's x and y against the source's rows n_id, each epoch): "
             f"{report['exact_checks']['passed']}/{report['exact_checks']['of']}. Flat within "
             f"{report['config']['tolerance']:.0%} after each phase's first epoch (GPU caches: after its first third)"
             f": {report['flat']}.", "",
             "| phase | series | after epoch 1 | judged from epoch | min | max | max drift | flat |",
             "|---|---|---|---:|---|---|---|---|"]
    names = dict(JUDGED + CONTEXT)
    for phase, p in report["phases"].items():
        for key, s in p["series"].items():
            judged = key in dict(JUDGED)
            drift_text = "-" if s["max_drift"] is None else f"{100 * s['max_drift']:.2f}%"
            lines.append(f"| {phase} ({p['epochs']} epochs) | {names[key]} | {_value(key, s['after_epoch_1'])} | "
                         f"{s.get('judged_from_epoch', 1)} | {_value(key, s['min'])} | {_value(key, s['max'])} | "
                         f"{drift_text} | "
                         f"{('yes' if s['flat'] else '**no**') if judged else 'not judged'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
