"""Stored row formats (hmgstore.rows.formats) and tables that keep rows in them (``compress=``, ``host_dtype=``).

Every format is checked bit for bit against the same rounding done with plain torch operations, on the CPU
and (gpu marker) through the gather kernel, whose decoding must match :meth:`Format.decode` byte for byte:
the GPU tier and the host tier, the three load widths the kernel picks by row size (16-byte, 4-byte and
single values), every one of the 256 codes of the 8-bit formats, writes, pickling and the split gather.
"""
from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgstore
from helpers import assert_same, random_table
from hmgstore.rows import formats

FORMATS = ["bfloat16", "float16", "float8", "int8"]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def torch_rounding(x: torch.Tensor, name: str) -> torch.Tensor:
    """What a float32 table reads as when stored in format ``name``, written with plain torch operations."""
    if name in ("bfloat16", "float16"):
        return x.to(getattr(torch, name)).to(torch.float32)
    flat = x.reshape(len(x), -1)
    qmax = 127.0 if name == "int8" else 448.0
    scale = flat.abs().amax(1, keepdim=True) / qmax
    scale = torch.where(scale > 0, scale.clamp(min=2.0 ** -117), torch.ones_like(scale))
    q = (flat / scale).clamp(-qmax, qmax)
    q = torch.round(q).to(torch.int8) if name == "int8" else q.to(torch.float8_e4m3fn)
    return (q.to(torch.float32) * scale).reshape(x.shape)


def varied_table(rows: int, row_shape, seed: int) -> torch.Tensor:
    """Rows of very different magnitudes, a zero row, tiny (subnormal-scaled) and negative-zero values."""
    x = random_table(rows, row_shape, torch.float32, seed=seed)
    # up to 1e4 (times randn): within float16's range, which refuses finite values past 65504
    x *= torch.logspace(-6, 4, rows).reshape(rows, *([1] * len(row_shape)))
    x[rows // 2] = 0.0
    x.view(rows, -1)[1, 0] = -0.0
    x.view(rows, -1)[2, :] = 1e-42  # subnormal float32
    return x


# ---- the formats themselves, on the CPU ------------------------------------------------------------------------
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("row_shape", [(1,), (3,), (100,), (128,), (4, 25)])
def test_decode_of_encode_is_torchs_rounding(name, row_shape):
    x = varied_table(64, row_shape, seed=1)
    fmt = formats.get(name)
    stored = fmt.encode(x)
    assert tuple(stored.shape) == fmt.stored_shape(x.shape) and stored.dtype == fmt.stored_dtype()
    assert_same(fmt.decode(stored, row_shape), torch_rounding(x, name))


@pytest.mark.parametrize("elems, pitch, scale_at", [(1, 16, 4), (3, 16, 4), (12, 16, 12), (13, 32, 16),
                                                    (100, 112, 100), (128, 144, 128)])
def test_scaled_rows_layout(elems, pitch, scale_at):
    for name in ("int8", "float8"):
        fmt = formats.get(name)
        assert fmt.pitch(elems) == pitch and fmt.scale_offset(elems) == scale_at
    assert formats.get("bfloat16").pitch(elems) == 2 * elems


def test_format_names_and_refusals():
    assert formats.get(torch.bfloat16).name == "bfloat16" and formats.get("fp8").name == "float8"
    assert formats.get("INT8").name == "int8" and formats.get("torch.float16").name == "float16"
    assert formats.get(None) is None
    with pytest.raises(ValueError, match="unknown stored row format"):
        formats.get("int4")
    with pytest.raises(ValueError, match="float32 rows"):
        formats.get("int8").encode(torch.ones(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("name", ["int8", "float8"])
@pytest.mark.parametrize("bad, at", [(float("nan"), 0), (float("nan"), 12), (-float("inf"), 5), (float("inf"), 12)])
def test_any_non_finite_value_of_a_row_is_found(name, bad, at):
    """Wherever a NaN or an infinity sits in a row (first, last, among larger values), encode names that row."""
    x = random_table(20, (13,), torch.float32, seed=3) * 1e3
    x[9, at] = bad
    with pytest.raises(ValueError, match="row 9 holds NaN or infinity"):
        formats.get(name).encode(x)


@pytest.mark.parametrize("name", ["int8", "float8"])
def test_encoding_in_blocks_of_rows_gives_the_same_bytes(name, monkeypatch):
    """Rows are quantised in blocks: any block size, one ending mid-table included, gives the same bytes."""
    fmt = formats.get(name)
    x = varied_table(50, (13,), seed=5)
    monkeypatch.setattr(formats, "ENCODE_BLOCK_BYTES", 1 << 40)  # one block
    whole = fmt.encode(x)
    for rows in (1, 3, 7, 49):
        monkeypatch.setattr(formats, "ENCODE_BLOCK_BYTES", rows * 4 * 13)
        assert torch.equal(fmt.encode(x), whole), rows


@pytest.mark.parametrize("name", FORMATS)
def test_encode_writes_into_a_given_tensor(name):
    """``out=``: the rows written in place (a host tier's rows, no temporary), the same bytes as a new tensor;
    a destination of the wrong shape or dtype refused."""
    fmt = formats.get(name)
    x = varied_table(40, (13,), seed=6)
    want = fmt.encode(x)
    tier = torch.full((100, *want.shape[1:]), 7, dtype=want.dtype)  # poisoned around and under the rows
    got = fmt.encode(x, first_row=30, out=tier[30:70])
    assert got.data_ptr() == tier[30:70].data_ptr()
    assert torch.equal(tier[30:70].view(torch.uint8), want.view(torch.uint8))
    with pytest.raises(ValueError, match="out must be a CPU tensor of shape"):
        fmt.encode(x, out=tier[:39])


@pytest.mark.parametrize("name", ["int8", "float8"])
def test_scaled_rows_pad_with_zero_bytes(name, monkeypatch):
    """The bytes between a row's values and its scale, and after the scale, are zeros (files and checksums of
    a stored table do not depend on what memory held before: fresh memory is poisoned here)."""
    fmt = formats.get(name)
    real = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: (lambda t: t.fill_(255) if t.dtype == torch.uint8 else t)(
        real(*a, **k)))
    stored = fmt.encode(random_table(30, (13,), torch.float32, seed=4) - 0.5)  # 13 values, scale at 16, pitch 32
    monkeypatch.undo()
    assert stored.shape == (30, 32)
    assert not stored[:, 13:16].any() and not stored[:, 20:].any()
    assert stored[:, 16:20].view(torch.float32).gt(0).all()  # a scale per row


@pytest.mark.parametrize("name", ["int8", "float8"])
def test_scaled_formats_refuse_non_finite_rows_naming_them(name):
    x = torch.ones(10, 4)
    x[7, 2] = float("inf")
    with pytest.raises(ValueError, match="row 107 holds NaN or infinity"):
        formats.get(name).encode(x, first_row=100)
    with pytest.raises(ValueError, match="row 7 holds NaN"):
        hmgstore.HybridTensor(x, "cpu", compress=name, progress=False)


def test_16_bit_formats_keep_nan_and_infinity():
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0]])
    for name in ("bfloat16", "float16"):
        fmt = formats.get(name)
        torch.testing.assert_close(fmt.decode(fmt.encode(x), (4,)), x, rtol=0, atol=0, equal_nan=True)


def test_kernel_format_codes_match_the_header():
    from hmgstore.cuda.gather import LAYOUT

    codes = {"float16": "FMT_F16", "bfloat16": "FMT_BF16", "float8": "FMT_E4M3", "int8": "FMT_INT8"}
    for name, define in codes.items():
        assert formats.get(name).code == LAYOUT[define]


# ---- tables in a stored format, on the CPU and on a GPU ---------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("width", [1, 3, 64, 100, 128])
def test_compressed_tables_read_torchs_rounding_from_every_tier(device, name, width):
    x = varied_table(3000, (width,), seed=width)
    want = torch_rounding(x, name)
    gpu_rows = torch.arange(0, 3000, 3) if device == "cuda" else None
    t = hmgstore.HybridTensor(x, device, compress=name, gpu_rows=gpu_rows, progress=False)
    assert t.dtype == torch.float32 and t.shape == x.shape and t.host_format.name == name
    idx = torch.randint(0, 3000, (2000,), generator=torch.Generator().manual_seed(2))
    idx[:3] = torch.tensor([2999, 1500, 0])
    out = torch.full((2000, width), float("nan"), device=t.device)  # poisoned: every row must be written
    t.gather(idx, out=out)
    assert_same(out.cpu(), want[idx])
    assert_same(t[idx.to(t.device)].cpu(), want[idx])  # ids already on the device
    assert_same(t.dense(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["int8", "float8", "bfloat16"])
def test_host_only_format_keeps_the_gpu_tier_as_it_reads(device, name):
    x = varied_table(2000, (32,), seed=3)
    t = hmgstore.HybridTensor(x, device, host_dtype=name, gpu_rows=torch.arange(0, 2000, 2), progress=False)
    assert t.gpu_format is None and t.gpu_row_bytes == 32 * 4
    idx = torch.randperm(2000)[:1500]
    assert_same(t[idx].cpu(), torch_rounding(x, name)[idx])


def test_compress_and_host_dtype_must_agree():
    x = torch.ones(10, 4)
    with pytest.raises(ValueError, match="pass one of them"):
        hmgstore.HybridTensor(x, "cpu", compress="int8", host_dtype=torch.bfloat16)
    t = hmgstore.HybridTensor(x, "cpu", compress="int8", host_dtype="int8")
    assert t.gpu_format.name == t.host_format.name == "int8"
    with pytest.raises(ValueError, match="keep float32 tables"):
        hmgstore.HybridTensor(torch.arange(10).reshape(5, 2), "cpu", compress="int8")


def test_gpu_budget_counts_stored_bytes():
    x = torch.ones(10, 128)
    assert hmgstore.HybridTensor(x, "cpu", compress="int8").gpu_row_bytes == 144
    assert hmgstore.HybridTensor(x, "cpu", compress="bfloat16").gpu_row_bytes == 256
    assert hmgstore.HybridTensor(x, "cpu").gpu_row_bytes == 512


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["int8", "float8", "float16"])
def test_writes_and_empty_tables_in_a_format(device, name):
    gpu_rows = torch.arange(0, 500, 2) if device == "cuda" else None
    t = hmgstore.HybridTensor.empty((500, 24), device=device, compress=name, gpu_rows=gpu_rows, progress=False)
    assert_same(t[torch.arange(500)].cpu(), torch.zeros(500, 24))  # zero bytes read as zero rows
    rows = varied_table(100, (24,), seed=4)
    ids = torch.randperm(500)[:100]
    t[ids] = rows
    assert_same(t[ids].cpu(), torch_rounding(rows, name))
    assert_same(t[torch.tensor([int(ids[0])])].cpu(), torch_rounding(rows[:1], name))


@pytest.mark.parametrize("name", ["int8", "bfloat16"])
def test_a_compressed_table_pickles_with_its_format(name):
    x = varied_table(300, (2, 10), seed=5)
    t = hmgstore.HybridTensor(x, "cpu", compress=name, progress=False)
    back = pickle.loads(pickle.dumps(t))
    assert back.shape == x.shape and back.host_format == t.host_format and back.gpu_format == t.gpu_format
    assert_same(back[torch.arange(300)], torch_rounding(x, name))


# ---- the kernel's decoding of every 8-bit code -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int8", "float8"])
def test_kernel_decodes_every_code_as_torch_does(name, cuda_device):
    fmt = formats.get(name)
    elems = 256
    stored = torch.zeros((4, fmt.pitch(elems)), dtype=torch.uint8)
    stored[:, :elems] = torch.arange(256, dtype=torch.uint8)  # every code, in every row
    scales = torch.tensor([1.0, 0.5, 3.0, 1e-30])
    stored[:, fmt.scale_offset(elems):fmt.scale_offset(elems) + 4] = scales.reshape(4, 1).view(torch.uint8)
    want = fmt.decode(stored, (elems,))
    for gpu_rows in (None, torch.tensor([1, 3])):
        t = hmgstore.HybridTensor.over_host_tier(stored.clone(), cuda_device, torch.float32, fmt=fmt, shape=(4, elems),
                                           gpu_format=fmt, gpu_rows=gpu_rows, progress=False)
        got = t[torch.tensor([3, 2, 1, 0])].cpu()
        torch.testing.assert_close(got, want[[3, 2, 1, 0]], rtol=0, atol=0, equal_nan=True)
        finite = torch.isfinite(want[[3, 2, 1, 0]])
        assert_same(got[finite], want[[3, 2, 1, 0]][finite])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int8", "float8", "bfloat16"])
def test_compressed_gpu_tier_holds_more_rows_under_one_budget(name, cuda_device):
    x = varied_table(20_000, (128,), seed=6)
    order = torch.randperm(20_000)
    full = hmgstore.HybridTensor(x, cuda_device, gpu_budget="1MB", hot_order=order, progress=False)
    small = hmgstore.HybridTensor(x, cuda_device, gpu_budget="1MB", hot_order=order, compress=name, progress=False)
    assert full.num_gpu_rows == 10**6 // 512 and small.num_gpu_rows == 10**6 // small.gpu_row_bytes
    assert small.num_gpu_rows >= 2 * full.num_gpu_rows
    idx = order[:3000]  # mostly GPU-tier rows
    assert_same(small[idx].cpu(), torch_rounding(x, name)[idx])


@pytest.mark.gpu
@pytest.mark.parametrize("resident", [False, True])
def test_split_gather_of_scaled_rows_is_bit_exact(resident, cuda_device):
    x = varied_table(120_000, (48,), seed=7)
    gpu_rows = torch.arange(0, 120_000, 4) if resident else None
    t = hmgstore.HybridTensor(x, cuda_device, compress="int8", gpu_rows=gpu_rows, split=0.5, progress=False)
    idx = torch.randint(0, 120_000, (50_000,), generator=torch.Generator().manual_seed(8))
    out = torch.full((50_000, 48), float("nan"), device=cuda_device)
    t.gather(idx, out=out)
    assert_same(out.cpu(), torch_rounding(x, "int8")[idx])


# ---- through PyG ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_pyg_stores_keep_float_attributes_compressed_and_labels_as_they_are(small_graph, workers):
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    from hmgstore.plugins.pyg import HybridNeighborSampler, from_data

    g = small_graph
    stores = from_data(Data(x=g.x, y=g.y, edge_index=g.edge_index), device="cpu", compress="int8", progress=False)
    assert stores[0].table(None, "x").host_format.name == "int8" and stores[0].table(None, "y").host_format is None
    want = torch_rounding(g.x, "int8")
    sampler = HybridNeighborSampler(stores, [4, 2], device="cpu", progress=False)
    loader = NeighborLoader(stores, [4, 2], neighbor_sampler=sampler, input_nodes=g.train_idx[:300], batch_size=100,
                            num_workers=workers, filter_per_worker=workers > 0)
    for batch in loader:
        assert_same(batch.x, want[batch.n_id])
        assert_same(batch.y, g.y[batch.n_id])
    assert_same(stores[0].get_tensor(group_name=None, attr_name="x", index=None), want)  # whole-table reads decode


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["float16", "bfloat16"]), st.integers(0, 5), st.integers(0, 7),
       st.floats(1.0, 3.4e38, allow_nan=False), st.booleans(), st.booleans())
def test_16_bit_rows_refuse_finite_values_past_their_range(name, at, col, magnitude, negative, with_inf):
    fmt = formats.get(name)
    rows = torch.randn(6, 8)
    if with_inf:
        rows[(at + 1) % 6, 0] = float("inf")  # an infinity the table already held: kept as it is
    value = -magnitude if negative else magnitude
    rows[at, col] = value
    past = abs(torch.tensor(value).to(fmt.element).float()) == float("inf")
    ids = torch.arange(100, 106)
    if past:
        with pytest.raises(ValueError, match=f"row {100 + at} holds .*past {name}'s largest finite value"):
            fmt.encode(rows, ids)
    else:
        stored = fmt.encode(rows, ids)
        assert torch.equal(fmt.decode(stored, (8,)), rows.to(fmt.element).float())
