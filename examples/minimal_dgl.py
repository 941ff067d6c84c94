"""A user's DGL training script, node features served by hmgstore: the lines marked ``# hmgstore:`` are all that
differs from stock DGL, whose sampler would prefetch from ``g.ndata``. GraphSAGE on a small synthetic graph, a
few seconds on a CPU. The package registry's DGL is a CPU build: it samples and trains on the CPU, so the tables
gather there too; a CUDA build of DGL trains on the GPU. Run: python examples/minimal_dgl.py [--help]"""
import hmgstore.plugins.dgl  # hmgstore: first, always: it lets DGL 2.1 import on this torch

# isort: split
import argparse
import warnings

import dgl
import torch
import torch.nn.functional as F
from dgl.nn import SAGEConv

import hmgstore  # hmgstore:
from hmgstore.cli import flags
from hmgstore.data import synthetic
from hmgstore.plugins.dgl import attach, dgl_supports_cuda  # hmgstore:

parser = argparse.ArgumentParser(description=__doc__.split(":")[0])
flags.add_seed(parser)
args = parser.parse_args()  # --help prints the usage and ends the script here, before any work
torch.manual_seed(args.seed)
graph = synthetic(num_nodes=5_000, feat_dim=32, num_classes=8)  # your graph: edge_index, x and y tensors
g = dgl.graph((graph.edge_index[0], graph.edge_index[1]), num_nodes=graph.num_nodes)
device = torch.device("cuda" if torch.cuda.is_available() and dgl_supports_cuda() else "cpu")
features = hmgstore.HybridTensor(graph.x, device)  # hmgstore: the table (gpu_budget=... keeps hot rows on a GPU)
attach(g, {"feat": features, "label": hmgstore.HybridTensor(graph.y, device)})  # hmgstore: instead of g.ndata
warnings.filterwarnings("ignore", message="Dataloader CPU affinity")  # DGL's advice on its worker processes
sampler = dgl.dataloading.NeighborSampler([10, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"])


class SAGE(torch.nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = torch.nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(sizes, sizes[1:]))

    def forward(self, blocks, h):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = F.relu(layer(block, h)) if i < len(self.layers) - 1 else layer(block, h)
        return h


model = SAGE([32, 64, 8]).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(3):
    loader = dgl.dataloading.DataLoader(g, graph.train_idx, sampler, device=device, batch_size=256, shuffle=True)
    for _input_nodes, _output_nodes, blocks in loader:
        loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")

model.eval()
loader = dgl.dataloading.DataLoader(g, graph.test_idx, sampler, device=device, batch_size=1024)
with torch.no_grad():
    correct = sum(int((model(b, b[0].srcdata["feat"]).argmax(-1) == b[-1].dstdata["label"]).sum()) for *_, b in loader)
print(f"test accuracy {correct / len(graph.test_idx):.3f}")
