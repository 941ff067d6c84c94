"""The one place that imports CuPy: host registration, kernel loading, launches.

CuPy is imported lazily, the first time a CUDA table is built, so that
``import hmgstore`` and the CPU path work on machines without a GPU or CuPy.
Kernels live in ``kernels/*.cu`` (installed as ``hmgstore.kernels``); each is
compiled by NVRTC once per device and kept in ``_modules``.
"""
from __future__ import annotations

import importlib.resources
import math
import threading
import weakref
import warnings
from dataclasses import dataclass

import numpy as np
import torch

#: Threads per block. Chosen by scripts/tune_gather.py on the H100 (see
#: benchmarks/results/tune-h100.md): 256 matched 512 within noise and beat 128.
BLOCK = 256
MAX_TIERS = 10  # keep in sync with kernels/gather.cu
# Job word offsets; keep in sync with the J_* defines of kernels/gather.cu.
J_IDS, J_PERM, J_OUT, J_MAP, J_N, J_NUM_ROWS, J_ROW_BYTES, J_TILE_START, J_FLAGS, J_NTIERS = range(10)
J_BOUNDS = 10
J_BASE = J_BOUNDS + MAX_TIERS + 1
J_PITCH = J_BASE + MAX_TIERS
J_WORDS = J_PITCH + MAX_TIERS

_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED, _HOST_REGISTER_READ_ONLY = 1, 2, 8
_ALREADY_REGISTERED = 712

_lock = threading.Lock()
_cupy = None
_modules: dict[tuple, object] = {}  # (device index, options) -> loaded RawModule
#: Rows each team copies per tile (loads in flight per thread); see gather.cu.
ROWS = 4
#: NVRTC options (ROWS is added at compile time).
KERNEL_OPTIONS = ("-std=c++17",)
_occupancy: dict[tuple, int] = {}
_streams: dict[int, object] = {}  # torch stream handle -> CuPy wrapper of it


def cupy():
    """The cupy module, or ImportError saying which package to install."""
    global _cupy
    if _cupy is None:
        try:
            import cupy as cp
        except ImportError as err:
            cuda = torch.version.cuda or "12.x"
            major = cuda.split(".")[0]
            raise ImportError(
                f"hmgstore needs CuPy for CUDA tables and it could not be imported ({err}). "
                f"Install the build matching your torch's CUDA {cuda}: "
                f"pip install cupy-cuda{major}x   (or pip install 'hmgstore[cuda{major}]'); "
                "or build the table with device='cpu'.") from None
        _cupy = cp
    return _cupy


def check_device(device: torch.device) -> None:
    """Raise a clear error if ``device`` (a CUDA device) cannot be used."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device} was asked for, but torch sees no CUDA GPU "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
            "Install a CUDA build of torch on a GPU machine, or pass device='cpu'.")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(f"device {device} does not exist: torch sees {torch.cuda.device_count()} GPU(s)")
    cupy()


def host_register(ptr: int, nbytes: int, read_only: bool) -> None:
    """Page-lock ``[ptr, ptr + nbytes)`` in place and map it for every GPU."""
    rt = cupy().cuda.runtime
    flags = _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED
    try:
        rt.hostRegister(ptr, nbytes, flags | (_HOST_REGISTER_READ_ONLY if read_only else 0))
    except rt.CUDARuntimeError as err:
        if err.status == _ALREADY_REGISTERED:
            raise ValueError(
                "the source table's memory is already page-locked by someone else "
                "(cudaHostRegister said: already registered); pass a tensor that is pinned as a "
                "whole (tensor.pin_memory()) or not pinned at all") from None
        if read_only:  # some platforms lack read-only registration: pin read-write instead
            rt.hostRegister(ptr, nbytes, flags)
        else:
            raise
    attrs = rt.pointerGetAttributes(ptr)
    if attrs.devicePointer != ptr:
        rt.hostUnregister(ptr)
        raise RuntimeError(
            "this platform maps registered host memory at a different device address; "
            "hmgstore needs unified addressing (64-bit Linux with a current driver)")


def host_unregister(ptr: int) -> None:
    cupy().cuda.runtime.hostUnregister(ptr)


def _module(device_index: int):
    """The compiled kernels for one device, compiled on first use."""
    options = (*KERNEL_OPTIONS, f"-DROWS={ROWS}")
    key = (device_index, options)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cp = cupy()
            source = importlib.resources.files("hmgstore.kernels").joinpath("gather.cu").read_text()
            with cp.cuda.Device(device_index):
                mod = cp.RawModule(code=source, options=options)
                mod.compile()
            _modules[key] = mod
        return mod


def _blocks_per_sm(device_index: int, kernel) -> int:
    key = (device_index, KERNEL_OPTIONS, ROWS, BLOCK)
    with _lock:
        if key not in _occupancy:
            cp = cupy()
            with cp.cuda.Device(device_index):
                _occupancy[key] = max(1, cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    kernel.kernel.ptr, BLOCK, 0))
        return _occupancy[key]


def grid_size(device_index: int, kernel, total_tiles: int, max_sms: int | None) -> int:
    """Blocks to launch: every tile once, at most ``max_sms`` SMs' worth of resident blocks.

    The grid strides over tiles, so a smaller grid does the same work with a
    smaller share of the GPU: with ``max_sms=k`` the gather holds at most k
    SMs' worth of thread slots (the hardware spreads those blocks over SMs;
    it bounds the share, not which SMs). ``None`` fills the GPU once.
    """
    sms = torch.cuda.get_device_properties(device_index).multi_processor_count
    if max_sms is not None:
        sms = max(1, min(int(max_sms), sms))
    return int(max(1, min(total_tiles, sms * _blocks_per_sm(device_index, kernel))))


@dataclass
class Job:
    """One table's share of a launch: rows ``ids`` -> ``out`` (see gather.cu).

    ``ids``: 1-D int32/int64 CUDA tensor of old row ids (sorted if ``perm``
    is given); ``perm``: int64 output position of each id, or None;
    ``out``: contiguous CUDA tensor of ``len(ids)`` rows of ``row_bytes`` each.
    ``tiers``: list of ``(first_new_id, end_new_id, base_ptr, pitch_bytes)``;
    ``map``: int32/int64 CUDA tensor new id per old id, or None.
    """

    ids: torch.Tensor
    perm: torch.Tensor | None
    out: torch.Tensor
    map: torch.Tensor | None
    num_rows: int
    row_bytes: int
    tiers: list[tuple[int, int, int, int]]


def vector_bytes(row_bytes: int, *addresses: int) -> int:
    """Widest vector (16, 8, 4, 2 or 1 bytes) dividing the row size and every address/pitch."""
    width = 16
    for value in (row_bytes, *addresses):
        while width > 1 and value % width:
            width //= 2
    return width


def job_words(job: Job, tile_start: int) -> tuple[list[int], int]:
    """The job's J_WORDS description and how many tiles it spans."""
    if len(job.tiers) > MAX_TIERS:
        raise ValueError(f"a table may have at most {MAX_TIERS} tiers, got {len(job.tiers)}")
    vec = vector_bytes(job.row_bytes, job.out.data_ptr(), *(p for t in job.tiers for p in t[2:]))
    nvec = job.row_bytes // vec
    tpr_log2 = min(5, max(0, (nvec - 1).bit_length()))  # team: pow2 >= nvec, at most a warp
    rows_per_tile = (BLOCK >> tpr_log2) * ROWS
    tiles = -(-len(job.ids) // rows_per_tile)
    words = [0] * J_WORDS
    words[J_IDS] = job.ids.data_ptr()
    words[J_PERM] = job.perm.data_ptr() if job.perm is not None else 0
    words[J_OUT] = job.out.data_ptr()
    words[J_MAP] = job.map.data_ptr() if job.map is not None else 0
    words[J_N] = len(job.ids)
    words[J_NUM_ROWS] = job.num_rows
    words[J_ROW_BYTES] = job.row_bytes
    words[J_TILE_START] = tile_start
    words[J_FLAGS] = (
        (job.ids.dtype == torch.int64)
        | (job.map is not None and job.map.dtype == torch.int64) << 1
        | (vec.bit_length() - 1) << 8
        | tpr_log2 << 16)
    words[J_NTIERS] = len(job.tiers)
    words[J_BOUNDS] = job.tiers[0][0]
    for t, (_, end, base, pitch) in enumerate(job.tiers):
        words[J_BOUNDS + t + 1] = end
        words[J_BASE + t] = base
        words[J_PITCH + t] = pitch
    return words, tiles


def launch_gather(jobs: list[Job], device: torch.device, stream: torch.cuda.Stream,
                  max_sms: int | None = None) -> None:
    """Run every job in one launch of ``hmg_gather`` on ``stream``.

    All tensors named by the jobs must be on ``device`` (or, for tier bases,
    readable from it) and stay alive until the stream reaches this point;
    allocations made on ``stream`` through torch's caching allocator do.
    """
    jobs = [j for j in jobs if len(j.ids) and j.row_bytes]
    if not jobs:
        return
    words, tile_start = [], 0
    for job in jobs:
        w, tiles = job_words(job, tile_start)
        words.extend(w)
        tile_start += tiles
    cp = cupy()
    table = torch.tensor(words, dtype=torch.int64).pin_memory().to(device, non_blocking=True)
    kernel = _module(device.index).get_function("hmg_gather")
    grid = grid_size(device.index, kernel, tile_start, max_sms)
    with cp.cuda.Device(device.index):
        kernel((grid,), (BLOCK,), (np.uint64(table.data_ptr()), np.int32(len(jobs)), np.int64(tile_start)),
               stream=_cupy_stream(stream))


def _cupy_stream(stream: torch.cuda.Stream):
    """CuPy's handle on a torch stream (cached: wrapping costs a few microseconds)."""
    handle = stream.cuda_stream
    wrapped = _streams.get(handle)
    if wrapped is None:
        with warnings.catch_warnings():  # ExternalStream is deprecated in CuPy 14, but CuPy 13 lacks its successor
            warnings.simplefilter("ignore", DeprecationWarning)
            wrapped = _streams[handle] = cupy().cuda.ExternalStream(handle)
    return wrapped


# ---- several GPUs: peer access, device buffers, CUDA IPC ------------------------
_PEER_ALREADY_ENABLED = 704
_IPC_LAZY_ENABLE_PEER_ACCESS = 1


def pci_bus_id(device_index: int) -> str:
    """The PCI bus id of a visible GPU, which names it the same way in every process."""
    return cupy().cuda.runtime.deviceGetPCIBusId(device_index).lower()


def can_access_peer(device_index: int, peer_index: int) -> bool:
    """Whether kernels on ``device_index`` can read ``peer_index``'s memory (NVLink or PCIe P2P)."""
    if device_index == peer_index:
        return True
    return bool(cupy().cuda.runtime.deviceCanAccessPeer(device_index, peer_index))


def enable_peer_access(device_index: int, peer_index: int) -> None:
    """Map ``peer_index``'s memory into ``device_index``'s context (no error if already done)."""
    if device_index == peer_index:
        return
    rt = cupy().cuda.runtime
    with cupy().cuda.Device(device_index):
        try:
            rt.deviceEnablePeerAccess(peer_index)
        except rt.CUDARuntimeError as err:
            if err.status != _PEER_ALREADY_ENABLED:
                raise


class DeviceBuffer:
    """``nbytes`` of memory on one GPU from cudaMalloc, outside torch's caching allocator,
    so that its CUDA IPC handle names exactly this buffer (offset 0). Freed by :meth:`free`
    or when dropped."""

    def __init__(self, nbytes: int, device_index: int):
        cp = cupy()
        self.nbytes, self.device_index = nbytes, device_index
        with cp.cuda.Device(device_index):
            self.ptr = cp.cuda.runtime.malloc(max(nbytes, 1))
        self._finalizer = weakref.finalize(self, _free, self.ptr, device_index)

    def as_tensor(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A torch view of the buffer as ``shape`` of ``dtype`` (the view keeps the buffer alive)."""
        raw = torch.as_tensor(_ArrayInterface(self), device=f"cuda:{self.device_index}")
        return raw[: math.prod(shape) * torch.empty(0, dtype=dtype).element_size()].view(dtype).view(shape)

    def ipc_handle(self) -> bytes:
        with cupy().cuda.Device(self.device_index):
            return bytes(cupy().cuda.runtime.ipcGetMemHandle(self.ptr))

    def free(self) -> None:
        self._finalizer()


def _free(ptr: int, device_index: int) -> None:
    try:
        with cupy().cuda.Device(device_index):
            cupy().cuda.runtime.deviceSynchronize()
            cupy().cuda.runtime.free(ptr)
    except Exception:  # interpreter shutdown or a dead context: the driver reclaims it
        pass


class _ArrayInterface:
    """Just enough ``__cuda_array_interface__`` for torch.as_tensor to wrap a DeviceBuffer as bytes."""

    def __init__(self, buffer: DeviceBuffer):
        self.buffer = buffer
        self.__cuda_array_interface__ = {"shape": (max(buffer.nbytes, 1),), "typestr": "|u1",
                                         "data": (buffer.ptr, False), "version": 3, "strides": None,
                                         "stream": None}


def ipc_open(handle: bytes, device_index: int) -> int:
    """Map another process's buffer (its :meth:`DeviceBuffer.ipc_handle`) for ``device_index``;
    returns its address here. Peer access is enabled as needed."""
    cp = cupy()
    with cp.cuda.Device(device_index):
        return int(cp.cuda.runtime.ipcOpenMemHandle(handle, _IPC_LAZY_ENABLE_PEER_ACCESS))


def ipc_close(ptr: int, device_index: int) -> None:
    cp = cupy()
    with cp.cuda.Device(device_index):
        cp.cuda.runtime.ipcCloseMemHandle(ptr)
