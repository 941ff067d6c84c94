"""The arguments of a file read (:func:`hmgstore.load`), checked before a byte of the file is read as rows."""
from __future__ import annotations

import operator
import tokenize
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..rows import checks

#: What numpy's .npy header reader raises for a damaged header. It reads the header as a Python literal
#: (tokenize, then ast.literal_eval), so one changed byte can raise any of these, tokenize.TokenError (no
#: ValueError) for an unclosed bracket among them: readers catch them all and raise a ValueError naming the file.
NPY_HEADER_ERRORS = (ValueError, SyntaxError, TypeError, EOFError, UnicodeDecodeError, OverflowError,
                     tokenize.TokenError)


def integer_layout(path: Path, shape, offset) -> tuple[tuple[int, ...], int]:
    """``(shape, offset)`` as Python integers. Raises TypeError naming the file for a shape that is not a
    sequence of integers (an int, floats such as ``10.0``, bools) or an offset that is not an integer: never
    truncated, and a flag passed by mistake (``operator.index(True)`` is 1) never read as a size."""
    try:
        if isinstance(shape, (str, bytes)) or isinstance(offset, (bool, np.bool_)) or \
                any(isinstance(s, (bool, np.bool_)) for s in shape):
            raise TypeError
        return tuple(operator.index(s) for s in shape), operator.index(offset)
    except TypeError:
        raise TypeError(f"shape= (a tuple) and offset= take integers; got shape={shape!r}, offset={offset!r} "
                        f"for {path.name}") from None


def valid_bools(read: tuple, name: str) -> tuple:
    """``read`` (rows, shape) unchanged after checking bool rows hold bytes 0 and 1 only. A file's byte 2 or 255
    read as a bool prints True yet compares and sums as itself, so such rows are refused (ValueError naming the
    first one) instead of handed on."""
    rows = read[0]
    if rows.dtype == torch.bool:
        data = rows.view(torch.uint8).reshape(-1)
        bad = (data > 1).nonzero()
        if len(bad):
            at = int(bad[0])
            raise ValueError(f"{name}: element {at} of its bool rows is the byte {int(data[at])}; "
                             "a bool is stored as 0 or 1. Read the file as uint8 (dtype=np.uint8) and compare "
                             "with 0 (x != 0)")
    return read


def zero(offset) -> bool:
    """Whether ``offset`` is the integer 0 (a Python, numpy or torch integer; not False, a flag passed by mistake)."""
    try:
        return checks.count(offset, "offset") == 0
    except (TypeError, ValueError):
        return False


#: How each kind of file that is not rows begins: ``.npy``; a zip archive (``torch.save``'s format since torch 1.6,
#: ``np.savez``); ``torch.save``'s older format (a pickle whose first value is torch's magic number).
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_TORCH_LEGACY_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")  # the pickled number


def _legacy_torch(head: bytes) -> bool:
    """Whether ``head`` starts a legacy ``torch.save`` file: a pickle (PROTO 2 to 5; 4 and 5 put a FRAME of an
    8-byte length first) whose first value is torch's magic number."""
    if len(head) < 2 or head[0] != 0x80 or not 2 <= head[1] <= 5:
        return False
    body = head[2:]
    return (body[9:] if body[:1] == b"\x95" else body).startswith(_TORCH_LEGACY_MAGIC)


def container(path: Path) -> str | None:
    """What the file at ``path`` is by its first bytes, whatever its name: ``"npy"``, ``"torch"`` (a file
    ``torch.save`` wrote, zip or legacy), ``"zip"`` (another zip archive: an ``.npz``), or None (no known header:
    raw rows, or absent/unreadable, which the raw reader says)."""
    try:
        with open(path, "rb") as f:
            head = f.read(32)
        if head.startswith(_NPY_MAGIC):
            return "npy"
        if _legacy_torch(head):
            return "torch"
        if head.startswith(_ZIP_MAGIC) and zipfile.is_zipfile(path):  # the end record too: not rows that start so
            with zipfile.ZipFile(path) as archive:
                return "torch" if any(n.endswith("/data.pkl") for n in archive.namelist()) else "zip"
    except (OSError, zipfile.BadZipFile):
        pass
    return None


def as_path(path) -> Path:
    """``path`` as a Path; arrays and tensors are refused with the call that takes them (TypeError)."""
    if isinstance(path, (np.ndarray, torch.Tensor)):
        what = "an np.memmap" if isinstance(path, np.memmap) else f"a {type(path).__name__}"
        raise TypeError(f"hmgstore.load reads a file by its path, and got {what}; build a table over an array "
                        "or memmap with hmgstore.HybridTensor(x, device), or pass the file's path")
    return checks.path(path, "a file", "hmgstore.load")


def dict_key(path: Path, key):
    """``key=`` (a .pt dict's key: a str, or an int for a dict saved with int keys), checked before the file is
    read; TypeError naming the file for anything else (a list, a bool, a float), never looked up."""
    if key is None or isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)):
        return key
    raise TypeError(f"key= names one tensor of {path.name}'s dict by its key (a str, or an int), got "
                    f"{type(key).__name__} {key!r}")
