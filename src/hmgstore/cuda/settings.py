"""The library's settings read from the environment when their modules are imported (a producer process
inherits them): here, below every layer that reads one (:mod:`hmgstore.cuda.gather`, :mod:`hmgstore.cuda.peer`,
:mod:`hmgstore.graph.sampling_stream`)."""
from __future__ import annotations

import os
import warnings


def choice(variable: str, allowed: tuple[str, ...], default: str) -> str:
    """The value of the environment's ``variable``, one of ``allowed``; ``default`` where it is unset, and where it
    is none of them, with a warning naming the values it takes (a misspelt setting is not silently ignored)."""
    value = os.environ.get(variable, default)
    if value in allowed:
        return value
    warnings.warn(f"{variable}={value!r} is not one of {', '.join(map(repr, allowed))}: using {default!r}",
                  stacklevel=2)
    return default
