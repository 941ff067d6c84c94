"""Fused gathers (hmgstore.gather.fusion): several batches' gathers recorded, then one job per table, one launch.

On the CPU a window changes nothing. On a GPU (gpu marker) the outputs equal ``x[idx]`` byte for byte once the
block ends, whatever the tiers, formats, layouts and id kinds; a window flushes in one launch; bad ids are still
reported; ``Pipeline(fuse=k)`` yields the same batches as without it, and an error in a group still arrives after
the batches made before it.
"""
from __future__ import annotations

import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore.gather.fusion import fused


def test_without_a_gpu_a_window_changes_nothing():
    x = random_table(1000, (8,), torch.float32, seed=1)
    t = hmgstore.HybridTensor(x, "cpu")
    with fused("cpu") as window:
        assert window is None
        idx = torch.randint(0, 1000, (300,))
        assert_same(t[idx], x[idx])  # read at once: nothing is deferred on the CPU


def test_pipeline_fuse_is_checked_and_ignored_on_the_cpu():
    with pytest.raises(ValueError, match="at least 1"):
        hmgstore.Pipeline([], fuse=0)
    batches = [{"i": i, "x": torch.full((3,), float(i))} for i in range(7)]
    assert [b["i"] for b in hmgstore.Pipeline(batches, fuse=3)] == list(range(7))


@pytest.mark.gpu
def test_a_window_writes_every_output_at_its_end_in_one_launch(cuda_device, monkeypatch):
    from hmgstore.cuda import gather

    x = random_table(50_000, (24,), torch.float32, seed=2)
    y = torch.arange(50_000)
    feats = hmgstore.HybridTensor(x, cuda_device, gpu_rows=torch.arange(0, 50_000, 3), progress=False)
    small = hmgstore.HybridTensor(x, cuda_device, compress="int8", layout=torch.randperm(50_000), progress=False)
    labels = hmgstore.HybridTensor(y, cuda_device)
    launches = []
    real = gather.run
    monkeypatch.setattr(gather, "run", lambda packed, *a, **k: launches.append(packed) or real(packed, *a, **k))
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 50_000, (4000 + 500 * k,), generator=g) for k in range(5)]
    got = []
    with fused(cuda_device, batches=2):  # more batches than expected: a second buffer per table
        for k, idx in enumerate(batches):
            ids = idx.to(cuda_device) if k % 2 else idx  # GPU ids and CPU ids
            got.append(hmgstore.gather_many([(feats, ids), (small, ids), (labels, ids)]))
        assert not launches  # nothing ran yet
    assert len(launches) == 1 and launches[0].num_jobs >= 3  # one launch; a job per buffer
    want_small = hmgstore.rows.formats.get("int8").decode(hmgstore.rows.formats.get("int8").encode(x), (24,))
    for idx, (f, s, lab) in zip(batches, got):
        assert_same(f.cpu(), x[idx])
        assert_same(s.cpu(), want_small[idx])
        assert_same(lab.cpu(), y[idx])


@pytest.mark.gpu
def test_gathers_with_an_out_run_at_once_and_bad_ids_are_still_reported(cuda_device):
    x = random_table(10_000, (8,), torch.float32, seed=4)
    t = hmgstore.HybridTensor(x, cuda_device)
    out = torch.empty(100, 8, device=cuda_device)
    idx = torch.arange(100)
    with fused(cuda_device):
        t.gather(idx, out=out)
        assert_same(out.cpu(), x[idx])  # written already: it was not recorded
        with pytest.raises(IndexError, match="10000"):
            t[torch.tensor([5, 10_000])]  # CPU ids are checked when recorded
        bad = t[torch.tensor([1, -3], device=cuda_device)]  # GPU ids: the kernel checks them at the end
    with pytest.raises(IndexError, match="-3"):
        hmgstore.raise_deferred(cuda_device)
    del bad


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [1, 3])
def test_pipeline_fuse_yields_the_same_batches(cuda_device, fuse, small_graph):
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    g = small_graph
    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device=cuda_device, progress=False)
    sampler = HybridNeighborSampler(stores, [5, 3], progress=False)
    loader = NeighborLoader(stores, [5, 3], neighbor_sampler=sampler, input_nodes=g.train_idx, batch_size=100)
    torch.manual_seed(0)
    seen = []
    for batch in hmgstore.Pipeline(loader, depth=2, fuse=fuse):
        assert_same(batch.x.cpu(), g.x[batch.n_id.cpu()])
        assert_same(batch.y.cpu(), g.y[batch.n_id.cpu()])
        seen.append(batch.n_id[:batch.batch_size].cpu())
    assert len(seen) == len(loader)
    assert torch.equal(torch.cat(seen).sort().values, g.train_idx.sort().values)


@pytest.mark.gpu
def test_an_error_in_a_fused_group_arrives_after_the_batches_before_it(cuda_device):
    x = random_table(5000, (4,), torch.float32, seed=5)
    t = hmgstore.HybridTensor(x, cuda_device)

    def loader():
        for i in range(8):
            if i == 5:
                raise ValueError("batch 5 could not be made")
            yield i, t[torch.arange(i, i + 100)]

    seen = []
    with pytest.raises(ValueError, match="batch 5"):
        for i, rows in hmgstore.Pipeline(loader(), depth=2, fuse=3):
            assert_same(rows.cpu(), x[i:i + 100])
            seen.append(i)
    assert seen == [0, 1, 2, 3, 4]
