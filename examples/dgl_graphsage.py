"""GraphSAGE node classification with DGL, node features served by hmgstore.

This is DGL's canonical mini-batch GraphSAGE script
(dgl/examples/pytorch/graphsage/node_classification.py: NeighborSampler with
prefetched "feat" and "label", DataLoader, three SAGEConv layers) with one
line added, marked "hmgstore" below. Delete that line (or pass --no-hmgstore)
and it is stock DGL reading g.ndata.

    python examples/dgl_graphsage.py                     # synthetic graph, ~15 s on 2 CPU cores
    python examples/dgl_graphsage.py --num-nodes 2000000 --device cuda --gpu-budget 4GB
    python examples/dgl_graphsage.py --epochs 1 --max-batches 5 --no-inference   # a check that it runs

After training, a layer-wise inference pass over all nodes (DGL's
``SAGE.inference``: one layer at a time, every neighbour, reading
``g.ndata["feat"]``, which keeps working after ``attach``) gives the
full-graph test accuracy; ``--no-inference`` skips it.

The graph is hmgstore's embedded synthetic community graph (no download).
--device cuda needs a CUDA build of DGL: a CPU build of DGL (the one on the
package registry) samples on the CPU and cannot move blocks to the GPU, so
it trains on the CPU.
"""
from __future__ import annotations

import argparse
import itertools
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import tqdm

import hmgstore
from hmgstore import data as datasets
from hmgstore.cli import flags
from hmgstore.plugins.dgl import attach, dgl_supports_cuda  # before dgl: makes DGL 2.1 import on newer torch

# isort: split
import dgl
import dgl.nn as dglnn
from dgl.dataloading import DataLoader, MultiLayerFullNeighborSampler, NeighborSampler

# DGL suggests CPU affinity on every loader; it is about DGL's workers, not about this script.
warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")


class SAGE(nn.Module):
    def __init__(self, in_size, hid_size, out_size, num_layers=3):
        super().__init__()
        sizes = [in_size] + [hid_size] * (num_layers - 1) + [out_size]
        self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))
        self.dropout = nn.Dropout(0.5)
        self.hid_size, self.out_size = hid_size, out_size

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h

    def inference(self, g, device, batch_size, progress=True):
        """Layer-wise inference over all nodes, as in DGL's example: each layer over every node, all neighbours."""
        feat = g.ndata["feat"]  # after attach: the table's host rows (hmgstore.plugins.dgl.views)
        sampler = MultiLayerFullNeighborSampler(1, prefetch_node_feats=["feat"])
        dataloader = DataLoader(g, torch.arange(g.num_nodes()).to(g.device), sampler, device=device,
                                batch_size=batch_size, shuffle=False, drop_last=False, num_workers=0)
        buffer_device = torch.device("cpu")
        pin_memory = buffer_device != device
        for i, layer in enumerate(self.layers):
            y = torch.empty(g.num_nodes(), self.hid_size if i != len(self.layers) - 1 else self.out_size,
                            dtype=feat.dtype, device=buffer_device, pin_memory=pin_memory)
            feat = feat.to(device)
            for input_nodes, output_nodes, blocks in tqdm.tqdm(dataloader, desc=f"inference, layer {i}",
                                                               disable=not progress):
                h = layer(blocks[0], feat[input_nodes])
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
                y[output_nodes[0]:output_nodes[-1] + 1] = h.to(buffer_device)
            feat = y
        return y


def layerwise_infer(device, g, nid, model, batch_size, progress=True):
    model.eval()
    with torch.no_grad():
        pred = model.inference(g, device, batch_size, progress)[nid]
        label = g.ndata["label"][nid].to(pred.device)
        return float((pred.argmax(1) == label).float().mean())


def evaluate(model, dataloader, max_batches=None):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for _, _, blocks in itertools.islice(dataloader, max_batches):
            y_hat = model(blocks, blocks[0].srcdata["feat"])
            y = blocks[-1].dstdata["label"]
            correct += int((y_hat.argmax(1) == y).sum())
            total += len(y)
    return correct / max(total, 1)


def train(args, device, g, data, model) -> dict:
    # PyG's order (seeds' hop first), as the other examples take it; DGL lists the input layer first.
    sampler = NeighborSampler(list(reversed(args.fanout)), prefetch_node_feats=["feat"], prefetch_labels=["label"])

    def loader(ids, shuffle):
        return DataLoader(g, ids, sampler, device=device, batch_size=args.batch_size, shuffle=shuffle,
                          drop_last=False, num_workers=args.num_workers)

    train_loader, val_loader = loader(data.train_idx, True), loader(data.val_idx, False)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=5e-4)

    train_time = seeds = 0
    epochs = []
    total = min(len(train_loader), args.max_batches or len(train_loader))  # --max-batches: a short epoch
    for epoch in range(args.epochs):
        model.train()
        total_loss, batches, start = 0.0, 0, time.perf_counter()
        progress = tqdm.tqdm(itertools.islice(train_loader, total), total=total, desc=f"epoch {epoch}",
                             disable=args.no_progress)
        for _, output_nodes, blocks in progress:
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss.item()
            seeds += len(output_nodes)
            batches += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_time += time.perf_counter() - start
        epochs.append({"batches": batches, "loss": total_loss / batches,
                       "val_acc": evaluate(model, val_loader, args.max_batches)})
        print(f"epoch {epoch:3d} | loss {epochs[-1]['loss']:.4f} | val accuracy {epochs[-1]['val_acc']:.4f}")
    test_acc = evaluate(model, loader(data.test_idx, False), args.max_batches)
    print(f"test accuracy {test_acc:.4f}")
    batches = sum(e["batches"] for e in epochs)
    print(f"training throughput: {batches / train_time:.1f} batches/s, {seeds / train_time:,.0f} seed nodes/s "
          f"(sampling, feature loading and training, {args.num_workers} sampler workers)")
    result = {"epochs": epochs, "test_acc": test_acc, "inference_test_acc": None}
    if not args.no_inference:
        start = time.perf_counter()
        acc = layerwise_infer(device, g, data.test_idx, model, 4096, progress=not args.no_progress)
        print(f"layer-wise inference over all {g.num_nodes():,} nodes: test accuracy {acc:.4f} "
              f"({time.perf_counter() - start:.2f} s)")
        result["inference_test_acc"] = acc
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=flags.positive_count, default=20_000,
                        help="synthetic graph size (at least --num-classes)")
    parser.add_argument("--avg-degree", type=flags.positive, default=10)
    parser.add_argument("--feat-dim", type=flags.positive, default=128)
    parser.add_argument("--num-classes", type=flags.whole(2), default=16)
    parser.add_argument("--device", type=flags.device_name, default=None,
                        help="cuda (needs a CUDA build of DGL) or cpu; default: cuda when DGL and torch can use it")
    parser.add_argument("--gpu-budget", type=flags.size("auto"), default=None,
                        help="GPU memory for hot feature rows, e.g. 4GB, or 'auto' (CUDA only; default: none, all "
                             "rows read zero-copy from pinned host memory)")
    flags.add_fanout(parser)  # from the seeds outwards; DGL's NeighborSampler takes the reverse (below)
    flags.add_batch_size(parser, 1024)
    parser.add_argument("--hidden", type=flags.positive, default=256)
    parser.add_argument("--lr", type=flags.positive_real, default=1e-3)
    parser.add_argument("--epochs", type=flags.positive, default=3)
    parser.add_argument("--num-workers", type=flags.natural, default=0)
    flags.add_max_batches(parser)
    flags.add_seed(parser)
    parser.add_argument("--no-hmgstore", action="store_true", help="stock DGL: read features from g.ndata")
    parser.add_argument("--no-inference", action="store_true",
                        help="skip the layer-wise inference pass over all nodes after training")
    flags.add_no_progress(parser)
    args = parser.parse_args(argv)

    if args.num_nodes < args.num_classes:  # the synthetic graph has a node of each class at least
        parser.error(f"--num-nodes {args.num_nodes} is fewer than --num-classes {args.num_classes}: the graph needs "
                     "a node of each class")
    cuda_ok = torch.cuda.is_available() and dgl_supports_cuda()
    if args.device is not None and args.device.type == "cuda" and not cuda_ok:
        parser.error("--device cuda needs a GPU and a CUDA build of DGL; this DGL is a CPU build (or torch sees "
                     "no GPU), which samples on the CPU and cannot move blocks to the GPU. Use --device cpu.")
    missing = flags.missing_device(args.device) if args.device is not None else None
    if missing is not None:
        parser.error(f"argument --device: {missing}")
    args.device = args.device or torch.device("cuda" if cuda_ok else "cpu")
    return args


def main(argv=None) -> dict:
    """Train as the command line ``argv`` (None: ``sys.argv[1:]``) says; the epochs' batches, losses and
    accuracies, the test accuracy and the layer-wise pass's (None when skipped)."""
    args = parse_args(argv)
    device = args.device
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)

    data = datasets.synthetic(args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes, seed=args.seed)
    g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes)
    g.ndata["feat"], g.ndata["label"] = data.x, data.y  # as a DGL dataset's graph comes
    # The graph stays on the CPU: DGL samples there, and DataLoader(device=...) moves blocks.

    if not args.no_hmgstore:
        hot = {}
        if args.gpu_budget:  # the rows the sampler draws most stay on the GPU, the rest are read from pinned memory
            csc = hmgstore.graph.to_csc(data.edge_index, "coo", size=(data.num_nodes, data.num_nodes))
            draws = hmgstore.graph.expected_draws(csc)
            hot = dict(gpu_budget=args.gpu_budget, hot_order=hmgstore.hotness.order_by_score(draws))
        table = hmgstore.HybridTensor(data.x, device, **hot)
        # ------------------------------------------------------------------ hmgstore: the one-line swap
        attach(g, {"feat": table, "label": data.y}, device=device)
        # ------------------------------------------------------------------ (DGL code below is unchanged)
    print(f"{g.num_nodes():,} nodes, {g.num_edges():,} edges, {args.feat_dim} features; device {device}; "
          f"features from {'g.ndata' if args.no_hmgstore else 'hmgstore'}")

    model = SAGE(args.feat_dim, args.hidden, data.num_classes, len(args.fanout)).to(device)
    return train(args, device, g, data, model)


if __name__ == "__main__":
    main()
