"""hmgstore.Pipeline: the next batches prepared on a side stream while the consumer trains."""
import threading
import time

import pytest
import torch

import hmgstore

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


class Batches:
    """A loader stand-in: batches of tensors made on the current stream, optionally slow or failing."""

    def __init__(self, n, device, delay=0.0, fail_at=None):
        self.n, self.device, self.delay, self.fail_at = n, device, delay, fail_at

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise ValueError(f"batch {i} could not be made")
            time.sleep(self.delay)
            x = torch.full((1000,), float(i), device=self.device)
            if self.device != "cpu":
                torch.cuda._sleep(1_000_000)  # GPU work queued on the producer's stream
            yield {"x": x * 2, "i": i}


@pytest.mark.parametrize("device", DEVICES)
def test_batches_come_in_order_and_ready(device):
    seen = []
    for batch in hmgstore.Pipeline(Batches(20, device), depth=3, device=device if device != "cpu" else None):
        assert torch.equal(batch["x"], torch.full((1000,), 2.0 * batch["i"], device=device))
        seen.append(batch["i"])
    assert seen == list(range(20))


@pytest.mark.parametrize("device", DEVICES)
def test_a_producer_error_reaches_the_loop_with_its_traceback(device):
    pipeline = hmgstore.Pipeline(Batches(10, device, fail_at=4), device=device if device != "cpu" else None)
    seen = []
    with pytest.raises(ValueError, match="batch 4 could not be made") as info:
        for batch in pipeline:
            seen.append(batch["i"])
    assert seen == [0, 1, 2, 3]
    assert any("__iter__" in str(entry.name) for entry in info.traceback)  # raised where it happened


def test_stopping_early_stops_the_thread():
    before = threading.active_count()
    for batch in hmgstore.Pipeline(Batches(1000, "cpu", delay=0.001), depth=2):
        if batch["i"] == 5:
            break
    time.sleep(0.2)
    assert threading.active_count() == before


def test_prefetch_overlaps_the_consumer():
    pipeline = hmgstore.Pipeline(Batches(10, "cpu", delay=0.05), depth=2)
    start = time.perf_counter()
    for _ in pipeline:
        time.sleep(0.05)  # "training" as long as making a batch
    spent = time.perf_counter() - start
    assert spent < 0.85  # serial would be ~1.0 s
    assert pipeline.waited < 0.35


@pytest.mark.gpu
def test_the_consumer_stream_waits_on_the_gpu_not_the_host():
    producer_done = []

    class Slow(Batches):
        def __iter__(self):
            for item in super().__iter__():
                torch.cuda._sleep(50_000_000)  # long GPU work on the side stream, after the batch is made
                item["x"] = item["x"] + 1
                producer_done.append(item["i"])
                yield item

    for batch in hmgstore.Pipeline(Slow(5, "cuda"), depth=1):
        assert torch.equal(batch["x"].cpu(), torch.full((1000,), 2.0 * batch["i"] + 1))  # the stream waited


def test_depth_is_checked():
    with pytest.raises(ValueError, match="at least 1"):
        hmgstore.Pipeline([], depth=0)


@pytest.mark.gpu
def test_the_training_thread_never_waits_for_the_gpu_in_the_steady_state():
    """Sampling (GPU sampler) and gathering (GPU ids, checked by the kernel) run in the pipeline's thread; the
    training thread only queues work. Proof: with 20 ms of GPU work queued per training step, 25 steps take the
    training thread far less than the 500 ms the GPU needs for them, and a loop that waits (a ``.item()`` per
    step, the control) takes at least that long."""
    from hmgstore.graph import NeighborSampler, Topology, to_csc

    device = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(5)
    n, e = 20_000, 200_000
    edge_index = torch.stack([torch.randint(0, n, (e,), generator=g), (torch.rand(e, generator=g) ** 2 * n).long()])
    topo = Topology(to_csc(edge_index, "coo", (n, n)), device, gpu_budget=2**30, progress=False)
    sampler = NeighborSampler({None: topo}, {None: n}, [10, 5])
    x = torch.randn(n, 64, generator=g)
    table = hmgstore.HybridTensor(x, device, gpu_rows=torch.arange(0, n, 4))
    weight = torch.randn(64, 64, device=device)

    class Loader:
        def __len__(self):
            return 40

        def __iter__(self):
            for i in range(40):
                seeds = torch.randint(0, n, (256,), generator=torch.Generator().manual_seed(i)).to(device)
                out = sampler.sample({None: seeds})
                yield out.node[None], table[out.node[None]]

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * 20 / start.elapsed_time(end))  # 20 ms of GPU time

    def loop(wait: bool) -> float:
        for k, (_nodes, feats) in enumerate(hmgstore.Pipeline(Loader(), depth=2)):
            if k == 10:  # past the warm-up batches and the first CUDA-graph captures
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            torch.cuda._sleep(cycles)  # the training step's GPU work
            loss = torch.relu(feats @ weight).sum()
            if wait:
                loss.item()
            if k == 34:
                return time.perf_counter() - t0

    queued = loop(wait=False)
    torch.cuda.synchronize()
    waited = loop(wait=True)
    assert waited >= 0.45, f"the control loop should take the GPU's 500 ms: {waited:.3f} s"
    assert queued < 0.25, f"the training thread waited for the GPU: 25 steps took {queued:.3f} s"


def test_max_sms_is_checked():
    for bad in (0, -3, 2.5, True, "half"):
        with pytest.raises(ValueError, match="max_sms"):
            hmgstore.Pipeline([], max_sms=bad)


def test_gather_caps_nest_and_stay_with_their_thread():
    from hmgstore.cuda.gather import capped_gathers, current_cap

    seen = {}
    with capped_gathers(8):
        assert current_cap() == 8
        with capped_gathers(None):
            assert current_cap() == 8  # None adds no cap
        with capped_gathers(16):
            assert current_cap() == 8  # the tightest holds
        with capped_gathers(4):
            assert current_cap() == 4
            other = threading.Thread(target=lambda: seen.update(cap=current_cap()))
            other.start()
            other.join()
        assert current_cap() == 8
    assert current_cap() is None and seen == {"cap": None}


def test_pipeline_makes_batches_under_no_cap_on_the_cpu():
    from hmgstore.cuda.gather import current_cap

    def loader():
        for _i in range(3):
            yield current_cap()

    assert list(hmgstore.Pipeline(loader(), device=None)) == [None] * 3


@pytest.mark.gpu
def test_auto_caps_the_batches_gathers_not_the_training_threads(monkeypatch):
    from torch_geometric.data import Data

    from hmgstore.cuda import gather
    from hmgstore.cuda.gather import current_cap
    from hmgstore.plugins.pyg import from_data
    from hmgstore.prefetch.pipeline import auto_sms

    x = torch.randn(1000, 16)
    stores = from_data(Data(x=x, edge_index=torch.randint(0, 1000, (2, 4000))), device="cuda", gpu_budget=None,
                       progress=False)  # every row in host memory: the case the auto cap is for
    table = stores[0].table(None, "x")
    caps, run = [], gather.run
    monkeypatch.setattr(gather, "run", lambda packed, *a, **k: caps.append(packed.max_sms) or run(packed, *a, **k))

    class Loader:
        data = stores

        def __len__(self):
            return 3

        def __iter__(self):
            for _i in range(3):
                ids = torch.randint(0, 1000, (100,), device="cuda")
                yield {"cap": current_cap(), "rows": table[ids], "ids": ids}

    limit = auto_sms(torch.device("cuda", torch.cuda.current_device()))
    assert 4 <= limit < torch.cuda.get_device_properties(0).multi_processor_count
    for batch in hmgstore.Pipeline(Loader(), max_sms=None):  # no cap
        assert batch["cap"] is None
    caps.clear()
    for batch in hmgstore.Pipeline(Loader()):  # the default, "auto": a host-reading table is capped
        assert batch["cap"] == limit and current_cap() is None
        assert torch.equal(batch["rows"].cpu(), x[batch["ids"].cpu()])
    assert caps == [limit] * 3 and table.max_sms is None  # the table itself is left as it was
    caps.clear()
    table[torch.arange(10, device="cuda")]  # the training thread's own gathers: not capped
    table.max_sms = 2
    with gather.capped_gathers(limit):
        got = table[torch.arange(10, device="cuda")]  # a table's own tighter cap holds
    assert caps == [None, 2] and torch.equal(got.cpu(), x[:10])


def test_the_default_cap_is_auto_and_none_turns_it_off():
    """Pipeline(loader) caps host-reading gathers as max_sms='auto' does (the README's swap is the tuned path:
    benchmarks/results/defaults-papers-h200.md); None leaves them uncapped; without a GPU nothing is capped."""
    assert hmgstore.Pipeline([]).max_sms == "auto"
    assert hmgstore.Pipeline([], max_sms=None).max_sms is None
    assert hmgstore.Pipeline([], device="cpu")._maker().max_sms is None


def test_auto_cap_leaves_loaders_whose_tables_are_all_on_the_gpu_uncapped(monkeypatch):
    """max_sms='auto' caps only where a table reads host memory: tables whole on the GPU gather uncapped. The
    pipeline learns a loader's tables from the finders adapters register."""
    from types import SimpleNamespace

    from hmgstore.prefetch import pipeline

    monkeypatch.setattr(pipeline, "_finders", [])
    class Loader(SimpleNamespace):
        def __iter__(self):
            return iter(())

    loader = Loader(tables=[SimpleNamespace(placement=SimpleNamespace(has_host_tier=False))] * 2)
    pipeline.register_table_finder(lambda loader: getattr(loader, "tables", None))
    pipeline.register_table_finder(lambda loader: pytest.fail("the first finder that knows the loader answers"))
    assert pipeline.tables_of(loader) == loader.tables
    assert hmgstore.Pipeline(loader, device=None)._auto_sms() is None


def test_the_pyg_adapter_tells_the_pipeline_its_stores_tables():
    pytest.importorskip("torch_geometric")
    from types import SimpleNamespace

    from hmgstore.plugins.pyg import from_tensors
    from hmgstore.prefetch.pipeline import tables_of

    store, graph = from_tensors(edge_index=torch.tensor([[0, 1], [1, 2]]), x=torch.randn(3, 4), y=torch.arange(3),
                                device="cpu", progress=False)
    assert {id(t) for t in tables_of(SimpleNamespace(data=(store, graph)))} == {id(t) for t in store.tables().values()}
    assert tables_of(SimpleNamespace(data=None)) == []


@pytest.mark.gpu
def test_auto_cap_is_off_for_tables_whole_on_the_gpu_and_on_for_host_tables():
    from torch_geometric.data import Data

    from hmgstore.plugins.pyg import from_data
    from hmgstore.prefetch.pipeline import auto_sms

    data = Data(x=torch.randn(1000, 16), edge_index=torch.randint(0, 1000, (2, 4000)))
    whole, _ = from_data(data, device="cuda", gpu_budget=2**40, progress=False)
    host, _ = from_data(data, device="cuda", gpu_budget=None, progress=False)  # gpu_budget="auto" would fit it all
    device = torch.device("cuda", torch.cuda.current_device())

    def loader(stores):  # a loader's stores are found through its .data (a PyG loader's)
        return type("Loader", (), {"data": (stores, None), "__iter__": lambda self: iter(())})()

    assert hmgstore.Pipeline(loader(whole), device=device)._auto_sms() is None
    assert hmgstore.Pipeline(loader(host), device=device)._auto_sms() == auto_sms(device)


@pytest.mark.gpu
def test_epochs_reuse_the_gpu_memory_of_the_last_one():
    """Pipelines share one side stream per GPU: blocks a batch freed are reused by the next epoch's batches (a
    new stream each epoch grew torch's reserved memory by the working set every epoch)."""
    class Loader:
        def __len__(self):
            return 6

        def __iter__(self):
            for k in range(6):
                yield torch.full((4 << 20,), float(k), device="cuda")  # 16 MB a batch, made on the side stream

    reserved = []
    for _epoch in range(8):  # a pipeline an epoch, as a user's loop may build it
        for k, batch in enumerate(hmgstore.Pipeline(Loader(), depth=2)):
            assert float(batch[-1]) == k
        del batch
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    # The pool may end an epoch a block short (a batch freed while the training stream still used it), early or
    # once later (H100: 64, 80, 80, 80, 80 MB; H200: 144.7 MB for four epochs, then 161.5): one batch's block at
    # most over the last five epochs. A stream an epoch grew it by the working set (3 batches) every epoch.
    batch_bytes = (4 << 20) * 4
    assert reserved[-1] - reserved[2] <= batch_bytes, f"reserved GPU memory grew over epochs: {reserved}"
