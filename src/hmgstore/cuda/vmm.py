"""GPU memory that other processes of the node map with the CUDA virtual memory API (cuMemCreate).

Why not cudaIpcOpenMemHandle. Kernels that read a peer's buffer through a legacy CUDA IPC mapping fetch
random 512 B rows at 14-24 GB/s on 2 x H200 joined by NVLink (NV18), against 300 GB/s for the same kernel
reading a peer buffer mapped in one process (``benchmarks/probes/probe_ipc_gather.py``;
``benchmarks/results/ipc-gather-h200x2.md``). A buffer from cuMemCreate is exported as a file descriptor,
imported by each peer and mapped there with cuMemMap: the mapping has the allocation's own page size.

The descriptor goes to peers over a Unix socket in the abstract namespace (``SCM_RIGHTS``), served by a
thread of the owner while the peers open it; a connection from another user is refused.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import uuid

_LOCATION_DEVICE = 1
_ALLOCATION_PINNED = 1
_HANDLE_POSIX_FD = 1
_GRANULARITY_RECOMMENDED = 1
_ACCESS_READ_WRITE = 3


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):
    # CUmemAllocationProp; the tail is zero padding, room for fields newer drivers may read
    _fields_ = [("type", ctypes.c_int), ("requested_handle_types", ctypes.c_int), ("location", _Location),
                ("win32_meta", ctypes.c_void_p), ("alloc_flags", ctypes.c_ubyte * 8), ("pad", ctypes.c_ubyte * 64)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver = None


def _cuda():
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({result})")


def _prop(device_index: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type, prop.requested_handle_types = _ALLOCATION_PINNED, _HANDLE_POSIX_FD
    prop.location = _Location(_LOCATION_DEVICE, device_index)
    return prop


def _map(handle: int, size: int, device_index: int) -> int:
    """Reserve ``size`` bytes of addresses, map ``handle`` there and let ``device_index`` read and write it."""
    cu, ptr = _cuda(), ctypes.c_uint64()
    _check(cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                  ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
    try:
        _check(cu.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                           ctypes.c_uint64(0)), "cuMemMap")
        access = _AccessDesc(_Location(_LOCATION_DEVICE, device_index), _ACCESS_READ_WRITE)
        result = cu.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
        if result != 0:
            cu.cuMemUnmap(ptr, ctypes.c_size_t(size))
            _check(result, "cuMemSetAccess")
    except BaseException:
        cu.cuMemAddressFree(ptr, ctypes.c_size_t(size))
        raise
    return ptr.value


def _unmap(ptr: int, size: int, handle: int) -> None:
    cu = _cuda()
    cu.cuMemUnmap(ctypes.c_uint64(ptr), ctypes.c_size_t(size))
    cu.cuMemAddressFree(ctypes.c_uint64(ptr), ctypes.c_size_t(size))
    cu.cuMemRelease(ctypes.c_uint64(handle))


class Allocation:
    """``nbytes`` (rounded up to the allocation granularity) of ``device_index``'s memory, mapped here and
    exportable to other processes of the machine. The device's context must be current (a torch or CuPy
    call on it has run in this thread)."""

    def __init__(self, nbytes: int, device_index: int):
        cu, prop = _cuda(), _prop(device_index)
        grain = ctypes.c_size_t()
        _check(cu.cuMemGetAllocationGranularity(ctypes.byref(grain), ctypes.byref(prop), _GRANULARITY_RECOMMENDED),
               "cuMemGetAllocationGranularity")
        self.size = -(-max(nbytes, 1) // grain.value) * grain.value
        handle = ctypes.c_uint64()
        _check(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                              ctypes.c_uint64(0)), "cuMemCreate")
        self.handle = handle.value
        try:
            self.ptr = _map(self.handle, self.size, device_index)
        except BaseException:
            cu.cuMemRelease(handle)
            raise
        self._server: _Server | None = None

    def share(self) -> tuple[str, int]:
        """``(socket name, size)``: what :func:`open_shared` needs in another process; starts serving the
        descriptor until :meth:`stop_sharing`."""
        if self._server is None:
            fd = ctypes.c_int(-1)
            _check(_cuda().cuMemExportToShareableHandle(ctypes.byref(fd), ctypes.c_uint64(self.handle),
                                                        _HANDLE_POSIX_FD, ctypes.c_uint64(0)),
                   "cuMemExportToShareableHandle")
            self._server = _Server(fd.value)
        return self._server.name, self.size

    def stop_sharing(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def free(self) -> None:
        self.stop_sharing()
        if self.ptr:
            _unmap(self.ptr, self.size, self.handle)
            self.ptr = 0


class Mapping:
    """Another process's :class:`Allocation`, mapped for ``device_index``; :meth:`close` unmaps it."""

    def __init__(self, name: str, size: int, device_index: int, timeout: float = 60.0):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect("\0" + name)
            _, fds, _, _ = socket.recv_fds(conn, 1, 1)
        if len(fds) != 1:
            raise RuntimeError(f"the owner of shared GPU memory {name} sent no file descriptor")
        handle = ctypes.c_uint64()
        try:
            _check(_cuda().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fds[0]),
                                                          _HANDLE_POSIX_FD), "cuMemImportFromShareableHandle")
        finally:
            os.close(fds[0])
        self.size, self.handle = size, handle.value
        try:
            self.ptr = _map(self.handle, size, device_index)
        except BaseException:
            _cuda().cuMemRelease(handle)
            raise

    def close(self) -> None:
        if self.ptr:
            _unmap(self.ptr, self.size, self.handle)
            self.ptr = 0


class _Server:
    """Hands ``fd`` to every process of this user that connects, until :meth:`stop` (which closes ``fd``)."""

    def __init__(self, fd: int):
        self.fd, self.name = fd, f"hmgstore-{os.getpid()}-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.name)
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hmgstore-share-gpu-memory", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        creds = struct.calcsize("3i")
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, creds))
                if uid == os.getuid():  # another user's process gets nothing
                    socket.send_fds(conn, [b"m"], [self.fd])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
        os.close(self.fd)
