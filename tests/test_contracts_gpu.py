"""The contracts whose CUDA paths differ from the CPU's: checked on a GPU (skipped without one).

Rows at the extremes of every stored format decode on the GPU bit for bit
as on the CPU, in both tiers; a memmap under a live CUDA table that is cut
short is refused at the next gather before a kernel reads a lost page; a
CUDA table sent to another process refuses a replaced file; bad CUDA ids
stay checked on the GPU and are reported at the next call.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hmgstore
from hmgstore.rows import formats
from hmgstore.rows.file_identity import FileChangedError

FLT_MAX = float(torch.finfo(torch.float32).max)
EXTREMES = st.sampled_from([FLT_MAX, -FLT_MAX, FLT_MAX / 3, 1.0, 0.0, 1e-38, -1e-44, 3e38, 448.0, -1e-30])


@pytest.mark.gpu
@given(st.sampled_from(["int8", "float8", "bfloat16", "float16"]),
       st.lists(st.lists(EXTREMES, min_size=8, max_size=8), min_size=2, max_size=12), st.data())
def test_extremes_decode_on_the_gpu_as_on_the_cpu(name, rows, data):
    x = torch.tensor(rows, dtype=torch.float32)
    fmt = formats.get(name)
    resident = data.draw(st.integers(0, len(rows)))
    try:
        expected = fmt.decode(fmt.encode(x), (8,))
    except ValueError as err:  # a 16-bit format refuses finite values past its range, the CUDA table alike
        assert not fmt.scaled and "largest finite value" in str(err)
        with pytest.raises(ValueError, match="largest finite value"):
            hmgstore.HybridTensor(x, "cuda", compress=name, gpu_rows=torch.arange(resident), progress=False)
        return
    table = hmgstore.HybridTensor(x, "cuda", compress=name, gpu_rows=torch.arange(resident), progress=False)
    got = table[torch.arange(len(rows))].cpu()
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))  # bit for bit, both tiers
    assert bool(torch.isfinite(got).all()) or not fmt.scaled
    table.close()


@pytest.mark.gpu
def test_a_memmap_cut_short_under_a_cuda_table_is_refused_before_a_kernel_reads(tmp_path):
    path = tmp_path / "m.npy"
    np.save(path, np.arange(200_000 * 32, dtype=np.float32).reshape(200_000, 32))  # past the 64 MiB copy
    table = hmgstore.HybridTensor(np.load(path, mmap_mode="r"), "cuda", progress=False)
    assert table[torch.tensor([199_999])].shape == (1, 32)
    os.truncate(path, 1 << 20)
    for ids in (torch.tensor([199_999]), torch.tensor([199_999], device="cuda")):
        with pytest.raises(RuntimeError, match=r"m\.npy was cut short under a live table"):
            table[ids]
    table.close()


@pytest.mark.gpu
def test_a_cuda_memmap_table_sent_elsewhere_refuses_a_replaced_file(tmp_path):
    path = tmp_path / "m.npy"
    np.save(path, np.ones((1000, 8), dtype=np.float32))
    table = hmgstore.HybridTensor(np.load(path, mmap_mode="r"), "cuda", progress=False)
    sent = pickle.dumps(table)
    np.save(tmp_path / "other.npy", np.zeros((1000, 8), dtype=np.float32))
    os.replace(tmp_path / "other.npy", path)
    with pytest.raises(FileChangedError, match=r"m\.npy was replaced by another file \(another inode\)"):
        pickle.loads(sent)
    table.close()


@pytest.mark.gpu
@given(st.integers(0, 200), st.booleans())
def test_bad_cuda_ids_stay_checked_on_the_gpu_and_raise_at_the_next_call(bad_offset, sync):
    x = torch.arange(300 * 4, dtype=torch.float32).reshape(300, 4)
    table = hmgstore.HybridTensor(x, "cuda", gpu_rows=torch.arange(0, 300, 3), progress=False)
    ids = torch.tensor([1, 300 + bad_offset, 2], device="cuda")
    if sync:
        with pytest.raises(IndexError, match=rf"index {300 + bad_offset} at position 1"):
            table.gather(ids, check="sync")
    else:
        table.gather(ids)  # returns without waiting
        torch.cuda.synchronize()
        with pytest.raises(IndexError, match=rf"index {300 + bad_offset} at position 1"):
            table[torch.tensor([0])]
    assert torch.equal(table[torch.tensor([299, 0], device="cuda")].cpu(), x[[299, 0]])  # the context lives
    table.close()
