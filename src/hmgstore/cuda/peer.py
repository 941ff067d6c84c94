"""Other GPUs of the node: peer access, raw device buffers and CUDA IPC."""
from __future__ import annotations

import math
import weakref

import torch

from .runtime import cupy

_PEER_ALREADY_ENABLED = 704
_IPC_LAZY_ENABLE_PEER_ACCESS = 1


def pci_bus_id(device_index: int) -> str:
    """The PCI bus id of a visible GPU, which names it the same way in every process."""
    return cupy().cuda.runtime.deviceGetPCIBusId(device_index).lower()


def local_ordinal(bus_id: str) -> int | None:
    """This process's index of the GPU with PCI bus id ``bus_id``, or None when it is not visible."""
    for k in range(torch.cuda.device_count()):
        if pci_bus_id(k) == bus_id:
            return k
    return None


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
