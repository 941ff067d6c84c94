"""The CUDA layer's pure parts, testable without a GPU: job layout, vectors, kernel source."""
import importlib.resources
import importlib.util
import re
import shutil
import subprocess

import pytest
import torch

from hmgstore import cuda
from hmgstore.cuda import gather
from hmgstore.rows.placement import Tier

L = gather.LAYOUT


def test_vector_width_divides_everything():
    assert gather.vector_bytes(512, 4096, 1024) == 16
    assert gather.vector_bytes(28, 4096) == 4
    assert gather.vector_bytes(512, 4104) == 8
    assert gather.vector_bytes(3, 4096) == 1


def test_job_words_layout():
    out = torch.empty(10, 40, dtype=torch.uint8)
    ids = torch.arange(10, dtype=torch.int32)
    tiers = [Tier("gpu", 0, 7, torch.arange(7), 1 << 20, 40), Tier("host", 7, 107, None, 1 << 30, 64)]
    job = gather.Job(ids, None, out, None, 100, 40, tiers)
    words, tiles = gather.job_words(job, tile_start=5)
    assert len(words) == gather.J_WORDS
    assert words[L["J_N"]] == 10 and words[L["J_TILE_START"]] == 5 and words[L["J_NTIERS"]] == 2
    assert words[L["J_BOUNDS"]:L["J_BOUNDS"] + 3] == [0, 7, 107]
    assert words[L["J_BASE"]:L["J_BASE"] + 2] == [1 << 20, 1 << 30]
    assert words[L["J_PITCH"]:L["J_PITCH"] + 2] == [40, 64]
    flags = words[L["J_FLAGS"]]
    vec_log2, tpr_log2 = (flags >> L["F_VEC_SHIFT"]) & 0xFF, (flags >> L["F_TPR_SHIFT"]) & 0xFF
    assert 1 << vec_log2 == 8  # 40-byte rows: 8-byte vectors
    assert 1 << tpr_log2 == 8  # 5 vectors -> a team of 8 threads
    assert tiles == -(-10 // ((gather.BLOCK >> tpr_log2) * gather.ROWS))
    assert flags & L["F_IDS64"] == 0  # int32 ids


def test_local_tiers_are_marked_and_a_capped_gather_splits_only_where_asked(monkeypatch):
    """J_LOCAL marks the tiers in the GPU's own memory; a capped launch reads them in a pass of its own, uncapped,
    only with CAPPED_ROWS="remote" and rows both local and remote; whole-SM launches stay one pass."""
    tiers = [Tier("replica", 0, 3, torch.arange(3), 1 << 20, 40), Tier("shard1", 3, 5, torch.arange(2), 1 << 21, 40),
             Tier("gpu", 5, 7, torch.arange(2), 1 << 22, 40), Tier("host", 7, 107, None, 1 << 30, 64)]
    assert gather.tier_words(tiers, None, 107, 40)[L["J_LOCAL"]] == 0b0101  # shard1 is another GPU's
    own = [tiers[0], tiers[1].bind(1 << 21, 40, own=True), *tiers[2:]]
    assert gather.tier_words(own, None, 107, 40)[L["J_LOCAL"]] == 0b0111  # the reading GPU's own shard
    with pytest.raises(ValueError, match="only a shard"):
        tiers[3].bind(1 << 30, 64, own=True)
    mixed = gather.Job(torch.arange(4), None, torch.empty(4, 10), None, 107, 40, tiers)
    host = gather.Job(torch.arange(4), None, torch.empty(4, 10), None, 107, 40, tiers[3:])
    whole = gather.Job(torch.arange(4), None, torch.empty(4, 10), None, 7, 40, tiers[2:3])
    one, two = ((L["PASS_ALL"], True),), ((L["PASS_LOCAL"], False), (L["PASS_REMOTE"], True))
    monkeypatch.setattr(gather, "CAPPED_ROWS", "all")
    assert gather.passes([mixed], 12, 0) == one and gather.passes([whole], 12, 0) == one
    monkeypatch.setattr(gather, "CAPPED_ROWS", "remote")
    assert gather.passes([mixed], 12, 0) == two
    assert gather.passes([host, whole], 12, 0) == two  # local and remote rows in different jobs of one launch
    assert gather.passes([mixed], None, 0) == one  # uncapped: nothing to split
    assert gather.passes([mixed], 12, 50_000) == one  # whole SMs
    assert gather.passes([host], 12, 0) == one  # every row remote: capped
    assert gather.passes([whole], 12, 0) == ((L["PASS_ALL"], False),)  # every row local: uncapped, one launch


def test_run_launches_each_pass_with_its_cap(monkeypatch):
    """run(): one launch per pass, in order, the kernel told its pass; the capped pass's grid from the cap, the
    uncapped one's from the whole GPU (the kernel, the grid and CuPy faked: no GPU here)."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    launches, grids = [], []

    def kernel(grid, block, args, stream=None, shared_mem=0):
        launches.append((grid, block, int(args[-1]), shared_mem))

    monkeypatch.setattr(gather, "_kernel", lambda *a, **k: kernel)
    monkeypatch.setattr(gather, "grid_size", lambda index, k, tiles, cap, narrow: grids.append(cap) or (cap or 99))
    monkeypatch.setattr(gather, "cupy", lambda: SimpleNamespace(cuda=SimpleNamespace(Device=lambda i: nullcontext())))
    monkeypatch.setattr(gather, "cupy_stream", lambda stream: stream)
    two = ((L["PASS_LOCAL"], False), (L["PASS_REMOTE"], True))
    packed = gather.Packed(torch.zeros(gather.J_WORDS, dtype=torch.int64), 1, 50, [0], max_sms=12, passes=two)
    gather.run(packed, torch.device("cuda", 0), "stream")
    assert grids == [None, 12]
    assert launches == [((99,), (gather.BLOCK,), L["PASS_LOCAL"], 0), ((12,), (gather.BLOCK,), L["PASS_REMOTE"], 0)]
    launches.clear()
    gather.run(gather.Packed(packed.table, 1, 50, [0], max_sms=12), torch.device("cuda", 0), "stream")
    assert [(g, p) for g, _, p, _ in launches] == [((12,), L["PASS_ALL"])]  # the default: one capped launch


def test_too_many_tiers_refused():
    tiers = [Tier("host", 0, 2, None, 0, 16)] * (gather.MAX_TIERS + 1)
    job = gather.Job(torch.arange(2), None, torch.empty(2, 4), None, 2, 16, tiers)
    with pytest.raises(ValueError, match="tiers"):
        gather.job_words(job, 0)


def test_job_layout_is_read_from_the_header_the_kernel_is_compiled_with():
    header = importlib.resources.files("hmgstore.kernels").joinpath(gather.HEADER).read_text()
    kernel = importlib.resources.files("hmgstore.kernels").joinpath(gather.SOURCE).read_text()
    assert gather.read_layout(header) == gather.LAYOUT
    assert L["J_BASE"] == L["J_BOUNDS"] + L["MAX_TIERS"] + 1 and L["J_NARROW"] == L["J_PITCH"] + L["MAX_TIERS"]
    assert L["J_LOCAL"] == L["J_NARROW"] + 1 and L["J_WORDS"] == L["J_LOCAL"] + 1 and gather.E_WORDS == 4
    assert "#define J_" not in kernel  # the layout is written once, in the header
    assert gather.read_layout("#define A 3\n#define B (A + 4) // seven\n") == {"A": 3, "B": 7}
    with pytest.raises(ValueError, match="only integers"):
        gather.read_layout("#define A (B * 2)\n")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="checks the message given without CuPy")
def test_missing_cupy_says_what_to_install():
    with pytest.raises(ImportError, match="pip install cupy-cuda"):
        cuda.cupy()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile (no GPU needed)")
def test_kernel_compiles_without_spills_and_the_plain_build_keeps_its_registers(tmp_path):
    source = tmp_path / "gather_full.cu"
    source.write_text(cuda.kernel_source(gather.HEADER, gather.SOURCE))
    registers = {}
    for narrow in (0, 1):
        res = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", f"-DROWS={gather.ROWS}", f"-DNARROW={narrow}",
                              "-Xptxas", "-v", "-c", str(source), "-o", str(tmp_path / "g.o")],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert "0 bytes spill stores" in res.stderr
        registers[narrow] = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
    # 3 blocks of 256 threads per SM fit within 85 registers; the widening build may take more
    assert registers[0] <= 80 and registers[1] >= registers[0], registers


# ---- ids grouped by host page (kernels/order.cu) --------------------------------------------------
def test_bucket_shift_covers_about_two_mib():
    from hmgstore.cuda import order

    assert order.bucket_shift(128) == 14 and order.bucket_shift(512) == 12 and order.bucket_shift(400) == 12
    assert order.bucket_shift(2 << 20) == 0 and order.bucket_shift(8 << 20) == 0
    with pytest.raises(ValueError, match="CUDA"):
        order.group_by_page(torch.arange(5), 5, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ids_grouped_by_page_are_a_permutation_in_page_order(cuda_device, dtype):
    from hmgstore.cuda import order

    num_rows, shift = 1_000_003, 10
    ids = torch.randint(0, num_rows, (300_000,), dtype=dtype)
    ids[:5] = torch.tensor([-7, num_rows, num_rows + (1 << 20), 0, num_rows - 1], dtype=dtype)  # bad ids too
    ids = ids.to(cuda_device)
    grouped, perm = order.group_by_page(ids, num_rows, shift)
    assert grouped.dtype == dtype and perm.dtype == torch.int64
    assert torch.equal(torch.sort(perm).values, torch.arange(len(ids), device=cuda_device))  # each position once
    assert torch.equal(grouped, ids[perm])
    buckets = (grouped.long() >> shift).clamp(0, (num_rows - 1) >> shift)
    assert bool((buckets[1:] >= buckets[:-1]).all())  # page order (bad ids in the first or last page)
    one, at = order.group_by_page(ids[:1], num_rows, shift)
    assert one.tolist() == ids[:1].tolist() and at.tolist() == [0]
    none, at = order.group_by_page(ids[:0], num_rows, shift)
    assert len(none) == 0 and len(at) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, map_dtype", [(torch.int32, torch.int32), (torch.int64, torch.int32),
                                              (torch.int32, torch.int64), (torch.int64, torch.int64)])
def test_ids_grouped_by_their_mapped_position(cuda_device, dtype, map_dtype):
    """A table that renumbers its rows (GPU tier, host layout) groups ids by where their rows are: map[id]."""
    from hmgstore.cuda import order

    num_rows, shift = 200_000, 8
    new_of_old = torch.randperm(num_rows, generator=torch.Generator().manual_seed(1)) + 1000  # 1000 GPU rows first
    ids = torch.randint(0, num_rows, (50_000,), dtype=dtype)
    ids[:2] = torch.tensor([-1, num_rows], dtype=dtype)  # never looked up: first or last group
    grouped, perm = order.group_by_page(ids.to(cuda_device), num_rows, shift, new_of_old.to(cuda_device, map_dtype),
                                        positions=num_rows + 1000)
    grouped, perm = grouped.cpu(), perm.cpu()
    assert torch.equal(torch.sort(perm).values, torch.arange(len(ids))) and torch.equal(grouped, ids[perm])
    last = (num_rows + 999) >> shift
    inside = (grouped >= 0) & (grouped < num_rows)  # out-of-range ids are keyed by themselves
    keys = torch.where(inside, new_of_old[grouped.long().clamp(0, num_rows - 1)], grouped.long().clamp(min=0))
    buckets = (keys >> shift).clamp(0, last)
    assert bool((buckets[1:] >= buckets[:-1]).all())
