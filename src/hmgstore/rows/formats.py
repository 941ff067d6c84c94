"""Stored row formats: how a tier keeps a float32 table's rows in fewer bytes, and how they read back.

A tier may keep its rows in a narrower *format*; every gather decodes them,
so a table always reads in its own dtype (float32):

====================  =========================  =================================  ==================
name                  stored row                 reads back as (torch)              bytes, 128 values
====================  =========================  =================================  ==================
``"bfloat16"``        ``elems`` bfloat16         ``x.to(torch.bfloat16).float()``   256 (2x fewer)
``"float16"``         ``elems`` float16          ``x.to(torch.float16).float()``    256 (2x)
``"float8"``          ``elems`` float8_e4m3fn,   ``q.float() * scale``              144 (3.6x)
                      then a float32 scale
``"int8"``            ``elems`` int8, then a     ``q.float() * scale``              144 (3.6x)
                      float32 scale
====================  =========================  =================================  ==================

The two scaled formats keep one float32 ``scale`` per row, ``max |x| / QMAX``
(127 for int8, 448, e4m3's largest finite value, for float8), and the
values ``q = x / scale`` rounded to the format (int8: to nearest, ties to
even, as ``torch.round``; float8: torch's conversion). A row of zeros
stores scale 1; a scale is at least ``MIN_SCALE`` (2^-117), so that every
decoded value is a normal float32 or zero, which a GPU computes exactly as
the CPU does whatever its handling of subnormal numbers (rows whose largest
magnitude is under about 1e-33 keep only their largest values; int8 rows under
half of ``MIN_SCALE``, about 3e-36, read back as zeros). A scaled
row is laid out as bytes: the ``elems`` values at offset 0, the scale at
:meth:`Format.scale_offset` (the next multiple of 4), the row padded to a
multiple of 16 bytes (:meth:`Format.pitch`) so that
the GPU reads it with 16-byte loads; the host tensor of such a tier is
``uint8 [N, pitch]``. The 16-bit formats are plain typed tensors
``[N, *row_shape]``.

:meth:`Format.encode` is the one place where rows are rounded, on the CPU
with torch, and :meth:`Format.decode` is the reference the gather kernel
(``kernels/gather.cu``) matches bit for bit: the same conversion of each
stored value to float32, then one float32 multiply by the scale. Rows with
NaN or infinity cannot be scaled (their scale would be NaN or infinite and
take the whole row with it): encoding raises ValueError, naming the first
such row. The 16-bit formats keep NaN and infinity as they are, but refuse a
finite value past their range (float16's 65504, bfloat16's 3.39e38), which
would read back as infinity: ValueError naming the row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: The smallest per-row scale: its products with the smallest stored values (float8's 2^-9) stay normal floats.
MIN_SCALE = 2.0 ** -117


@dataclass(frozen=True)
class Format:
    """One stored row format (see the module docstring); get them with :func:`get`."""

    name: str
    element: torch.dtype  # the stored values' dtype
    scaled: bool  # a float32 scale per row after the values
    code: int  # the kernel's name for it (F_FMT_* in kernels/gather_job.cuh)
    qmax: float = 0.0  # scaled formats: the largest stored magnitude

    @property
    def element_size(self) -> int:
        return self.element.itemsize  # no tensor made: this runs for every batch of a narrow table

    def scale_offset(self, elems: int) -> int:
        """Byte offset of a scaled row's float32 scale: after its values, 4-byte aligned."""
        return -(-elems * self.element_size // 4) * 4

    def pitch(self, elems: int) -> int:
        """Bytes a stored row of ``elems`` values takes (a scaled row padded to a multiple of 16)."""
        if not self.scaled:
            return elems * self.element_size
        return -(-(self.scale_offset(elems) + 4) // 16) * 16

    def stored_shape(self, shape) -> tuple[int, ...]:
        """The host tensor's shape for a table of ``shape`` (rows first)."""
        shape = tuple(shape)
        if not self.scaled:
            return shape
        return (shape[0], self.pitch(_elems(shape)))

    def stored_dtype(self) -> torch.dtype:
        return torch.uint8 if self.scaled else self.element

    def encode(self, rows: torch.Tensor, first_row: int | torch.Tensor = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """``rows`` (float32 CPU ``[n, *row_shape]``) in this format: ``stored_shape`` of ``stored_dtype``.

        ``first_row``: the caller's row id of ``rows[0]`` (rows in id order),
        or the caller's id of every row (int64 ``[n]``: rows written by id,
        or copied in a layout's order), for error messages, which name the
        caller's row id, never a position;
        ``out``: where to write them (a CPU tensor of that shape and dtype,
        e.g. the rows of a host tier), returned; default a new tensor.
        Raises ValueError for a non-float32 input, for scaled formats a row
        holding NaN or infinity (found from each row's extremes, which also
        give its scale), and for 16-bit formats a row with a finite value past
        their range. Quantised in blocks of rows whose temporaries
        stay in the CPU's caches: about 5x the encode that scanned every
        value and worked on all rows at once (1M rows of 128 values, 2-core
        VM, interleaved: 0.21-0.24 against 1.09-1.12 s; the blocks alone
        1.8x; taking each block's extremes in the same pass was 25% slower).
        """
        if rows.dtype != torch.float32:
            raise ValueError(f"stored formats keep float32 rows; got {rows.dtype}")
        n, elems = rows.shape[0], _elems(rows.shape)
        stored = self.stored_shape(rows.shape)
        if out is not None and (tuple(out.shape) != stored or out.dtype != self.stored_dtype() or out.is_cuda):
            raise ValueError(f"out must be a CPU tensor of shape {stored} and dtype {self.stored_dtype()}; got "
                             f"{tuple(out.shape)}, {out.dtype} on {out.device}")
        if not self.scaled:
            out = rows.to(self.element) if out is None else out.copy_(rows)
            if bool(torch.isinf(out).any()):  # one pass over the 16-bit rows; the culprit only then
                self._refuse_overflow(rows, out, first_row)
            return out
        flat = rows.reshape(n, elems)
        if elems:  # a row's largest magnitude, from its extremes: NaN or infinite exactly where the row holds one
            low, high = torch.aminmax(flat, dim=1)
            largest = torch.maximum(high, low.neg_())
        else:
            largest = torch.zeros(n)
        bad = ~torch.isfinite(largest)
        if bool(bad.any()):
            at = int(bad.nonzero()[0, 0])
            row = int(first_row[at]) if isinstance(first_row, torch.Tensor) else first_row + at
            raise ValueError(f"row {row} holds NaN or infinity, which {self.name} rows (values scaled by the row's "
                             f"largest magnitude) cannot store; clean the table, or store it as bfloat16")
        scale = largest / self.qmax  # a zero row (or none of its values) gets scale 1 below
        scale = torch.where(scale > 0, scale.clamp(min=MIN_SCALE), torch.ones_like(scale))
        # A row near FLT_MAX: qmax * scale, rounded, may pass FLT_MAX and decode as infinity. One float32 below
        # (twice at most) keeps qmax * scale finite; its values then clamp to qmax, a few ulps under the original.
        for _ in range(2):
            scale = torch.where(torch.isinf(scale * self.qmax), torch.nextafter(scale, torch.zeros(())), scale)
        width, offset = elems * self.element_size, self.scale_offset(elems)
        if out is None:
            out = torch.empty(stored, dtype=torch.uint8)  # every byte written below, padding as zeros
        out[:, width:offset] = 0
        out[:, offset:offset + 4] = scale.reshape(n, 1).view(torch.uint8)
        out[:, offset + 4:] = 0
        step = max(1, ENCODE_BLOCK_BYTES // max(1, 4 * elems))
        for a in range(0, n, step):  # blocks whose temporaries stay in the CPU's caches
            q = torch.div(flat[a:a + step], scale[a:a + step, None]).clamp_(-self.qmax, self.qmax)
            if self.element == torch.int8:
                q.round_()
            out[a:a + step, :width].view(self.element).copy_(q)  # converted as .to() would, straight into place
        return out

    def _refuse_overflow(self, rows: torch.Tensor, stored: torch.Tensor, first_row) -> None:
        """ValueError naming the first row with a finite value past this 16-bit format's range (it would read
        back as infinity); infinities the table already held are kept, as the module docstring says."""
        grown = (torch.isinf(stored) & torch.isfinite(rows)).reshape(rows.shape[0], -1)
        if not bool(grown.any()):
            return
        at, where = (int(i) for i in grown.nonzero()[0])
        row = int(first_row[at]) if isinstance(first_row, torch.Tensor) else first_row + at
        value = float(rows[at].reshape(-1)[where])
        largest = torch.finfo(self.element).max
        raise ValueError(f"row {row} holds {value:.6g}, past {self.name}'s largest finite value ({largest:.6g}): "
                         f"it would read back as infinity; store the table as int8 or float8 (scaled per row)"
                         + (" or bfloat16" if self.element == torch.float16 else ""))

    def decode(self, stored: torch.Tensor, row_shape) -> torch.Tensor:
        """Stored rows (as :meth:`encode` returns them, any device) back as float32 ``[n, *row_shape]``."""
        row_shape = tuple(row_shape)
        if not self.scaled:
            return stored.to(torch.float32)
        n, elems = stored.shape[0], _elems((0, *row_shape))
        values = stored[:, :elems * self.element_size].contiguous().view(self.element).to(torch.float32)
        offset = self.scale_offset(elems)
        scale = stored[:, offset:offset + 4].contiguous().view(torch.float32)
        return (values * scale).reshape(n, *row_shape)


#: Rows :meth:`Format.encode` quantises at a time, in float32 bytes (1-4 MiB measured fastest on the 2-core VM).
ENCODE_BLOCK_BYTES = 4 << 20


def _elems(shape) -> int:
    count = 1
    for size in tuple(shape)[1:]:
        count *= int(size)
    return count


FORMATS = {f.name: f for f in (
    Format("bfloat16", torch.bfloat16, False, 2),
    Format("float16", torch.float16, False, 1),
    Format("float8", torch.float8_e4m3fn, True, 3, 448.0),
    Format("int8", torch.int8, True, 4, 127.0),
)}
_ALIASES = {torch.bfloat16: "bfloat16", torch.float16: "float16", "bf16": "bfloat16", "fp16": "float16",
            "half": "float16", "fp8": "float8", "float8_e4m3fn": "float8", "e4m3": "float8",
            torch.float8_e4m3fn: "float8", torch.int8: "int8"}


def get(spec, name: str = "compress") -> Format | None:
    """The format ``spec`` names: a :class:`Format`, a name (``"int8"``, ``"fp8"``, ``"bf16"`` ...), a torch
    dtype (``torch.bfloat16``, ``torch.int8``), or None (rows kept as they are): the one reading of
    ``host_dtype=`` and ``compress=`` for every entry point. Raises ValueError for anything else (another
    dtype, an unknown name, a number), naming the argument ``name`` and listing the choices."""
    if spec is None or isinstance(spec, Format):
        return spec
    try:
        key = _ALIASES.get(spec, spec)
    except TypeError:  # unhashable (a list, a dict): no name of a format
        key = None
    if isinstance(key, str):
        key = key.lower().removeprefix("torch.")
        key = _ALIASES.get(key, key)
    if not isinstance(key, str) or key not in FORMATS:
        names = ", ".join(repr(n) for n in FORMATS)
        raise ValueError(f"unknown stored row format {spec!r} for {name}=; use one of {names} (or the torch dtypes "
                         "torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int8), or None to keep rows as "
                         "they are")
    return FORMATS[key]


def check_table(dtype: torch.dtype, fmt: Format | None, what: str = "this table") -> None:
    """Refuse a stored format ``fmt`` for a table of ``dtype`` other than float32 (ValueError naming ``what``, the
    table or the file it is read from); None: nothing."""
    if fmt is not None and dtype != torch.float32:
        raise ValueError(f"stored row formats ({fmt.name} here) keep float32 tables; {what} holds {dtype}. "
                         "Convert it first (x.float()), or keep its rows as they are (host_dtype=None)")


def of_host_tier(stored: torch.Tensor, dtype: torch.dtype, shape=None, fmt: Format | None = None):
    """``(format, table shape)`` of ``stored``, a host tier already in its stored form, of a table reading as
    ``dtype``: ``fmt`` (None: the 16-bit format whose element ``stored`` holds, where ``dtype`` differs) and
    ``shape`` (None: ``stored``'s). ValueError where they do not describe ``stored``: no format reads its dtype
    as ``dtype``, or its shape is not the stored shape of ``shape``, so that no byte is read as another row."""
    if fmt is None and stored.dtype != dtype:
        fmt = next((f for f in FORMATS.values() if not f.scaled and f.element == stored.dtype), None)
        if fmt is None:
            raise ValueError(f"a host tier of {stored.dtype} rows cannot read as {dtype}: name its stored format, "
                             f"or read it as {stored.dtype}")
    check_table(dtype, fmt)
    shape = tuple(stored.shape) if shape is None else tuple(shape)
    want = fmt.stored_shape(shape) if fmt is not None else shape
    if tuple(stored.shape) != want:
        raise ValueError(f"a {fmt.name if fmt else stored.dtype} host tier of a {shape} table has shape {want}, "
                         f"not {tuple(stored.shape)}")
    return fmt, shape


def for_tiers(host_dtype, compress):
    """``(host tier's format, GPU tier's format)`` from the constructor's ``host_dtype`` and ``compress``."""
    host, both = get(host_dtype, "host_dtype"), get(compress, "compress")
    if both is not None:
        if host is not None and host != both:
            raise ValueError(f"compress={both.name!r} stores both tiers as {both.name}; host_dtype={host.name!r} "
                             "asks for another host format: pass one of them")
        return both, both
    return host, None
