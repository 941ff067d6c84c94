"""The gather kernel (``kernels/gather.cu``): its job layout and its launch.

The layout of a job's description is defined once, in
``kernels/gather_job.cuh``; this module reads its ``#define`` lines and the
kernel is compiled with the header in front of it, so the two cannot drift.
"""
from __future__ import annotations

import ast
import contextlib
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .runtime import cupy, cupy_stream, kernel_source, module
from .settings import choice

#: Threads per block: 256 matched 512 and beat 128 (benchmarks/probes/tune_gather.py, benchmarks/results/tune-h100.md).
BLOCK = 256
#: Rows each team copies per tile, so every thread keeps this many loads in flight (see gather.cu); 4 brought the
#: GPU tier's reads close to index_select's (benchmarks/NOTES.md).
ROWS = 4
HEADER, SOURCE = "gather_job.cuh", "gather.cu"
#: Extra NVRTC options; the tuning script sets launch bounds through it.
KERNEL_OPTIONS: tuple[str, ...] = ()
#: True: a capped gather's blocks hold whole SMs (:func:`exclusive_smem`); False (the default): the cap bounds its
#: thread slots, spread over SMs. Whole SMs sped up the training step's kernels but not the epoch, where they varied
#: more from run to run than spread blocks (``benchmarks/results/strong-step-h100.md``). Set by
#: ``HMGSTORE_WHOLE_SMS=1`` in the environment (a producer process inherits it), or here for this process only.
EXCLUSIVE = choice("HMGSTORE_WHOLE_SMS", ("0", "1"), "0") == "1"
#: Threads per block of a capped gather, one block to an SM.
EXCLUSIVE_BLOCK = 1024
#: The whole-SM build's preferred shared-memory carveout, in percent of the most an SM can give (100: all of it).
CARVEOUT = 100
#: Which rows of a capped gather the cap holds: ``"all"`` (the default), or ``"remote"``: only those read over a link
#: (host, peer GPUs), the rows in the GPU's own memory then read by a launch of their own with the GPU's full width
#: (:func:`passes`). On the papers-shaped graph beside a strong step, "remote" made the producer alone 16-23% faster
#: and its epoch 3.5-5% slower: the uncapped launch slows the step more than it shortens the gather
#: (``benchmarks/results/loader-gather-papers-h200.md``). Set by ``HMGSTORE_CAPPED_ROWS`` in the environment (a
#: producer process inherits it), or here for this process only.
CAPPED_ROWS = choice("HMGSTORE_CAPPED_ROWS", ("all", "remote"), "all")


def _evaluate(expr: str, known: dict[str, int]) -> int:
    """The value of a ``#define`` body: integers, earlier names, + and -, parentheses."""

    def value(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left - right
        raise ValueError(f"cannot read {expr!r} in {HEADER}: only integers, earlier names, + and - are allowed")

    return value(ast.parse(expr, mode="eval").body)


def read_layout(text: str) -> dict[str, int]:
    """Every ``#define NAME value`` of a header, in order, with values evaluated."""
    layout: dict[str, int] = {}
    for name, expr in re.findall(r"^#define\s+(\w+)\s+([^/\n]+?)\s*(?://.*)?$", text, flags=re.M):
        layout[name] = _evaluate(expr, layout)
    return layout


LAYOUT = read_layout(kernel_source(HEADER))
MAX_TIERS = LAYOUT["MAX_TIERS"]
J_WORDS = LAYOUT["J_WORDS"]
E_WORDS = LAYOUT["E_WORDS"]


@dataclass
class Job:
    """One table's share of a launch: rows ``ids`` -> ``out`` (see gather.cu).

    ``ids``: 1-D int32/int64 CUDA tensor of old row ids, each in
    ``[0, num_rows)`` (grouped by host page if ``perm`` is given); ``perm``: int64 output
    position of each id, or None; ``out``: contiguous CUDA tensor of
    ``len(ids)`` rows of ``row_bytes`` each. ``tiers``: the table's tiers in
    new-id order, each with ``start``, ``end``, ``base`` and ``pitch``
    (:class:`hmgstore.rows.placement.Tier`); ``map``: int32/int64 CUDA tensor, new
    id per old id, or None when new id = old id.
    """

    ids: torch.Tensor
    perm: torch.Tensor | None
    out: torch.Tensor
    map: torch.Tensor | None
    num_rows: int
    row_bytes: int
    tiers: Sequence


def vector_bytes(row_bytes: int, *addresses: int) -> int:
    """Widest vector (16, 8, 4, 2 or 1 bytes) dividing the row size and every address/pitch."""
    width = 16
    for value in (row_bytes, *addresses):
        while width > 1 and value % width:
            width //= 2
    return width


def job_words(job: Job, tile_start: int, block: int = BLOCK) -> tuple[list[int], int]:
    """The job's ``J_WORDS`` description and how many tiles of a ``block``-thread launch it spans."""
    L = LAYOUT
    formats = {t.stored for t in job.tiers if t.stored is not None}
    if len(formats) > 1:
        raise ValueError(f"the tiers of one table may store rows in one narrower format, not {sorted(formats)}")
    out_ptr, n = job.out.data_ptr(), job.ids.shape[0]  # read once: each torch call of a batch takes the GIL
    vec = vector_bytes(job.row_bytes, out_ptr, *(p for t in job.tiers if t.stored is None for p in (t.base, t.pitch)))
    fmt = formats.pop() if formats else None
    format_flags, values = _format_flags(job, fmt, out_ptr) if fmt is not None else (0, 1)
    # Loads a team makes per row: vectors of rows kept as they read, stored-value loads of decoded rows.
    loads = max(job.row_bytes // vec if any(t.stored is None for t in job.tiers) else 1,
                job.row_bytes // 4 // values if fmt is not None else 1)
    tpr_log2 = min(5, max(0, (loads - 1).bit_length()))  # team: pow2 >= loads, at most a warp
    rows_per_tile = (block >> tpr_log2) * ROWS
    tiles = -(-n // rows_per_tile)
    words = tier_words(job.tiers, job.map, job.num_rows, job.row_bytes)
    words[L["J_IDS"]] = job.ids.data_ptr()
    words[L["J_PERM"]] = job.perm.data_ptr() if job.perm is not None else 0
    words[L["J_OUT"]] = out_ptr
    words[L["J_N"]] = n
    words[L["J_TILE_START"]] = tile_start
    words[L["J_FLAGS"]] |= (
        (L["F_IDS64"] if job.ids.dtype == torch.int64 else 0)
        | (vec.bit_length() - 1) << L["F_VEC_SHIFT"]
        | tpr_log2 << L["F_TPR_SHIFT"]
        | format_flags)
    return words, tiles


def tier_words(tiers: Sequence, map: torch.Tensor | None, num_rows: int, row_bytes: int) -> list[int]:
    """The ``J_WORDS`` of a table's layout alone: its map, row count and size, and its tiers (where each
    tier's rows are; see gather.cu). A job adds its ids and output; the sampler's read of a chunked
    topology (kernels/sample.cu) takes these words as they are."""
    L = LAYOUT
    if len(tiers) > MAX_TIERS:
        raise ValueError(f"a table may have at most {MAX_TIERS} tiers, got {len(tiers)}")
    words = [0] * J_WORDS
    words[L["J_MAP"]] = map.data_ptr() if map is not None else 0
    words[L["J_NUM_ROWS"]] = num_rows
    words[L["J_ROW_BYTES"]] = row_bytes
    words[L["J_FLAGS"]] = L["F_MAP64"] if map is not None and map.dtype == torch.int64 else 0
    words[L["J_NTIERS"]] = len(tiers)
    words[L["J_BOUNDS"]] = tiers[0].start
    for t, tier in enumerate(tiers):
        words[L["J_BOUNDS"] + t + 1] = tier.end
        words[L["J_BASE"] + t] = tier.base
        words[L["J_PITCH"] + t] = tier.pitch
        if tier.stored is not None:
            words[L["J_NARROW"]] |= 1 << t
        if tier.local:  # in this GPU's memory (hmgstore.rows.placement.Tier.local)
            words[L["J_LOCAL"]] |= 1 << t
    return words


def _format_flags(job: Job, fmt, out_ptr: int) -> tuple[int, int]:
    """Flag bits of a job whose narrow tiers keep rows in ``fmt`` (:class:`hmgstore.rows.formats.Format`): its code,
    and the widest load (16, 4 or the element's own bytes) that every narrow tier's base and pitch, the
    output and the row's value count allow; and the stored values that load reads."""
    L = LAYOUT
    if job.out.dtype != torch.float32:
        raise ValueError(f"narrow tiers decode into float32 tables, not {job.out.dtype}")
    elems = job.row_bytes // 4
    aligned = vector_bytes(16, *(p for t in job.tiers if t.stored is not None for p in (t.base, t.pitch)))
    if fmt.scaled and aligned < 4:
        raise ValueError(f"{fmt.name} rows need 4-byte aligned tiers (base and pitch), got {aligned}-byte")
    size = fmt.element_size
    loads = [(16, 16 // size)] + ([(4, 4)] if size == 1 else [])  # (bytes, values) the kernel has builds for
    out_aligned = vector_bytes(16, out_ptr) == 16  # the decoded values are written as float4 (out_ptr: job.out's)
    values = next((v for load, v in loads if out_aligned and aligned >= load and elems % v == 0), 1)
    return fmt.code << L["F_FMT_SHIFT"] | (values.bit_length() - 1) << L["F_NVEC_SHIFT"], values


def _kernel(device_index: int, narrow: bool = False, whole: bool = False):
    """The gather kernel; ``narrow``: the build that widens narrow tiers (see gather.cu: NARROW); ``whole``: the
    build for whole-SM blocks (:func:`exclusive_smem`), its registers bounded so that one block of
    ``EXCLUSIVE_BLOCK`` threads fits an SM (at most 64 a thread on sm80/sm90: the plain build needs more)."""
    options = (*KERNEL_OPTIONS, f"-DROWS={ROWS}", f"-DNARROW={int(narrow)}")
    if whole:
        options = (*options, f"-DLB_THREADS={EXCLUSIVE_BLOCK}", "-DLB_MIN_BLOCKS=1")
    return module(device_index, (HEADER, SOURCE), options).get_function("hmg_gather")


_occupancy: dict[tuple, int] = {}
_occupancy_lock = threading.Lock()


def _blocks_per_sm(device_index: int, kernel, narrow: bool = False) -> int:
    key = (device_index, KERNEL_OPTIONS, ROWS, BLOCK, narrow)
    with _occupancy_lock:
        if key not in _occupancy:
            cp = cupy()
            with cp.cuda.Device(device_index):
                _occupancy[key] = max(1, cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    kernel.kernel.ptr, BLOCK, 0))
        return _occupancy[key]


_cap = threading.local()  # .value: this thread's cap on its gathers' SMs (capped_gathers), or None


@contextlib.contextmanager
def capped_gathers(max_sms: int | None):
    """Within the block, every gather this thread launches holds at most ``max_sms`` SMs' worth of blocks
    (whole SMs with :data:`EXCLUSIVE`; as a table's own ``max_sms``, which still applies); None adds no cap.
    Caps nest (the tightest holds) and stay with the thread: another thread's gathers are not capped.
    :class:`hmgstore.Pipeline` makes its batches inside one. The sampler's kernels are not capped: capping
    them too gained nothing and cost time with the topology in host memory (benchmarks/results/cap-scope-h200.md)."""
    before = getattr(_cap, "value", None)
    _cap.value = tightest_cap(before, max_sms)
    try:
        yield
    finally:
        _cap.value = before


def tightest_cap(*caps: int | None) -> int | None:
    """The SM cap that holds where several apply (tables' ``max_sms``, a pipeline's, this thread's): the smallest
    given, None when none is. Every cap is merged here."""
    given = [cap for cap in caps if cap is not None]
    return min(given) if given else None


def current_cap() -> int | None:
    """This thread's cap on its gathers' SMs (see :func:`capped_gathers`), or None."""
    return getattr(_cap, "value", None)


_exclusive: dict[tuple, int | None] = {}


def exclusive_smem(device_index: int, narrow: bool = False) -> int | None:
    """Dynamic shared memory that leaves room for one block of a capped gather on an SM (with
    :data:`EXCLUSIVE`), or None where the device cannot run such a block (the cap then bounds thread slots
    only, spread over SMs).

    Why. A capped grid of ``k`` SMs' worth of 256-thread blocks is spread by the hardware one block to an SM,
    over up to 8k SMs, where each might keep the step's large matrix-product blocks off its SM. A block that
    asks for more than half an SM's shared memory shares its SM with no other such block (another gather
    block, or a matrix product's large one): a cap of ``k`` holds ``k`` SMs, the others free of it (the step's
    small kernels can still run beside it, with less L1 cache). It holds ``EXCLUSIVE_BLOCK`` threads, half an
    SM's slots (each keeps ``ROWS`` rows in flight). The kernel does not use the memory. Such blocks run their own
    build, its registers bounded to fit (the plain build's may not fit a 1024-thread block). None also where the
    block still does not fit: a capped launch under :data:`EXCLUSIVE` then warns, once. Measured: see
    :data:`EXCLUSIVE`."""
    key = (device_index, KERNEL_OPTIONS, ROWS, EXCLUSIVE_BLOCK, narrow)
    with _occupancy_lock:
        if key not in _exclusive:
            cp = cupy()
            kernel = _kernel(device_index, narrow, whole=True)
            try:
                with cp.cuda.Device(device_index):
                    attributes = cp.cuda.Device(device_index).attributes
                    smem = attributes["MaxSharedMemoryPerMultiprocessor"] // 2 + 1024
                    fits = smem <= attributes["MaxSharedMemoryPerBlockOptin"]
                    if fits:
                        kernel.max_dynamic_shared_size_bytes = smem
                        # All shared memory, little L1: the carveout the step's matrix products run with, so that
                        # an SM need not drain to change its carveout between theirs and this block.
                        kernel.preferred_shared_memory_carveout = CARVEOUT
                        fits = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                            kernel.kernel.ptr, EXCLUSIVE_BLOCK, smem) == 1
            except (KeyError, AttributeError, cp.cuda.driver.CUDADriverError) as err:  # an older CuPy or device
                fits = False
                logging.getLogger(__name__).debug("exclusive_smem: %r", err)
            _exclusive[key] = smem if fits else None
        return _exclusive[key]


_spread_warned: set = set()


def _whole_sms(device_index: int, narrow: bool) -> int:
    """:func:`exclusive_smem` for a capped launch under :data:`EXCLUSIVE`, 0 where the blocks must spread (a
    warning, once per GPU and kernel build, says so)."""
    smem = exclusive_smem(device_index, narrow)
    if smem is None and (device_index, narrow) not in _spread_warned:
        _spread_warned.add((device_index, narrow))
        logging.getLogger(__name__).warning(
            "hmgstore: capped gathers cannot hold whole SMs on GPU %d (%s rows): their blocks are spread over SMs "
            "instead", device_index, "narrow" if narrow else "plain")
    return smem or 0


def grid_size(device_index: int, kernel, total_tiles: int, max_sms: int | None, narrow: bool = False) -> int:
    """Blocks to launch: every tile once, at most ``max_sms`` SMs' worth of resident blocks.

    The grid strides over tiles, so a smaller grid does the same work with a
    smaller share of the GPU: with ``max_sms=k`` the gather holds at most k
    SMs' worth of thread slots (the hardware spreads those blocks over SMs;
    it bounds the share, not which SMs). ``None`` fills the GPU once.
    """
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    if max_sms is not None:
        sms = max(1, min(int(max_sms), sms))
    return int(max(1, min(total_tiles, sms * _blocks_per_sm(device_index, kernel, narrow))))


@dataclass
class Packed:
    """A launch's description on the device: ``table`` of ``num_jobs`` jobs spanning ``tiles`` tiles;
    ``kept[i]``: the position, in the list given to :func:`pack`, of the ``i``-th job launched."""

    table: torch.Tensor
    num_jobs: int
    tiles: int
    kept: list[int]
    narrow: bool = False  # some job reads a narrow tier: the kernel build that widens
    max_sms: int | None = None  # the launch's cap: the tables' and the packing thread's (capped_gathers)
    smem: int = 0  # a capped launch's shared memory per block (exclusive_smem), 0: none
    block: int = BLOCK
    passes: tuple[tuple[int, bool], ...] = ((LAYOUT["PASS_ALL"], True),)  # (gather_job.cuh's PASS_*, capped)


def passes(jobs: Sequence[Job], max_sms: int | None, smem: int) -> tuple[tuple[int, bool], ...]:
    """The launches a gather of ``jobs`` takes, in order, each a pass (gather_job.cuh's ``PASS_*``) and whether
    the cap holds it. One capped launch for every row, unless the cap holds the remote rows only
    (:data:`CAPPED_ROWS`): then the rows in the GPU's memory (:attr:`hmgstore.rows.placement.Tier.local`) are
    read uncapped, in a launch of their own where the jobs also read rows over a link (whole-SM launches,
    :data:`EXCLUSIVE`, keep one capped pass).

    Why. A capped launch exists so that rows that wait on PCIe do not hold the GPU beside the training step; the
    rows already in GPU memory are bandwidth-bound and under the same cap lengthen the launch (the cached
    papers-shaped loader alone ran 16-23% faster with them uncapped). Beside a GPU-bound step the uncapped launch
    cost the epoch more than that: see :data:`CAPPED_ROWS`."""
    L = LAYOUT
    if max_sms is None or CAPPED_ROWS != "remote" or smem:
        return ((L["PASS_ALL"], True),)
    local = remote = False
    for job in jobs:
        for tier in job.tiers:
            local, remote = local or tier.local, remote or not tier.local
    if local and remote:
        return (L["PASS_LOCAL"], False), (L["PASS_REMOTE"], True)
    return ((L["PASS_ALL"], remote),)


def pack(jobs: list[Job], device: torch.device, *caps: int | None) -> Packed | None:
    """The launch's description, copied (asynchronously) to ``device``, or None when there is nothing to
    copy; ``caps``: the tables' caps on its SMs (None: no cap), merged with this thread's (:func:`capped_gathers`)
    by :func:`tightest_cap`. Host work only; :func:`run` launches it. A capped launch holds whole SMs where
    :func:`exclusive_smem` allows."""
    kept = [k for k, j in enumerate(jobs) if j.ids.shape[0] and j.row_bytes]
    if not kept:
        return None
    max_sms = tightest_cap(*caps, current_cap())
    narrow = any(t.stored is not None for k in kept for t in jobs[k].tiers)
    smem = _whole_sms(device.index, narrow) if max_sms is not None and EXCLUSIVE else 0
    block = EXCLUSIVE_BLOCK if smem else BLOCK
    words, tile_start = [], 0
    for k in kept:
        w, tiles = job_words(jobs[k], tile_start, block)
        words.extend(w)
        tile_start += tiles
    table = torch.tensor(words, dtype=torch.int64).pin_memory().to(device, non_blocking=True)
    return Packed(table, len(kept), tile_start, kept, narrow, max_sms, smem, block,
                  passes([jobs[k] for k in kept], max_sms, smem))


def run(packed: Packed | None, device: torch.device, stream: torch.cuda.Stream,
        err: torch.Tensor | None = None) -> None:
    """Launch a :func:`pack` result on ``stream``: each of its :func:`passes`, capped as it was packed.

    ``err``: an int64 CUDA tensor of ``E_WORDS`` zeros where the kernel
    records the first id out of range (see gather_job.cuh), or None.
    """
    if packed is None:
        return
    kernel = _kernel(device.index, packed.narrow, whole=bool(packed.smem))
    for step, capped in packed.passes:
        cap = packed.max_sms if capped else None
        if packed.smem and cap is not None:  # one block to an SM: the cap is whole SMs
            sms = torch.cuda.get_device_properties(device.index).multi_processor_count
            grid = max(1, min(packed.tiles, int(cap), sms))
        else:
            grid = grid_size(device.index, kernel, packed.tiles, cap, packed.narrow)
        with cupy().cuda.Device(device.index):
            kernel((grid,), (packed.block,), (np.uint64(packed.table.data_ptr()), np.int32(packed.num_jobs),
                                              np.int64(packed.tiles), np.uint64(0 if err is None else err.data_ptr()),
                                              np.int32(step)), stream=cupy_stream(stream), shared_mem=packed.smem)


def launch_gather(jobs: list[Job], device: torch.device, stream: torch.cuda.Stream,
                  max_sms: int | None = None) -> None:
    """Run every job in one launch of ``hmg_gather`` on ``stream`` (two where :func:`passes` says so).

    All tensors named by the jobs must be on ``device`` (or, for tier bases,
    readable from it) and stay alive until the stream reaches this point;
    allocations made on ``stream`` through torch's caching allocator do.
    """
    run(pack(jobs, device, max_sms), device, stream)
