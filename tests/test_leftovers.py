"""What the commands of the README and docs/ leave behind lies in folders git ignores (``bench-out/``, ``dataset/``).

A newcomer who runs the documented commands in the checkout must not find new
files in ``git status``: every path such a command writes, and every
folder it tells the reader to put data in, is ignored. (The notebook's and
the benchmarks' temporary files are checked in test_notebook.py.)
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def written_by_readme() -> list[str]:
    """Paths, relative to the checkout, that README commands write or that it tells the reader to fill."""
    return [*re.findall(r"python -m hmgstore\.cli\.partition (\S+)", README),  # the partition command's folder
            *re.findall(r"--(?:json|out) ([^\s`]+)", README),  # result files and folders of examples and benchmarks
            *(f"{folder.rstrip('/')}/" for folder in re.findall(r"under `\./([^`]+)`", README))]  # data folders


def test_what_readme_commands_leave_is_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a checkout")
    paths = written_by_readme()
    assert any("hmgstore.cli.partition" in line for line in README.splitlines()) and paths
    assert any(p.startswith("bench-out/parts") for p in paths), paths  # the partition command's folder was found
    for path in paths:
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0
        assert ignored, f"a README command leaves {path!r} in the checkout, and git does not ignore it: write it " \
                        "under bench-out/ (ignored)"
