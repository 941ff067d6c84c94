"""Page-locking host memory in place, so that GPU kernels read it over PCIe (zero-copy)."""
from __future__ import annotations

from .runtime import cupy

_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED, _HOST_REGISTER_READ_ONLY = 1, 2, 8
_ALREADY_REGISTERED = 712
_MEMORY_TYPE_HOST = 1


class AlreadyPinned(ValueError):
    """Part of a host range is page-locked already, by someone other than hmgstore."""


def host_register(ptr: int, nbytes: int, read_only: bool) -> None:
    """Page-lock ``[ptr, ptr + nbytes)`` in place and map it for every GPU.

    Raises ValueError when part of the range is already page-locked by
    someone else, RuntimeError when the platform maps it at another address.
    """
    rt = cupy().cuda.runtime
    flags = _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED
    try:
        rt.hostRegister(ptr, nbytes, flags | (_HOST_REGISTER_READ_ONLY if read_only else 0))
    except rt.CUDARuntimeError as err:
        if err.status == _ALREADY_REGISTERED:
            raise AlreadyPinned(
                "part of the source table's memory is already page-locked by someone else "
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


def is_pinned(ptr: int) -> bool:
    """Whether the host byte at ``ptr`` is page-locked and mapped at the same address for the GPUs."""
    attrs = cupy().cuda.runtime.pointerGetAttributes(ptr)
    return attrs.type == _MEMORY_TYPE_HOST and attrs.devicePointer == ptr


def unpinned_ranges(start: int, end: int, page: int, progress=None) -> list[tuple[int, int]]:
    """The page-aligned parts of ``[start, end)`` that no one has page-locked.

    Looks at every page: another component may have pinned any part of the
    range (``tensor.is_pinned()`` looks at the first byte only). ``progress``:
    an optional callable taking the bytes looked at so far.
    """
    gaps: list[tuple[int, int]] = []
    gap_start = None
    for k, ptr in enumerate(range(start, end, page)):
        if is_pinned(ptr):
            if gap_start is not None:
                gaps.append((gap_start, ptr))
                gap_start = None
        elif gap_start is None:
            gap_start = ptr
        if progress is not None and k % 4096 == 4095:
            progress(ptr + page - start)
    if gap_start is not None:
        gaps.append((gap_start, end))
    return gaps
