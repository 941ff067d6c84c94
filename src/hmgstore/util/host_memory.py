"""How much host memory this machine can still give: ``MemAvailable`` of ``/proc/meminfo``.

Why. Linux hands out memory it does not have (overcommit): a tensor larger than what is free is allocated
at once, and the process is killed by the OOM killer only as the tensor is filled, with no Python error.
Code about to allocate a size that a user's argument sets (a sampling fanout, say) checks it here first and
raises MemoryError saying which argument to lower.
"""
from __future__ import annotations


def available_bytes(path: str = "/proc/meminfo") -> int | None:
    """Bytes the kernel says it can give without swapping (``MemAvailable``), or None where that cannot be
    read (not Linux, an old kernel, a file without the line)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


#: Sizes below this are not checked: a batch's ordinary hops stay far under it, and reading /proc/meminfo for each
#: would cost more than the hop's own work on small graphs.
CHECK_FROM = 1 << 28


def check_room(nbytes: int, what: str, fix: str, available: int | None = None) -> None:
    """Raise MemoryError when ``nbytes`` (what ``what`` needs) pass the host memory available now (None:
    read :func:`available_bytes`; nothing is checked where it is unknown, or below :data:`CHECK_FROM`);
    ``fix`` says what to change."""
    if nbytes < CHECK_FROM:
        return
    free = available_bytes() if available is None else available
    if free is not None and nbytes > free:
        raise MemoryError(f"{what} needs about {nbytes / 1e9:.3g} GB of host memory, more than the "
                          f"{free / 1e9:.3g} GB available; {fix}")
