"""The gather plan and its launch: what :func:`hmgstore.gather_many` does once its arguments are checked.

For a batch of requests ``(table, ids)`` on one device:

1. every index is checked and made flat (:func:`hmgstore.rows.ids.prepare_many`;
   CPU ids before anything is read, GPU ids as the ``check`` mode says);
2. each request gets its output, given or allocated on the gather's stream;
3. on the CPU, ``torch.index_select`` reads each table's source (widening
   narrow host rows: :func:`read_host`; one table's gather skips the steps
   above: :func:`gather_cpu`); on a GPU, each request becomes one kernel *job*
   (:func:`job`: ids narrowed to int32 where they fit and grouped by ~2 MiB
   of host memory, :mod:`hmgstore.cuda.order`), all jobs go in ONE launch
   (:mod:`hmgstore.cuda.gather`), and split tables hand a share of their
   host rows to the CPU (:mod:`hmgstore.gather.cpu_share`) while it runs.

Nothing here checks the caller's arguments or the tables' lifetime: the
public functions of :mod:`hmgstore.table.tensor` do, before calling :func:`run`.
The tables are :class:`hmgstore.HybridTensor` objects; this module reads
their tiers and settings and never imports the class.
"""
from __future__ import annotations

import contextlib

import torch

from ..cuda import deferred, gather, order
from ..memory.pinned import PinnedHost
from ..rows.ids import Index, check_pending, check_range, prepare_many
from ..rows.placement import host_only
from ..rows.writes import shares_memory
from . import cpu_share, finish_scope


def run(requests, outs, device: torch.device, stream, check: str) -> list[torch.Tensor]:
    """``[table[index] for table, index in requests]`` into ``outs`` (None entries: allocated).

    ``requests``: checked ``(table, index)`` pairs, every table on
    ``device`` and ready to read; ``outs``: one destination or None per
    request. Returns the results shaped ``[*index.shape, *row_shape]``.
    """
    context = contextlib.nullcontext() if device.type == "cpu" else cuda_context(device, stream)
    with context as stream:
        indices, pending = prepare_many([(index, table.num_rows) for table, index in requests], device, check)
        results, every_ids = [], [i.ids for i in indices]
        # Per batch, every torch call here takes the GIL from a training thread beside a pipeline: sizes and
        # shapes are read as attributes (ids.shape[0]), not with len() or numel(), which are torch calls.
        for (table, _), index, out in zip(requests, indices, outs):
            if out is None:
                out = torch.empty((index.ids.shape[0], *table.row_shape), dtype=table.dtype, device=device)
            else:
                check_out(out, (*index.shape, *table.row_shape), table.dtype, device, table, every_ids)
                out = out.view(index.ids.shape[0], *table.row_shape)
            results.append(out)
        counting = list({id(t): t for t, _ in requests if t.counter is not None}.values())
        started = [t.counter.start() for t in counting]
        if device.type == "cpu":
            check_pending(pending)
            for (table, _), index, out in zip(requests, indices, results):
                read_host(table, index.ids, out)
        else:
            gather_cuda(requests, indices, results, pending, check, device, stream)
        for table, start in zip(counting, started):
            table.counter.stop(start)
    return [_shaped(out, (*index.shape, *table.row_shape))
            for (table, _), index, out in zip(requests, indices, results)]


def _shaped(out: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``out`` viewed as ``shape``; ``out`` itself where it has that shape already (a 1-D index)."""
    return out if out.shape == shape else out.view(shape)


def gather_cpu(table, index: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``table[index]`` for a CPU table: :func:`run`'s work for one request, without its per-batch set-up.

    ``index``: int32/int64 CPU tensor of any shape (1-D or more), not
    checked yet; ``out``: None or a destination for :func:`check_out`. The
    caller holds the table (``_enter``/``_ready``). Returns
    ``[*index.shape, *row_shape]`` of the table's dtype on the CPU. Raises
    IndexError for an id out of range (before any row is read), ValueError
    for a bad ``out``. Small CPU gathers cost a fraction of :func:`run`'s
    per-batch set-up here.
    """
    ids = index.reshape(-1)
    check_range(ids, table.num_rows)
    shape = (*index.shape, *table.row_shape)
    if out is None:
        out = torch.empty(shape, dtype=table.dtype)
    else:
        check_out(out, shape, table.dtype, table.device, table, (ids,))
    started = table.counter.start() if table.counter is not None else None
    read_host(table, ids, out.view(len(ids), *table.row_shape))
    if started is not None:
        table.counter.stop(started)
    return out


def read_host(table, ids: torch.Tensor, out: torch.Tensor) -> None:
    """``out[i] = table row ids[i]``, read from the host tier on the CPU with ``torch.index_select``.

    ``ids``: 1-D int32/int64 CPU tensor, every id in range (checked by the
    caller); ``out``: contiguous CPU ``[len(ids), *row_shape]`` of the
    table's dtype. Half-width rows (bf16/fp16) are widened in the copy into
    ``out``, in one pass with no float32 temporary (faster than decoding
    first, and than reading in pieces through one buffer); scaled formats
    are decoded whole.
    """
    at = table.host_positions(ids)
    fmt, source = table.host_format, table.host_tier
    if fmt is None:
        torch.index_select(source, 0, at, out=out)
    elif fmt.scaled:
        out.copy_(fmt.decode(torch.index_select(source, 0, at), table.row_shape))
    else:
        out.copy_(torch.index_select(source, 0, at))  # widened in the copy: decode()'s .to(float32), one pass
    if table.counter is not None:
        table.counter.rows[-1] += len(ids)  # a CPU table is its host tier


def check_out(out: torch.Tensor, shape, dtype, device, table=None, ids=()) -> None:
    """Raise ValueError unless ``out`` is a contiguous tensor of ``shape``, ``dtype`` on ``device`` that does not
    require grad (a gather writes it outside autograd, which would not know) and shares no memory with
    ``table``'s tiers (rows written while others are read from it would read half-written rows) nor with any
    tensor of ``ids`` (the gather's ids: rows written over ids not read yet would fetch the wrong rows), TypeError
    for what is not a tensor."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out is a tensor to write the rows into, or None; got {type(out).__name__}")
    if out.requires_grad:
        raise ValueError("out requires grad, and a gather writes it outside autograd (as torch's index_select(out=) "
                         "refuses to); pass out.detach() (the same memory), or no out to get a new tensor")
    shape = torch.Size(shape)
    if out.shape != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous tensor of shape {tuple(shape)}, dtype {dtype} on {device}; "
            f"got shape {tuple(out.shape)}, dtype {out.dtype} on {out.device}"
            f"{'' if out.is_contiguous() else ', not contiguous'}")
    if table is not None and any(shares_memory(out, tier) for tier in (table._source, table.gpu_tier)):
        raise ValueError("out shares memory with the table it gathers from (its rows would be overwritten while "
                         "they are read); pass a separate tensor, or no out to get a new one")
    for k, index in enumerate(ids):
        if shares_memory(out, index):
            which = "the ids" if len(ids) == 1 else f"the ids of request {k}"
            raise ValueError(f"out shares memory with {which} (rows written over ids not read yet would fetch the "
                             "wrong rows); pass a separate tensor, or the ids' .clone()")


def check_outs_apart(tables: list, outs: list) -> None:
    """Raise ValueError where two of one gather's ``outs`` (a tensor or None per request) share a byte, or an out
    shares memory with any table of the gather: one request's rows would overwrite another's result, or rows
    another request is still reading (:func:`check_out` checks each out against its own table only). Outs that are
    not contiguous are left to :func:`check_out`, which refuses them."""
    spans = sorted((out.data_ptr(), out.data_ptr() + out.numel() * out.element_size(), k)
                   for k, out in enumerate(outs) if out is not None and out.numel() and out.is_contiguous())
    for (_, end, k), (start, _, j) in zip(spans, spans[1:]):
        if start < end:
            raise ValueError(f"outs {min(k, j)} and {max(k, j)} share memory (one request's rows would overwrite "
                             "the other's); give each request its own buffer")
    for k, out in enumerate(outs):
        for j, table in enumerate(tables):
            if out is not None and any(shares_memory(out, tier) for tier in (table._source, table.gpu_tier)):
                raise ValueError(f"out shares memory with the table of request {j} (out {k}: that table's rows would "
                                 "be overwritten while they are read); pass a separate tensor, or no out")


def page_shift(table) -> int:
    """log2 of the rows per ~2 MiB of the table's host tier: the groups a gather's ids are ordered in."""
    return order.bucket_shift(table.pinned.pitch if table.pinned is not None else table.row_bytes)


def job(table, index: Index, out: torch.Tensor, prepared: dict, checked: bool):
    """The kernel job for one table's ids. Runs on the current stream.

    ``prepared`` caches narrowed/grouped ids per index within one batch, so
    features and labels indexed by the same ids convert and group them once
    (grouped by host page: :mod:`hmgstore.cuda.order`).
    Ids not ``checked`` yet (the kernel checks them) are never narrowed,
    which could wrap a bad id into range.
    """
    narrow = table.placement.index_dtype if checked else index.ids.dtype
    shift = page_shift(table) if table.sort_ids and table.reads_host and index.ids.shape[0] > 1 else None
    key = (id(index), narrow, shift, id(table.row_map))  # tables with the same bucket size and map share a grouping
    if key not in prepared:
        ids = index.ids if index.ids.dtype == narrow else index.ids.to(narrow)  # checked ids cannot wrap
        perm = None
        if shift is not None:  # by host position: map[id] when the table renumbers its rows
            ids, perm = order.group_by_page(ids, table.num_rows, shift, table.row_map, table.placement.bounds[-1])
        prepared[key] = (ids, perm)
    ids, perm = prepared[key]
    return gather.Job(ids, perm, out, table.row_map, table.num_rows, table.row_bytes, table.tiers)


def fill_rows(pinned: PinnedHost, rows: torch.Tensor, out: torch.Tensor, device: torch.device,
              stored=None) -> None:
    """``out[i] = source[rows[i]]`` on ``device``, reading the pinned source with the gather kernel; waits.

    ``rows``: ids in range (they come from a placement); ``stored``: the
    :class:`~hmgstore.rows.formats.Format` the source keeps rows in, decoded on
    the way into ``out`` (float32); None copies the rows' bytes as they are.
    """
    if not len(rows):
        return
    num_rows = pinned.tensor.shape[0]
    host = host_only(num_rows)
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        ids = rows.to(device, host.index_dtype)
        tiers = [host.tier("host").bind(pinned.address, pinned.pitch, stored)]
        row_bytes = out[0].numel() * out.element_size()
        gather.launch_gather([gather.Job(ids, None, out, None, num_rows, row_bytes, tiers)], device, stream, None)
        stream.synchronize()


def gather_cuda(requests, indices, results, pending, check, device, stream, shares=None) -> None:
    """Queue one launch for every request on ``stream``, and the CPU's share of split tables' rows.

    ``shares``: per request, the CPU's share of the split gather, or None
    to use each table's own setting. Returns once the CPU's rows are read
    and queued, or, inside :func:`hmgstore.gather.finish_scope.deferred_finishes`,
    at once: the CPU's rows land by the events of that block's futures.
    """
    prepared: dict = {}
    unchecked = {id(ids) for ids, _, _ in pending} if check == "deferred" else set()
    if shares is None:  # each table's own (an "auto" table's first batch of a size class measures it here)
        shares = [table_share(table, index) for (table, _), index in zip(requests, indices)]
    jobs, parts = [], []
    for (table, _), index, out, share in zip(requests, indices, results, shares):
        split = split_job if index.host is not None else split_job_gpu_ids
        work, part = (None, None) if not share else split(table, index, out, share, stream)
        jobs.append(work or job(table, index, out, prepared, id(index.ids) not in unchecked))
        if part is not None:
            parts.append((table, part, out))
    packed = gather.pack(jobs, device, *(t.max_sms or None for t, _ in requests))  # a cap of 0: none
    record = None
    if check == "sync":
        check_pending(pending)  # the range check's read-back, after the host work it overlaps
    elif pending and packed is not None:
        record = deferred.error_record(device)
    gather.run(packed, device, stream, record)
    if record is not None and packed is not None:  # a record is made for a packed launch only
        described = [(requests[k][0].num_rows, f"a table of shape {tuple(requests[k][0].shape)}")
                     for k in packed.kept]
        deferred.deferred(device, stream, record, described)
    later = finish_scope.deferring()  # in a pipeline's thread: the reader thread finishes, see finish_later
    for table, part, out in parts:  # the CPU's rows, read while the kernel runs
        (cpu_share.finish_later if later else cpu_share.finish)(part, out, stream)
        if table.counter is not None:
            table.counter.rows[-1] += len(part.ids)  # served by the host tier, through the CPU
    for (table, _), work in zip(requests, jobs):
        if table.counter is not None:
            count(table, work)


def count(table, work) -> None:
    """Add a CUDA job's rows to the table's per-tier counters (device work only, no waiting)."""
    ids = clamped(work.ids, table.num_rows)  # ids of a deferred check may be out of range (reported later)
    new = ids if table.row_map is None else table.row_map[ids]
    tier = torch.searchsorted(table.tier_starts, new.to(table.tier_starts.dtype), right=True) - 1
    table.counter.add(tier)
    table.counter.add_pages(new, tier)


def clamped(ids: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``ids`` clamped into ``[0, num_rows)``, the bound within their dtype's range (int32 ids of a table of more
    than 2**31 rows): safe to index a row map with before the ids are checked."""
    return ids.clamp(0, min(num_rows, torch.iinfo(ids.dtype).max + 1) - 1)


def table_share(table, index: Index) -> float | None:
    """The CPU's share of ``index``'s host rows: the table's split setting for CPU ids; for GPU ids only a fixed
    share (``"auto"`` models times each path alone, which misses what the GPU ids' case is for, see
    :func:`split_job_gpu_ids`)."""
    setting = table.split_setting
    if setting is None:
        return None
    if index.host is not None:
        return setting.share(table, len(index.host))
    return None if setting.value == "auto" else setting.value


def split_job_gpu_ids(table, index: Index, out: torch.Tensor, share: float, stream):
    """:func:`split_job` for ids on the GPU: the GPU divides the batch, the CPU gets its host rows' places.

    Why. Beside a GPU-bound training step, host rows read by the CPU and
    moved by the copy engine cost the step less than the zero-copy kernel,
    which holds SMs while it waits on PCIe
    (``benchmarks/results/dma-misses-h100.md``). The price: the gathering
    thread waits for the ids (their range, checked here whatever the
    ``check`` mode: IndexError), then for the division's counts and the
    CPU's ids, read back small: two read-backs (the range and the host
    rows' count in one; then the CPU's ids), where ``nonzero`` would add
    one each; dividing on the CPU instead (the ids read back whole) was
    slower. Returns ``(None, None)`` when the CPU's share is under
    :data:`hmgstore.gather.cpu_share.MIN_IDS` rows.
    """
    ids = index.ids
    host_start = table.placement.tier("host").start  # its row r is new id host_start + r (the layout applied)
    n = len(ids)
    # An id out of range must not index the row map before the check: clamped there, reported below.
    new = ids.long() if table.row_map is None else table.row_map[clamped(ids, table.num_rows)].long()
    on_host = new >= host_start
    low, high, n_host = torch.stack([ids.min().long(), ids.max().long(), on_host.sum()]).tolist() if n else (0, 0, 0)
    if low < 0 or high >= table.num_rows:  # the one synchronisation before the CPU's ids
        check_range(ids.cpu(), table.num_rows)  # raises with the value and position
    k = int(round(share * n_host))
    if k < cpu_share.MIN_IDS:
        return None, None
    host = torch.nonzero_static(on_host, size=n_host).flatten()  # the count is known: no read-back
    cpu = host[:k]
    rest = torch.nonzero_static(~on_host, size=n - n_host).flatten()
    if k < n_host:
        rest = torch.cat([rest, host[k:]])
    fmt = table.host_format
    decode = None if fmt is None or not fmt.scaled else (lambda rows: fmt.decode(rows, table.row_shape))
    part = cpu_share.CpuPart((new[cpu] - host_start).cpu(), cpu, decode, table.split_setting.threads)
    cpu_share.start(part, table.host_tier, out, stream)
    ids = ids[rest].to(table.placement.index_dtype)  # checked above: cannot wrap
    return gather.Job(ids, rest, out, table.row_map, table.num_rows, table.row_bytes, table.tiers), part


def split_job(table, index: Index, out: torch.Tensor, share: float, stream):
    """The kernel's job and the CPU's part of a split gather, or ``(None, None)`` when too few rows."""
    host = index.host
    assert host is not None  # the split for CPU ids: gather_cuda takes split_job_gpu_ids for the others
    k, cpu, rest = cpu_share.divide(host, table.split_setting.on_host(table.placement), share)
    if not k:
        return None, None
    fmt = table.host_format
    decode = None if fmt is None or not fmt.scaled else (lambda rows: fmt.decode(rows, table.row_shape))
    part = cpu_share.CpuPart(table.host_positions((host[:k] if cpu is None else host[cpu]).to(torch.int64)),
                             cpu, decode, table.split_setting.threads)
    cpu_share.start(part, table.host_tier, out, stream)
    if rest is None:  # every row on the host: the kernel reads positions k..n
        ids, positions = index.ids[k:], torch.arange(k, len(index.ids), device=table.device)
    else:
        positions = rest.to(table.device, non_blocking=True)
        ids = index.ids[positions]
    ids = ids.to(table.placement.index_dtype)  # CPU ids: checked, cannot wrap
    perm = positions
    if table.sort_ids and len(ids) > 1:
        ids, by_page = order.group_by_page(ids, table.num_rows, page_shift(table), table.row_map,
                                           table.placement.bounds[-1])
        perm = positions if by_page is None else positions[by_page]
    return gather.Job(ids, perm, out, table.row_map, table.num_rows, table.row_bytes, table.tiers), part


def gather_with_share(table, ids: torch.Tensor, out: torch.Tensor, share: float) -> None:
    """Gather CPU ids (int64, in range) of a CUDA table into ``out`` with the CPU reading ``share`` of its host
    rows (how :mod:`hmgstore.gather.cpu_share` measures its cost model)."""
    with cuda_context(table.device, None) as stream:
        index = Index(ids.to(table.device, non_blocking=True), (len(ids),), ids)
        gather_cuda([(table, ids)], [index], [out], [], "sync", table.device, stream, [share])


@contextlib.contextmanager
def cuda_context(device: torch.device, stream):
    """Run on ``device`` with ``stream`` (default: its current stream) current, so every
    allocation and copy of the gather is ordered on that one stream."""
    if stream is not None and stream.device != device:
        raise ValueError(f"stream is on {stream.device} but the tables are on {device}")
    with torch.cuda.device(device):
        stream = stream if stream is not None else torch.cuda.current_stream(device)
        with torch.cuda.stream(stream):
            yield stream
