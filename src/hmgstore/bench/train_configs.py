"""``bench train``'s configuration names: a base (``stock``, ``all_gpu``, ``host``, ``cache``), a mode
(``+pipe``: hmgstore.Pipeline; ``+proc``: hmgstore.Producer), a cap (``@4``, ``@none``) and variants
(``/split1.0``, ``/topo1.0``, ``/overlapon``, ``/streamon``, ``/capwhole``, ``/rowsremote``, ``/run2``), each list
expanded from the command line's options; what the training side of a producer-only run keeps of the graph; the
loader kept between configurations; the sampler stream and the gathers' settings a configuration runs under."""
from __future__ import annotations

import contextlib
import gc
import os
from typing import Any

import torch

from ..graph import sampling_stream
from ..util.environ import environ


def _resident_gb() -> float | None:
    """This process's resident memory now, in GB (None where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _hollow(data):
    """``data`` without its features' and edges' storage (an empty ``x`` of the same width and dtype): what the
    training side of a ``+proc`` configuration reads (the model's sizes), for when every configuration left
    builds its own graph in a producer process. A papers-shaped graph's 57 GB of features would else be held
    twice."""
    from torch_geometric.data import Data

    return Data(x=torch.empty((0, *data.x.shape[1:]), dtype=data.x.dtype), y=data.y[:0].clone(),
                num_nodes=data.num_nodes)


def _mode(config: str) -> str:
    """``pipe``, ``proc`` or ``""`` of a configuration's name (``cache+proc@4/topo1.0/run2``: ``proc``)."""
    return config.partition("/")[0].partition("@")[0].partition("+")[2]


def base_of(config: str) -> str:
    return config.partition("+")[0].partition("@")[0].partition("/")[0]


def _with_variants(configs: list, key: str, values: list) -> list:
    """Each cache configuration once per value (``name/split1.0``, ``name/topo1.0``) when several are given."""
    if len(values) < 2:
        return configs
    return [f"{c}/{key}{v or 0}" if base_of(c) == "cache" else c for c in configs for v in
            (values if base_of(c) == "cache" else [None])]


def variant(config: str, key: str, default, kind=float):
    """The value a ``/keyV`` suffix of ``config`` names (``cache+pipe/topo1.0/split1.0``), as ``kind``, else
    ``default``."""
    for part in config.split("/")[1:]:
        if part.startswith(key):
            return kind(part[len(key):])
    return default


def _repeated(configs: list, times: int) -> list:
    """The list ``times`` over, interleaved (drift in the machine then touches every configuration alike)."""
    return [c if k == 1 else f"{c}/run{k}" for k in range(1, times + 1) for c in configs]


def _with_caps(configs: list, caps: list) -> list:
    """Each pipelined configuration once per cap (``name@cap``) when several caps are given."""
    if len(caps) < 2:
        return configs
    out = []
    for config in configs:
        if "+" in config and base_of(config) != "api":  # api+pipe: the Pipeline's own default
            out += [f"{config}@{'none' if cap is None else cap}" for cap in caps]
        else:
            out.append(config)
    return out


def _cap_modes(given: list) -> list[str]:
    """``--cap-mode``'s values, or the library's mode (:data:`hmgstore.cuda.gather.EXCLUSIVE`) where none is given."""
    from ..cuda import gather

    return given if any(given) else ["whole" if gather.EXCLUSIVE else "spread"]


def _capped_rows() -> str:
    """The library's :data:`hmgstore.cuda.gather.CAPPED_ROWS` (the report's where no value is given)."""
    from ..cuda import gather

    return gather.CAPPED_ROWS


def _whole_sm_launch(device) -> dict | None:
    """Whether capped gathers can hold whole SMs on ``device``: the shared memory a block asks for, per kernel
    build (None: that build spreads its blocks), or None without a GPU."""
    if device.type != "cuda":
        return None
    from ..cuda import gather as gather_kernel

    return {f"{kind} rows": gather_kernel.exclusive_smem(device.index, narrow)
            for kind, narrow in (("plain", False), ("narrow", True))}


class Kept:
    """The last configuration's loader, kept for the next one where that differs only in what the pipeline or the
    features' split sets (a cap, a split's share or threads): a papers-shaped cache takes minutes to build.
    Closed when a configuration needs another loader, and at the end."""

    def __init__(self):
        self.key: tuple | None = None
        self.built: Any = None
        self.config: str | None = None

    def get(self, key: tuple, config: str, make) -> tuple[Any, str | None]:
        """``(Built, the configuration that built it)``, built by ``make()`` unless the kept one has ``key``."""
        self.keep_only(key)
        if self.built is None:
            self.key, self.built, self.config = key, make(), config
        return self.built, self.config

    def keep_only(self, key: tuple | None) -> None:
        """Close the kept loader unless it has ``key`` (None: close it whatever its key)."""
        if self.built is not None and (key is None or key != self.key):
            self.close()

    def close(self) -> None:
        if self.built is not None:
            for obj in (self.built.stores[0] if self.built.stores else None, self.built.sampler):
                if obj is not None:
                    obj.close()
            self.key = self.built = self.config = None
        gc.collect()  # PyG's loader holds a bound method of itself: its stores and tables go in a collection
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the closed tiers' blocks, for a producer process started next


@contextlib.contextmanager
def _setting_as(module, name: str, value, variable: str, text: str):
    """``module``'s setting ``name`` at ``value`` in the block and its environment variable at ``text`` (a producer
    started in the block reads it when imported); both as before afterwards."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        with environ({variable: text}):
            yield
    finally:
        setattr(module, name, before)


def sampler_stream_as(value: str | None):
    """Samplers built in the block run their batches on a stream of their own (``"on"``) or not (``"off"``):
    :data:`hmgstore.graph.sampling_stream.OWN_STREAM`, read when a sampler is built, a producer's alike. ``None``:
    as they are."""
    on = value == "on"
    return contextlib.nullcontext() if value is None else \
        _setting_as(sampling_stream, "OWN_STREAM", on, "HMGSTORE_SAMPLER_STREAM", "1" if on else "0")


def capped_rows_as(value: str | None):
    """Gathers launched in the block cap the rows ``value`` says (:data:`hmgstore.cuda.gather.CAPPED_ROWS`, read at
    each launch), a producer started in it alike. ``None``: as they are."""
    from ..cuda import gather

    return contextlib.nullcontext() if value is None else \
        _setting_as(gather, "CAPPED_ROWS", value, "HMGSTORE_CAPPED_ROWS", value)


def cap_mode_as(value: str | None):
    """Capped gathers launched in the block hold whole SMs (``"whole"``, :data:`hmgstore.cuda.gather.EXCLUSIVE`)
    or spread blocks (``"spread"``), a producer started in it alike. ``None``: as they are."""
    from ..cuda import gather

    return contextlib.nullcontext() if value is None else \
        _setting_as(gather, "EXCLUSIVE", value == "whole", "HMGSTORE_WHOLE_SMS", "1" if value == "whole" else "0")
