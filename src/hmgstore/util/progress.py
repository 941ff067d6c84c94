"""The progress bar of long set-up work: tqdm's notebook bar where it can draw one, its text bar elsewhere.

``tqdm.auto`` picks the notebook bar inside Jupyter and warns ("IProgress not
found") when ipywidgets is missing; the text bar then works as well, so it is
taken without the warning.
"""
from __future__ import annotations

try:
    import ipywidgets  # noqa: F401  (only whether it imports matters)
except ImportError:
    from tqdm.std import tqdm
else:
    from tqdm.auto import tqdm

__all__ = ["tqdm"]
