"""The split gather (hmgstore.gather.cpu_share): the CPU reads part of a batch's host rows beside the kernel.

The pieces that need no GPU (how a batch is divided, the threaded take, the
cost model's cache) run everywhere; the gather itself is checked bit-exactly
against ``x[idx]`` on a GPU.
"""
from __future__ import annotations

import json

import pytest
import torch

import hmgstore
from helpers import assert_same, random_table
from hmgstore.gather import cpu_share as split


# ---- what runs without a GPU -------------------------------------------------------------------------------------
def test_divide_gives_the_cpu_its_share_of_host_rows_only():
    on_host = torch.ones(100_000, dtype=torch.bool)
    on_host[:50_000] = False  # the first half is resident on the GPU
    ids = torch.randint(0, 100_000, (40_000,), generator=torch.Generator().manual_seed(1))
    k, cpu, rest = split.divide(ids, on_host, 0.5)
    assert bool(on_host[ids[cpu]].all())  # the CPU reads host rows only
    assert k == len(cpu) == round(0.5 * int(on_host[ids].sum()))
    together = torch.cat([cpu, rest]).sort().values
    assert torch.equal(together, torch.arange(len(ids)))  # every position exactly once


def test_divide_with_every_row_on_the_host_gives_ranges():
    assert split.divide(torch.arange(20_000), None, 0.3) == (6000, None, None)
    assert split.divide(torch.arange(split.MIN_IDS), None, 0.5) == (0, None, None)  # too small: kernel alone


def test_read_chunks_copies_rows_in_order():
    x = random_table(50_000, (7, 3), torch.float32, seed=2)[::2]  # every other row: not back to back
    ids = torch.randint(0, 25_000, (30_000,), generator=torch.Generator().manual_seed(3))
    ids[:2] = torch.tensor([24_999, 24_999])  # the last row, twice
    into = torch.full((30_000, 7, 3), float("nan"))
    chunks = split.read_chunks(x, ids, into, chunks=3)
    spans = [span for span, _ in chunks]
    assert spans == [(0, 10_000), (10_000, 20_000), (20_000, 30_000)]
    for _, future in chunks:
        future.result()
    assert_same(into, x[ids])


def test_read_chunks_with_a_thread_count_reads_with_that_many(monkeypatch):
    """``threads``: torch's thread count in the reader thread for the reads only, set back after them (torch gives
    threads started later the count it was last set to); the rows the same."""
    x = random_table(20_000, (5,), torch.float32, seed=4)
    ids = torch.randint(0, 20_000, (12_000,), generator=torch.Generator().manual_seed(5))
    before = split._reader.submit(torch.get_num_threads).result()
    want = 2 if before == 1 else 1  # a count the reader does not have already
    seen = []
    real = torch.index_select

    def index_select(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "index_select", index_select)
    into = torch.full((12_000, 5), float("nan"))
    for _, future in split.read_chunks(x, ids, into, chunks=2, threads=want):
        future.result()
    monkeypatch.undo()
    assert_same(into, x[ids])
    assert seen == [want, want]  # each piece read with that many
    assert split._reader.submit(torch.get_num_threads).result() == before  # and the reader's own count back


def test_ids_are_clamped_within_their_dtype_before_a_row_map_lookup():
    """GPU ids of a split gather index the row map before their check: clamped into the table, and int32 ids of a
    table of more than 2**31 rows within int32 (no overflow error)."""
    from hmgstore.gather.plan import clamped

    assert clamped(torch.tensor([-5, 3, 2**31 - 1], dtype=torch.int32), 2**31 + 10).tolist() == [0, 3, 2**31 - 1]
    assert clamped(torch.tensor([-1, 5, 99]), 10).tolist() == [0, 5, 9]
    assert clamped(torch.tensor([7], dtype=torch.int32), 10).dtype == torch.int32


def fake_stat(busy_per_core: list[int], idle: int = 1000) -> str:
    lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]  # the total line is not read: only the allowed cores
    lines += [f"cpu{c} {b} 0 0 {idle} 7 0 0 0 0 0" for c, b in enumerate(busy_per_core)]
    return "\n".join(lines + ["intr 12345"])


def fake_self(utime: int, stime: int) -> str:
    fields = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 30
    return "4242 (python (a b)) " + " ".join(fields)  # a command name holding spaces and parentheses


def test_cpu_load_counts_cores_other_processes_keep_busy():
    now, stat, own = [0.0], [fake_stat([0, 0, 0, 0])], [fake_self(0, 0)]
    load = split.CpuLoad(lambda: stat[0], lambda: own[0], lambda: now[0], cpus=[0, 1, 3])
    assert load.idle() == 3.0  # nothing measured yet: every allowed core counts as idle
    # one second later (100 ticks): cores 0, 1 and 3 busy for 90, 100 and 60 ticks; core 2 is not ours;
    # this process itself used 50 of them
    now[0], stat[0], own[0] = 1.0, fake_stat([90, 100, 100, 60], idle=1100), fake_self(30, 20)
    assert load.idle() == pytest.approx(3 - (250 - 50) / 100)
    assert load.room_for(0) and not load.room_for(1)
    assert not load.room_for(16)  # threads count for at most half the cores: 1 + 1 > 1.5
    now[0], stat[0] = 1.1, fake_stat([400, 400, 400, 400])  # within PERIOD: the last figure stands
    assert load.idle() == pytest.approx(1.0)
    now[0] = 2.0  # everything busy: no idle core, never below 0
    assert load.idle() == 0.0 and not load.room_for(0)


def test_cpu_load_without_proc_files_counts_every_core_idle():
    def missing():
        raise OSError("no /proc here")

    load = split.CpuLoad(missing, missing, cpus=[0, 1])
    assert load.idle() == 2.0 and load.room_for(1)
    renumbered = split.CpuLoad(lambda: fake_stat([5, 5]), lambda: fake_self(0, 0), cpus=[7, 8])  # lxcfs-style
    assert renumbered.idle() == 2.0 and renumbered.idle() == 2.0  # no figure to trust: every core idle


def test_cpu_load_leaves_room_for_torch_default_threads():
    now, stat = [0.0], [fake_stat([0] * 16)]
    load = split.CpuLoad(lambda: stat[0], lambda: fake_self(0, 0), lambda: now[0], cpus=range(16))
    load.idle()
    now[0], stat[0] = 1.0, fake_stat([100] * 3 + [0] * 13)  # 3 cores busy elsewhere: 13 idle
    assert load.room_for(16)  # one thread per core (torch's default) still fits: 1 + 8 <= 13
    now[0], stat[0] = 2.0, fake_stat([200] * 12 + [0] * 4)  # 12 sampler workers busy: 4 idle
    assert not load.room_for(16) and not load.room_for(4)


def test_cpu_load_sees_a_busy_process(tmp_path):
    import subprocess
    import sys
    import time

    load = split.CpuLoad()
    cores = len(load._cpus)
    try:
        load._sample()
    except (OSError, ValueError) as err:
        pytest.skip(f"this system's /proc does not list its allowed cores: {err}")
    assert 0 <= load.idle() <= cores
    spinner = subprocess.Popen([sys.executable, "-c",
                                "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)
        load.idle()  # the first sample of the window
        time.sleep(split.CpuLoad.PERIOD * 4)
        assert load.idle() <= cores - 0.5  # the spinner kept (most of) one core busy
    finally:
        spinner.kill()
        spinner.wait()


def test_split_arguments_are_checked_on_the_cpu_too():
    x = random_table(1000, (4,), torch.float32)
    for bad in ("fast", 1.5, -0.1, True):
        with pytest.raises(ValueError, match="split must be"):
            hmgstore.HybridTensor(x, "cpu", split=bad)
    t = hmgstore.HybridTensor(x, "cpu", split="auto")  # on the CPU every row is read by the CPU already
    assert_same(t[torch.arange(10)], x[:10])
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="split's threads must be"):
            t.set_split(0.5, threads=bad)


def test_the_cost_model_keeps_the_fastest_share_measured():
    model = split.Model(3e8, 1e8, {0.0: 1.0, 1.0: 3.0, 0.25: 0.9, 0.375: 0.8}, "k")
    assert model.predicted == pytest.approx(0.25) and model.share == 0.375
    assert split.Model(1e9, 1e7, {0.0: 1.0, 1.0: 100.0, 0.01: 1.1}, "k").share == 0.0  # splitting does not pay


def test_measurements_are_cached_by_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HMGSTORE_CACHE_DIR", str(tmp_path))
    assert split.cache_path() == tmp_path / "split.json"
    split._write_cache("machine|table", split.Model(2e8, 1e8, {0.0: 1.0, 1.0: 2.0, 0.4: 0.7}, "machine|table"))
    entry = json.loads((tmp_path / "split.json").read_text())["machine|table"]
    assert entry["kernel_rows_per_s"] == 2e8 and entry["cpu_rows_per_s"] == 1e8 and "measured" in entry
    assert entry["share"] == 0.4 and entry["seconds"] == {"0.0": 1.0, "1.0": 2.0, "0.4": 0.7}
    (tmp_path / "split.json").write_text("{not json")  # a damaged cache is measured again, not fatal
    assert split._read_cache() == {}
    (tmp_path / "split.json").write_text(json.dumps({"k": {"kernel_rows_per_s": 1.0}}))  # an entry lacking fields
    monkeypatch.setattr(split, "cache_key", lambda table, batch: "k")
    monkeypatch.setattr(split, "measure",
                        lambda table, batch, key, run: split.Model(1.0, 1.0, {0.0: 1.0, 1.0: 2.0}, key))
    assert split.model_for(object(), 1000, None).share == 0.0  # measured again (the stub), and the cache repaired
    assert json.loads((tmp_path / "split.json").read_text())["k"]["share"] == 0.0


# ---- on a GPU ------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("share", [0.3, 1.0])
@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("host_dtype", [None, torch.bfloat16])
def test_split_gather_is_bit_exact(cuda_device, share, resident, host_dtype):
    x = random_table(200_000, (32,), torch.float32, seed=11)
    want_table = x if host_dtype is None else x.to(host_dtype).float()
    gpu_rows = torch.arange(0, 200_000, 3) if resident else None
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows, split=share, host_dtype=host_dtype, stats=True)
    assert t.split_setting.value == share
    idx = torch.randint(0, 200_000, (60_000,), generator=torch.Generator().manual_seed(12))
    idx[:3] = torch.tensor([199_999, 0, 199_999])
    out = torch.full((60_000, 32), float("nan"), device=cuda_device)  # poisoned: every row must be written
    t.gather(idx, out=out)
    assert_same(out.cpu(), want_table[idx])
    stats = t.stats()
    assert stats["rows"] == 60_000  # the CPU's rows are counted once, as host-tier rows
    if resident:
        assert stats["tiers"]["gpu"]["rows"] == int((idx % 3 == 0).sum())


@pytest.mark.gpu
def test_split_in_a_fused_gather_and_with_gpu_ids(cuda_device):
    x = random_table(100_000, (16,), torch.float32, seed=13)
    labels = torch.arange(100_000)
    t = hmgstore.HybridTensor(x, cuda_device, split=0.5)
    y = hmgstore.HybridTensor(labels, cuda_device)
    idx = torch.randint(0, 100_000, (50_000,), generator=torch.Generator().manual_seed(14))
    feats, labs = hmgstore.gather_many([(t, idx), (y, idx)])
    assert_same(feats.cpu(), x[idx])
    assert_same(labs.cpu(), labels[idx])
    assert_same(t[idx.to(cuda_device)].cpu(), x[idx])  # GPU ids: read back, then split the same way
    assert_same(t[idx[:100]].cpu(), x[idx[:100]])  # a small batch: the kernel alone


@pytest.mark.gpu
@pytest.mark.parametrize("compress", [None, "int8"])
def test_fixed_split_hands_gpu_ids_host_rows_to_the_cpu(cuda_device, compress):
    """GPU ids with a fixed share: the ids are read back, the CPU reads the host rows (counted as host-tier rows),
    the kernel the GPU tier's; bit-exact, and a bad id raises at once even with check='deferred'."""
    x = random_table(120_000, (32,), torch.float32, seed=21)
    want = x if compress is None else hmgstore.rows.formats.get("int8").decode(
        hmgstore.rows.formats.get("int8").encode(x), (32,))
    gpu_rows = torch.arange(0, 120_000, 4)
    t = hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows, split=1.0, compress=compress, stats=True)
    idx = torch.randint(0, 120_000, (50_000,), generator=torch.Generator().manual_seed(22))
    idx[:2] = torch.tensor([119_999, 0])
    reads, real = [], split.read_chunks
    split.read_chunks = lambda source, ids, into, chunks=2, threads=None: reads.append((len(ids), threads)) or \
        real(source, ids, into, chunks, threads)
    try:
        out = torch.full((50_000, 32), float("nan"), device=cuda_device)  # poisoned
        t.gather(idx.to(cuda_device), out=out)
        t.set_split(1.0, threads=3)  # the CPU's reads with 3 of torch's threads: the same rows
        again = torch.full((50_000, 32), float("nan"), device=cuda_device)
        t.gather(idx.to(cuda_device), out=again)
    finally:
        split.read_chunks = real
    assert_same(out.cpu(), want[idx])
    assert_same(again.cpu(), want[idx])
    host_rows = int((idx % 4 != 0).sum())
    assert reads == [(host_rows, None), (host_rows, 3)]  # every host-tier row through the CPU, once a gather
    stats = t.stats()  # two gathers
    assert stats["rows"] == 100_000 and stats["tiers"]["gpu"]["rows"] == 2 * (50_000 - host_rows)
    bad = idx.clone()
    bad[7] = 120_000
    with pytest.raises(IndexError, match="120000"):
        t.gather(bad.to(cuda_device), check="deferred")
    auto = hmgstore.HybridTensor(x, cuda_device, gpu_rows=gpu_rows, split=0.0)
    assert auto.split_setting is None  # a zero share is no split: GPU ids stay on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["layout", "host_only", "half_share", "int32_ids"])
def test_split_gpu_ids_in_every_table_shape(cuda_device, case):
    """GPU ids split by the GPU in the other table shapes: a host tier in its own order (layout), no GPU tier
    (no row map), a share below 1 (the kernel reads the rest of the host rows), int32 ids; bit-exact each."""
    n = 80_000
    x = random_table(n, (16,), torch.float32, seed=31)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(32))
    kwargs = {"layout": dict(gpu_rows=order[:n // 5], layout=order), "host_only": {},
              "half_share": dict(gpu_rows=order[:n // 5]), "int32_ids": dict(gpu_rows=order[:n // 5])}[case]
    share = 0.5 if case == "half_share" else 1.0
    t = hmgstore.HybridTensor(x, cuda_device, split=share, **kwargs)
    idx = torch.randint(0, n, (40_000,), generator=torch.Generator().manual_seed(33))
    ids = idx.to(cuda_device, torch.int32 if case == "int32_ids" else torch.int64)
    out = torch.full((40_000, 16), float("nan"), device=cuda_device)  # poisoned
    t.gather(ids, out=out)
    assert_same(out.cpu(), x[idx])


@pytest.mark.gpu
def test_auto_split_measures_once_and_reads_the_cache(cuda_device, tmp_path, monkeypatch):
    monkeypatch.setenv("HMGSTORE_CACHE_DIR", str(tmp_path))
    x = random_table(300_000, (32,), torch.float32, seed=15)
    calls = []
    measure = split.measure
    monkeypatch.setattr(split, "measure", lambda *a, **k: calls.append(1) or measure(*a, **k))
    monkeypatch.setattr(split.cpu_load, "room_for", lambda threads: True)  # however busy this machine is
    t = hmgstore.HybridTensor(x, cuda_device, split="auto")
    assert not (tmp_path / "split.json").exists()  # measured at the first batch, at its size
    idx = torch.randint(0, 300_000, (100_000,))
    assert_same(t[idx].cpu(), x[idx])
    entries = json.loads((tmp_path / "split.json").read_text())
    (key, entry), = entries.items()
    assert key == split.cache_key(t, 100_000) and key.endswith("batch<=131072")
    assert entry["kernel_rows_per_s"] > 0 and entry["cpu_rows_per_s"] > 0
    fastest = float(min(entry["seconds"], key=entry["seconds"].get))
    assert entry["share"] == fastest == t.split_setting.share(t, 100_000)  # the fastest share measured
    again = hmgstore.HybridTensor(x.clone(), cuda_device, split="auto")
    assert_same(again[idx[:70_000]].cpu(), x[idx[:70_000]])  # same size class
    assert len(calls) == 1  # the second table of the same kind read the cache


@pytest.mark.gpu
def test_auto_split_leaves_busy_cpus_to_other_processes(cuda_device, tmp_path, monkeypatch):
    monkeypatch.setenv("HMGSTORE_CACHE_DIR", str(tmp_path))
    x = random_table(300_000, (32,), torch.float32, seed=17)
    t = hmgstore.HybridTensor(x, cuda_device, split="auto")
    monkeypatch.setattr(split, "model_for", lambda table, batch, run: split.Model(1.0, 1.0, {0.5: 1.0, 0.0: 2.0}, "k"))
    room = [True]
    monkeypatch.setattr(split.cpu_load, "room_for", lambda threads: room[0])
    idx = torch.randint(0, 300_000, (100_000,))
    assert t.split_setting.share(t, 100_000) == 0.5 and t.split_skipped == 0
    room[0] = False  # sampler workers took the cores: the kernel reads the whole batch
    out = t[idx]
    assert t.split_setting.share(t, 100_000) == 0.0 and t.split_skipped == 2
    assert_same(out.cpu(), x[idx])
    t.set_split(0.5)  # a fixed share is the caller's choice: kept however busy the CPUs are
    assert t.split_setting.share(t, 100_000) == 0.5 and t.split_skipped == 2


@pytest.mark.gpu
def test_split_reads_a_column_slice(cuda_device):
    x = random_table(100_000, (16,), torch.float32, seed=16)
    t = hmgstore.HybridTensor(x[:, 3:11], cuda_device, split=0.5)  # rows 32 B apart by 64 B
    idx = torch.randint(0, 100_000, (20_000,))
    assert_same(t[idx].cpu(), x[:, 3:11][idx])
