"""Placement: parsing budgets, hotness order, tiers and the new-id map (CPU)."""
import pytest
import torch

import hmgstore
from hmgstore.rows import hotness, placement


@pytest.mark.parametrize("text, value", [(1000, 1000), ("8GB", 8 * 10**9), ("512 MiB", 512 * 2**20),
                                         ("1.5e3", 1500), ("2gib", 2 * 2**30), ("0", 0)])
def test_parse_bytes(text, value):
    assert hotness.parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["eight GB", "8 parsecs", -1, True, "1e400", float("inf"), float("nan"), "1..2GB"])
def test_parse_bytes_refuses(bad):
    with pytest.raises(ValueError):
        hotness.parse_bytes(bad)


def test_nan_hotness_is_refused():
    with pytest.raises(ValueError, match="row 1 is NaN"):
        hotness.order_by_score(torch.tensor([1.0, float("nan"), 3.0]))
    with pytest.raises(ValueError, match="NaN"):
        hotness.hot_rows_under_budget({"a": torch.tensor([float("nan"), 1.0]), "b": torch.tensor([2.0])},
                                        {"a": 4, "b": 4}, 100)


def test_order_by_score_is_stable_and_hottest_first():
    assert hotness.order_by_score(torch.tensor([1, 5, 5, 0, 3])).tolist() == [1, 2, 4, 0, 3]
    with pytest.raises(ValueError):
        hotness.order_by_score(torch.ones(2, 2))


def test_by_hotness_takes_what_fits():
    order = torch.tensor([9, 3, 7, 1])
    assert hotness.by_hotness(order, 250, row_bytes=100).tolist() == [9, 3]
    assert hotness.by_hotness(order, "1KB", row_bytes=100).tolist() == [9, 3, 7, 1]


def test_by_ids_renumbers_into_contiguous_tiers():
    p = placement.by_ids(6, torch.tensor([4, 1]))
    assert p.names == ("gpu", "host") and p.bounds == (0, 2, 8)
    # GPU rows get slots 0, 1 in the given order; host rows keep their position after the GPU tier.
    assert p.new_of_old().tolist() == [2, 1, 4, 5, 0, 7]
    assert p.has_host_tier and p.num_gpu_rows == 2


def test_all_rows_resident_needs_no_map():
    p = placement.by_ids(5, torch.tensor([3, 0, 4, 1, 2]))
    assert p.names == ("gpu",) and p.bounds == (0, 5) and p.new_of_old() is None
    assert p.gpu_rows.tolist() == [0, 1, 2, 3, 4] and not p.has_host_tier


def test_by_ids_refuses_bad_ids():
    with pytest.raises(IndexError):
        placement.by_ids(5, [0, 5])
    with pytest.raises(ValueError, match="more than once"):
        placement.by_ids(5, [1, 1])
    assert placement.by_ids(5, []).names == ("host",)


def test_hot_rows_under_budget():
    hot = {"a": torch.tensor([5.0, 1.0, 9.0]), "b": torch.tensor([7, 0])}
    rows = hotness.hot_rows_under_budget(hot, {"a": 10, "b": 100}, 115)
    assert rows["a"].tolist() == [2] and rows["b"].tolist() == [0]  # 9 (a2), then 7 (b0): 110 bytes
    rows = hotness.hot_rows_under_budget(hot, {"a": 10, "b": 100}, "1KB")
    assert rows["a"].tolist() == [2, 0, 1] and rows["b"].tolist() == [0, 1]
    assert all(len(r) == 0 for r in hotness.hot_rows_under_budget(hot, {"a": 10, "b": 100}, 0).values())
    score = torch.rand(100)
    order = hotness.order_by_score(score)
    assert torch.equal(hotness.hot_rows_under_budget({None: score}, {None: 8}, 80)[None],
                       hotness.by_hotness(order, 80, 8))


def test_sharded_deals_hot_rows_in_turn():
    order = torch.tensor([9, 3, 7, 1, 0, 5, 2, 8, 4, 6])
    # 4 rows per GPU (row_bytes 10, budget 40): 1 replicated, 3 per shard on 2 GPUs.
    p = placement.sharded(10, order, 10, 2, 40, replicate=10)
    assert p.names == ("replica", "shard0", "shard1", "host")
    assert p.rows_of("replica").tolist() == [9]
    assert p.rows_of("shard0").tolist() == [3, 1, 5] and p.rows_of("shard1").tolist() == [7, 0, 2]
    assert p.bounds == (0, 1, 4, 7, 17) and p.resident_rows == 7 and p.num_shards == 2
    new = p.new_of_old()
    for t, lo in zip(p.names[:-1], p.bounds):
        assert new[p.rows_of(t)].tolist() == list(range(lo, lo + len(p.rows_of(t))))
    for host_row in (8, 4, 6):  # host rows keep their place after the resident tiers
        assert new[host_row] == 7 + host_row
    assert p.num_gpu_rows == 0  # a sharded table has no single GPU tier


def test_sharded_unreachable_shard_reads_host():
    p = placement.sharded(6, torch.arange(6), 4, 2, 8)  # 2 rows per GPU, no replica
    assert p.names == ("shard0", "shard1", "host")
    new = p.new_of_old(host_tiers=("shard1",))
    assert new[p.rows_of("shard0")].tolist() == [0, 1]
    assert new[p.rows_of("shard1")].tolist() == [4 + r for r in p.rows_of("shard1").tolist()]


def test_sharded_everything_resident_and_partial_orders():
    p = placement.sharded(5, torch.arange(5), 1, 3, "2B")
    assert not p.has_host_tier and p.resident_rows == 5
    assert sorted(torch.cat(p.resident).tolist()) == [0, 1, 2, 3, 4]
    p = placement.sharded(5, torch.tensor([4]), 1, 2, 100)  # unlisted rows stay on the host
    assert p.resident_rows == 1 and p.has_host_tier


def test_sharded_refuses_bad_arguments():
    with pytest.raises(ValueError, match="must fit in gpu_budget"):
        placement.sharded(5, torch.arange(5), 1, 2, 2, replicate=3)
    with pytest.raises(ValueError, match="more than once"):
        placement.sharded(5, torch.tensor([1, 1, 2]), 1, 2, 2)
    with pytest.raises(IndexError):
        placement.sharded(5, torch.tensor([7]), 1, 2, 2)
    with pytest.raises(ValueError, match="1 to 8 GPUs"):
        placement.sharded(5, torch.arange(5), 1, 9, 2)


CUDA = torch.device("cuda")  # for_table only computes ids; the device names where they would go


def test_hot_order_refuses_float_ids_and_says_what_it_wants():
    for bad in (torch.tensor([0.5, 1.7]), [0.5, 1.7], torch.tensor([1.0, 0.0], dtype=torch.float64)):
        with pytest.raises(TypeError, match=r"hot_order is row ids, hottest first.*hotness=score"):
            placement.for_table(50, 16, CUDA, gpu_budget=32, hot_order=bad)
    with pytest.raises(TypeError, match="hot_order is row ids"):
        placement.for_table(2, 16, CUDA, gpu_budget=32, hot_order=torch.tensor([True, False]))


def test_every_hot_order_id_is_checked_not_only_those_within_the_budget():
    # 2 rows fit in the budget; ids past them are checked too
    with pytest.raises(IndexError, match=r"hot_order.*index 1000000 at position 2"):
        placement.for_table(50, 16, CUDA, gpu_budget=32, hot_order=[0, 1, 10**6])
    with pytest.raises(IndexError, match="index -1 at position 3"):
        placement.for_table(50, 16, torch.device("cpu"), gpu_budget=32, hot_order=[0, 1, 2, -1])
    with pytest.raises(ValueError, match="lists row 1 more than once"):
        placement.for_table(50, 16, CUDA, gpu_budget=32, hot_order=[0, 1, 2, 1])
    with pytest.raises(IndexError, match="hot_order"):
        placement.sharded(5, torch.tensor([0, 1, 9]), 1, 1, 2)
    with pytest.raises(ValueError, match="more than once"):
        placement.sharded(5, torch.tensor([0, 1, 2, 1]), 1, 1, 2)


def test_scores_given_as_hot_order_are_named_as_such():
    degrees = torch.tensor([3, 0, 3, 1, 0, 2])  # a score per row, not an order of ids
    with pytest.raises(ValueError, match=r"hot_order lists row 3 more than once.*ordering of row ids.*"
                                         r"hotness=score.*order_by_score"):
        placement.for_table(6, 16, CUDA, gpu_budget=32, hot_order=degrees)


def test_hotness_is_a_score_per_row():
    degrees = torch.tensor([3, 0, 5, 1, 0, 2])
    p = placement.for_table(6, 16, CUDA, gpu_budget=48, hotness=degrees)
    assert p.gpu_rows.tolist() == [2, 0, 5]  # the 3 hottest, hottest first
    scores = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.0, 0.3])
    assert placement.for_table(6, 16, CUDA, gpu_budget=32, hotness=scores).gpu_rows.tolist() == [1, 2]
    with pytest.raises(ValueError, match="hotness has 5 entries for 6 rows"):
        placement.for_table(6, 16, CUDA, gpu_budget=32, hotness=scores[:5])
    with pytest.raises(ValueError, match="NaN"):
        placement.for_table(6, 16, CUDA, gpu_budget=32, hotness=torch.tensor([float("nan")] * 6))
    with pytest.raises(ValueError, match="not both"):
        placement.for_table(6, 16, CUDA, gpu_budget=32, hotness=scores, hot_order=[0])
    with pytest.raises(ValueError, match="only used with gpu_budget"):
        placement.for_table(6, 16, CUDA, hotness=scores)


def test_a_budget_alone_keeps_rows_in_id_order():
    """The one default, on every device: without hot_order or hotness, the first rows that fit."""
    assert placement.for_table(50, 16, CUDA, gpu_budget=160).gpu_rows.tolist() == list(range(10))
    assert placement.for_table(50, 16, torch.device("cpu"), gpu_budget=160).names == ("host",)
    assert placement.for_table(50, 16, CUDA, gpu_budget="1MB").names == ("gpu",)


def test_odd_orders_scores_and_rows_are_refused_by_name():
    assert placement.for_table(50, 16, CUDA, gpu_budget=32, hot_order=[]).names == ("host",)  # nothing is hot
    with pytest.raises(ValueError, match=r"hot_order must be 1-D.*got shape \(2, 2\)"):
        placement.for_table(50, 16, CUDA, gpu_budget=32, hot_order=torch.tensor([[3, 2], [1, 0]]))
    with pytest.raises(ValueError, match=r"hotness must be 1-D.*got shape \(5, 10\)"):
        placement.for_table(50, 16, CUDA, gpu_budget=32, hotness=torch.rand(5, 10))
    for bad in ("abc", {"paper": torch.rand(50)}):
        with pytest.raises(TypeError, match="hotness is one real score per row"):
            placement.for_table(50, 16, CUDA, gpu_budget=32, hotness=bad)
    with pytest.raises(TypeError, match="gpu_rows.*integer"):
        placement.for_table(50, 16, CUDA, gpu_rows=torch.tensor([1.0]))


@pytest.mark.parametrize("size", [2.5, 0.2, "2.5", "0.5B", 1e9 + 0.5])
def test_bytes_with_a_fraction_are_refused_with_the_unit_to_write(size):
    with pytest.raises(ValueError, match="not a whole number of bytes.*GB"):
        hotness.parse_bytes(size)
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        hotness.parse_budget(size)


@pytest.mark.parametrize("size, value", [(2.0, 2), (1e9, 10**9), ("1.5e9", 1_500_000_000), ("2.5GB", 2_500_000_000),
                                         ("0.5KiB", 512)])
def test_whole_bytes_and_fractions_of_a_unit_are_read(size, value):
    assert hotness.parse_bytes(size) == value


def test_by_hotness_states_and_keeps_its_contract():
    assert hotness.by_hotness(torch.tensor([5, 1, 3]), 24, 8).tolist() == [5, 1, 3]
    assert hotness.by_hotness([5, 1, 3], "16B", 8).tolist() == [5, 1]
    assert hotness.by_hotness(torch.tensor([5, 1]), 100, 0).tolist() == []  # rows of no bytes: none resident
    with pytest.raises(TypeError, match="order holds torch.float32"):
        hotness.by_hotness(torch.tensor([1.0, 2.0]), 100, 8)
    with pytest.raises(ValueError, match="order must be 1-D"):
        hotness.by_hotness(torch.zeros(2, 2, dtype=torch.int64), 100, 8)
    with pytest.raises(TypeError, match="row_bytes"):
        hotness.by_hotness(torch.tensor([1]), 100, True)
    with pytest.raises(ValueError, match="row_bytes"):
        hotness.by_hotness(torch.tensor([1]), 100, -4)
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        hotness.by_hotness(torch.tensor([1]), 2.5, 8)


def test_an_order_that_is_not_ids_is_named_and_a_uint8_order_is_ids():
    """A layout or hot order is a list of rows: a string is refused naming the argument (not as a table index),
    and a uint8 tensor is read as ids (never as the mask torch would make of a uint8 index)."""
    x = torch.arange(8.0).reshape(4, 2)
    with pytest.raises(TypeError, match=r"layout is row ids \(an integer tensor, numpy array or list\), got str"):
        hmgstore.HybridTensor(x, "cpu", layout="zz")
    table = hmgstore.HybridTensor(x, "cpu", layout=torch.tensor([3, 1, 0, 2], dtype=torch.uint8), progress=False)
    assert torch.equal(table[torch.arange(4)], x)


def test_a_misspelt_backing_is_refused_even_where_nothing_is_copied():
    with pytest.raises(ValueError, match=r"backing must be one of \('auto', 'hugepage', 'cuda'\), got 'zz'"):
        hmgstore.HybridTensor(torch.ones(4, 2), "cpu", backing="zz")
