"""Wide fanouts on the CPU: Floyd's positions drawn seed by seed (a set for the "drawn before?" test) are the
positions of the all-seeds-at-once loop, which is quadratic in the fanout."""
import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hmgstore.graph import hop


@settings(max_examples=40, deadline=None)
@given(degrees=st.lists(st.integers(0, 300), min_size=1, max_size=6), fanout=st.integers(1, 300),
       key=st.integers(0, 2**63 - 1), data=st.data())
def test_seed_by_seed_positions_are_the_all_at_once_positions(degrees, fanout, key, data):
    degree = torch.tensor(degrees)
    count = torch.minimum(degree, torch.tensor(fanout))
    index = torch.tensor(data.draw(st.lists(st.integers(0, 10**6), min_size=len(degrees), max_size=len(degrees))))
    old = hop.FLOYD_SET_WIDTH
    try:
        hop.FLOYD_SET_WIDTH = 10**9
        at_once = hop._floyd_cpu(key, index, count, degree)
        hop.FLOYD_SET_WIDTH = 0
        by_seed = hop._floyd_cpu(key, index, count, degree)
    finally:
        hop.FLOYD_SET_WIDTH = old
    assert torch.equal(at_once, by_seed)
    for row, c, d in zip(by_seed.tolist(), count.tolist(), degrees):  # c distinct positions of the list, then -1
        assert len(set(row[:c])) == c and all(0 <= p < d for p in row[:c]) and all(p == -1 for p in row[c:])


def test_a_wide_fanout_is_linear_in_its_slots():
    degree, count = torch.tensor([200_000]), torch.tensor([100_000])
    start = time.perf_counter()
    chosen = hop._floyd_cpu(7, torch.tensor([3]), count, degree)
    assert time.perf_counter() - start < 10  # 34 s with the all-at-once loop on a 2-core CPU
    assert len(set(chosen[0].tolist())) == 100_000
