"""Which device a table, a topology or a sampler lives on: :func:`resolve_device`, the one rule; and the
device's long-lived streams."""
from __future__ import annotations

import torch

from ..cuda.runtime import check_visible
from . import fork_guard  # noqa: F401 - registers its fork hooks with the first import of hmgstore


def resolve_device(device) -> torch.device:
    """The device a table lives on: ``None`` means the current GPU, or the CPU without one.

    A bare ``"cuda"`` gets the current GPU's index. Every public entry
    point that takes a ``device`` resolves it here first, so each says the
    same thing. Raises ValueError for device types other than cpu and cuda,
    and RuntimeError saying what to do for a CUDA device where torch sees no
    GPU (or not that one).
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        check_visible(device)  # before torch's own "not compiled with CUDA" from deep inside a call
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"hmgstore tables live on 'cpu' or 'cuda' devices, not {device}")
    return device


_kept_streams: dict[tuple[str, int | None], torch.cuda.Stream] = {}


def kept_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """The one stream of ``device`` for ``role`` (the pipeline's side stream, the sampler's own), made on first
    use and kept: torch's caching allocator reuses a freed block only for the stream that made it, so a new
    stream each epoch or batch would strand every earlier one's blocks."""
    key = (role, device.index)
    if key not in _kept_streams:
        _kept_streams[key] = torch.cuda.Stream(device)
    return _kept_streams[key]
