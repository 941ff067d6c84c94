"""mkdocs hook: the package as griffe should see it, for the API reference (docs/api/).

The package installs from three folders (pyproject's ``package-dir``): ``src/hmgstore`` as ``hmgstore``,
``plugins`` as ``hmgstore.plugins`` and ``kernels`` as ``hmgstore.kernels``. griffe reads packages from their
source files, one folder per package, so it would not find ``hmgstore.plugins``. Before each build this hook
makes ``build/docs-package/hmgstore``: a link to every entry of ``src/hmgstore``, plus ``plugins`` linked to the
top-level folder; ``mkdocs.yml`` points mkdocstrings there (``paths``). Nothing is imported: the reference is
read from the sources, so it builds without torch, PyG or DGL.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "docs-package"


def package_tree(root: Path = ROOT, tree: Path = TREE) -> Path:
    """Make ``tree/hmgstore`` afresh (links only) and return ``tree``."""
    package = tree / "hmgstore"
    if tree.exists():
        shutil.rmtree(tree)
    package.mkdir(parents=True)
    for entry in sorted((root / "src" / "hmgstore").iterdir()):
        if entry.name != "__pycache__":
            os.symlink(entry, package / entry.name)
    os.symlink(root / "plugins", package / "plugins")
    return tree


@event_priority(100)  # before mkdocstrings reads the package
def on_config(config, **kwargs):
    package_tree()
    return config
