"""benchmarks/results/ is an index, not a pile: every result file is listed in its README, every file named exists.

The README's tables give each file (or a family, written with ``{a,b}`` or ``*``) the command that wrote it,
the device, the date and the claim it supports; the docs and the top-level README cite result files by path
(``benchmarks/results/x.md``) or, beside such a path, by name alone (``reach-h200.md``). A run superseded by a
later one is removed from the folder (git keeps it), and its citations with it.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
#: A path the documents cite: under benchmarks/ or examples/, or a result file's bare name (it names its device).
CITED = re.compile(r"`((?:benchmarks|examples)/[^`\s]+"
                   r"|[\w.{},*-]+-(?:h100|h200|cpu)[\w.{},*-]*\.(?:json|jsonl|md|log|png|txt))`")


def expand(pattern: str) -> list[str]:
    """``a-{x,y}.json`` -> ``[a-x.json, a-y.json]`` (one level of braces, any number of them)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [e for part in m.group(1).split(",") for e in expand(pattern[:m.start()] + part + pattern[m.end():])]


def matches(base: Path, pattern: str) -> list[Path]:
    return [p for name in expand(pattern) for p in (sorted(base.glob(name)) if "*" in name else [base / name])
            if p.exists()]


def indexed_patterns() -> list[str]:
    """The first cell of every table row of the index: its backticked file names."""
    rows = [line for line in INDEX.read_text().splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def result_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p != INDEX)


def test_expand_and_match():
    assert expand("a-{x,y}.{json,md}") == ["a-x.json", "a-x.md", "a-y.json", "a-y.md"]
    assert matches(RESULTS, "README.{md,nothing}") == [INDEX]
    assert matches(RESULTS, "no-such-*.json") == []


def test_every_result_file_is_indexed():
    patterns = indexed_patterns()
    assert len(patterns) > 30
    covered = {p for pattern in patterns for p in matches(RESULTS, pattern)}
    missing = [str(p.relative_to(RESULTS)) for p in result_files() if p not in covered]
    assert not missing, f"benchmarks/results/README.md does not list: {missing}"


def test_every_indexed_name_is_there():
    for pattern in indexed_patterns():
        for name in expand(pattern):
            assert matches(RESULTS, name), f"the index lists {name}, which is not in benchmarks/results/"


def test_every_index_row_gives_command_device_date_and_claim():
    rows = [line for line in INDEX.read_text().splitlines() if line.startswith("| `")]
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) == 5 and all(cells), row
        assert re.search(r"20\d\d-\d\d-\d\d", cells[3]), f"no date: {row}"


def _documents() -> list[Path]:
    return [ROOT / "README.md", INDEX, *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_file_the_documents_cite_exists():
    missing = []
    for doc in _documents():
        for cited in CITED.findall(doc.read_text()):
            base = ROOT if cited.startswith(("benchmarks/", "examples/")) else RESULTS
            if not all(matches(base, name) for name in expand(cited)):
                missing.append(f"{doc.relative_to(ROOT)}: {cited}")
    assert not missing, "cited but not there:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_citation():
    """The citation pattern catches both forms, so a removed run's citation cannot slip through."""
    text = "see `benchmarks/results/gone-h100.json` and `gone-h200.md`, and `benchmarks/NOTES.md`"
    assert CITED.findall(text) == ["benchmarks/results/gone-h100.json", "gone-h200.md", "benchmarks/NOTES.md"]
    assert not matches(ROOT, "benchmarks/results/gone-h100.json") and not matches(RESULTS, "gone-h200.md")


def test_the_performance_page_is_short_and_every_section_names_its_command_and_file():
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(page.splitlines()) <= 150
    sections = page.split("\n## ")[1:]
    assert len(sections) >= 4 and sections[0].startswith("What to set")
    for section in sections[1:]:
        title = section.splitlines()[0]
        assert re.search(r"`(?:python|torchrun) [^`]+`", section), f"{title}: no command"
        files = [f for f in CITED.findall(section) if not f.startswith(("benchmarks/", "examples/"))]
        assert files and all(matches(RESULTS, f) for f in files), f"{title}: no result file, or a missing one"
