"""hmgstore.graph.sampling_stream: a GPU sampler's batch on a stream of its own, the same rows, never early."""
import pytest
import torch
from test_graph_sampler import build, power_law_graph

from hmgstore.graph import sampling_stream

LONG = 500_000_000  # cycles of torch.cuda._sleep: ~0.3 s, far longer than a batch takes to sample


@pytest.fixture
def own_stream(monkeypatch):
    def set_to(value):
        monkeypatch.setattr(sampling_stream, "OWN_STREAM", value)
    return set_to


def _reference(seeds, step):
    cpu, _ = build(power_law_graph(), 3000, ("cpu", None), num_neighbors=[6, 3, 2])
    torch.manual_seed(100 + step)
    return cpu.sample({None: seeds})


def _same(a, b):
    for field in ("node", "row", "col", "edge"):
        assert torch.equal(getattr(a, field)[None], getattr(b, field)[None].cpu()), field
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


@pytest.mark.gpu
@pytest.mark.parametrize("own", [True, False], ids=["own-stream", "calling-stream"])
def test_a_batch_does_not_wait_for_the_calling_streams_work_on_its_own_stream(own_stream, own):
    """Eager, captured and replayed batches: the same as the CPU's; with a stream of its own, a replayed
    batch comes back while the calling stream's earlier work still runs (without one, after it)."""
    own_stream(own)
    gpu, _ = build(power_law_graph(), 3000, ("cuda", 0.3), num_neighbors=[6, 3, 2])
    caller = torch.cuda.Stream()
    outputs = []
    for step in range(5):
        seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(step))[:400]
        slept = torch.cuda.Event()
        with torch.cuda.stream(caller):
            torch.cuda._sleep(LONG)  # the last batch's gather, say
            slept.record(caller)
            torch.manual_seed(100 + step)
            out = gpu.sample({None: seeds})
            # the sleep itself, not the caller's stream: a replay queues its outputs' copies there afterwards
            busy = not slept.query()
        caller.synchronize()
        _same(_reference(seeds, step), out)
        if step >= 2:  # replays (the capture itself synchronises the device)
            assert busy == own, step
        outputs.append((seeds, out))
    seeds, out = outputs[2]  # an earlier batch's rows are its own, not the next replays'
    _same(_reference(seeds, 2), out)


@pytest.mark.gpu
def test_seeds_made_on_the_gpu_by_the_calling_stream_are_waited_for(own_stream):
    """GPU seeds copied in by the calling stream behind long work: the sampling stream waits for them (a
    batch read from the buffer's earlier zeros would differ from the CPU's)."""
    own_stream(True)
    gpu, _ = build(power_law_graph(), 3000, ("cuda", 0.3), num_neighbors=[6, 3, 2])
    caller = torch.cuda.Stream()
    for step in range(4):
        seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(step))[:400]
        on_gpu = torch.zeros(400, dtype=torch.int64, device="cuda")
        pinned = seeds.pin_memory()
        torch.cuda.synchronize()
        with torch.cuda.stream(caller):
            torch.cuda._sleep(LONG)
            on_gpu.copy_(pinned, non_blocking=True)
            torch.manual_seed(100 + step)
            out = gpu.sample({None: on_gpu})
        caller.synchronize()
        _same(_reference(seeds, step), out)


def test_on_the_cpu_the_switch_changes_nothing(own_stream):
    own_stream(True)
    cpu, _ = build(power_law_graph(), 3000, ("cpu", None), num_neighbors=[6, 3, 2])
    seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(0))[:400]
    torch.manual_seed(100)
    out = cpu.sample({None: seeds})
    _same(_reference(seeds, 0), out)


def _slow_output(sampler, monkeypatch, fail=False):
    """Make every batch's outputs land ~0.3 s late on the stream that samples it (and, with ``fail``, raise)."""
    original = sampler._output

    def slow(*args):
        torch.cuda._sleep(LONG)
        if fail:
            raise RuntimeError("a batch that fails after its kernels were queued")
        return original(*args)
    monkeypatch.setattr(sampler, "_output", slow)


@pytest.mark.gpu
def test_the_calling_stream_reads_a_batch_only_once_it_has_landed(own_stream, monkeypatch):
    """The outputs land late on the sampling stream; copies taken at once on the calling stream (no host
    synchronisation in between) still hold the batch, eager, captured and replayed."""
    own_stream(True)
    gpu, _ = build(power_law_graph(), 3000, ("cuda", 0.3), num_neighbors=[6, 3, 2])
    _slow_output(gpu, monkeypatch)
    caller = torch.cuda.Stream()
    for step in range(5):
        seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(step))[:400]
        with torch.cuda.stream(caller):
            torch.manual_seed(100 + step)
            out = gpu.sample({None: seeds})
            copies = {f: getattr(out, f)[None].clone() for f in ("node", "row", "col", "edge")}
        del out  # its memory is not reused by the next batch before the copies above have run
        caller.synchronize()
        reference = _reference(seeds, step)
        for f, copy in copies.items():
            assert torch.equal(getattr(reference, f)[None], copy.cpu()), (step, f)


@pytest.mark.gpu
def test_a_batch_that_fails_still_holds_the_calling_stream_until_its_reads_are_done(own_stream, monkeypatch):
    """GPU seeds read by a batch that raises after queueing its kernels: the calling stream waits for them
    (so the seeds' memory is not reused under a pending read)."""
    own_stream(True)
    gpu, _ = build(power_law_graph(), 3000, ("cuda", 0.3), num_neighbors=[6, 3, 2])
    gpu.sample({None: torch.arange(10)})  # the first batch waits for the calling stream: done before the test
    _slow_output(gpu, monkeypatch, fail=True)
    caller = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(caller):
        seeds = torch.arange(0, 3000, 7, device="cuda")
        with pytest.raises(RuntimeError, match="fails after"):
            gpu.sample({None: seeds})
        assert not caller.query()  # still waiting for the sampling stream's work
    caller.synchronize()
