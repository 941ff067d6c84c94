"""gather_many's outs: any two that share a byte, or an out inside any table of the gather, are refused before a
row is written; outs apart from each other and from the tables get exactly ``table[ids]``."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore


def _tables():
    first = hmgstore.HybridTensor(torch.arange(40, dtype=torch.float32).view(10, 4) + 1, "cpu")
    second = hmgstore.HybridTensor(torch.arange(40, dtype=torch.float32).view(10, 4) + 101, "cpu")
    return first, second


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 6), b=st.integers(0, 6), n=st.integers(1, 4))
def test_outs_in_one_buffer_are_refused_where_they_meet(a, b, n):
    first, second = _tables()
    buf = torch.full((10, 4), -7.0)  # poison: a row left unwritten shows
    ids_a, ids_b = list(range(n)), list(range(9, 9 - n, -1))
    outs = [buf[a:a + n], buf[b:b + n]]
    if a < b + n and b < a + n:  # the two windows share rows
        with pytest.raises(ValueError, match="outs 0 and 1 share memory"):
            hmgstore.gather_many([(first, ids_a), (second, ids_b)], outs=outs)
        assert torch.equal(buf, torch.full((10, 4), -7.0)), "nothing is written before the refusal"
        return
    got = hmgstore.gather_many([(first, ids_a), (second, ids_b)], outs=outs)
    assert torch.equal(got[0], first.source[ids_a]) and torch.equal(got[1], second.source[ids_b])
    assert torch.equal(buf[a:a + n], first.source[ids_a]) and torch.equal(buf[b:b + n], second.source[ids_b])


@pytest.mark.parametrize("whose", [0, 1])
def test_an_out_inside_another_table_of_the_gather_is_refused(whose):
    first, second = _tables()
    before = second.source.clone()
    outs = [second.source[0:4], None] if whose == 0 else [None, first.source[0:4]]
    with pytest.raises(ValueError, match=rf"the table of request {1 - whose} \(out {whose}:"):
        hmgstore.gather_many([(first, [0, 1, 2, 3]), (second, [5, 6, 7, 8])], outs=outs)
    assert torch.equal(second.source, before)


def _int_table(device):
    """Rows of int64, the ids' own dtype: an id buffer fits such a table's out."""
    return hmgstore.HybridTensor(torch.arange(40, dtype=torch.int64).view(20, 2) * 10 + 7, device)


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("whose", [0, 1])
def test_an_out_over_another_requests_ids_is_refused(device, whose):
    table = _int_table(device)
    first = torch.tensor([3, 4, 5, 6] * 4, device=device)  # request 0's 4 ids lead a buffer of 16
    second = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], device=device)
    requests = [(table, first[:4]), (table, second)]
    outs = [None, first.view(8, 2)] if whose == 0 else [second.view(4, 2), None]
    before = [first.clone(), second.clone()]
    with pytest.raises(ValueError, match=f"the ids of request {whose}"):
        hmgstore.gather_many(requests, outs=outs)
    assert torch.equal(first, before[0]) and torch.equal(second, before[1]), "nothing written before the refusal"


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_over_the_gathers_own_ids_is_refused_and_a_neighbouring_one_is_not(device):
    table = _int_table(device)
    buf = torch.tensor([1, 2, 0, 0, 0, 0], device=device)
    with pytest.raises(ValueError, match="shares memory with the ids"):
        table.gather(buf[:2], out=buf[:4].view(2, 2))
    got = table.gather(buf[:2], out=buf[2:].view(2, 2))  # beside the ids, not over them: exact rows
    assert torch.equal(got.cpu(), torch.tensor([[27, 37], [47, 57]]))
