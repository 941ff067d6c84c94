"""The documents' commands work as written: README.md and every page under docs/.

- Each document's ```python blocks run, in order, in one namespace (on the CPU in CI), and each block runs alone
  or after the blocks of the same document that its first line says it continues
  (``# continues the block(s) of: <heading> (names it takes), ...``). Blocks marked ```py are illustrations
  (several GPUs, a producer process) and are not run.
- The commands the documents name exist: every ``python -m hmgstore.bench X``, ``python -m M`` module, ``make X``
  target and example script; the CPU ``torchrun`` commands run as written.
- Relative links resolve, from the README into docs/ and between docs pages (``make docs`` checks the pages'
  own links again in strict mode).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = {path: path.read_text() for path in DOCUMENTS}
ALL = "\n".join(TEXT.values())


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", TEXT[path], flags=re.S | re.M)


def sections_of_blocks(path: Path) -> list[str]:
    """The ``##``/``###`` heading each ```python block sits under ("the introduction" above the first)."""
    sections, heading = [], "the introduction"
    for line in re.findall(r"^#{2,3} .*$|^```python$", TEXT[path], flags=re.M):
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        else:
            sections.append(heading)
    return sections


def continued(path: Path, k: int) -> list[int]:
    """The blocks of the same document that block ``k`` continues, as its first comment lines name them (``#
    continues the blocks of: A (names it takes), B (...)``, a name being a heading or a heading's start), each
    with the blocks it continues in turn, in document order; none for a block that runs alone."""
    block, sections = python_blocks(path)[k], sections_of_blocks(path)
    comments = []
    for line in block.splitlines():  # the marker may wrap over the block's leading comment lines
        if not line.startswith("# "):
            break
        comments.append(line[2:])
    match = re.match(r"continues the blocks? of: (.*)", " ".join(comments))
    if match is None:
        return []
    names = [n.strip() for n in re.sub(r"\([^)]*\)", "", match.group(1)).split(",") if n.strip()]
    found = set()
    for wanted in names:
        hits = [j for j, section in enumerate(sections[:k]) if section.startswith(wanted)]
        assert hits, f"{name(path)} python block {k + 1} continues {wanted!r}: no block above sits under such a heading"
        for j in hits:
            found |= {j, *continued(path, j)}
    return sorted(found)


def run_blocks(path: Path, order: list[int], alone: int | None = None) -> None:
    pytest.importorskip("torch_geometric")
    pytest.importorskip("hmgstore.plugins.dgl")
    blocks = python_blocks(path)
    namespace: dict = {"__name__": "docs"}
    for j in order:
        try:
            exec(compile(blocks[j], f"{name(path)} python block {j + 1}", "exec"), namespace)
        except Exception as err:
            hint = " alone (mark the blocks it continues, or make it self-contained)" if j == alone else ""
            raise AssertionError(f"{name(path)} python block {j + 1} fails{hint}: {type(err).__name__}: {err}\n"
                                 f"{blocks[j]}") from err


WITH_BLOCKS = [path for path in DOCUMENTS if python_blocks(path)]
EACH_BLOCK = [(path, k) for path in WITH_BLOCKS for k in range(len(python_blocks(path)))]


def test_the_pages_have_runnable_blocks():
    assert (ROOT / "docs" / "index.md").exists()
    assert len(WITH_BLOCKS) >= 7 and len(EACH_BLOCK) >= 11


def test_blocks_are_python_or_marked_illustrations():
    """A ```python block runs in CI; ```py marks an illustration. A bare ``` fence would be neither."""
    for path, text in TEXT.items():
        in_fence = False
        for line in text.splitlines():
            fence = line.strip()
            if fence.startswith("```"):
                if not in_fence:
                    assert fence != "```", f"{name(path)}: a code block without a language (python runs, py does not)"
                in_fence = not in_fence


@pytest.mark.parametrize("path", WITH_BLOCKS, ids=name)
def test_python_blocks_run_in_order(path):
    run_blocks(path, list(range(len(python_blocks(path)))))


@pytest.mark.parametrize("path, k", EACH_BLOCK, ids=lambda v: name(v) if isinstance(v, Path) else f"block{v + 1}")
def test_each_block_runs_as_documented(path, k):
    """Each ```python block runs alone in a fresh namespace, or after the blocks of its document that its first
    line says it continues (a reader who jumps to one section copies one block)."""
    run_blocks(path, [*continued(path, k), k], alone=None if continued(path, k) else k)


# ---- what the documents name exists -------------------------------------------------------------------------
NAMED_BENCHMARKS = sorted(set(re.findall(r"python -m hmgstore\.bench (\w+)", ALL)))


def test_the_documents_name_every_benchmark():
    from hmgstore.bench.__main__ import BENCHMARKS

    assert set(NAMED_BENCHMARKS) == set(BENCHMARKS), "the documents and `python -m hmgstore.bench` list different ones"


@pytest.mark.parametrize("benchmark", NAMED_BENCHMARKS)
def test_named_benchmarks_exist(benchmark):
    done = subprocess.run([sys.executable, "-m", "hmgstore.bench", benchmark, "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr


@pytest.mark.parametrize("module", sorted(set(re.findall(r"python -m (hmgstore[\w.]*)", ALL))))
def test_named_modules_exist(module):
    """``python -m hmgstore.X`` in a document: the module is there (a module that moves leaves no stale command)."""
    assert importlib.util.find_spec(module) is not None, f"the documents name python -m {module}, which is not there"


def test_named_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for path, text in TEXT.items():
        for target in re.findall(r"`make ([a-z-]+)", text):
            assert re.search(rf"^{target}:", makefile, flags=re.M), (
                f"{name(path)} names make {target}; the Makefile has none")


def test_named_files_exist():
    named = set(re.findall(
        r"\b(examples/[\w/]+\.(?:py|ipynb)|tests/\w+\.py|benchmarks/[\w/.-]+\.(?:md|sh|py|json|log))", ALL))
    assert {"examples/pyg_graphsage.py", "examples/dgl_graphsage.py", "examples/multi_gpu_pyg.py",
            "examples/minimal_pyg.py", "examples/minimal_dgl.py", "benchmarks/NOTES.md"} <= named
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"the documents name files that are not there: {missing}"


def test_relative_links_resolve():
    for path, text in TEXT.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = target.split("#")[0]
            assert (path.parent / file).exists(), f"{name(path)} links to {target}, which is not there"


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in DOCUMENTS[1:]:
        page = str(path.relative_to(ROOT / "docs"))
        assert f" {page}" in nav or page.startswith("hooks/"), f"{page} is not in mkdocs.yml's nav"


def test_the_api_reference_names_public_names_only():
    """``::: X`` directives name what the package exports (hmgstore.X, hmgstore.plugins.pyg.X, ...), never an
    internal module path, which moves (issue 32)."""
    import hmgstore

    for path in (ROOT / "docs" / "api").glob("*.md"):
        for target in re.findall(r"^::: ([\w.]+)", TEXT[path], flags=re.M):
            module, _, attr = target.rpartition(".")
            if target in ("hmgstore", "hmgstore.distributed", "hmgstore.plugins.pyg", "hmgstore.plugins.dgl"):
                continue
            assert module in ("hmgstore", "hmgstore.distributed", "hmgstore.plugins.pyg", "hmgstore.plugins.dgl"), \
                f"{name(path)}: {target} is not reached through a public module"
            if module.startswith("hmgstore.plugins"):
                continue  # importing PyG or DGL here is the adapters' tests' business; names checked below
            assert attr in importlib.import_module(module).__all__, f"{name(path)}: {target} is not exported"
    assert hmgstore.HybridTensor


@pytest.mark.parametrize("plugin", ["pyg", "dgl"])
def test_the_api_reference_lists_each_plugins_public_names(plugin):
    module = pytest.importorskip(f"hmgstore.plugins.{plugin}")
    text = (ROOT / "docs" / "api" / f"{plugin}.md").read_text()
    listed = set(re.findall(rf"^::: hmgstore\.plugins\.{plugin}\.(\w+)", text, flags=re.M))
    assert listed == set(module.__all__)


def test_no_document_speaks_of_lent_machines():
    for path, text in TEXT.items():
        assert not re.search(r"\blent\b", text, flags=re.I), f"{name(path)} speaks of lent machines"


def test_the_cpu_torchrun_commands_run_as_written():
    """Every `torchrun --standalone --nproc-per-node 2 examples/...` the documents give for a machine without GPUs
    runs as written (GPUs hidden), here in CI too."""
    commands = sorted(set(re.findall(r"`(torchrun --standalone --nproc-per-node 2 examples/[^`]+)`", ALL)))
    assert commands, "the documents name no CPU form of a torchrun example"
    for command in commands:
        argv = shlex.split(command)
        env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
               "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": "0"}
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv[1:]], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{command}: still running after 600 s") from None
        assert proc.returncode == 0, f"{command} failed:\n{err[-3000:]}"
        assert "2 ranks (gloo)" in out, out


def test_every_environment_variable_read_is_in_the_set_up_table():
    """Each HMGSTORE_* variable the package reads has a row in docs/setup.md's table, and each row one read."""
    read = set()
    for folder in ("src", "plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"HMGSTORE_[A-Z_]+", path.read_text()))
    table = (ROOT / "docs" / "setup.md").read_text().partition("## Environment variables")[2]
    rows = set(re.findall(r"^\| `(HMGSTORE_[A-Z_]+)` \|", table, flags=re.M))
    assert read == rows, f"read, not in the table: {sorted(read - rows)}; in the table, not read: {sorted(rows - read)}"

