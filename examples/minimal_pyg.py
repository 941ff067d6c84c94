"""A user's PyG training script, with node features and sampling served by hmgstore.

GraphSAGE on a small synthetic graph (a few seconds on a CPU; the GPU when there is one). The lines marked
``# hmgstore:`` are all that differs from stock PyG, where the loader would read ``data`` with PyG's sampler.

    python examples/minimal_pyg.py [--seed N] [--batch-size N]
"""
import argparse

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
from torch_geometric.nn import GraphSAGE

import hmgstore  # hmgstore:
from hmgstore.cli import flags
from hmgstore.data import synthetic
from hmgstore.plugins.pyg import HybridNeighborSampler, from_data  # hmgstore:

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
flags.add_seed(parser)
flags.add_batch_size(parser, 256)
args = parser.parse_args()  # --help prints the usage and ends the script here, before any work
torch.manual_seed(args.seed)
graph = synthetic(num_nodes=5_000, feat_dim=32, num_classes=8)  # your graph: any Data with x, y and edge_index
data = Data(x=graph.x, y=graph.y, edge_index=graph.edge_index)

stores = from_data(data)  # hmgstore: feature and graph stores (hot rows on the GPU, the rest pinned in host memory)
sampler = HybridNeighborSampler(stores, [10, 5])  # hmgstore: neighbour sampling on the stores' device
device = stores[0].device  # hmgstore: batches land where the stores gather (the GPU when there is one)


def loader(ids, shuffle):
    return NeighborLoader(stores, [10, 5], neighbor_sampler=sampler,  # hmgstore: stores and sampler, not data
                          input_nodes=ids, batch_size=args.batch_size, shuffle=shuffle)


model = GraphSAGE(32, 64, num_layers=2, out_channels=8).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(3):
    model.train()
    for batch in hmgstore.Pipeline(loader(graph.train_idx, shuffle=True)):  # hmgstore: next batches made meanwhile
        optimizer.zero_grad()
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")

model.eval()
correct = 0
with torch.no_grad():
    for batch in loader(graph.test_idx, shuffle=False):
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        correct += int((out.argmax(-1) == batch.y[:batch.batch_size]).sum())
print(f"test accuracy {correct / len(graph.test_idx):.3f}")
