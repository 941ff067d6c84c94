"""Gathers from a table sharded over the GPUs of a node, one process per GPU (``hmgstore.distributed.shard``).

``bench peer`` drives every GPU from one process, each reading the others' shards through peer access of
that process. Training runs one process per GPU (torchrun): there each reads its peers' shards through
CUDA IPC mappings. This probe times the second way, every GPU gathering at once, for ids that all lie in
this rank's own shard (``own``), all in another's (``peer``) and anywhere (``mixed``), with the ids already
on the GPU as int64 (what the GPU sampler hands the gather). Each variant is checked bit for bit against
``x[ids]`` first (the output poisoned with NaN), then timed with CUDA events over ``--reps`` batches;
the ranks start each variant together (a barrier) and report the median batch.

Run (2+ GPUs): ``torchrun --standalone --nproc-per-node 2 benchmarks/probes/probe_ipc_gather.py``.
Prints one JSON object from rank 0: GB/s of rows delivered per GPU, per variant and table size.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import hmgstore.distributed as hd


def rows_of(table, rank: int, world: int, mine: bool) -> torch.Tensor:
    """The ids of this rank's shard (``mine``) or of every other rank's."""
    p = table.placement
    if mine:
        return p.rows_of(f"shard{rank}")
    return torch.cat([p.rows_of(f"shard{s}") for s in range(world) if s != rank])


def timed(table, ids: torch.Tensor, out: torch.Tensor, reps: int) -> float:
    """Median seconds of one gather of ``ids`` into ``out`` on the current stream."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        table.table.gather(ids, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, nargs="+", default=[4.0, 32.0], help="table sizes (all GPUs together)")
    p.add_argument("--row-bytes", type=int, default=512)
    p.add_argument("--batch", type=int, default=250_000, help="ids per gather")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    width = args.row_bytes // 4
    results = []
    for gb in args.gb:
        n = int(gb * 1e9) // args.row_bytes

        def make(n=n):
            x = torch.empty(n, width)
            for chunk in x.split(1 << 22):
                chunk.uniform_(-1, 1)
            return x

        t0 = time.perf_counter()
        x = hd.share_on_node(make, progress=False)
        table = hd.shard(x, gpu_budget=int(gb * 1e9 / world * 1.05) + (1 << 26), hot_order=torch.arange(n),
                         device=device, progress=False)
        built = time.perf_counter() - t0
        gen = torch.Generator().manual_seed(rank)
        pools = {"own": rows_of(table, rank, world, True), "peer": rows_of(table, rank, world, False),
                 "mixed": torch.arange(n)}
        row = {"gb": gb, "rows": n, "build_s": built}
        for name, pool in pools.items():
            ids = pool[torch.randint(len(pool), (args.batch,), generator=gen)]
            ids_gpu = ids.to(device)
            out = torch.full((args.batch, width), float("nan"), device=device)
            table.table.gather(ids_gpu, out=out)
            exact = bool(torch.equal(out.cpu(), x[ids]))
            dist.barrier()
            seconds = timed(table, ids_gpu, out, args.reps)
            row[name] = {"exact": exact, "ms": seconds * 1e3, "GB/s": args.batch * args.row_bytes / seconds / 1e9}
        every = [None] * world
        dist.all_gather_object(every, row)
        results.append(every)
        table.close()
        del x
    if rank == 0:
        print(json.dumps({"device": torch.cuda.get_device_name(device), "world": world, "row_bytes": args.row_bytes,
                          "batch": args.batch, "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
