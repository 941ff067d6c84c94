"""The graph layer's entry points refuse, by name, inputs they would otherwise misread.

Each case below was read silently before: a uint64 time past 2**63 wrapped to a time before every other, a
fanout given as a set was drawn in its hash order, an edge type keyed by a string or a pair was read by its first
and last characters, a time for a node type the batch lacks was dropped. Others failed deep inside torch.
"""
import numpy as np
import pytest
import torch

from hmgstore.graph import CSC, NeighborSampler, Topology, to_csc
from hmgstore.graph.csc import edge_weight_in_csc_order
from hmgstore.graph.fanout import check_fanout
from hmgstore.graph.hop import sample_hop
from hmgstore.graph.temporal import sort_by_time


def _temporal():
    ei = torch.tensor([[1, 2, 3], [0, 0, 0]])
    csc = sort_by_time(to_csc(ei, "coo", size=(4, 4)), node_time=torch.tensor([0, 1, 2, 3]))
    return Topology(csc, src_time=torch.tensor([0, 1, 2, 3]))


def test_one_hop_refuses_seed_times_past_int64_and_not_1d():
    topo = _temporal()
    with pytest.raises(ValueError, match="2\\*\\*63 or more"):
        sample_hop(topo, torch.tensor([0]), -1, False, 0, seed_time=np.array([2**63 + 5], dtype=np.uint64))
    with pytest.raises(ValueError, match="1-D"):
        sample_hop(topo, torch.tensor([0]), -1, False, 0, seed_time=torch.tensor([[7]]))
    nbr, _, counts = sample_hop(topo, torch.tensor([0]), -1, False, 0, seed_time=torch.tensor([2]))
    assert counts.tolist() == [2] and sorted(nbr.tolist()) == [1, 2]  # node 3's time, 3, is after the seed's


def test_the_sampler_refuses_times_of_another_node_type_and_a_column_of_times():
    sampler = NeighborSampler({None: _temporal()}, {None: 4}, [2])
    with pytest.raises(KeyError, match="seed_time names node types \\['paper'\\]"):
        sampler.sample({None: torch.tensor([0])}, seed_time={None: torch.tensor([2]), "paper": torch.tensor([1])})
    with pytest.raises(ValueError, match="1-D"):
        sampler.sample({None: torch.tensor([0])}, seed_time={None: torch.tensor([[2]])})


def test_a_replace_fanout_too_large_to_allocate_is_refused_by_one_hop_too():
    topo = Topology(to_csc(torch.tensor([[0, 1], [1, 0]]), "coo", size=(2, 2)))
    with pytest.raises(ValueError, match="k is 2147483648"):
        sample_hop(topo, torch.tensor([0]), 2**31, True, 0)


def test_a_fanout_is_an_ordered_sequence_not_a_set():
    with pytest.raises(TypeError, match="keeps no order"):
        check_fanout({5, 10})
    with pytest.raises(TypeError, match="keeps no order"):
        NeighborSampler({None: _temporal()}, {None: 4}, frozenset([2]))
    assert check_fanout((10, 5)) == [10, 5] and check_fanout(np.array([3, -1])) == [3, -1]


@pytest.mark.parametrize("key", ["ab", ("a", "b"), ("a", 1, "a"), 5])
def test_an_edge_type_is_a_triple_of_strings(key):
    topo = Topology(to_csc(torch.tensor([[0, 1], [1, 0]]), "coo", size=(2, 2)))
    with pytest.raises(TypeError, match="triple of strings"):
        NeighborSampler({key: topo}, {"a": 2, "b": 2}, [2])


def test_the_homogeneous_key_does_not_mix_with_edge_types():
    topo = Topology(to_csc(torch.tensor([[0, 1], [1, 0]]), "coo", size=(2, 2)))
    with pytest.raises(ValueError, match="mixes the homogeneous key None"):
        NeighborSampler({None: topo, ("a", "r", "a"): topo}, {None: 2, "a": 2}, [2])


@pytest.mark.parametrize("weight", [["a", "b"], np.array(["1", "2"]), "ab", None])
def test_weights_that_are_not_numbers_raise_type_error(weight):
    csc = to_csc(torch.tensor([[1, 2], [0, 0]]), "coo", size=(3, 3))
    with pytest.raises(TypeError, match="edge weights must be real numbers"):
        edge_weight_in_csc_order(weight, csc)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_a_csc_of_wide_unsigned_ids_names_the_fix(dtype):
    row, colptr = torch.tensor([1, 2, 0]), torch.tensor([0, 2, 3, 3])
    with pytest.raises(TypeError, match="pass row.long"):
        CSC(row.to(dtype), colptr, None, (3, 3))
    with pytest.raises(TypeError, match="pass colptr.long"):
        CSC(row, colptr.to(dtype), None, (3, 3))
    assert to_csc((row.to(dtype), colptr.to(dtype)), "csc").colptr.tolist() == [0, 2, 3, 3]  # converted there


def test_metis_order_refuses_a_bipartite_csc():
    from hmgstore.graph import locality

    pytest.importorskip("pymetis")
    with pytest.raises(ValueError, match="must be square"):
        locality.metis_order(to_csc(torch.tensor([[4, 1], [0, 1]]), "coo", size=(5, 2)), 2)
    with pytest.raises(TypeError, match="hmgstore.graph.CSC"):
        locality.metis_order(torch.tensor([[0, 1], [1, 0]]), 2)
