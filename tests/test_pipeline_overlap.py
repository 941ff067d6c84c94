"""Pipeline(overlap_reads=...): a split gather's CPU reads finish on the reader thread while the next batch is made.

Without a GPU: the argument's check, the ``"auto"`` decision, and the
deferral block's bookkeeping (hmgstore.gather.finish_scope) with the reader
thread's order. On a GPU: split gathers inside a pipeline, bit-exact against
``x[idx]`` into poisoned outputs; an error in a deferred finish raised at its
batch; a gather in the block returning while its reads are still held back.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore.gather import cpu_share as split
from hmgstore.gather import finish_scope


# ---- what runs without a GPU -------------------------------------------------------------------------------------
def test_overlap_reads_is_checked():
    for bad in ("yes", 1, 0, None, "Auto"):
        with pytest.raises(ValueError, match="overlap_reads is True, False or 'auto'"):
            hmgstore.Pipeline([], overlap_reads=bad)
        with pytest.raises(ValueError, match="overlap_reads"):
            hmgstore.Producer(list, overlap_reads=bad)
    for good in ("auto", True, False):
        assert hmgstore.Pipeline([], overlap_reads=good).overlap_reads == good


def pyg_loader(small_graph, **kwargs):
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    g = small_graph
    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device="cpu", progress=False)
    sampler = HybridNeighborSampler(stores, [5, 3], progress=False)
    return NeighborLoader(stores, [5, 3], neighbor_sampler=sampler, input_nodes=g.train_idx, batch_size=100, **kwargs)


def test_auto_overlaps_reads_for_a_pyg_loader_without_a_transform_only(small_graph):
    from torch_geometric.loader import NeighborLoader

    plain = pyg_loader(small_graph)
    assert isinstance(plain, NeighborLoader) and plain.transform is None
    assert hmgstore.Pipeline(plain, device=None, overlap_reads="auto")._overlaps_reads()
    assert not hmgstore.Pipeline(plain, device=None, overlap_reads=False)._overlaps_reads()
    transformed = pyg_loader(small_graph, transform=lambda batch: batch)  # could read x before its rows land
    assert not hmgstore.Pipeline(transformed, device=None, overlap_reads="auto")._overlaps_reads()
    assert hmgstore.Pipeline(transformed, device=None, overlap_reads=True)._overlaps_reads()  # the caller's word
    dataloader = torch.utils.data.DataLoader(list(range(10)))  # a collate_fn and no filter_fn: not PyG's
    for unknown in ([1, 2, 3], iter([]), dataloader):
        assert not hmgstore.Pipeline(unknown, device=None, overlap_reads="auto")._overlaps_reads()
        assert hmgstore.Pipeline(unknown, device=None, overlap_reads=True)._overlaps_reads()


def test_a_cpu_pipeline_defers_nothing():
    """On the CPU there is no copy stream: batches are made outside any deferral block, whatever the argument."""
    def loader():
        for i in range(4):
            yield i, finish_scope.deferring()

    for overlap in ("auto", True):
        assert list(hmgstore.Pipeline(loader(), device=None, overlap_reads=overlap)) == [(i, False) for i in range(4)]


def test_the_deferral_block_belongs_to_its_thread_and_nests():
    assert not finish_scope.deferring()
    with pytest.raises(RuntimeError, match="outside deferred_finishes"):
        finish_scope.current()
    seen = {}
    with finish_scope.deferred_finishes() as outer:
        assert outer == [] and finish_scope.deferring() and finish_scope.current() is outer
        other = threading.Thread(target=lambda: seen.update(deferring=finish_scope.deferring()))
        other.start()
        other.join()
        with finish_scope.deferred_finishes() as inner:
            assert finish_scope.current() is inner and inner is not outer
        with finish_scope.inline():  # the split's cost model times whole gathers in here
            assert not finish_scope.deferring()
            with pytest.raises(RuntimeError):
                finish_scope.current()
        assert finish_scope.current() is outer  # back after each nested block
    assert seen == {"deferring": False} and not finish_scope.deferring()
    with pytest.raises(KeyError), finish_scope.deferred_finishes():
        raise KeyError("made while the block was open")
    assert not finish_scope.deferring()  # an error leaves no block behind


def test_work_queued_in_the_block_runs_after_the_reads_before_it():
    """What finish_later relies on: the reader is one thread, so a finish queued after a part's reads sees them
    done; its future (and error) is the block's."""
    x = random_table(40_000, (8,), torch.float32, seed=4)
    ids = torch.randint(0, 40_000, (30_000,), generator=torch.Generator().manual_seed(5))
    into = torch.full((30_000, 8), float("nan"))
    with finish_scope.deferred_finishes() as futures:
        chunks = split.read_chunks(x, ids, into, chunks=3)
        finish_scope.current().append(split._reader.submit(
            lambda: (all(f.done() for _, f in chunks), into.clone())))

        def fails():
            raise ValueError("reading went wrong")

        finish_scope.current().append(split._reader.submit(fails))
    assert len(futures) == 2
    reads_done, rows = futures[0].result(timeout=30)
    assert reads_done and len(chunks) == 3
    assert_same(rows, x[ids])  # every chunk was in place when the work ran
    with pytest.raises(ValueError, match="reading went wrong"):
        futures[1].result(timeout=30)


# ---- on a GPU ------------------------------------------------------------------------------------------------------
N, DIM = 200_000, 32


def split_table(device, compress=None):
    """A table with a host tier and a GPU tier (every 4th row), the host rows read by the CPU (GPU ids)."""
    x = random_table(N, (DIM,), torch.float32, seed=41)
    t = hmgstore.HybridTensor(x, device, gpu_rows=torch.arange(0, N, 4), split=1.0, compress=compress)
    want = x if compress is None else hmgstore.rows.formats.get(compress).decode(
        hmgstore.rows.formats.get(compress).encode(x), (DIM,))
    return t, want


class IdsLoader:
    """A NeighborLoader-like loop: each batch's node ids on the GPU, their rows gathered into a poisoned output
    on the pipeline's stream. Big batches (~90k host rows), so that the CPU's reads tend to outlast the
    hand-over and a consumer stream that did not wait for them would read NaN."""

    def __init__(self, table, batches=6, size=120_000):
        self.table, self.batches, self.size = table, batches, size

    def __len__(self):
        return self.batches

    def __iter__(self):
        for i in range(self.batches):
            g = torch.Generator().manual_seed(100 + i)
            ids = torch.randint(0, N, (self.size,), generator=g).to(self.table.device)
            out = torch.full((self.size, DIM), float("nan"), device=self.table.device)  # poisoned
            self.table.gather(ids, out=out)
            yield i, ids, out


def count_deferred(monkeypatch) -> list:
    calls, real = [], split.finish_later
    monkeypatch.setattr(split, "finish_later", lambda part, out, stream: calls.append(len(part.ids)) or
                        real(part, out, stream))
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("compress", [None, "int8"])
def test_split_gathers_in_an_overlapping_pipeline_are_bit_exact(cuda_device, monkeypatch, compress):
    t, want = split_table(cuda_device, compress)
    deferred = count_deferred(monkeypatch)
    seen = []
    for i, ids, out in hmgstore.Pipeline(IdsLoader(t), depth=2, overlap_reads=True):
        assert_same(out.cpu(), want[ids.cpu()])  # on the consumer's stream, which waited for the copy stream
        seen.append(i)
    assert seen == list(range(6))
    assert len(deferred) == 6 and min(deferred) > split.MIN_IDS  # every batch's host rows read by the CPU, later
    deferred.clear()
    for _i, ids, out in hmgstore.Pipeline(IdsLoader(t, batches=2), overlap_reads="auto"):  # not a PyG loader
        assert_same(out.cpu(), want[ids.cpu()])
    assert deferred == []  # finished inline, as before


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [1, 3])
def test_a_pyg_loader_overlaps_under_auto_and_stays_exact(cuda_device, monkeypatch, fuse):
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.data import synthetic
    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data
    from hmgstore.prefetch.pipeline import side_stream

    g = synthetic(num_nodes=60_000, avg_degree=10, feat_dim=32, num_classes=4, seed=3)
    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device=cuda_device, gpu_budget=3_000_000,
                       progress=False)
    table = stores[0].table(None, "x")
    assert table.num_gpu_rows > 0 and table.placement.has_host_tier
    table.set_split(1.0)
    sampler = HybridNeighborSampler(stores, [10, 5], progress=False)
    loader = NeighborLoader(stores, [10, 5], neighbor_sampler=sampler, input_nodes=g.train_idx[:4096],
                            batch_size=512)
    deferred = count_deferred(monkeypatch)
    with torch.cuda.stream(side_stream(cuda_device)):  # outputs are allocated there: poison its cached blocks
        poison = torch.full((64 << 20,), float("nan"), device=cuda_device)
        del poison
    seen = 0
    for batch in hmgstore.Pipeline(loader, depth=2, fuse=fuse, overlap_reads="auto"):
        n_id = batch.n_id.cpu()
        assert_same(batch.x.cpu(), g.x[n_id])
        assert_same(batch.y.cpu(), g.y[n_id])
        seen += 1
    assert seen == len(loader) and len(deferred) >= 1  # batches of >= MIN_IDS host rows were read later


@pytest.mark.gpu
def test_an_error_in_a_deferred_finish_is_raised_at_its_batch(cuda_device, monkeypatch):
    t, want = split_table(cuda_device)
    reads, real = [], split.read_chunks

    def fails():
        raise OSError("the host tier could not be read")

    def read_chunks(source, ids, into, chunks=2, threads=None):
        reads.append(len(ids))
        queued = real(source, ids, into, chunks, threads)
        if len(reads) == 4:  # batch 3: one more piece, failing after the real ones
            queued.append(((len(ids), len(ids)), split._reader.submit(fails)))
        return queued

    monkeypatch.setattr(split, "read_chunks", read_chunks)
    deferred = count_deferred(monkeypatch)
    seen = []
    with pytest.raises(OSError, match="could not be read"):
        for i, ids, out in hmgstore.Pipeline(IdsLoader(t), depth=2, overlap_reads=True):
            assert_same(out.cpu(), want[ids.cpu()])
            seen.append(i)
    assert seen == [0, 1, 2] and len(deferred) >= 4  # raised by a deferred finish, not by one run inline
    monkeypatch.setattr(split, "read_chunks", real)
    for _i, ids, out in hmgstore.Pipeline(IdsLoader(t, batches=2), overlap_reads=True):  # the reader goes on
        assert_same(out.cpu(), want[ids.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gpu_ids", "cpu_ids_host_only"])
def test_a_gather_in_the_block_returns_before_its_reads(cuda_device, case):
    """The reader thread is held by a gate: inside the block the gather returns with its part queued behind it
    (outside, it would wait for the gate); once the gate opens the part's event brings every row. GPU ids land
    in a buffer and are scattered; CPU ids of a table without a GPU tier are copied straight into the output."""
    if case == "gpu_ids":
        t, want = split_table(cuda_device)
    else:
        want = random_table(N, (DIM,), torch.float32, seed=43)
        t = hmgstore.HybridTensor(want, cuda_device, split=0.5)
    idx = torch.randint(0, N, (100_000,), generator=torch.Generator().manual_seed(44))
    ids = idx.to(cuda_device) if case == "gpu_ids" else idx
    out = torch.full((100_000, DIM), float("nan"), device=cuda_device)  # poisoned
    gate = threading.Event()
    split._reader.submit(gate.wait, 20)  # a gather that waited for its reads would take 20 s
    try:
        started = time.perf_counter()
        with finish_scope.deferred_finishes() as futures:
            t.gather(ids, out=out)
        took = time.perf_counter() - started
        assert len(futures) == 1 and not futures[0].done()
        assert took < 10
    finally:
        gate.set()
    torch.cuda.current_stream(cuda_device).wait_event(futures[0].result(timeout=60))
    assert_same(out.cpu(), want[idx])


@pytest.mark.gpu
def test_the_cost_model_times_whole_gathers_inside_a_block(cuda_device, tmp_path, monkeypatch):
    """split='auto' measures at a batch's first size class, here inside a pipeline's block: its timing runs
    finish inline (else it would time the kernel alone), and leave no futures in the block."""
    monkeypatch.setenv("HMGSTORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(split.cpu_load, "room_for", lambda threads: True)
    x = random_table(300_000, (32,), torch.float32, seed=45)
    t = hmgstore.HybridTensor(x, cuda_device, split="auto")
    deferring, measure = [], split.measure

    def spied(table, batch, key, run):
        return measure(table, batch, key, lambda *a: deferring.append(finish_scope.deferring()) or run(*a))

    monkeypatch.setattr(split, "measure", spied)
    idx = torch.randint(0, 300_000, (100_000,), generator=torch.Generator().manual_seed(46))
    with finish_scope.deferred_finishes() as futures:
        got = t[idx]
    assert deferring and not any(deferring)
    assert len(futures) <= 1  # the batch itself: deferred where the measured share is not 0
    for future in futures:
        torch.cuda.current_stream(cuda_device).wait_event(future.result(timeout=60))
    assert_same(got.cpu(), x[idx])


def test_overlap_is_off_by_default(small_graph):
    """Measured on an H100 not to pay (strong-step-h100.md): a PyG loader without a transform, which "auto"
    would overlap, is not overlapped unless asked."""
    loader = pyg_loader(small_graph)
    assert hmgstore.Pipeline(loader, device=None).overlap_reads is False
    assert not hmgstore.Pipeline(loader, device=None)._overlaps_reads()
    assert hmgstore.Pipeline(loader, device=None, overlap_reads="auto")._overlaps_reads()


@pytest.mark.gpu
def test_close_waits_for_the_reads_still_queued(cuda_device):
    """A table closed while a deferred finish of its gather is still queued on the reader thread (held by a
    gate here) waits for it: close() returns only after the gate opens and the part's rows have landed."""
    t, want = split_table(cuda_device)
    idx = torch.randint(0, N, (100_000,), generator=torch.Generator().manual_seed(45))
    out = torch.full((100_000, DIM), float("nan"), device=cuda_device)  # poisoned
    gate = threading.Event()
    split._reader.submit(gate.wait, 20)
    try:
        with finish_scope.deferred_finishes() as futures:
            t.gather(idx.to(cuda_device), out=out)
        threading.Timer(1.0, gate.set).start()
        started = time.perf_counter()
        t.close()
        assert time.perf_counter() - started > 0.5 and futures[0].done()  # it waited for the gate, then the part
    finally:
        gate.set()
    torch.cuda.current_stream(cuda_device).wait_event(futures[0].result(timeout=60))
    assert_same(out.cpu(), want[idx])


def test_settle_neither_waits_for_itself_nor_fails_at_shutdown(monkeypatch):
    """settle() (a CUDA table's close()) called on the reader thread itself returns instead of waiting behind
    its own task; with the pool shut down (interpreter exit) it skips the wait instead of raising; before any
    deferred finish it does not touch the pool at all."""
    import concurrent.futures

    synced = []
    monkeypatch.setattr(split, "synchronize", lambda devices: synced.append(devices))
    device = torch.device("cuda", 0)
    monkeypatch.setattr(split, "_deferred_any", False)
    idle = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hmgstore-split")
    idle.shutdown()
    monkeypatch.setattr(split, "_reader", idle)  # submit() would raise: settle must not call it
    split.settle(device)
    monkeypatch.setattr(split, "_deferred_any", True)
    split.settle(device)  # shut down: the wait is skipped, no RuntimeError
    reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hmgstore-split")
    monkeypatch.setattr(split, "_reader", reader)
    try:
        reader.submit(split.settle, device).result(timeout=10)  # would wait for itself forever
        split.settle(device)  # from another thread: waits behind the queue, then returns
    finally:
        reader.shutdown()
    assert synced == [(device,)] * 4
