"""The product's text speaks of the product: no work log leaks into the code, the docs or the examples.

How a figure or a design was found belongs in git (commit messages) and in the result files under
``benchmarks/results/``; the code says why in a line or two, the docs give current facts with their
commands. This test keeps two markers of a work log out of the text a user reads: a "session" and a
reference to a numbered issue ("issue 29"). It reads every text file of the folders below, as
``grep -rniE "\\bsession\\b|issue [0-9]+" src plugins kernels examples docs`` would, plus the two READMEs.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src", "plugins", "kernels", "examples", "docs")
FILES = ("README.md", "benchmarks/results/README.md")
HISTORY = re.compile(r"\bsession\b|issue [0-9]+", re.IGNORECASE)
SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints"}


def _text_files() -> list[Path]:
    found = [ROOT / f for f in FILES]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and not SKIPPED_PARTS & set(path.parts):
                found.append(path)
    return found


def _hits(path: Path) -> list[str]:
    data = path.read_bytes()
    if b"\0" in data:  # a binary file (an image): no prose in it
        return []
    text = data.decode("utf-8", errors="replace")
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
            for n, line in enumerate(text.splitlines(), 1) if HISTORY.search(line)]


def test_the_pattern_finds_what_grep_finds():
    """The test itself can fail: each marker is caught, in any case, and look-alikes are not."""
    for line in ("the eighth session found", "Session 3", "see issue 29", "Issue 31's soak", "ISSUE 2"):
        assert HISTORY.search(line), line
    for line in ("sessions of training", "an issue with ids", "issue_time 12"):
        assert not HISTORY.search(line), line


def test_the_scanned_tree_is_there():
    files = _text_files()
    assert all(f.is_file() for f in files)
    assert {"src", "plugins", "kernels", "examples", "docs"} <= {f.relative_to(ROOT).parts[0] for f in files}
    assert any(f.suffix == ".cu" for f in files) and any(f.suffix == ".py" for f in files)


@pytest.mark.parametrize("folder", [*FOLDERS, "READMEs"])
def test_no_work_log_in_the_product_text(folder):
    files = [ROOT / f for f in FILES] if folder == "READMEs" else [
        f for f in _text_files() if f.relative_to(ROOT).parts[0] == folder]
    hits = [hit for path in files for hit in _hits(path)]
    assert not hits, ("say why, not when or in which session; history belongs in git and benchmarks/results/:\n"
                      + "\n".join(hits))
