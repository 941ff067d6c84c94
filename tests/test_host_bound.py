"""hmgstore.host_bound: what a loader's batches read from host memory, and the batches/s that allows.

The counting (rows per tier, distinct 2 MiB pages of the host tier) runs on
the CPU here with the same counter a CUDA table uses; the model is checked
against hand-computed figures from a made-up reach; the GPU test checks the
counts of a real table's zero-copy gathers against ``x[idx]``'s own ids.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from hmgstore.prefetch.pipeline import register_table_finder
from hmgstore.rows.stats import TierCounter
from hmgstore.table.host_pages import Curve, Reach

MiB2 = 2 << 20


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_counter_counts_the_distinct_pages_each_gather_reads(data):
    pitch = data.draw(st.sampled_from([4, 128, 512, 4096, 1 << 20]))
    host_rows = data.draw(st.integers(1, 5000))
    start = data.draw(st.integers(0, 100))
    base = data.draw(st.integers(0, 1 << 40)) // 4 * 4
    counter = TierCounter(("gpu", "host"), pitch, torch.device("cpu"))
    counter.watch_pages(1, start, base, pitch, host_rows)
    expected = 0
    for _ in range(data.draw(st.integers(1, 3))):
        n = data.draw(st.integers(0, 300))
        new = torch.randint(0, start + host_rows, (n,))
        tier = (new >= start).long()
        counter.add_pages(new, tier)
        host = new[tier == 1]
        expected += len({(base + (int(i) - start) * pitch) >> 21 for i in host})
    assert int(counter.pages) == expected
    assert counter.report()["host_pages"] == expected


def test_a_counter_that_watches_no_pages_reports_none():
    counter = TierCounter(("gpu", "host"), 16, torch.device("cpu"))
    counter.add_pages(torch.arange(4), torch.zeros(4, dtype=torch.long))  # not watching: nothing happens
    assert counter.pages is None and "host_pages" not in counter.report()


def _reach(gbps_512: float = 20.0, us_per_page: float = 1.0) -> Reach:
    """A made-up machine: 512 B rows at ``gbps_512`` up to 256 pages, then ``us_per_page`` a page."""
    rows = 100_000
    t0 = rows * 512 / (gbps_512 * 1e9)
    curve = Curve(512, pages=[64, 256, 1024, 2048], rows=[rows] * 4,
                  kernel_seconds=[t0, t0, t0 + 768 * us_per_page * 1e-6, t0 + 1792 * us_per_page * 1e-6])
    return Reach("made-up", 50.0, 4 << 30, {512: curve})


class FakeFormat:
    def pitch(self, elems):
        return elems + 4  # int8 values and a float32 scale


class CountedTable:
    """What host_bound reads of a table: its device, dtype, shape, formats and per-tier counters."""

    def __init__(self, host_rows_per_batch, rows_per_batch, pages_per_batch, *, fmt=None, width=128):
        self.device, self.dtype, self.shape = torch.device("cuda"), torch.float32, (10**6, width)
        self.row_bytes, self.host_format = 4 * width, fmt
        self.per = (host_rows_per_batch, rows_per_batch, pages_per_batch)
        self.counter, self.batches, self.resets = None, 0, []

    def reset_stats(self, counting=True):
        self.resets.append(counting)
        self.counter = object() if counting else None
        self.batches = 0

    def stats(self):
        host, rows, pages = (v * self.batches for v in self.per)
        return {"rows": rows, "tiers": {"gpu": {"rows": rows - host}, "host": {"rows": host}}, "host_pages": pages}


class CountingLoader:
    def __init__(self, tables, batches):
        self.tables, self.n = tables, batches

    def __iter__(self):
        for k in range(self.n):
            if k:  # the warm-up batch is drawn before the counts are read
                for t in self.tables:
                    t.batches += 1
            yield k


register_table_finder(lambda loader: loader.tables if isinstance(loader, CountingLoader) else None)


def test_bytes_bound_float32_table_says_compress():
    table = CountedTable(host_rows_per_batch=200_000, rows_per_batch=400_000, pages_per_batch=100)
    bound = hmgstore.host_bound(CountingLoader([table], 5), batches=4, reach=_reach(gbps_512=20.0))
    assert bound.host_rows == 200_000 and bound.rows == 400_000 and bound.host_pages == 100
    assert bound.host_bytes == 200_000 * 512
    assert bound.by == "bytes"
    assert bound.batches_per_s == pytest.approx(20e9 / (200_000 * 512))
    assert "compress='int8'" in str(bound) and "50% of its rows" in str(bound)
    assert table.resets == [True, False]  # counting turned on for the batches, then off again


def test_pages_bound_int8_table_says_a_larger_budget():
    table = CountedTable(host_rows_per_batch=10_000, rows_per_batch=400_000, pages_per_batch=5000, fmt=FakeFormat())
    bound = hmgstore.host_bound(CountingLoader([table], 3), batches=2, reach=_reach(gbps_512=20.0, us_per_page=2.0))
    assert bound.host_bytes == 10_000 * 132  # int8 rows as stored: 128 values and a scale
    assert bound.by == "pages"
    assert bound.batches_per_s == pytest.approx(1 / (5000 * 2e-6), rel=1e-6)
    assert "gpu_budget" in bound.fix


def test_no_host_rows_is_no_bound():
    table = CountedTable(host_rows_per_batch=0, rows_per_batch=1000, pages_per_batch=0)
    bound = hmgstore.host_bound(CountingLoader([table], 2), batches=1, reach=_reach())
    assert math.isinf(bound.batches_per_s) and "not bound by PCIe" in str(bound)


def test_a_table_already_counting_keeps_counting():
    table = CountedTable(100, 1000, 1)
    table.reset_stats()
    hmgstore.host_bound(CountingLoader([table], 3), batches=2, reach=_reach())
    assert table.counter is not None and table.resets == [True]


@pytest.mark.parametrize("batches, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                                            ("2", TypeError)])
def test_batches_is_checked(batches, error):
    with pytest.raises(error, match="batches"):
        hmgstore.host_bound([], batches=batches)


def test_too_short_a_loader_is_refused_with_the_count_to_pass():
    with pytest.raises(ValueError, match="gave 3 batches.*pass batches=2"):
        hmgstore.host_bound(CountingLoader([CountedTable(1, 2, 1)], 3), batches=4, reach=_reach())
    with pytest.raises(ValueError, match="gave no batch"):
        hmgstore.host_bound(CountingLoader([CountedTable(1, 2, 1)], 0), batches=1, reach=_reach())


def test_cpu_tables_have_no_pcie_bound():
    x = torch.randn(100, 8)
    table = hmgstore.HybridTensor(x, "cpu")

    class Loader(list):
        pass

    register_table_finder(lambda loader: [table] if isinstance(loader, Loader) else None)
    assert hmgstore.host_bound(Loader([table[torch.arange(10)]] * 3)) is None


@pytest.mark.gpu
def test_a_cuda_tables_host_rows_and_pages_are_counted_exactly():
    torch.manual_seed(0)
    x = torch.randn(200_000, 32)  # 128 B rows: 16384 rows a 2 MiB page
    gpu_rows = torch.arange(0, 200_000, 3)
    table = hmgstore.HybridTensor(x, "cuda", gpu_rows=gpu_rows)
    batches = [torch.randint(0, 200_000, (5000,)) for _ in range(4)]

    class Loader:
        def __iter__(self):
            for ids in batches:
                out = table[ids]
                assert torch.equal(out.cpu(), x[ids])  # exact rows while counting
                yield out

    register_table_finder(lambda loader: [table] if isinstance(loader, Loader) else None)
    bound = hmgstore.host_bound(Loader(), batches=3, reach=_reach())
    resident = torch.zeros(200_000, dtype=torch.bool)
    resident[gpu_rows] = True
    host = [ids[~resident[ids]] for ids in batches[1:]]
    assert bound.host_rows == pytest.approx(sum(len(h) for h in host) / 3)
    host_tier = next(t for t in table.tiers if t.name == "host")
    new_of_old = table.row_map.cpu() if table.row_map is not None else torch.arange(200_000)
    pages = [len({(host_tier.base + (int(new_of_old[i]) - host_tier.start) * host_tier.pitch) >> 21 for i in h})
             for h in host]
    assert bound.host_pages == pytest.approx(sum(pages) / 3)
    assert table.counter is None  # counting was off before, and is off again
    table.close()
