"""hmgstore.Producer: batches made in another process and handed over through a ring of shared buffers."""
import collections
import functools
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import hmgstore
from helpers import shm_left_behind
from hmgstore.prefetch import shared_ring as ring
from hmgstore.prefetch.producer import RemoteTraceback, remove_ipc_files

# Seconds after which a script run apart counts as hung. They take 5-20 s alone; on a loaded 2-core machine
# (another test run beside this one) several times that, so the limit is far above it: only a hang reaches it.
HANG = 600
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
Pair = collections.namedtuple("Pair", "a b")


class Batches:
    """A loader stand-in: shuffled batches of tensors of varying sizes (torch's RNG), optionally failing."""

    def __init__(self, n, device, fail_at=None, exit_at=None):
        self.n, self.device, self.fail_at, self.exit_at = n, device, fail_at, exit_at

    def __len__(self):
        return self.n

    def __iter__(self):
        order = torch.randperm(self.n)
        for step, i in enumerate(order.tolist()):
            if step == self.fail_at:
                raise ValueError(f"batch {step} could not be made")
            if step == self.exit_at:
                os._exit(3)
            size = 1000 + 5000 * (i % 4)  # some batches outgrow the slot made for an earlier one
            x = torch.randn(size, 8, device=self.device)
            yield {"x": x, "i": i, "mask": x[:, 0] > 0, "pair": Pair(x[:, 1:3].t(), torch.tensor([i]))}


def make_batches(n, device, fail_at=None, exit_at=None):
    return Batches(n, device, fail_at, exit_at)


class SparseFirst(Batches):
    """Each pass's first batch cannot go through the ring (a sparse tensor); the rest can."""

    def __iter__(self):
        yield {"adj": torch.eye(3).to_sparse()}
        yield from super().__iter__()


def make_sparse_first(n):
    return SparseFirst(n, "cpu")


def make_with_none():
    return [torch.arange(3) + 1, None, torch.arange(4) + 2]


def make_pyg(device):
    """hmgstore's PyG stores and sampler behind a stock NeighborLoader, as a user's script builds them."""
    from torch_geometric.loader import NeighborLoader

    from hmgstore.data import synthetic
    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    g = synthetic(num_nodes=3000, avg_degree=6, feat_dim=16, seed=1)
    from torch_geometric.data import Data

    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device=device, progress=False)
    sampler = HybridNeighborSampler(stores, [5, 3], device=device, progress=False)
    return NeighborLoader(stores, [5, 3], neighbor_sampler=sampler, input_nodes=g.train_idx, batch_size=128,
                          shuffle=True)


def make_same_objects(device):
    """The same PyG objects handed out again and again: a cached list of mini-batches (one of them twice in a pass),
    a full-graph batch, a HeteroData."""
    from torch_geometric.data import Data, HeteroData

    g = torch.Generator().manual_seed(5)
    data = [Data(x=torch.randn(200 + 50 * i, 4, generator=g).to(device), y=torch.tensor([i], device=device))
            for i in range(3)]
    hetero = HeteroData()
    hetero["paper"].x = torch.arange(12.0, device=device).view(6, 2)
    hetero["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [2, 3]], device=device)
    return [data[0], data[1], hetero, data[2], data[1]]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device, (a, b)
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


def _expected(factory, seed, passes):
    torch.manual_seed(seed)
    loader = factory()
    return [[b for b in loader] for _ in range(passes)]


def test_the_ring_round_trips_a_batch_bit_for_bit():
    x = torch.randn(50, 7)
    batch = {"x": x.t(), "ids": torch.arange(5), "flags": torch.tensor([True, False]), "empty": torch.empty(0, 3),
             "half": x[:4].half(), "pair": Pair(torch.ones(3, dtype=torch.int8), 7), "list": [x[0], "name"]}
    want = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    want["pair"], want["list"] = Pair(batch["pair"].a.clone(), 7), [x[0].clone(), "name"]
    top = torch.max(x, 1)
    batch.update(ordered=collections.OrderedDict(a=x[1], b=2), shape=x.shape, top=top)  # their types kept too
    want.update(ordered=collections.OrderedDict(a=x[1].clone(), b=2), shape=x.shape,
                top=type(top)((top.values.clone(), top.indices.clone())))
    skeleton, grown = ring.pack(batch, None, torch.device("cpu"))
    assert grown is not None and grown.is_shared() and grown.numel() >= 50 * 7 * 4
    got = ring.unpack(skeleton, grown)
    _same(got, want)
    assert type(got["ordered"]) is collections.OrderedDict and type(got["shape"]) is torch.Size
    assert type(got["top"]) is type(top) and torch.equal(got["top"].values, top.values)
    small = torch.zeros(16, dtype=torch.uint8)
    _, bigger = ring.pack({"x": x}, small, torch.device("cpu"))
    assert bigger is not None and bigger.numel() >= x.nbytes
    _, same = ring.pack({"x": x[:2]}, bigger, torch.device("cpu"))
    assert same is None  # fits: the slot is kept


def test_the_ring_refuses_sparse_tensors_with_the_way_out():
    with pytest.raises(TypeError, match="dense"):
        ring.pack({"adj": torch.eye(3).to_sparse()}, None, torch.device("cpu"))


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_batches_in_the_same_order_as_the_loader(device):
    factory = functools.partial(make_batches, 12, device)
    want = _expected(factory, 5, 2)
    with hmgstore.Producer(factory, seed=5, depth=2, device=device if device != "cpu" else None) as batches:
        assert len(batches) == 12
        for expected in want:
            got = []
            for batch in batches:
                got.append(ring.swap(batch, lambda t: t.clone()))  # a batch lives until the next one is taken
            assert len(got) == len(expected)
            for a, b in zip(got, expected):
                _same(a, b)
        assert batches.stats["batches"] == 12 and batches.stats["busy_s"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_pyg_neighbor_loader_through_the_producer(device):
    factory = functools.partial(make_pyg, device)
    want = _expected(factory, 3, 1)[0]
    with hmgstore.Producer(factory, seed=3, device=device if device != "cpu" else None) as batches:
        got = [ring.swap(b, lambda t: t.clone()) for b in batches]
    assert len(got) == len(want) > 3
    for a, b in zip(got, want):
        assert a.batch_size == b.batch_size
        for key in ("x", "y", "n_id", "edge_index"):
            assert torch.equal(a[key], b[key]), key
        assert a.x.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_pyg_objects_the_loader_hands_out_again_arrive_as_they_are(device):
    """A loader may yield the same Data/HeteroData object twice in a pass or in every epoch (a cached list, one
    full-graph batch): each time it arrives with its own values, never the ring slot of an earlier batch."""
    factory = functools.partial(make_same_objects, device)
    want = factory()
    with hmgstore.Producer(factory, device=device if device != "cpu" else None) as batches:
        for _ in range(3):
            got = [ring.swap(b, lambda t: t.clone()) for b in batches]
            assert len(got) == len(want)
            for a, b in zip(got, want):
                for store_a, store_b in zip(a.stores, b.stores):
                    assert sorted(store_a.keys()) == sorted(store_b.keys())
                    for key in store_a.keys():
                        assert torch.equal(store_a[key], store_b[key]), key


def test_errors_reach_the_loop_with_the_producers_traceback_and_the_producer_goes_on():
    with hmgstore.Producer(functools.partial(make_batches, 10, "cpu", fail_at=4), seed=0) as batches:
        for _ in range(2):  # the pass after a failed one fails again, at the same batch
            seen = 0
            with pytest.raises(ValueError, match="batch 4 could not be made") as info:
                for _ in batches:
                    seen += 1
            assert seen == 4
            assert isinstance(info.value.__cause__, RemoteTraceback)
            assert "in __iter__" in str(info.value.__cause__) and "raise ValueError" in str(info.value.__cause__)


def test_a_loader_that_cannot_be_built_fails_at_start():
    with pytest.raises(TypeError, match="unexpected keyword") as info:
        hmgstore.Producer(functools.partial(make_batches, 3, "cpu", colour="red")).start()
    assert "make_batches" in str(info.value.__cause__)


def test_a_dead_producer_raises_instead_of_hanging():
    """Run apart with a time limit, so that a hang fails the test instead of stalling the suite."""
    script = textwrap.dedent(f"""
        import functools, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import hmgstore, test_producer
        if __name__ == "__main__":
            producer = hmgstore.Producer(functools.partial(test_producer.make_batches, 10, "cpu", exit_at=3))
            seen = 0
            try:
                for _ in producer:
                    seen += 1
            except RuntimeError as err:
                assert "producer process died (exit code 3)" in str(err), err
                assert seen <= 3, seen  # what it had sent but not flushed dies with it
                producer.close()
                print("ok", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_stopping_early_then_a_whole_pass():
    factory = functools.partial(make_batches, 30, "cpu")
    want = _expected(factory, 1, 1)[0]
    with hmgstore.Producer(factory, seed=1, depth=3) as batches:
        for i, batch in enumerate(batches):
            _same(batch, want[i])
            if i == 4:
                break
        # the next pass is whole (how far the stopped pass had drawn from the RNG decides its order)
        assert sorted(b["i"] for b in batches) == list(range(30))
        pid = batches.pid
    _wait_gone(pid)


def test_a_none_batch_is_a_batch_not_the_end_of_the_epoch():
    with hmgstore.Producer(make_with_none) as producer:
        got = list(producer)
    assert len(got) == 3 and got[1] is None
    assert torch.equal(got[0], torch.arange(3) + 1) and torch.equal(got[2], torch.arange(4) + 2)


def test_closing_mid_pass_raises_nothing():
    for _ in range(3):  # closing while the producer still sends: the messages dropped unread are no error
        with hmgstore.Producer(functools.partial(make_batches, 50, "cpu")) as producer:
            for _batch in producer:
                producer.close()
                break


def test_closing_ends_the_process_and_a_dead_trainer_ends_it_too():
    script = textwrap.dedent(f"""
        import functools, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import hmgstore, test_producer
        if __name__ == "__main__":
            p = hmgstore.Producer(functools.partial(test_producer.make_batches, 1000, "cpu")).start()
            it = iter(p)
            next(it)
            print(p.pid, flush=True)
            os._exit(0)  # the trainer dies mid-pass, without closing anything
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0, out.stderr
    _wait_gone(int(out.stdout.split()[-1]))


def test_bad_arguments_say_what_to_pass():
    with pytest.raises(TypeError, match="picklable"):
        hmgstore.Producer(lambda: []).start()
    with pytest.raises(ValueError, match="depth"):
        hmgstore.Producer(list, depth=0)
    with pytest.raises(ValueError, match="max_sms"):
        hmgstore.Producer(list, max_sms=0)
    with pytest.raises(ValueError, match="sm_percent"):
        hmgstore.Producer(list, sm_percent=0)


def _wait_gone(pid, seconds=120):  # a process exits in a second or two alone; a loaded machine may take many
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # a child of ours that exited stays a zombie until reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"producer process {pid} still runs {seconds} s after its trainer left")


@pytest.mark.parametrize("device", DEVICES)
def test_teardown_leaves_no_shared_segments_or_warnings(device):
    """A trainer that takes a pass and closes leaves nothing in /dev/shm behind it, in either process, and
    neither process warns about shared tensors still in use."""
    script = textwrap.dedent(f"""
        import functools, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import hmgstore, test_producer
        if __name__ == "__main__":
            with hmgstore.Producer(functools.partial(test_producer.make_batches, 8, {device!r}), seed=0) as p:
                for batch in p:
                    assert batch["x"].device.type == {device!r}
                del batch
                pid = p.pid
            print(pid, flush=True)
    """)
    before = set(os.listdir("/dev/shm"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0, out.stderr
    _wait_gone(int(out.stdout.split()[-1]))
    assert shm_left_behind(before) == set()  # other programs' files, made and removed meanwhile, are theirs
    assert "[W" not in out.stderr and "shared CUDA tensors" not in out.stderr, out.stderr  # torch's own warnings
    # CPython's resource tracker may, under load, count a queue's semaphore as leaked after it was removed (it
    # then says "No such file or directory"): nothing leaked, as /dev/shm shows. Any other warning fails.
    leaked = [line for line in out.stderr.splitlines() if "leaked" in line]
    assert not leaked or "No such file or directory" in out.stderr, out.stderr
    assert "Warning" not in out.stderr.replace("UserWarning: resource_tracker", ""), out.stderr


def test_files_left_behind_are_told_from_other_programs_files():
    """The check above, on a shared machine: a file that another program (outside this test's processes) holds
    is its own; a file nobody holds, made since the test began, is left behind."""
    before = set(os.listdir("/dev/shm"))
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time
        if os.fork():
            os._exit(0)  # the grandchild below is no descendant of the test's process any more
        f = open(f"/dev/shm/hmgstore-test-other-{os.getpid()}", "w")
        print(os.getpid(), flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    held = f"hmgstore-test-other-{other.stdout.readline().strip()}"
    ours = f"hmgstore-test-ours-{os.getpid()}"
    try:
        open(f"/dev/shm/{ours}", "w").close()
        assert held in os.listdir("/dev/shm")
        assert shm_left_behind(before) == {ours}
    finally:
        os.kill(int(held.rsplit("-", 1)[1]), 9)
        other.wait(timeout=HANG)
        for name in (held, ours):
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")


def test_the_driver_files_of_an_exited_process_are_removed_and_no_others(tmp_path):
    ours, other = 0x7FFFFFF0, 0x7FFFFFF1  # no pid a Linux machine hands out
    paths = [f"/dev/shm/cuda.shm.0.{ours:x}.1", f"/dev/shm/cuda.shm.1.{ours:x}.2", f"/dev/shm/cuda.shm.0.{other:x}.1"]
    try:
        for path in paths:
            open(path, "w").close()
        remove_ipc_files(ours)
        assert [os.path.exists(p) for p in paths] == [False, False, True]
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)


def test_batches_that_cannot_be_packed_keep_no_slot():
    """More failed passes than the ring has slots: each fails at its batch, none hangs (run apart, with a limit).

    The ring is on the CPU, where the sparse tensor is: only tensors on the ring's device are packed into a
    slot, so on a GPU machine a ring on the default device (the GPU) would pickle the CPU tensor into the
    batch's skeleton, as documented, and the batch would come through."""
    script = textwrap.dedent(f"""
        import functools, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import hmgstore, test_producer
        if __name__ == "__main__":
            with hmgstore.Producer(functools.partial(test_producer.make_sparse_first, 4), depth=1,
                                   device="cpu") as p:
                for _ in range(4):
                    try:
                        for batch in p:
                            raise SystemExit("a batch came before the failing one")
                    except TypeError as err:
                        assert "dense" in str(err), err
                print("ok", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_only_tensors_on_the_rings_device_are_packed_others_travel_pickled():
    """Why the test above names device="cpu": into a ring on a GPU a sparse CPU tensor is pickled, not refused
    (checked here without a GPU: a slot big enough is given, so nothing is allocated on the device)."""
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(TypeError, match="dense"):
        ring.pack({"adj": sparse}, torch.empty(1 << 10, dtype=torch.uint8), torch.device("cpu"))
    skeleton, grown = ring.pack({"adj": sparse}, torch.empty(1 << 10, dtype=torch.uint8), torch.device("cuda", 0))
    assert grown is None and torch.equal(ring.unpack(skeleton, None)["adj"].to_dense(), torch.eye(3))
    assert hmgstore.Producer(functools.partial(make_sparse_first, 4), device="cpu").device == torch.device("cpu")


def test_a_second_iterator_stops_the_first_and_gets_a_whole_pass():
    with hmgstore.Producer(functools.partial(make_batches, 10, "cpu"), depth=2) as producer:
        first = iter(producer)
        next(first)
        assert sorted(b["i"] for b in producer) == list(range(10))  # not the rest of the first pass
        with pytest.raises(RuntimeError, match="ended by a later pass of the same Producer"):
            next(first)  # stopped, and says so rather than ending as if its epoch were over
        assert sorted(b["i"] for b in producer) == list(range(10))


class NoLength(Batches):
    def __len__(self):
        raise NotImplementedError("no length")


def make_no_length(n):
    return NoLength(n, "cpu")


def test_a_pass_cut_by_close_or_a_loader_without_len_says_what_happened():
    """close() during a pass (an error handler, another thread): the pass raises RuntimeError saying the producer
    was closed, not an error of its internals; a loader whose __len__ raises still runs (no len() is needed)."""
    with hmgstore.Producer(functools.partial(make_batches, 20, "cpu")) as producer:
        batches = iter(producer)
        next(batches)
        producer.close()
        with pytest.raises(RuntimeError, match="was closed while a pass over it was under way"):
            next(batches)
    with hmgstore.Producer(functools.partial(make_no_length, 5)) as producer:
        assert sorted(b["i"] for b in producer) == list(range(5))
        with pytest.raises(TypeError, match="has no len"):
            len(producer)


def test_ctrl_c_in_the_process_group_leaves_the_producer_to_its_trainer():
    import signal

    with hmgstore.Producer(functools.partial(make_batches, 6, "cpu")) as producer:
        os.kill(producer.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the whole group
        time.sleep(0.5)
        assert sorted(b["i"] for b in producer) == list(range(6))


def test_a_producer_without_an_mps_daemon_is_warned(tmp_path, monkeypatch, caplog):
    """No MPS control pipe: the warning names the cost and the fix (and that sm_percent does nothing); with one
    (a control file in $CUDA_MPS_PIPE_DIRECTORY), no warning."""
    import logging

    from hmgstore.prefetch import producer

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not producer.mps_running()
    with caplog.at_level(logging.WARNING, logger="hmgstore.prefetch.producer"):
        producer.warn_without_mps(30)
    assert "no CUDA MPS daemon" in caplog.text and "nvidia-cuda-mps-control -d" in caplog.text
    assert "sm_percent=30 has no effect" in caplog.text
    caplog.clear()
    (tmp_path / "control").touch()
    assert producer.mps_running()
    with caplog.at_level(logging.WARNING, logger="hmgstore.prefetch.producer"):
        producer.warn_without_mps(30)
    assert caplog.text == ""


class EnvironmentSeen:
    """A loader stand-in whose one batch holds the producer process's values of the MPS variables (-1: unset)."""

    def __iter__(self):
        yield {name: torch.tensor([int(os.environ.get(name, "-1"))])
               for name in ("CUDA_MPS_CLIENT_PRIORITY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}


def make_environment_seen():
    return EnvironmentSeen()


def test_mps_settings_reach_the_producer_process_and_leave_the_trainers_alone(monkeypatch):
    """sm_percent and mps_priority are the producer's own environment; the trainer's is as it was."""
    monkeypatch.setenv("CUDA_MPS_CLIENT_PRIORITY", "1")  # the trainer runs below normal
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    with hmgstore.Producer(make_environment_seen, device="cpu", mps_priority=0, sm_percent=40) as producer:
        (seen,) = [{k: int(v) for k, v in b.items()} for b in producer]
    assert seen == {"CUDA_MPS_CLIENT_PRIORITY": 0, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": 40}
    assert os.environ["CUDA_MPS_CLIENT_PRIORITY"] == "1" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ
    with hmgstore.Producer(make_environment_seen, device="cpu") as producer:  # none given: inherited
        (seen,) = [{k: int(v) for k, v in b.items()} for b in producer]
    assert seen == {"CUDA_MPS_CLIENT_PRIORITY": 1, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": -1}


@pytest.mark.parametrize("bad, error", [(2, ValueError), (-1, ValueError), (0.0, TypeError), (True, TypeError)])
def test_an_mps_priority_other_than_0_or_1_is_refused(bad, error):
    with pytest.raises(error, match="mps_priority"):
        hmgstore.Producer(list, mps_priority=bad)
