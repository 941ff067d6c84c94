"""The graph layer owns what it trusts, and ``-1`` means every neighbour whatever ``replace`` says.

- CSC offsets are checked once, then trusted by every sampler: ``to_csc`` keeps its own copy, so an edit of
  the caller's array afterwards (a numpy array, whose memory ``torch.from_numpy`` shares, included) never moves
  the neighbour ranges a sampler reads.
- A fanout of ``-1`` takes each neighbour once, with replacement or without, as PyG's and DGL's samplers do,
  on the CPU and on a GPU, for one hop and through the multi-hop sampler.
"""
import numpy as np
import pytest
import torch

from hmgstore.graph import NeighborSampler, Topology, to_csc
from hmgstore.graph.hop import sample_hop

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("view", [False, True], ids=["array", "view-into-a-larger-array"])
def test_csc_offsets_from_numpy_are_not_the_callers_memory(view):
    row = np.array([1, 2, 0, 2, 0, 1], dtype=np.int64)
    backing = np.array([7, 0, 2, 4, 6], dtype=np.int64)
    colptr = backing[1:] if view else backing[1:].copy()
    csc = to_csc((row, colptr), "csc")
    colptr[1] = 5  # the caller reuses its array
    assert csc.colptr.tolist() == [0, 2, 4, 6]
    topo = Topology(csc)
    nbr, _, counts = sample_hop(topo, torch.tensor([0, 1, 2]), -1, False, 0)
    assert counts.tolist() == [2, 2, 2] and nbr.tolist() == [1, 2, 0, 2, 0, 1]


def test_csc_offsets_from_a_torch_view_are_not_the_callers_memory():
    colptr = torch.tensor([9, 0, 2, 4, 6])
    csc = to_csc((torch.tensor([1, 2, 0, 2, 0, 1]), colptr[1:]), "csc")
    colptr[2] = 5
    assert csc.colptr.tolist() == [0, 2, 4, 6]


def _star(device):
    """Of 7 nodes, node 0 has six in-neighbours (1..6), node 1 has two (5, 6), node 2 none."""
    ei = torch.tensor([[1, 2, 3, 4, 5, 6, 5, 6], [0, 0, 0, 0, 0, 0, 1, 1]])
    return Topology(to_csc(ei, "coo", size=(7, 7)), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("replace", [False, True])
def test_fanout_minus_one_takes_every_neighbour_once_one_hop(device, replace):
    topo = _star(device)
    for key in range(5):
        nbr, _, counts = sample_hop(topo, torch.tensor([0, 1, 2], device=device), -1, replace, key)
        assert counts.tolist() == [6, 2, 0]
        got = nbr.cpu().tolist()
        assert sorted(got[:6]) == [1, 2, 3, 4, 5, 6] and sorted(got[6:]) == [5, 6]


@pytest.mark.parametrize("device", DEVICES)
def test_fanout_minus_one_with_replacement_in_the_sampler(device):
    topo = _star(device)
    sampler = NeighborSampler({None: topo}, {None: 7}, [-1], replace=True)
    out = sampler.sample({None: torch.tensor([0, 1], device=device)})
    node = out.node[None].cpu()
    src, dst = node[out.row[None].cpu()], node[out.col[None].cpu()]
    edges = sorted(zip(src.tolist(), dst.tolist()))
    assert edges == sorted([(s, 0) for s in range(1, 7)] + [(5, 1), (6, 1)])
