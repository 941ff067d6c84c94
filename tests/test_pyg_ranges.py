"""Contiguous rows of a PyG store read as one slice of host memory (hmgstore.plugins.pyg.ranges).

``store[group, name, lo:hi]`` and a tensor of consecutive ids give the rows a
gather gives; on a CPU store the result is a view of the host tier (no
copy), except for read-only and stored-format sources; random ids, other
steps and ids out of range still go through the gather and its checks.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch_geometric")

from hmgstore.plugins import pyg as hpyg  # noqa: E402
from hmgstore.plugins.pyg import ranges  # noqa: E402

N = 3 * ranges.MIN_RUN


@pytest.fixture()
def x():
    return torch.randn(N, 6, generator=torch.Generator().manual_seed(0))


def test_as_range_names_runs_only():
    assert ranges.as_range(slice(5, 20), N) == (5, 20)
    assert ranges.as_range(slice(None), N) == (0, N)
    assert ranges.as_range(slice(-10, None), N) == (N - 10, N)
    assert ranges.as_range(slice(20, 5), N) == (20, 20)  # empty, as in torch
    assert ranges.as_range(slice(0, 20, 2), N) is None
    run = torch.arange(100, 100 + ranges.MIN_RUN)
    assert ranges.as_range(run, N) == (100, 100 + ranges.MIN_RUN)
    assert ranges.as_range(run.int(), N) == (100, 100 + ranges.MIN_RUN)
    assert ranges.as_range(run[:10], N) is None  # short: the gather is cheap
    holes = run.clone()
    holes[5], holes[6] = holes[6], holes[5]  # same ends and length, not in order
    assert ranges.as_range(holes, N) is None
    assert ranges.as_range(torch.arange(N - 10, N - 10 + ranges.MIN_RUN), N) is None  # past the end: the gather says
    assert ranges.as_range(run.float(), N) is None


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_runs_of_unsigned_ids_read_as_runs_and_ids_past_int64_still_raise(x, dtype):
    """Unsigned ids, which the gather takes, are runs too (torch has no diff() for them); a uint64 id of 2**63
    or more inside a run turns negative as int64, so it is no run and reaches the gather's IndexError."""
    store = hpyg.HybridFeatureStore("cpu")
    store.put_tensor(x, group_name=None, attr_name="x")
    run = torch.arange(7, 7 + ranges.MIN_RUN).to(dtype)
    assert ranges.as_range(run, N) == (7, 7 + ranges.MIN_RUN)
    assert torch.equal(store.get_tensor(None, "x", run), x[7:7 + ranges.MIN_RUN])
    if dtype == torch.uint64:
        far = torch.from_numpy(np.arange(7, 7 + ranges.MIN_RUN, dtype=np.uint64))
        far[5] = torch.from_numpy(np.array([2**63 + 3], dtype=np.uint64))[0]
        assert ranges.as_range(far, N) is None
        with pytest.raises(IndexError, match="out of range"):
            store.get_tensor(None, "x", far)


def test_cpu_store_reads_a_run_as_a_view_of_host_memory(x):
    store = hpyg.HybridFeatureStore("cpu")
    store.put_tensor(x, group_name=None, attr_name="x")
    got = store.get_tensor(None, "x", slice(10, 5000))
    assert torch.equal(got, x[10:5000]) and got.data_ptr() == x[10:].data_ptr()
    run = torch.arange(7, 7 + ranges.MIN_RUN)
    got = store.get_tensor(None, "x", run)
    assert torch.equal(got, x[run]) and got.data_ptr() == x[7:].data_ptr()
    assert torch.equal(store[None, "x", 100:200], x[100:200])
    rand = torch.randint(0, N, (ranges.MIN_RUN,))
    both = store.multi_get_tensor([store._tensor_attr_cls(None, "x", rand), store._tensor_attr_cls(None, "x", run)])
    assert torch.equal(both[0], x[rand]) and torch.equal(both[1], x[run])
    with pytest.raises(IndexError):
        store.get_tensor(None, "x", torch.arange(N - 5, N + ranges.MIN_RUN))


def test_read_only_and_half_width_sources_are_copied_or_decoded(x, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, x.numpy())
    stores = hpyg.from_tensors(edge_index=torch.zeros(2, 0, dtype=torch.int64), num_nodes=N, device="cpu",
                               x=np.load(path, mmap_mode="r"))
    got = stores[0].get_tensor(None, "x", slice(0, 300))
    assert torch.equal(got, x[:300]) and got.is_contiguous()
    got[0] = 0  # a copy: writing to it is safe
    half = hpyg.HybridFeatureStore.from_sources({(None, "x"): x}, "cpu", host_dtype=torch.bfloat16)
    assert torch.equal(half.get_tensor(None, "x", slice(3, 40)), x[3:40].to(torch.bfloat16).float())


def test_a_torch_tensor_over_read_only_pages_is_read_as_a_copy(x, tmp_path):
    """torch.from_numpy of a memmap opened "r" is writable to torch; a view of it handed out would crash the
    process (SIGSEGV) at the caller's first in-place edit, so a range of it is copied."""
    path = tmp_path / "x.npy"
    np.save(path, x.numpy())
    with warnings.catch_warnings():  # torch's "not writable" warning, given once a process
        warnings.simplefilter("ignore")
        source = torch.from_numpy(np.load(path, mmap_mode="r"))
    store = hpyg.HybridFeatureStore.from_sources({(None, "x"): source}, "cpu")
    for index in (slice(5, 300), torch.arange(7, 7 + ranges.MIN_RUN)):
        got = store.get_tensor(None, "x", index)
        assert torch.equal(got, x[index])
        end = source.data_ptr() + source.numel() * source.element_size()
        assert not source.data_ptr() <= got.data_ptr() < end, "a view of the read-only pages"
        got[0] = -1  # a copy: safe
    assert torch.equal(store.get_tensor(None, "x", slice(5, 6)), x[5:6])


@pytest.mark.gpu
def test_cuda_store_reads_a_run_in_one_copy(x, cuda_device):
    store = hpyg.HybridFeatureStore.from_sources({(None, "x"): x}, cuda_device, gpu_budget="8KB",
                                                 hotness={None: torch.arange(N)})
    got = store.get_tensor(None, "x", slice(N - 4000, N))  # the hot rows included: the host tier has them too
    assert got.is_cuda and torch.equal(got.cpu(), x[N - 4000:])



@settings(max_examples=20, deadline=None)
@given(compress=st.sampled_from([None, "int8", "bfloat16"]), seed=st.integers(0, 2**31 - 1),
       a=st.integers(0, N), b=st.integers(0, N), as_tensor=st.booleans())
def test_ranges_of_a_laid_out_table_are_its_rows_by_id(compress, seed, a, b, as_tensor):
    """A table whose host tier keeps rows in a layout's order has no id-ordered slice to hand out: a range of
    ids (a slice, or MIN_RUN and more consecutive ids) is gathered instead, and equals the same read of the
    table kept in id order bit for bit (x itself for float32 rows). It once recursed for ever."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=gen)
    lo, hi = min(a, b), max(a, b)
    if as_tensor and hi - lo < ranges.MIN_RUN:  # a shorter tensor is not a run: gathered anyway
        lo, hi = max(0, hi - ranges.MIN_RUN), max(hi, ranges.MIN_RUN)
    index = torch.arange(lo, hi) if as_tensor else slice(lo, hi)
    data = Data(x=x, edge_index=torch.tensor([[0, 1], [1, 2]]))
    plain, _ = hpyg.from_data(data, device="cpu", gpu_budget=None, compress=compress, progress=False)
    laid, _ = hpyg.from_data(data, device="cpu", gpu_budget=None, compress=compress, progress=False,
                             layout=torch.randperm(N, generator=gen))
    got = laid[None, "x", index]
    assert got.shape == (hi - lo, 6) and torch.equal(got, plain[None, "x", index])
    if compress is None:
        assert torch.equal(got, x[lo:hi])
