"""A DGL GraphSAGE trains to the same losses whether features come from g.ndata or hmgstore.

Both runs use DGL's own NeighborSampler and DataLoader with the same seeds;
the only difference is the one-line ``attach``. DGL's sampler is
deterministic under ``dgl.seed`` only with one OpenMP thread, hence the
fixture.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hmgstore
from hmgstore.plugins.dgl import attach

# isort: split
import dgl  # noqa: E402  (after the plugin, which makes dgl importable on this torch)
from dgl.nn import SAGEConv  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Dataloader CPU affinity")


class SAGE(torch.nn.Module):
    def __init__(self, in_size: int, hidden: int, out_size: int):
        super().__init__()
        self.layers = torch.nn.ModuleList([SAGEConv(in_size, hidden, "mean"), SAGEConv(hidden, out_size, "mean")])
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


@pytest.fixture
def deterministic_sampling():
    dgl_threads, torch_threads = dgl.utils.get_num_threads(), torch.get_num_threads()
    dgl.utils.set_num_threads(1)
    yield
    dgl.utils.set_num_threads(dgl_threads)
    torch.set_num_threads(torch_threads)


def _train(graph, train_idx, in_size, num_classes, epochs=3) -> list[float]:
    torch.manual_seed(0)
    np.random.seed(0)  # DGL's DataLoader shuffles with numpy
    dgl.seed(0)
    model = SAGE(in_size, 32, num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = dgl.dataloading.NeighborSampler([5, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(graph, train_idx, sampler, batch_size=256, shuffle=True)
    losses = []
    for _ in range(epochs):
        for _, _, blocks in loader:
            loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@pytest.mark.parametrize("idtype", [torch.int64, torch.int32], ids=["int64", "int32"])
def test_graphsage_losses_match_plain_ndata(small_graph, idtype, deterministic_sampling):
    src, dst = small_graph.edge_index
    plain = dgl.graph((src, dst), num_nodes=small_graph.num_nodes, idtype=idtype)
    hybrid = plain.clone()
    plain.ndata["feat"], plain.ndata["label"] = small_graph.x, small_graph.y
    attach(hybrid, {"feat": hmgstore.HybridTensor(small_graph.x, "cpu"), "label": small_graph.y})
    train_idx = small_graph.train_idx.to(idtype)
    args = (train_idx, small_graph.x.shape[1], small_graph.num_classes)

    expected = _train(plain, *args)
    got = _train(hybrid, *args)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert np.mean(expected[-5:]) < np.mean(expected[:5])  # it learns: the comparison means something
