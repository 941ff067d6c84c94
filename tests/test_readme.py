"""The README is a hub: what hmgstore is, set-up, the PyG and DGL swaps, the headline figures, and links.

Its ```python blocks, named commands and links are checked with the docs pages' in tests/test_docs.py (the
README is one of the documents there). Here: what only the README must do.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_hub_of_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_the_readme_keeps_the_swaps_runnable():
    blocks = re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)
    assert len(blocks) >= 3
    assert any("hmgstore.plugins.pyg" in b and "NeighborLoader" in b for b in blocks)
    assert any("hmgstore.plugins.dgl" in b and "attach(" in b for b in blocks)


def test_the_readme_states_the_test_command_and_its_fresh_clone_time():
    """CI (.ci/run) runs the README's test command; the README says what a fresh clone's run takes."""
    assert re.search(r"^make test\b", README, flags=re.M), "the set-up block names make test"
    assert re.search(r"`make test` \d+ min( \d+ s)? \(", README), "the fresh clone's make test timing line"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_the_readme_links_every_docs_page():
    """Every page of docs/ is one link away: from the README or from docs/index.md, which the README links."""
    index = (ROOT / "docs" / "index.md").read_text()
    assert "](docs/index.md)" in README
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"](docs/{page.name})" in README or f"]({page.name})" in index, f"docs/{page.name} is not linked"
    assert "](docs/api/index.md)" in README


def test_the_readme_has_a_short_performance_table():
    section = README.split("## Performance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert 3 <= len(rows) <= 10
