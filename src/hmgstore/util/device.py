"""Which device a table, a topology or a sampler lives on: :func:`resolve_device`, the one rule."""
from __future__ import annotations

import torch


def resolve_device(device) -> torch.device:
    """The device a table lives on: ``None`` means the current GPU, or the CPU without one.

    A bare ``"cuda"`` gets the current GPU's index. Raises ValueError for
    device types other than cpu and cuda.
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        if not torch.cuda.is_available():
            return device  # check_device explains
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"hmgstore tables live on 'cpu' or 'cuda' devices, not {device}")
    return device
