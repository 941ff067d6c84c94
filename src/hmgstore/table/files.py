"""Tables read from files straight into host memory hmgstore owns: :func:`load`.

A ``.npy`` file or a raw binary file is read piece by piece with
``readinto`` into the table's own memory (cudaHostAlloc for a GPU table,
2 MiB pages for a CPU one; see :mod:`hmgstore.memory.owned`), so the rows are never held twice; a ``.pt``
file is opened memory-mapped by torch and copied piece by piece. Either
way a progress bar shows the bytes read.

Every reader checks the file against what it promises before it reads a
row, and refuses with a ValueError naming the file, what was expected and
what was found: a ``.npy`` header must be readable and its shape and dtype
must account for every byte after it (a header that says more rows ends
early, one that says fewer leaves bytes over; sizes are summed as Python
integers, so a huge shape cannot wrap); a raw file read with ``shape[0] ==
-1`` must hold whole rows after ``offset``; a ``.pt`` must load with torch
(``weights_only``) and hold a tensor of at least one dimension, its values
dense in CPU memory (not meta, sparse or nested). A file is known by its first bytes, whatever its name
(:func:`hmgstore.table.file_args.container`): a ``.npy`` or torch file named ``.bin`` is read as what it is,
and a zip archive of another kind is refused, never read as raw rows.
"""
from __future__ import annotations

import inspect
import math
import os
from pathlib import Path

import numpy as np
import torch

from ..memory import owned
from ..rows import checks, formats
from ..util.device import resolve_device
from ..util.progress import tqdm
from .file_args import NPY_HEADER_ERRORS, as_path, container, dict_key, integer_layout, valid_bools, zero
from .tensor import HybridTensor

#: Bytes read per ``readinto`` call (one progress step).
READ_CHUNK_BYTES = 64 << 20


def _torch_dtype(dtype, name: str = "a file") -> torch.dtype:
    """A file's dtype (numpy or torch) as a torch dtype a table holds (:func:`hmgstore.rows.checks.table_dtype`:
    TypeError naming the file otherwise), checked before a row is read."""
    if not isinstance(dtype, torch.dtype):
        try:
            dtype = torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
        except TypeError:
            raise ValueError(f"hmgstore tables hold numbers; cannot read {name} of dtype {dtype}") from None
    return checks.table_dtype(dtype, name)


def _numpy_dtype(dtype, name: str) -> np.dtype:
    """``dtype=`` (numpy or torch) as a numpy dtype; ValueError naming the file for a torch dtype numpy has no
    match for (bfloat16, float8), which a raw or .npy file cannot say it holds."""
    if not isinstance(dtype, torch.dtype):
        try:
            return np.dtype(dtype)
        except TypeError as err:
            raise ValueError(f"dtype={dtype!r} for {name} is not a dtype: {err}") from None
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        raise ValueError(f"{name}: dtype={dtype} has no numpy match to read the file's bytes as; read them as "
                         f"torch.int{dtype.itemsize * 8} and .view({dtype}) the loaded rows") from None


def _stored(shape, dtype, fmt, name: str, backing: str):
    """``(host tier, encode)`` for a file's ``shape`` rows of ``dtype`` (numpy or torch): owned memory for the
    rows as they read (``encode`` None), or in the stored format ``fmt`` with its encoder (a value a format
    cannot keep is refused, naming its row, as for a HybridTensor). Nothing is read yet."""
    dtype = _torch_dtype(dtype, name)
    formats.check_table(dtype, fmt, name)
    if fmt is None:
        return owned.empty(shape, dtype, backing, zero=False), None  # every byte is read in
    return owned.empty(fmt.stored_shape(shape), fmt.stored_dtype(), backing, zero=False), fmt.encode


def _npy_header(path: Path, f) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """``(shape, fortran_order, dtype)`` of an open .npy file, positioned at its data; None for versions
    numpy reads only through ``np.load``. Raises ValueError naming ``path`` for a header numpy cannot read."""
    try:
        version = np.lib.format.read_magic(f)
        readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in readers:
            return None
        return readers[version](f)
    except NPY_HEADER_ERRORS as err:
        raise ValueError(f"{path.name} is not a .npy file numpy can read: its header is damaged ({err})") from err


def _np_load(path: Path) -> np.memmap:
    """numpy's own memory-mapped reader (other header versions, Fortran order), its errors naming ``path``."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except NPY_HEADER_ERRORS as err:
        raise ValueError(f"{path.name} is not a .npy file numpy can read ({err})") from err


def _check_layout(path: Path, shape: tuple, np_dtype: np.dtype, source: str) -> None:
    """Refuse a layout no table has: no dimension, negative sizes, Python objects. ``source`` says who
    gave the layout ("its header says", "shape=")."""
    if np_dtype.subdtype is not None or np_dtype.fields is not None:
        raise ValueError(f"{path.name} holds a record or sub-array dtype ({np_dtype}); a table holds one number per "
                         "element: give the element's dtype and put the sub-array in shape=")
    if np_dtype.hasobject:
        raise ValueError(f"{path.name} holds Python objects (dtype {np_dtype}), which hmgstore never unpickles; "
                         "save numbers")
    if np_dtype.byteorder == ">" or (np_dtype.byteorder == "=" and not np.little_endian):
        raise ValueError(f"{path.name} holds big-endian numbers ({np_dtype}); convert it with numpy first")
    if len(shape) == 0:
        raise ValueError(f"{path.name} holds a 0-dim array (a single {np_dtype} value); a table has at least one "
                         "dimension (rows): save x.reshape(1) or x[None]")
    if any(s < 0 for s in shape):
        raise ValueError(f"{path.name}: {source} shape {tuple(shape)}, with a negative size")


def _check_size(path: Path, start: int, shape: tuple, np_dtype: np.dtype, exact: bool) -> int:
    """The bytes a ``shape`` table of ``np_dtype`` takes after byte ``start`` of ``path``, checked against the
    file's length (``exact``: no bytes may be left over). Python integers: a huge shape cannot wrap."""
    nbytes = math.prod(shape) * np_dtype.itemsize
    have = os.path.getsize(path) - start
    if have < nbytes:
        raise ValueError(f"{path.name} ends {nbytes - have} bytes early: a {tuple(shape)} table of {np_dtype} "
                         f"needs {nbytes} bytes after byte {start}, the file has {have}")
    if exact and have > nbytes:
        raise ValueError(f"{path.name} holds {have} bytes of rows after its header, which says shape "
                         f"{tuple(shape)} of {np_dtype}: {nbytes} bytes; the file is damaged or its header lies")
    return nbytes


def read(path, *, dtype=None, shape=None, offset: int = 0, key: str | int | None = None, host_dtype=None,
         backing: str = "auto", progress: bool = True) -> torch.Tensor:
    """The table stored at ``path`` as a CPU tensor on owned memory, its rows in the stored format ``host_dtype``
    names (:func:`hmgstore.rows.formats.get`; None: as the file holds them). See :func:`load` for the arguments."""
    return _read(path, dtype, shape, offset, key, formats.get(host_dtype, "host_dtype"), backing, progress)[0]


def _read(path, dtype, shape, offset, key, fmt, backing: str, progress: bool) -> tuple[torch.Tensor, tuple[int, ...]]:
    """:func:`read` of rows stored as ``fmt`` (a Format or None), and the table's shape (not a scaled host tier's)."""
    path = as_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is a directory, not a file of rows" if path.is_dir() else f"no file at {path}")
    suffix, kind = path.suffix.lower(), container(path)
    npy = suffix == ".npy" or kind == "npy"  # a .npy under another name (.pt too): its header, never rows
    if kind == "zip":
        raise ValueError(f"{path.name} is a zip archive (np.savez writes them), not rows: read the array with "
                         "np.load(path)[name], np.save it as a .npy file, and load that")
    if (suffix in (".pt", ".pth") or kind == "torch") and not npy:  # a torch file under another name too
        if dtype is not None or shape is not None:
            raise ValueError(f"{path.name} is a torch file, which records its own dtype and shape; drop dtype/shape")
        if not zero(offset):
            raise ValueError(f"{path.name} is a torch file: offset= (the byte a raw file's rows start at) does not "
                             f"apply; drop offset={offset!r}")
        return _read_torch(path, key, fmt, backing, progress)
    if key is not None:
        raise ValueError(f"key= picks a tensor of a .pt file's dict; {path.name} is not a torch file: drop "
                         f"key={key!r}")
    if npy:
        _npy_arguments_agree(path, dtype, shape, offset)
        return valid_bools(_read_npy(path, fmt, backing, progress), path.name)
    if dtype is None or shape is None:
        raise ValueError(f"cannot tell the layout of {path.name}: pass dtype= and shape= (the first size may be "
                         "-1, read from the file's length) for a raw binary file, or use a .npy or .pt file")
    np_dtype = _numpy_dtype(dtype, path.name)
    shape, offset = _raw_layout(path, shape, np_dtype, offset)
    return valid_bools(_read_raw(path, offset, shape, np_dtype, fmt, backing, progress), path.name)


def _npy_arguments_agree(path: Path, dtype, shape, offset) -> None:
    """A .npy file describes itself: ``dtype=``, ``shape=`` and ``offset=`` that disagree with its header are
    refused (ValueError naming the file and both values), never obeyed; ones that agree are accepted."""
    if not zero(offset):
        raise ValueError(f"{path.name} is a .npy file, whose rows start where its header ends; offset= is for raw "
                         f"binary files: drop offset={offset!r}")
    if dtype is None and shape is None:
        return
    found_shape, _, found_dtype, _, _ = _npy_checked(path)
    if dtype is not None:
        _npy_dtype_agrees(path, dtype, found_dtype)
    if shape is not None:
        given, _ = integer_layout(path, shape, 0)
        same = len(given) == len(found_shape) and all(
            g == f or (k == 0 and g == -1) for k, (g, f) in enumerate(zip(given, found_shape)))
        if not same:
            raise ValueError(f"{path.name} is a .npy file whose header says shape {found_shape}; shape={given} "
                             "disagrees. A .npy file describes itself: drop shape= (reshape the rows after "
                             "loading if you need another shape)")


def _npy_dtype_agrees(path: Path, dtype, found: np.dtype) -> None:
    """Refuse a ``dtype=`` other than the .npy header's (ValueError saying what it says and what to pass). Torch
    dtypes are compared as such: bfloat16, which numpy lacks, is not a reason to read the bytes as int16 but to
    drop ``dtype=`` (a float32 file's rows are kept as bfloat16 with ``host_dtype=``)."""
    header = _torch_dtype(found, path.name)
    if dtype == header if isinstance(dtype, torch.dtype) else _numpy_dtype(dtype, path.name) == found:
        return
    shown = dtype if isinstance(dtype, torch.dtype) else np.dtype(dtype)
    stored = formats.FORMATS.get(str(shown).removeprefix("torch.")) if header == torch.float32 else None
    to_do = (f"to keep its rows as {stored.name} in host memory, pass host_dtype={stored.name!r} instead"
             if stored is not None else f"to get {shown} rows, convert the table after loading")
    raise ValueError(f"{path.name} is a .npy file whose header says dtype {found}; dtype={shown} disagrees. A .npy "
                     f"file describes itself: drop dtype= (or pass dtype={header}, what it holds); {to_do}")


def _raw_layout(path: Path, shape, np_dtype: np.dtype, offset) -> tuple[tuple[int, ...], int]:
    """``(shape, offset)`` of a raw file, checked: integers, offset inside the file, ``shape[0] == -1`` made the
    number of whole rows after ``offset`` (bytes left over are refused: a wrong dtype, shape or offset)."""
    shape, offset = integer_layout(path, shape, offset)
    size = os.path.getsize(path)
    if offset < 0:
        raise ValueError(f"offset must be >= 0 for {path.name}: the byte its rows start at; got {offset}")
    if offset > size:
        raise ValueError(f"offset={offset} is past the end of {path.name} ({size} bytes)")
    if shape and shape[0] == -1:
        if any(s < 0 for s in shape[1:]):
            raise ValueError(f"{path.name}: shape= shape {shape}, with a negative size past its first (-1)")
        row_bytes = math.prod(shape[1:]) * np_dtype.itemsize
        if row_bytes <= 0:
            raise ValueError(f"cannot count the rows of {path.name} with shape {shape}: rows of {row_bytes} bytes")
        rows, left = divmod(size - offset, row_bytes)
        if left:
            raise ValueError(f"{path.name} holds {size - offset} bytes after byte {offset}, not a whole number of "
                             f"{row_bytes}-byte rows ({shape[1:]} of {np_dtype}): {left} bytes left over; check "
                             "dtype=, shape= and offset=")
        shape = (rows, *shape[1:])
    _check_layout(path, shape, np_dtype, "shape=")
    return shape, offset


def npy_layout(path) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of the .npy file at ``path``, from its header, checked as :func:`load` checks it
    (a header numpy reads, a shape and dtype that account for every byte after it), without reading a row.
    Raises FileNotFoundError, or ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}")
    shape, _, np_dtype, _, _ = _npy_checked(path)
    return shape, np_dtype


def _npy_checked(path: Path) -> tuple[tuple[int, ...], bool, np.dtype, int, np.ndarray | None]:
    """``(shape, fortran_order, dtype, data start, numpy's memmap or None)`` of a .npy file, its header
    checked against its length."""
    with open(path, "rb") as f:
        header = _npy_header(path, f)
        start = f.tell()
    array = None
    if header is None:  # other header versions: numpy's reader, then the same checks
        array = _np_load(path)
        header, start = (array.shape, not array.flags.c_contiguous, array.dtype), array.offset
    shape, fortran, np_dtype = tuple(header[0]), header[1], header[2]
    _check_layout(path, shape, np_dtype, "its header says")
    _check_size(path, start, shape, np_dtype, exact=True)
    return shape, fortran, np_dtype, start, array


def _read_npy(path: Path, fmt, backing, progress) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A .npy file, its header checked against its length before any row is read."""
    shape, fortran, np_dtype, start, array = _npy_checked(path)
    if not fortran:
        return _read_raw(path, start, shape, np_dtype, fmt, backing, progress)
    array = _np_load(path) if array is None else array  # Fortran order: numpy's reader
    out, encode = _stored(array.shape, array.dtype, fmt, path.name, backing)
    return owned.copy_in(out, array, progress, desc=f"reading {path.name}", encode=encode), tuple(array.shape)


def _read_raw(path: Path, start: int, shape, np_dtype: np.dtype, fmt, backing, progress) -> tuple[torch.Tensor, tuple]:
    dtype = _torch_dtype(np_dtype, path.name)  # byte order: checked by _check_layout
    nbytes = _check_size(path, start, shape, np_dtype, exact=False)  # a raw file may hold more than is read
    out, encode = _stored(shape, dtype, fmt, path.name, backing)
    target = out.view(-1).view(torch.uint8) if encode is None else None  # rows read straight into place
    row_bytes = max(1, nbytes // max(shape[0], 1)) if shape else nbytes
    step = max(row_bytes, READ_CHUNK_BYTES // row_bytes * row_bytes)
    with open(path, "rb") as f, tqdm(total=nbytes, unit="B", unit_scale=True, desc=f"reading {path.name}",
                                      leave=False, disable=not progress or nbytes < 4 * READ_CHUNK_BYTES) as bar:
        f.seek(start)
        done = 0
        while done < nbytes:
            size = min(step, nbytes - done)
            if target is not None:
                # an ndarray is a buffer: numpy's stubs say so (__buffer__) for Python 3.12 on only
                view = memoryview(target[done:done + size].numpy())  # type: ignore[arg-type]
            else:
                view = memoryview(bytearray(size))
            got = f.readinto(view)
            if got != size:
                raise ValueError(f"{path.name} ended early while reading (got {got} of {size} bytes at {done})")
            if encode is not None:
                rows = torch.frombuffer(view, dtype=dtype).view(-1, *shape[1:])
                first = done // row_bytes
                encode(rows, first, out=out[first:first + len(rows)])
            done += size
            bar.update(size)
    return out, tuple(shape)


def load_torch_file(path: Path, what: str = "a torch file"):
    """What ``torch.save`` wrote to ``path`` (memory-mapped where the format allows; ``weights_only``), or a
    ValueError naming the file when torch cannot read it (cut short, damaged, not a torch file)."""
    try:
        try:
            return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except RuntimeError:  # files saved without the zipfile format cannot be memory-mapped
            return torch.load(path, map_location="cpu", weights_only=True)
    except (PermissionError, IsADirectoryError, MemoryError):
        raise
    except Exception as err:  # torch's zip reader, the unpickler, EOF: all say the same to a user
        detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        raise ValueError(f"{path.name} cannot be read as {what} (torch.load raised {type(err).__name__}: "
                         f"{detail}); it is cut short, damaged or not written by torch.save") from err


def _read_torch(path: Path, key, fmt, backing, progress) -> tuple[torch.Tensor, tuple[int, ...]]:
    key = dict_key(path, key)
    obj = load_torch_file(path)
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if key is None and len(tensors) == 1:
            key = next(iter(tensors))
        if key not in tensors:
            if not tensors:
                raise ValueError(f"{path.name} holds a dict without a tensor among its values")
            given = "" if key is None else f", and {key!r} is not one of its keys"
            raise ValueError(f"{path.name} holds a dict{given}; pass key= one of "
                             f"{', '.join(sorted(map(repr, tensors)))}")
        obj = tensors[key]
    elif key is not None:
        what = "a single tensor" if isinstance(obj, torch.Tensor) else f"a {type(obj).__name__}, not a dict"
        raise ValueError(f"{path.name} holds {what}; drop key={key!r}")
    if not isinstance(obj, torch.Tensor):
        raise ValueError(f"{path.name} holds a {type(obj).__name__}, not a tensor")
    _check_tensor_values(path, obj)
    if obj.dim() == 0:
        raise ValueError(f"{path.name} holds a 0-dim tensor (a single {obj.dtype} value); a table has at least one "
                         "dimension (rows): save x.reshape(1) or x[None]")
    out, encode = _stored(obj.shape, obj.dtype, fmt, path.name, backing)
    return owned.copy_in(out, obj, progress, desc=f"reading {path.name}", encode=encode), tuple(obj.shape)


def _check_tensor_values(path: Path, obj: torch.Tensor) -> None:
    """Refuse a tensor without dense values in CPU memory to copy rows from (ValueError naming the file): torch
    loads with ``map_location="cpu"``, yet a meta tensor stays on its device, and sparse and nested tensors have
    no rows in place."""
    if obj.is_nested:
        raise ValueError(f"{path.name} holds a nested tensor (rows of several shapes); save one tensor per shape, "
                         "or x.to_padded_tensor(0)")
    if obj.layout != torch.strided:
        raise ValueError(f"{path.name} holds a {obj.layout} tensor; save x.to_dense()")
    if obj.device.type != "cpu":  # torch moved every other device's tensors to the CPU, so: meta, a shape alone
        raise ValueError(f"{path.name} holds a tensor on the {obj.device.type} device, without values in CPU memory "
                         "(a meta tensor is a shape alone); save a tensor holding the rows")


def load(path, device=None, *, dtype=None, shape=None, offset: int = 0, key: str | int | None = None,
         host_dtype=None, compress=None, backing: str = "auto", progress: bool = True, **kwargs) -> HybridTensor:
    """A :class:`HybridTensor` read from ``path`` into host memory hmgstore owns (``backing``, see
    :mod:`hmgstore.memory.owned`).

    ``path``: a ``.npy`` file, a ``.pt``/``.pth`` file (a tensor, or a dict
    of tensors with ``key``, a str or int, naming one) or a raw binary file of rows (give
    ``dtype`` and ``shape``; ``shape[0]`` may be -1, meaning as many rows as
    the file holds after ``offset`` bytes). The rows are read piece by piece
    into the table's memory, under a progress bar; no second copy is made.
    ``host_dtype`` and ``compress``: keep float32 rows in a stored format,
    named as :class:`HybridTensor` takes them (:func:`hmgstore.rows.formats.get`:
    ``"bfloat16"``, ``"float16"``, ``"int8"``, ``"float8"`` or their torch
    dtypes; anything else: ValueError listing them, before a byte is read;
    for a file of another dtype: ValueError). ``device`` and ``kwargs`` (``gpu_rows``,
    ``gpu_budget``, ``hot_order``, ``hotness``, ``max_sms``, ``stats``,
    ``split``, ``layout``) are as for :class:`HybridTensor`: with ``layout``
    the file's rows (in id order) are put in layout order, and ids stay the
    caller's (``t[i]`` is the file's row ``i``).

    Contract: a file that describes itself is believed over the arguments.
    ``dtype=``/``shape=`` given for a ``.npy`` file (any file that starts
    with the ``.npy`` magic, whatever its name, ``.pt`` included) must agree with its header
    (``shape[0]`` may be -1), and ``offset=`` applies to raw files
    only, ``key=`` to ``.pt`` files only: anything else is refused with a
    ValueError naming the file, never obeyed. Files are known by their
    first bytes whatever their names: one ``torch.save`` wrote is a torch
    file, and a zip archive of another kind (``np.savez``) is refused, so a
    header is never read as rows. Raises TypeError for a
    ``path`` that is an array, memmap or tensor (build a
    :class:`HybridTensor` over it instead), for a keyword ``load`` does
    not take, for ``shape=``/``offset=`` that are not integers (a bool
    included), for a ``key=`` that is not a str or int, and for a file of a dtype tables do not hold (uint16/32/64,
    float8: :func:`hmgstore.rows.checks.table_dtype`); FileNotFoundError for a missing file; ValueError for a file
    that does not hold what it says (too short, bytes left over, a header
    that lies or is damaged, an unknown layout, a dict without ``key``, a meta,
    sparse or nested tensor), for a ``dtype=``
    a file's bytes cannot be read as (bfloat16, record and sub-array
    dtypes) or one a ``.npy`` header disagrees with (saying what it holds), for a ``layout``
    that is not a permutation of the rows, and as :class:`HybridTensor`
    does for the placement arguments.
    """
    checks.keywords("hmgstore.load", kwargs, LOAD_OPTIONS, named=inspect.signature(load).parameters)
    host_format, gpu_format = formats.for_tiers(host_dtype, compress)  # before a byte is read
    device = resolve_device(device)
    host, table_shape = _read(path, dtype, shape, offset, key, host_format, owned.chosen(backing, device), progress)
    table_dtype = torch.float32 if host_format is not None else host.dtype
    layout = kwargs.pop("layout", None)
    if layout is not None:  # the file holds rows in id order; the host tier keeps them in layout order
        layout = checks.permutation(layout, host.shape[0], "layout")
        host = owned.copy_in(owned.empty(host.shape, host.dtype, owned.chosen(backing, device), zero=False), host,
                             progress, "putting rows in layout order", order=layout)
    return HybridTensor.over_host_tier(host, device, table_dtype, fmt=host_format, shape=table_shape,
                                       gpu_format=gpu_format, layout=layout, progress=progress, **kwargs)


#: The keywords :func:`load` passes on to the table (as :class:`HybridTensor` takes them).
LOAD_OPTIONS = ("gpu_rows", "gpu_budget", "hot_order", "hotness", "max_sms", "stats", "split", "layout")
