"""Probe: the split gather inside a loop fed by sampler worker processes (issue 11, item 2), on one GPU.

Usage: python benchmarks/probes/probe_split_loop.py [--gb 40] [--row-bytes 512] [--workers 12] [--work-ms 20 150] \
           > probe_split_loop.json

A torch DataLoader with ``--workers`` processes stands in for a CPU neighbour sampler: each batch costs a
worker ``--work-ms`` (each value in turn) of single-threaded CPU work (sorting) and yields ``--batch`` random ids
of a host table of ``--gb`` (owned memory). The main process gathers each batch onto the GPU and runs a few ms of GPU
work (the "training step"). Batches per second over ``--batches`` batches, for:
- ``workers_only``: the loader alone (how fast the stand-in sampler is);
- ``kernel``: gathers by the zero-copy kernel alone;
- ``split``: ``split="auto"`` with ``--threads`` torch threads in the main process (which reads a batch
  with the kernel alone while other processes leave too few idle cores);
- ``split_ungated``: the same share, fixed, so that it splits every batch however busy the CPUs are.
If the split's CPU reads took cores from the workers, ``split`` would fall below ``kernel`` or the workers'
own rate. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch

import hmgstore
import hmgstore.gather.cpu_share


class Batches(torch.utils.data.Dataset):
    def __init__(self, num_rows: int, batch: int, work_ms: float, length: int):
        self.num_rows, self.batch, self.length = num_rows, batch, length
        self.work = int(2_000_000 * work_ms / 100)  # ~100 ms per 2M-element sort on one core

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        torch.sort(torch.rand(self.work, generator=g))  # the sampler's CPU work
        return torch.randint(0, self.num_rows, (self.batch,), generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=40)
    p.add_argument("--row-bytes", type=int, default=512)
    p.add_argument("--batch", type=int, default=500_000)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--work-ms", type=float, nargs="+", default=[20, 150],
                   help="CPU work per batch per worker: 20 leaves the workers far ahead, 150 makes them the bottleneck")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--batches", type=int, default=80)
    p.add_argument("--backing", default="auto", choices=["auto", "hugepage", "cuda"],
                   help="the owned host memory; 'hugepage' gets copied into every forked worker")
    args = p.parse_args()
    device = torch.device("cuda", 0)
    n = int(args.gb * 1e9) // args.row_bytes
    # Filled in place, piece by piece: a source plus a copy (80 GB at 40 GB) and 12 forked workers got the
    # first run of this probe killed on the 128 GiB H100 box.
    table = hmgstore.HybridTensor.empty((n, args.row_bytes // 4), torch.float32, device, backing=args.backing,
                                        progress=False)
    step, began = (64 << 20) // args.row_bytes, time.perf_counter()
    block = torch.randint(-2**31, 2**31 - 1, (step, args.row_bytes // 4), dtype=torch.int32)  # values repeat
    for a in range(0, n, step):
        piece = table.source[a:a + step].view(torch.int32)
        piece.copy_(block[:piece.shape[0]])
    print(f"filled {args.gb:g} GB in {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    torch.set_num_threads(args.threads)
    w = torch.randn(2048, 2048, device=device)
    report = {"device": torch.cuda.get_device_name(device), "args": vars(args), "runs": {}}
    for work_ms, (name, split) in itertools.product(
            args.work_ms, (("workers_only", None), ("kernel", None), ("split", "auto"), ("split_ungated", "fixed"))):
        measured = table.split_setting.shares.get(hmgstore.gather.cpu_share.batch_class(args.batch), 0.0)
        table.set_split(measured if split == "fixed" else split)  # a fixed share skips the busy-CPU check
        if split == "auto":  # the first batch of the size measures the model: not in the timed loop
            table[torch.randint(0, n, (args.batch,))]
        loader = torch.utils.data.DataLoader(Batches(n, args.batch, work_ms, args.batches + 5), batch_size=None,
                                             num_workers=args.workers, prefetch_factor=2, persistent_workers=False)
        it = iter(loader)
        for _ in range(5):  # workers started, queues full
            next(it)
        torch.cuda.synchronize()
        start, skipped_before = time.perf_counter(), table.split_skipped
        for ids in it:
            if name != "workers_only":
                rows = table[ids]
                for _ in range(4):  # the training step's GPU work, a few ms
                    w = torch.tanh(w @ w) if rows.numel() else w
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        name = f"{name}@{work_ms:g}ms"
        report["runs"][name] = {"seconds": seconds, "batches_per_s": args.batches / seconds,
                                "share": {None: 0.0, "fixed": measured}.get(
                                    split, table.split_setting.shares.get(
                                        hmgstore.gather.cpu_share.batch_class(args.batch), 0.0)),
                                "split_skipped": table.split_skipped - skipped_before}
        print(name, report["runs"][name], flush=True, file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
