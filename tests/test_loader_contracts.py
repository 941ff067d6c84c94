"""What a loader may be, for Pipeline and Producer, and the checks of the loaders' helpers.

- An iterable (``iter()`` starts again) gives an epoch a pass, and an epoch may be empty.
- A one-shot iterator (a generator) is read once across passes: a pass left early is resumed by the next,
  which yields first the batches made ahead, so nothing is lost or repeated; once it is used up, the next
  pass says so. An iterator whose ``__iter__`` starts it over is one-shot too: its iter() is called once.
- A producer that cannot start says what failed, and blames pickling only where pickling failed.
- Hotness scores, locality batches and pre-sampling refuse what they cannot use, naming it.
"""
from __future__ import annotations

import functools
import importlib
import multiprocessing.context
import pickle
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from hmgstore.graph import NeighborSampler, Topology, locality, to_csc
from hmgstore.graph.presample import presample
from hmgstore.prefetch.producer import died_without_a_word


class Epochs:
    """A re-iterable loader whose epochs hold the given numbers of batches (a fresh iterator each pass)."""

    def __init__(self, sizes):
        self.sizes, self.passes = list(sizes), 0

    def __iter__(self):
        size = self.sizes[min(self.passes, len(self.sizes) - 1)]
        self.passes += 1
        return iter([torch.full((2,), 10 * self.passes + i) for i in range(size)])


def shrinking_loader():
    return Epochs([3, 0, 2])


def counting_generator(n):
    return (torch.full((2,), i) for i in range(n))


def _number(batch) -> int:
    """A producer's batch read at once: its tensors are views into a ring slot, valid until the next batch."""
    return int(batch[0])


def _take(pipeline, count: int, pause: float = 0.0, keep=lambda batch: batch) -> list:
    """The first ``count`` batches of a pass (each as ``keep`` reads it), then ``break``; ``pause`` lets the
    pipeline fill up meanwhile."""
    taken = []
    for batch in pipeline:
        taken.append(keep(batch))
        time.sleep(pause)
        if len(taken) == count:
            break
    return taken


# ---- an iterable's epoch may be empty; a one-shot iterator's second epoch is refused ----------------------
def test_a_pipeline_over_an_iterable_yields_an_empty_later_epoch_as_empty():
    pipeline = hmgstore.Pipeline(Epochs([3, 0, 2, 0]), device="cpu")
    assert [len(list(pipeline)) for _ in range(5)] == [3, 0, 2, 0, 0]


@pytest.mark.parametrize("make", [lambda: (i for i in range(3)), lambda: iter([0, 1, 2]), lambda: map(int, "012")],
                         ids=["generator", "list iterator", "map"])
def test_a_pipeline_over_a_one_shot_iterator_still_refuses_its_second_epoch(make):
    pipeline = hmgstore.Pipeline(make(), device="cpu")
    assert list(pipeline) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="one-shot iterator.*second epoch"):
        list(pipeline)


def test_one_shot_is_told_by_what_the_loader_is():
    from hmgstore.prefetch.pipeline import is_one_shot

    assert is_one_shot(i for i in range(2)) and is_one_shot(iter([1])) and is_one_shot(map(int, "1"))
    assert not is_one_shot([1, 2]) and not is_one_shot(Epochs([1])) and not is_one_shot(range(3))


# ---- a pass left early over a one-shot iterator is resumed, nothing lost or repeated ----------------------
@pytest.mark.parametrize("depth", [1, 3])
def test_a_pipeline_resumes_a_generator_where_its_consumer_left_off(depth):
    pipeline = hmgstore.Pipeline((i for i in range(20)), depth=depth, device="cpu")
    seen = _take(pipeline, 3, pause=0.02)  # the pipeline has made batches ahead by the break
    seen += _take(pipeline, 1)
    seen += _take(pipeline, 4, pause=0.02)
    seen += list(pipeline)
    assert seen == list(range(20))
    with pytest.raises(RuntimeError, match="one-shot iterator.*used it up"):
        list(pipeline)


class Resettable:
    """An iterator whose ``__iter__`` starts it over and returns itself (a hand-written loader's common shape)."""

    def __init__(self, n):
        self.n, self.i = n, 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1


@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.sampled_from([1, 3]))
@settings(max_examples=15, deadline=None)
def test_an_iterator_that_restarts_itself_is_read_once_across_passes(breaks, depth):
    """iter() of such a loader is called once: passes left early resume it, each batch comes once, in order."""
    pipeline = hmgstore.Pipeline(Resettable(20), depth=depth, device="cpu")
    seen = []
    for k in breaks:
        seen += _take(pipeline, k)
    seen += list(pipeline)
    assert seen == list(range(20))
    with pytest.raises(RuntimeError, match="one-shot iterator.*its iter\\(\\) is called once"):
        list(pipeline)


def test_the_pass_after_a_generator_raised_says_that_it_raised():
    def failing():
        yield 0
        raise KeyError("shard 3 is missing")

    pipeline = hmgstore.Pipeline(failing(), device="cpu")
    with pytest.raises(KeyError, match="shard 3"):
        list(pipeline)
    with pytest.raises(RuntimeError, match="used it up.*it ended when it raised KeyError: 'shard 3 is missing'"):
        list(pipeline)


def test_a_new_pass_over_a_generator_ends_the_one_under_way_and_goes_on_from_it():
    pipeline = hmgstore.Pipeline((i for i in range(8)), depth=2, device="cpu")
    first = iter(pipeline)
    assert [next(first), next(first)] == [0, 1]
    time.sleep(0.05)
    assert list(pipeline) == list(range(2, 8))
    assert list(first) == []  # the earlier pass was ended


def test_a_generator_taken_whole_but_left_before_its_end_has_an_empty_used_up_next_pass():
    pipeline = hmgstore.Pipeline((i for i in range(3)), device="cpu")
    assert [b for _, b in zip(range(3), pipeline)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="one-shot iterator"):
        list(pipeline)


def test_an_error_made_ahead_in_a_pass_left_early_is_raised_by_the_next_pass_at_its_batch():
    def failing():
        yield from range(3)
        raise ValueError("batch 3 could not be made")

    pipeline = hmgstore.Pipeline(failing(), depth=4, device="cpu")
    assert _take(pipeline, 1, pause=0.05) == [0]
    got = []
    with pytest.raises(ValueError, match="batch 3"):
        for batch in pipeline:
            got.append(batch)
    assert got == [1, 2]


def test_a_pass_left_early_over_an_iterable_starts_the_next_epoch_afresh():
    pipeline = hmgstore.Pipeline(list(range(6)), depth=2, device="cpu")
    assert _take(pipeline, 2, pause=0.02) == [0, 1]
    assert list(pipeline) == list(range(6))


# ---- the producer: the same contract across its process ---------------------------------------------------
def test_a_producer_resumes_a_generator_with_the_batches_in_its_ring_and_yields_an_empty_epoch():
    with hmgstore.Producer(functools.partial(counting_generator, 12), depth=2, device="cpu") as producer:
        seen = _take(producer, 2, pause=0.1, keep=_number)  # the ring fills meanwhile
        seen += _take(producer, 3, pause=0.05, keep=_number)
        seen += [_number(b) for b in producer]
        assert seen == list(range(12))
        with pytest.raises(RuntimeError, match="one-shot iterator"):
            list(producer)
    with hmgstore.Producer(shrinking_loader, device="cpu") as producer:
        assert [len(list(producer)) for _ in range(3)] == [3, 0, 2]


# ---- a producer that cannot start says what failed ----------------------------------------------------------
def test_a_producer_that_cannot_start_names_the_failure_not_pickling(monkeypatch):
    def refuse(process):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)
    with pytest.raises(RuntimeError, match="could not be started: OSError: Resource temporarily") as caught:
        hmgstore.Producer(shrinking_loader, device="cpu").start()
    assert "pickl" not in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)


def test_a_producer_whose_make_loader_cannot_be_pickled_says_so_and_chains_the_error():
    with pytest.raises(TypeError, match="could not be pickled.*picklable") as caught:
        hmgstore.Producer(lambda: [], device="cpu").start()
    assert isinstance(caught.value.__cause__, (pickle.PicklingError, AttributeError, TypeError))  # pickling's own


def test_a_producer_that_dies_while_starting_points_at_unpickling_not_at_memory():
    starting = died_without_a_word(1, starting=True)
    assert "unpickle" in starting and "out of memory" not in starting
    assert "signal 9" in died_without_a_word(-9, starting=False)
    assert "exit code 3" in died_without_a_word(3, starting=False)


# ---- hotness, locality batches, pre-sampling --------------------------------------------------------------
@pytest.mark.parametrize("mask", [torch.tensor([True, False, True]), np.array([True, False]), [True, False]],
                         ids=["tensor", "numpy", "list"])
def test_order_by_score_refuses_booleans_naming_the_dtype(mask):
    with pytest.raises(TypeError, match=r"torch\.bool mask of booleans; pass mask\.float\(\)"):
        hmgstore.hotness.order_by_score(mask)
    assert hmgstore.hotness.order_by_score(torch.tensor([1.0, 0.0, 1.0])).tolist() == [0, 2, 1]


def test_locality_batches_refuse_ids_of_two_dimensions_naming_the_shape():
    part = torch.zeros(10, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"input_nodes must be 1-D ids, got shape \(2, 3\)"):
        locality.LocalityBatchSampler(torch.arange(6).reshape(2, 3), part, 2)
    assert list(locality.LocalityBatchSampler(torch.tensor(4), part, 2)) == [[0]]  # one id: a list of one
    with pytest.raises(TypeError, match="generator is a torch.Generator or None, got int"):
        locality.LocalityBatchSampler(torch.arange(3), part, 2, generator=5)


def test_hotness_imports_as_a_module_and_stays_an_attribute():
    module = importlib.import_module("hmgstore.hotness")
    from hmgstore.hotness import order_by_score
    from hmgstore.placement import Placement
    from hmgstore.stats import TierCounter

    assert module is hmgstore.hotness is hmgstore.rows.hotness
    assert order_by_score is hmgstore.rows.hotness.order_by_score
    assert Placement is hmgstore.Placement and TierCounter is hmgstore.rows.stats.TierCounter


@pytest.mark.parametrize("generator", [5, "seed", np.random.default_rng(0)])
def test_presample_refuses_a_generator_that_is_not_torchs_naming_it(generator):
    csc = to_csc(torch.tensor([[0, 1], [1, 2]]), "coo", size=(3, 3))
    sampler = NeighborSampler({None: Topology(csc, "cpu")}, {None: 3}, [2])
    with pytest.raises(TypeError, match="presample's generator is a torch.Generator or None, got "
                                        f"{type(generator).__name__}"):
        presample(sampler, torch.arange(3), generator=generator, progress=False)
    hot = presample(sampler, torch.arange(3), generator=torch.Generator().manual_seed(0), progress=False)
    assert hot.batches == 1


@pytest.mark.parametrize("warm", [0, 1, 2, 5])
def test_a_pipeline_makes_every_batch_whatever_it_makes_in_the_consumers_thread(warm):
    """``warm`` batches are made in the consumer's thread, the rest in the background one: none of them, or
    more than the epoch holds, changes nothing a consumer sees."""
    pipeline = hmgstore.Pipeline([1, 2, 3, 4])
    pipeline.warm = warm
    assert list(pipeline) == [1, 2, 3, 4] and list(pipeline) == [1, 2, 3, 4]
    assert list(hmgstore.Pipeline([])) == []


@pytest.mark.parametrize("loader", [5, None, object()])
def test_a_pipeline_refuses_a_loader_that_is_not_iterable_when_built(loader):
    with pytest.raises(TypeError, match=r"Pipeline takes a loader, an iterable of batches.*got "):
        hmgstore.Pipeline(loader, device="cpu")
