"""Other GPUs of the node: peer access, raw device buffers and CUDA IPC."""
from __future__ import annotations

import logging
import math
import weakref

import torch

from . import vmm
from .runtime import cupy
from .settings import choice

log = logging.getLogger("hmgstore")

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


#: How a GPU's shard is shared with the node's other processes: "vmm" (cuMemCreate, :mod:`.vmm`; the default,
#: where the driver supports it) or "ipc" (cudaMalloc and a legacy CUDA IPC handle, 14-24 GB/s of random rows
#: on an NVLink pair where "vmm" reads at the peer-access rate). HMGSTORE_PEER_MEMORY=ipc selects the second.
SHARE_WITH = choice("HMGSTORE_PEER_MEMORY", ("vmm", "ipc"), "vmm")


class DeviceBuffer:
    """``nbytes`` of memory on one GPU outside torch's caching allocator, which other processes of the machine
    can map (:func:`open_handle` of its :meth:`handle`): from cuMemCreate (:mod:`.vmm`) or, where the driver
    refuses that or ``SHARE_WITH`` is "ipc", from cudaMalloc with a CUDA IPC handle naming exactly this buffer.
    Freed by :meth:`free` or when dropped."""

    def __init__(self, nbytes: int, device_index: int):
        cp = cupy()
        self.nbytes, self.device_index, self._vmm = nbytes, device_index, None
        with cp.cuda.Device(device_index):
            if SHARE_WITH == "vmm":
                try:
                    self._vmm = vmm.Allocation(nbytes, device_index)
                except (OSError, RuntimeError) as err:  # no libcuda VMM or no POSIX handles: the legacy way
                    log.info("hmgstore: cuMemCreate unavailable on GPU %d (%s); sharing it by CUDA IPC",
                             device_index, err)
            self.ptr = self._vmm.ptr if self._vmm is not None else cp.cuda.runtime.malloc(max(nbytes, 1))
        self._finalizer = weakref.finalize(self, _free, self._vmm or self.ptr, device_index)

    def as_tensor(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A torch view of the buffer as ``shape`` of ``dtype`` (the view keeps the buffer alive)."""
        raw = torch.as_tensor(_ArrayInterface(self), device=f"cuda:{self.device_index}")
        return raw[: math.prod(shape) * torch.empty(0, dtype=dtype).element_size()].view(dtype).view(shape)

    def handle(self) -> tuple:
        """What another process passes to :func:`open_handle` (picklable); a cuMemCreate buffer is served to
        peers until :meth:`stop_sharing`."""
        if self._vmm is not None:
            return ("vmm", *self._vmm.share())
        with cupy().cuda.Device(self.device_index):
            return ("ipc", bytes(cupy().cuda.runtime.ipcGetMemHandle(self.ptr)))

    def stop_sharing(self) -> None:
        """No further process may open the buffer (those that have keep their mapping)."""
        if self._vmm is not None:
            self._vmm.stop_sharing()

    def free(self) -> None:
        self._finalizer()


class PeerMapping:
    """Another process's :class:`DeviceBuffer` mapped for ``device_index`` (:func:`open_handle`): ``ptr``,
    ``kind`` ("vmm" or "ipc") and :meth:`close` to unmap it."""

    def __init__(self, handle: tuple, device_index: int):
        self.device_index, self.kind, self._vmm = device_index, handle[0], None
        with cupy().cuda.Device(device_index):
            if handle[0] == "vmm":
                self._vmm = vmm.Mapping(handle[1], handle[2], device_index)
                self.ptr = self._vmm.ptr
            else:
                self.ptr = int(cupy().cuda.runtime.ipcOpenMemHandle(handle[1], _IPC_LAZY_ENABLE_PEER_ACCESS))

    def close(self) -> None:
        with cupy().cuda.Device(self.device_index):
            if self._vmm is not None:
                cupy().cuda.runtime.deviceSynchronize()  # no kernel of ours reads it any more
                self._vmm.close()
            elif self.ptr:
                cupy().cuda.runtime.ipcCloseMemHandle(self.ptr)
            self.ptr = 0


def open_handle(handle: tuple, device_index: int) -> PeerMapping:
    """Map another process's buffer (its :meth:`DeviceBuffer.handle`) for ``device_index``."""
    return PeerMapping(handle, device_index)


def _free(memory: vmm.Allocation | int, device_index: int) -> None:
    """Free a :class:`DeviceBuffer`'s memory (a cuMemCreate allocation or a cudaMalloc address)."""
    try:
        with cupy().cuda.Device(device_index):
            cupy().cuda.runtime.deviceSynchronize()
            if isinstance(memory, vmm.Allocation):
                memory.free()
            else:
                cupy().cuda.runtime.free(memory)
    except Exception:  # interpreter shutdown or a dead context: the driver reclaims it
        pass


class _ArrayInterface:
    """Just enough ``__cuda_array_interface__`` for torch.as_tensor to wrap a DeviceBuffer as bytes."""

    def __init__(self, buffer: DeviceBuffer):
        self.buffer = buffer
        self.__cuda_array_interface__ = {"shape": (max(buffer.nbytes, 1),), "typestr": "|u1",
                                         "data": (buffer.ptr, False), "version": 3, "strides": None,
                                         "stream": None}
