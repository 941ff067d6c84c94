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
