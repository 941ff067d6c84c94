"""CuPy, device checks, kernel compilation and stream handles."""
from __future__ import annotations

import importlib.resources
import threading
import warnings
from typing import Any

import torch

_lock = threading.Lock()
_cupy = None
_modules: dict[tuple, object] = {}  # (device index, files, options) -> compiled RawModule
_functions: dict[tuple, Any] = {}  # (device index, files, kernel name) -> CuPy function
_streams: dict[int, object] = {}  # torch stream handle -> CuPy wrapper of it
_sms: dict[int, int] = {}


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


def synchronize(devices) -> None:
    """Wait for every kernel on ``devices``; nothing to wait for at shutdown or in a dead context.

    Torch only (no CuPy): memory that kernels may read is freed after it.
    """
    for device in devices:
        try:
            torch.cuda.synchronize(device)
        except Exception:  # interpreter shutdown or a dead context
            pass


def check_device(device: torch.device) -> None:
    """Raise a clear error if ``device`` (a CUDA device) cannot be used: no GPU, no such GPU, no CuPy."""
    check_visible(device)
    cupy()


def check_visible(device: torch.device) -> None:
    """Raise RuntimeError saying what to do when torch sees no GPU, or not GPU ``device.index``."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device} was asked for, but torch sees no CUDA GPU "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
            "Install a CUDA build of torch on a GPU machine, or pass device='cpu'.")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(f"device {device} does not exist: torch sees {torch.cuda.device_count()} GPU(s)")


def kernel_source(*names: str) -> str:
    """The text of ``kernels/<name>`` files (installed as ``hmgstore.kernels``), joined in order."""
    folder = importlib.resources.files("hmgstore.kernels")
    return "\n".join(folder.joinpath(name).read_text() for name in names)


def module(device_index: int, files: tuple[str, ...], options: tuple[str, ...] = ()):
    """The CuPy ``RawModule`` compiled from ``files`` (concatenated) for one device, compiled once."""
    key = (device_index, files, options)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            cp = cupy()
            with cp.cuda.Device(device_index):
                # -ftz=false: a stored row's scale multiplies into float32 exactly as torch does on the CPU,
                # subnormal results included (hmgstore/formats.py).
                mod = cp.RawModule(code=kernel_source(*files), options=("-std=c++17", "-ftz=false", *options))
                mod.compile()
            _modules[key] = mod
        return mod


def cupy_stream(stream: torch.cuda.Stream):
    """CuPy's handle on a torch stream (cached: wrapping costs a few microseconds)."""
    handle = stream.cuda_stream
    wrapped = _streams.get(handle)
    if wrapped is None:
        with warnings.catch_warnings():  # ExternalStream is deprecated in CuPy 14, but CuPy 13 lacks its successor
            warnings.simplefilter("ignore", DeprecationWarning)
            wrapped = _streams[handle] = cupy().cuda.ExternalStream(handle, stream.device.index)
    return wrapped


#: Blocks per SM that :func:`launch` gives a grid-stride kernel at most: enough resident warps to hide
#: memory latency for the one-element-per-thread kernels of sampling and relabelling.
BLOCKS_PER_SM = 8


def launch(files: tuple[str, ...], name: str, work: int, args: tuple, device: torch.device, block: int = 256) -> None:
    """Launch ``name`` from ``files`` over ``work`` threads (a grid-stride loop inside covers more) on
    the current stream of ``device``. ``args``: CuPy kernel arguments (numpy scalars)."""
    if work <= 0:
        return
    index = device.index
    fn = _functions.get((index, files, name))
    if fn is None:
        fn = _functions[(index, files, name)] = module(index, files).get_function(name)
    sms = _sms.get(index)
    if sms is None:
        sms = _sms[index] = torch.cuda.get_device_properties(index).multi_processor_count
    grid = max(1, min(-(-work // block), sms * BLOCKS_PER_SM))
    with cupy().cuda.Device(index):
        fn((grid,), (block,), args, stream=cupy_stream(torch.cuda.current_stream(device)))
