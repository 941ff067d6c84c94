"""GraphSAGE test accuracy under hmgstore's options against the plain setting, 3 seeds, paired by seed.

Usage: python benchmarks/accuracy.py formats > formats.json     (float32 / bfloat16 / float8 / int8 rows)
       python benchmarks/accuracy.py batches > batches.json     (random batches / locality-aware, windows 4 and 16)
       python benchmarks/accuracy.py labor > labor.json         (uniform / LABOR-0 sampling at the same fanout,
                                                                 30,000 nodes of degree 20, 30% of edges inside
                                                                 a community, so that accuracy is not saturated)
       python benchmarks/accuracy.py step > step.json           (the plain step / layers trimmed per hop + TF32;
                                                                 on the GPU when there is one: TF32 is a GPU mode)

Task (as benchmarks/results/half-width-accuracy-cpu.md): GraphSAGE, fanout 15,10,5, hidden 256, batch 1024,
lr 0.003, 3 epochs, hmgstore's stores and sampler through a stock PyG NeighborLoader, on hmgstore's synthetic
community graph of 50,000 nodes, 16 features, 16 classes (chance 0.0625), degree 2 (so that accuracy is not
saturated and a difference could show). ``batches`` uses 500 communities of one class each (fine-grained
locality, which the community layout finds) and degree 4. Each seed seeds the graph and the model, so the
settings of one seed train on the same graph from the same initial weights.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader

from hmgstore.bench.train_setup import SAGE, train_step  # the benchmarks' one GraphSAGE and step
from hmgstore.data import synthetic
from hmgstore.graph import locality as L
from hmgstore.graph import to_csc
from hmgstore.plugins.pyg import HybridNeighborSampler, from_data


def run(seed: int, compress=None, window=None, communities=None, degree=2, trim=False, tf32=False, labor=False,
        num_nodes=50_000, intra=0.8) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    g = synthetic(num_nodes=num_nodes, avg_degree=degree, feat_dim=16, num_classes=16, communities=communities,
                  intra=intra, seed=seed)
    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device=device, compress=compress, progress=False)
    sampler = HybridNeighborSampler(stores, [15, 10, 5], device=device, progress=False, labor=labor)
    torch.manual_seed(seed)
    if window is None:
        loader = NeighborLoader(stores, [15, 10, 5], neighbor_sampler=sampler, input_nodes=g.train_idx,
                                batch_size=1024, shuffle=True)
    else:
        csc = to_csc(g.edge_index, "coo", (g.num_nodes, g.num_nodes))
        layout = L.community_order(csc, generator=torch.Generator().manual_seed(seed), progress=False)
        batches = L.LocalityBatchSampler(g.train_idx, L.parts_of(layout, 256), 1024, window,
                                         generator=torch.Generator().manual_seed(seed))
        loader = NeighborLoader(stores, [15, 10, 5], neighbor_sampler=sampler, input_nodes=g.train_idx,
                                batch_sampler=batches)
    test = NeighborLoader(stores, [15, 10, 5], neighbor_sampler=sampler, input_nodes=g.test_idx, batch_size=2048)
    model = SAGE([16, 256, 256, 16]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    start, nodes, batches = time.perf_counter(), 0, 0
    for _ in range(3):
        model.train()
        for batch in loader:
            train_step(model, optimizer, batch, trim)
            nodes, batches = nodes + batch.num_nodes, batches + 1
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in test:
            hops = (batch.num_sampled_nodes, batch.num_sampled_edges) if trim else ()
            pred = model(batch.x, batch.edge_index, *hops)[:batch.batch_size].argmax(1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
    return {"seed": seed, "compress": compress, "window": window, "trim": trim, "tf32": tf32, "device": device,
            "labor": labor,
            "test_acc": correct / total, "nodes_per_batch": nodes / batches, "seconds": time.perf_counter() - start}


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "formats"
    settings = {"formats": [dict(compress=c) for c in (None, "bfloat16", "float8", "int8")],
                "batches": [dict(window=w, communities=500, degree=4) for w in (None, 4, 16)],
                "step": [dict(trim=False, tf32=False), dict(trim=True, tf32=True)],
                "labor": [dict(labor=False, degree=20, num_nodes=30_000, intra=0.3, trim=True),
                          dict(labor=True, degree=20, num_nodes=30_000, intra=0.3, trim=True)]}[what]
    runs = []
    for seed in (0, 1, 2):
        for s in settings:
            r = run(seed, **s)
            runs.append({**s, **r})
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    base = [r for r in runs if r.get("compress") is None and r.get("window") is None and not r.get("labor")
            and r.get("trim") == (what == "labor")]
    summary = []
    for s in settings:
        mine = [r for r in runs if all(r.get(k) == v for k, v in s.items())]
        diffs = [a["test_acc"] - b["test_acc"] for a, b in zip(mine, base)]
        accs = [r["test_acc"] for r in mine]
        summary.append({**s, "acc": accs, "mean": statistics.mean(accs), "std": statistics.stdev(accs),
                        "diff": diffs, "diff_mean": statistics.mean(diffs), "diff_std": statistics.stdev(diffs)})
    print(json.dumps({"what": what, "date": time.strftime("%F %T"), "command": " ".join(sys.argv), "runs": runs,
                      "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
