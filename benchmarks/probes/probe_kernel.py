"""hmg_gather against a naive reference kernel, kernel-only timings (GPU only).

    python benchmarks/probes/probe_kernel.py --out DIR

The probe of host pages showed the gather reaching ~42 GB/s even for 4 KiB
rows, where DESIGN.md saw a naive kernel at ~50. This times, on a 16 GiB
registered table with 500k unique ids per batch (a batch covers <= 1/8 of
the table, like a real mini-batch's n_id):
  - a naive reference kernel (a warp per row, 4 bytes per thread), ids
    unsorted and pre-sorted;
  - hmg_gather alone (ids pre-sorted, no validation);
  - the whole gather (validation + sort + kernel).
The 2026-11-21 run also tried __ldg and L2::128B/256B load hints and 4-byte
vectors (a LOAD_MODE define since removed): see
benchmarks/results/probe-kernel-h100.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import hmgstore
from hmgstore import cuda
from hmgstore.bench.gather import hashed_buffer
from hmgstore.bench.timing import h2d_limit_gbps, median_seconds
from hmgstore.cuda import gather as kernel

NAIVE = r"""
extern "C" __global__ void naive(const float* __restrict__ src, const long long* __restrict__ ids,
                                 float* __restrict__ out, long long n, long long cols) {
  long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  long long warps = (gridDim.x * (long long)blockDim.x) >> 5;
  for (long long r = warp; r < n; r += warps) {
    const float* s = src + ids[r] * cols;
    float* d = out + r * cols;
    for (long long c = lane; c < cols; c += 32) d[c] = s[c];
  }
}
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench-out/probe-kernel")
    p.add_argument("--table-gib", type=float, default=16)
    p.add_argument("--batch", type=int, default=500_000)
    args = p.parse_args()
    dev = torch.device("cuda", 0)
    cp = cuda.cupy()
    naive = cp.RawKernel(NAIVE, "naive")
    limit = h2d_limit_gbps(dev)
    buf = hashed_buffer(int(args.table_gib * 2**30))
    res = {"h2d_limit_gbps": limit, "rows": []}
    print(f"H2D limit {limit:.1f} GB/s")
    stream = torch.cuda.current_stream(dev)
    for rb in (128, 512, 4096):
        cols = rb // 4
        x = buf[: buf.numel() // cols * cols].view(-1, cols)
        n = len(x)
        t = hmgstore.HybridTensor(x, dev, progress=False)
        ids = [torch.randperm(n, device=dev)[: args.batch] for _ in range(3)]
        sorted_ids = [torch.sort(i.int()) for i in ids]
        out = torch.empty((args.batch, cols), device=dev)
        useful = args.batch * rb
        row = {"row_bytes": rb, "num_rows": n}

        def run_naive(i, sort):
            idx = sorted_ids[i % 3].values.long() if sort else ids[i % 3]
            naive((132 * 16,), (256,), (np.uint64(x.data_ptr()), np.uint64(idx.data_ptr()),
                                        np.uint64(out.data_ptr()), np.int64(args.batch), np.int64(cols)))

        with cp.cuda.ExternalStream(stream.cuda_stream):
            for sort in (False, True):
                med = median_seconds(lambda i: run_naive(i, sort), reps=10, warmup=2, device=dev)[0]
                row[f"naive_{'sorted' if sort else 'unsorted'}"] = useful / med / 1e9

        def kernel_only(i):
            s = sorted_ids[i % 3]
            kernel.launch_gather([kernel.Job(s.values, s.indices, out, None, n, rb, t.tiers)], dev, stream)

        out.fill_(float("nan"))
        kernel_only(0)
        assert torch.equal(out.cpu().view(torch.int32), x[ids[0].cpu()].view(torch.int32))
        med = median_seconds(kernel_only, reps=10, warmup=2, device=dev)[0]
        row["hmg_kernel_only"] = useful / med / 1e9
        med = median_seconds(lambda i: t[ids[i % 3]], reps=10, warmup=2, device=dev)[0]
        row["hmg_full_gather"] = useful / med / 1e9
        t.close()
        res["rows"].append(row)
        print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe-kernel.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
