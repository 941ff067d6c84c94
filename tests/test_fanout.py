"""Fanouts are checked once, for every sampler and command line: -1 means all, nothing else negative, no fractions."""
import argparse

import numpy as np
import pytest
import torch

from hmgstore.cli import flags
from hmgstore.graph import NeighborSampler, Topology, check_fanout, parse_fanout, to_csc


def test_whole_numbers_and_minus_one_pass():
    assert check_fanout([15, np.int64(10), torch.tensor(5), -1, 0]) == [15, 10, 5, -1, 0]
    assert parse_fanout(" 15, 10,5") == [15, 10, 5]


@pytest.mark.parametrize("bad, error, words", [
    ([-5, 5], ValueError, "num_neighbors[0] is -5"),
    ([5, -2], ValueError, "num_neighbors[1] is -2"),
    ([1.5], TypeError, "num_neighbors[0] is 1.5"),
    ([2.0], TypeError, "whole number"),
    ([True], TypeError, "whole number"),
    ("15,10", TypeError, "list of neighbours per hop"),
    (5, TypeError, "list of neighbours per hop"),
])
def test_bad_fanouts_raise_naming_the_hop(bad, error, words):
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        check_fanout(bad)


def test_command_line_fanout_is_a_usage_error():
    p = argparse.ArgumentParser()
    flags.add_fanout(p)
    assert p.parse_args([]).fanout == [15, 10, 5]
    assert p.parse_args(["--fanout", "10,-1"]).fanout == [10, -1]
    for bad in ("-5,5", "1.5", "ten"):
        with pytest.raises(SystemExit):
            p.parse_args(["--fanout", bad])


def test_samplers_refuse_bad_fanouts_before_building_anything():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    topo = Topology(to_csc(ei, "coo", (3, 3)), "cpu", progress=False)
    with pytest.raises(ValueError, match="-5"):
        NeighborSampler({None: topo}, {None: 3}, [-5, 5])
    with pytest.raises(TypeError, match="1.5"):
        NeighborSampler({None: topo}, {None: 3}, [1.5])


def test_pyg_sampler_refuses_bad_fanouts(data):
    from hmgstore.plugins.pyg import HybridNeighborSampler

    with pytest.raises(ValueError, match="-5"):
        HybridNeighborSampler(data, [-5, 5], device="cpu", progress=False)
    with pytest.raises(TypeError, match="1.5"):
        HybridNeighborSampler(data, [1.5], device="cpu", progress=False)
