"""Probe: which score, known before training, ranks a table's rows as the sampler will touch them (CPU).

Usage: python benchmarks/probes/probe_default_hotness.py [--nodes 2000000] > default-hotness.json

For each graph, two epochs' worth of batches are pre-sampled from the training seeds with hmgstore's CPU
sampler (fanout 15,10,5, batch 1024), with different seed orders and draws: one epoch is what the scores are
judged on (its feature touches), the other is one of the scores. A score keeps the top ``share`` of the rows;
its hit rate is the share of the judged touches that fall on them (``hmgstore.graph.hit_ratio``). Scores:
in-degree (a node's list length), out-degree (the lists a node is in), ``expected_draws`` with fanout 10 and 15,
and the other epoch's touches. Graphs, 2M nodes each:

- papers-shaped: 28.8M edges, Zipf(0.6) in-degrees, sources uniform, 1.1% of the nodes train (as the
  ``papers:`` graphs of ``bench train``);
- the same with sources Zipf(0.6) over the same ranking (hubs cite and are cited);
- the same made symmetric (each edge both ways, 28.8M edges);
- ``hmgstore.data.synthetic`` (community graph, 10 in-edges a node), its own training split.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from hmgstore.data import synthetic
from hmgstore.data.power_law import power_law_csc
from hmgstore.graph import NeighborSampler, Topology, expected_draws, hit_ratio, presample, to_csc

SHARES = (0.2, 0.5, 0.79)  # 0.79: the rows 20% of the float32 bytes hold as int8 rows of 128 features


def touches(sampler, train: torch.Tensor, batches: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    seeds = train[torch.randperm(len(train), generator=g)][:batches * 1024]
    return presample(sampler, seeds, generator=g, progress=False).features[None]


def judge(name: str, csc, train: torch.Tensor, batches: int) -> dict:
    topo = Topology(csc, "cpu", progress=False)
    sampler = NeighborSampler({None: topo}, {None: csc.size[1]}, [15, 10, 5])
    start = time.perf_counter()
    judged, other = touches(sampler, train, batches, 7), touches(sampler, train, batches, 8)
    scores = {"in_degree": csc.colptr.diff(), "out_degree": torch.bincount(csc.row.long(), minlength=csc.size[0]),
              "expected_draws_10": expected_draws(csc, 10), "expected_draws_15": expected_draws(csc, 15),
              "other_epoch": other}
    hits = {str(share): {s: round(hit_ratio(judged, torch.argsort(v.double(), descending=True, stable=True)
                                            [:int(share * csc.size[0])]), 3) for s, v in scores.items()}
            for share in SHARES}
    print(f"{name}: {hits} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    return {"graph": name, "batches": batches, "hit_rate": hits}


def symmetric(csc, n: int):
    col = torch.repeat_interleave(torch.arange(n), csc.colptr.diff())
    return to_csc(torch.stack([torch.cat([csc.row.long(), col]), torch.cat([col, csc.row.long()])]), "coo", (n, n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2_000_000)
    args = p.parse_args()
    n = args.nodes
    train = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:max(1, n * 11 // 1000)]
    batches = -(-len(train) // 1024)
    results = [judge("papers-shaped", power_law_csc(n, n * 144 // 10, 0.6), train, batches)]
    hubs = power_law_csc(n, n * 144 // 10, 0.6, source_skew=0.6)
    results.append(judge("papers-shaped, hubs cite too", hubs, train, batches))
    results.append(judge("symmetric power-law", symmetric(power_law_csc(n, n * 72 // 10, 0.6, source_skew=0.6), n),
                         train, batches))
    g = synthetic(num_nodes=n, avg_degree=10, feat_dim=1, seed=0)
    results.append(judge("synthetic community", to_csc(g.edge_index, "coo", (n, n)), g.train_idx, 100))
    json.dump({"command": "python " + " ".join(sys.argv), "nodes": n, "fanout": [15, 10, 5], "batch_size": 1024,
               "results": results}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
