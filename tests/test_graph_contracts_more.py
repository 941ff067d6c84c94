"""Graph entry points refuse or convert what they would otherwise misread: narrow id dtypes, uint64 ids past
int64, unordered fanouts at the PyG sampler, disjoint keys past int64, seed times that are not 1-D."""
import numpy as np
import pytest
import torch

from hmgstore.graph import CSC, NeighborSampler, Topology, sample_hop, to_csc


def _triangle(dtype: torch.dtype) -> CSC:
    return CSC(torch.tensor([1, 2, 0, 2, 0, 1]).to(dtype), torch.tensor([0, 2, 4, 6]).to(dtype), None, (3, 3))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32])
def test_csc_of_narrow_ids_samples_as_int64(dtype):
    csc = _triangle(dtype)
    assert csc.colptr.dtype == torch.int64 and csc.row.dtype in (torch.int32, torch.int64)
    topo = Topology(csc, progress=False)
    nbr, eid, counts = sample_hop(topo, [0, 1, 2], -1, False, 3)
    assert nbr.tolist() == [1, 2, 0, 2, 0, 1] and eid.tolist() == list(range(6))
    assert counts.dtype == torch.int64 and counts.tolist() == [2, 2, 2]
    out = NeighborSampler({None: topo}, {None: 3}, [2, 2]).sample({None: torch.tensor([0])})
    assert out.node[None].tolist() == [0, 1, 2]


@pytest.mark.parametrize("layout", ["coo", "csc"])
def test_to_csc_refuses_uint64_ids_past_int64(layout):
    big = np.array([2**63 + 1], dtype=np.uint64)
    given = np.stack([big, np.zeros(1, np.uint64)]) if layout == "coo" else (big, np.array([0, 1], np.uint64))
    with pytest.raises(ValueError, match=r"2\*\*63.*int64"):
        to_csc(given, layout)
    with pytest.raises(ValueError, match=r"colptr.*2\*\*63"):
        to_csc((np.zeros(1, np.uint64), np.array([0, 2**63 + 1], np.uint64)), "csc")
    csc = to_csc((np.array([1, 0], np.uint64), np.array([0, 1, 2], np.uint64)), "csc")
    assert csc.row.tolist() == [1, 0] and csc.colptr.tolist() == [0, 1, 2] and csc.size == (2, 2)


def test_disjoint_keys_past_int64_refused():
    n = 2**62
    topo = Topology(CSC(torch.tensor([n - 1]), torch.tensor([0, 1]), None, (n, 1)), progress=False)
    sampler = NeighborSampler({("a", "r", "b"): topo}, {"a": n, "b": 1}, [1], disjoint=True)
    assert sampler.sample({"b": torch.tensor([0])}).batch["a"].tolist() == [0]
    with pytest.raises(ValueError, match="disjoint.*smaller batches"):
        sampler.sample({"b": torch.tensor([0, 0, 0])})


def test_sampler_seed_time_must_be_1d():
    csc = to_csc((torch.tensor([1, 2, 0, 2, 0, 1]), torch.tensor([0, 2, 4, 6])), "csc")
    sampler = NeighborSampler({None: Topology(csc, progress=False, src_time=torch.tensor([0, 1, 2]))},
                              {None: 3}, [2])
    with pytest.raises(ValueError, match="1-D"):
        sampler.sample({None: torch.tensor([0])}, {None: torch.tensor(2)})
    assert sampler.sample({None: torch.tensor([0])}, {None: torch.tensor([2])}).node[None].tolist()[0] == 0


def test_pyg_sampler_refuses_a_set_fanout():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import HybridNeighborSampler

    data = Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)
    with pytest.raises(TypeError, match="set.*list"):
        HybridNeighborSampler(data, {2, 1})
    with pytest.raises(TypeError, match="set.*list"):
        HybridNeighborSampler(data, frozenset({2, 1}))
    assert HybridNeighborSampler(data, {2: None, 1: None}.keys()).num_neighbors.values == [2, 1]
