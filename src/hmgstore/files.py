"""Tables read from files straight into host memory hmgstore owns: :func:`load`.

A ``.npy`` file or a raw binary file is read piece by piece with
``readinto`` into the table's own memory (cudaHostAlloc for a GPU table,
2 MiB pages for a CPU one; see :mod:`hmgstore.memory.owned`), so the rows are never held twice; a ``.pt``
file is opened memory-mapped by torch and copied piece by piece. Either
way a progress bar shows the bytes read.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from .progress import tqdm

from .memory import owned
from .device import resolve_device
from .tensor import HybridTensor

#: Bytes read per ``readinto`` call (one progress step).
READ_CHUNK_BYTES = 64 << 20


def _torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    except TypeError:
        raise ValueError(f"hmgstore tables hold numbers; cannot read a file of dtype {dtype}") from None


def _host(dtype: torch.dtype, host_dtype: torch.dtype | None, name: str) -> torch.dtype:
    """The dtype the host tier keeps a file's rows in."""
    if host_dtype is not None and host_dtype != dtype and dtype != torch.float32:
        raise ValueError(f"{name} holds {dtype}; half-width host rows (host_dtype={host_dtype}) are for float32 "
                         "tables")
    return host_dtype or dtype


def _npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """``(shape, fortran_order, dtype)`` of an open .npy file, positioned at its data; None for versions
    numpy reads only through ``np.load``."""
    version = np.lib.format.read_magic(f)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        return None
    return readers[version](f)


def read(path, *, dtype=None, shape=None, offset: int = 0, key: str | None = None,
         host_dtype: torch.dtype | None = None, backing: str = "auto", progress: bool = True) -> torch.Tensor:
    """The table stored at ``path`` as a CPU tensor on owned memory (see :func:`load` for the arguments)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}")
    suffix = path.suffix.lower()
    if suffix in (".pt", ".pth"):
        if dtype is not None or shape is not None:
            raise ValueError(f"{path.name} is a torch file, which records its own dtype and shape; drop dtype/shape")
        return _read_torch(path, key, host_dtype, backing, progress)
    if suffix == ".npy" and dtype is None and shape is None:
        with open(path, "rb") as f:
            header = _npy_header(f)
            data_start = f.tell()
        if header is None or header[1] or header[2].hasobject:  # other versions, Fortran order: numpy's reader
            array = np.load(path, mmap_mode="r", allow_pickle=False)
            host = _host(_torch_dtype(array.dtype), host_dtype, path.name)
            return owned.copy_in(owned.empty(array.shape, host, backing, zero=False), array,
                                 progress, desc=f"reading {path.name}")
        shape, _, np_dtype = header
        return _read_raw(path, data_start, tuple(shape), np_dtype, host_dtype, backing, progress)
    if dtype is None or shape is None:
        raise ValueError(f"cannot tell the layout of {path.name}: pass dtype= and shape= (the first size may be "
                         "-1, read from the file's length) for a raw binary file, or use a .npy or .pt file")
    np_dtype = np.dtype(dtype) if not isinstance(dtype, torch.dtype) else torch.empty(0, dtype=dtype).numpy().dtype
    shape = tuple(int(s) for s in shape)
    if shape and shape[0] == -1:
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * np_dtype.itemsize
        shape = ((os.path.getsize(path) - offset) // max(row_bytes, 1), *shape[1:])
    return _read_raw(path, offset, shape, np_dtype, host_dtype, backing, progress)


def _read_raw(path: Path, start: int, shape, np_dtype: np.dtype, host_dtype, backing, progress) -> torch.Tensor:
    dtype = _torch_dtype(np_dtype)
    if np_dtype.byteorder == ">" or (np_dtype.byteorder == "=" and np.little_endian is False):
        raise ValueError(f"{path.name} holds big-endian numbers; convert it with numpy first")
    nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
    have = os.path.getsize(path) - start
    if have < nbytes:
        raise ValueError(f"{path.name} ends {nbytes - have} bytes early: a {shape} table of {np_dtype} needs "
                         f"{nbytes} bytes after byte {start}, the file has {have}")
    out = owned.empty(shape, _host(dtype, host_dtype, path.name), backing, zero=False)  # every byte is read in
    direct = out.dtype == dtype
    target = out.view(-1).view(torch.uint8) if direct else None
    row_bytes = max(1, nbytes // max(shape[0], 1)) if shape else nbytes
    step = max(row_bytes, READ_CHUNK_BYTES // row_bytes * row_bytes)
    with open(path, "rb") as f, tqdm(total=nbytes, unit="B", unit_scale=True, desc=f"reading {path.name}",
                                      leave=False, disable=not progress or nbytes < 4 * READ_CHUNK_BYTES) as bar:
        f.seek(start)
        done = 0
        while done < nbytes:
            size = min(step, nbytes - done)
            if direct:
                view = memoryview(target[done:done + size].numpy())
            else:
                view = memoryview(bytearray(size))
            got = f.readinto(view)
            if got != size:
                raise ValueError(f"{path.name} ended early while reading (got {got} of {size} bytes at {done})")
            if not direct:
                rows = torch.frombuffer(view, dtype=dtype).view(-1, *shape[1:])
                first = done // row_bytes
                out[first:first + len(rows)].copy_(rows)
            done += size
            bar.update(size)
    return out


def _read_torch(path: Path, key, host_dtype, backing, progress) -> torch.Tensor:
    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except RuntimeError:  # files saved without the zipfile format cannot be memory-mapped
        obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if key is None and len(tensors) == 1:
            key = next(iter(tensors))
        if key not in tensors:
            raise ValueError(f"{path.name} holds a dict; pass key= one of {sorted(map(str, tensors))}")
        obj = tensors[key]
    elif key is not None:
        raise ValueError(f"{path.name} holds a single tensor; drop key={key!r}")
    if not isinstance(obj, torch.Tensor):
        raise ValueError(f"{path.name} holds a {type(obj).__name__}, not a tensor")
    return owned.copy_in(owned.empty(obj.shape, _host(obj.dtype, host_dtype, path.name), backing, zero=False), obj,
                         progress,
                         desc=f"reading {path.name}")


def load(path, device=None, *, dtype=None, shape=None, offset: int = 0, key: str | None = None,
         host_dtype: torch.dtype | None = None, backing: str = "auto", progress: bool = True,
         **kwargs) -> HybridTensor:
    """A :class:`HybridTensor` read from ``path`` into host memory hmgstore owns (``backing``, see
    :mod:`hmgstore.memory.owned`).

    ``path``: a ``.npy`` file, a ``.pt``/``.pth`` file (a tensor, or a dict
    of tensors with ``key`` naming one) or a raw binary file of rows (give
    ``dtype`` and ``shape``; ``shape[0]`` may be -1, meaning as many rows as
    the file holds after ``offset`` bytes). The rows are read piece by piece
    into the table's memory, under a progress bar; no second copy is made.
    ``host_dtype``: keep float32 rows half-width on the host (see
    :class:`HybridTensor`). ``device`` and ``kwargs`` (``gpu_rows``,
    ``gpu_budget``, ``hot_order``, ``max_sms``, ``stats``) are as for
    :class:`HybridTensor`. Raises FileNotFoundError for a missing file and
    ValueError for a file that does not hold what it says (too short, an
    unknown layout, a dict without ``key``).
    """
    device = resolve_device(device)
    host = read(path, dtype=dtype, shape=shape, offset=offset, key=key, host_dtype=host_dtype,
                backing=owned.chosen(backing, device), progress=progress)
    table_dtype = torch.float32 if host_dtype is not None else host.dtype
    return HybridTensor._of_host(host, device, table_dtype, progress=progress, **kwargs)
