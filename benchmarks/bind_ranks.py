"""Run ``examples/multi_gpu_pyg.py`` under torchrun with each rank bound to CPUs and the garbage collector set.

A measurement of two straggler remedies for the several-GPU example, kept so that it can be rerun:

- ``BIND=numa``: each rank runs on the CPUs local to its GPU (``/sys/bus/pci/devices/BUS/local_cpulist``),
  shared evenly by the ranks whose GPUs report the same list; ``BIND=split``: the CPUs split evenly by local
  rank; ``BIND=off`` (the default): the scheduler's choice, as torchrun leaves it.
- ``GC=freeze``: ``gc.freeze()`` before the script starts, so that full collections skip the imported
  modules' objects; ``GC=off``: no automatic collection; ``GC=on`` (the default): Python's.

    BIND=numa GC=freeze torchrun --standalone --nproc-per-node 4 benchmarks/bind_ranks.py --graph papers:111M:1.6B ...

Results: ``benchmarks/results/multi-gpu-h200x4.md`` (neither helped on a one-socket host).
"""
from __future__ import annotations

import gc
import os
import runpy
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def cpu_list(text: str) -> list[int]:
    """CPU numbers of a kernel CPU list such as ``0-15,32-47``."""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def gpu_local_cpus(device: int, allowed: list[int]) -> tuple[int, ...]:
    """The allowed CPUs that the kernel lists as local to GPU ``device`` (every allowed CPU when it says none)."""
    import cupy  # the PCI bus id of a CUDA device, in the form sysfs names it

    bus = cupy.cuda.runtime.deviceGetPCIBusId(device).lower()
    try:
        local = cpu_list(Path(f"/sys/bus/pci/devices/{bus}/local_cpulist").read_text())
    except OSError:
        return tuple(allowed)
    return tuple(c for c in local if c in allowed) or tuple(allowed)


def bind(mode: str, rank: int, ranks: int) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if mode == "split":
        share = len(allowed) // ranks
        os.sched_setaffinity(0, allowed[rank * share:(rank + 1) * share])
    elif mode == "numa":
        local = [gpu_local_cpus(d, allowed) for d in range(ranks)]
        group = [d for d in range(ranks) if local[d] == local[rank]]  # ranks whose GPUs share these CPUs
        share = len(local[rank]) // len(group)
        start = group.index(rank) * share
        os.sched_setaffinity(0, local[rank][start:start + share])
    elif mode != "off":
        sys.exit(f"BIND={mode!r}: use off, numa or split")


def main() -> None:
    rank, ranks = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    bind(os.environ.get("BIND", "off"), rank, ranks)
    collector = os.environ.get("GC", "on")
    if collector == "off":
        gc.disable()
    elif collector == "freeze":
        gc.collect()
        gc.freeze()
    elif collector != "on":
        sys.exit(f"GC={collector!r}: use on, off or freeze")
    cpus = sorted(os.sched_getaffinity(0))
    print(f"rank {rank}: {len(cpus)} CPUs from {cpus[0]}, GC={collector}", file=sys.stderr, flush=True)
    sys.path.insert(0, str(EXAMPLES))  # the example imports its single-GPU sibling
    sys.argv = [str(EXAMPLES / "multi_gpu_pyg.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
