"""The tree a maintainer can change: layers import only layers below them, no import circles, small modules.

Every import counts, a function's own ``from .x import y`` included: one made
inside a function still ties the two modules together. The layers, lowest
first (a module may import its own layer and those below it):
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"hmgstore": ROOT / "src" / "hmgstore", "hmgstore.plugins": ROOT / "plugins"}

#: Lowest first, one entry per folder of src/hmgstore (and plugins/): ``ls src/hmgstore`` shows these layers.
#: A module belongs to the entry that names its folder; inside a folder, modules may import each other
#: (no circles: test_no_import_circles).
LAYERS = [
    ["hmgstore.cuda"],                                # the CUDA layer: kernels, launches, the only CuPy import
    ["hmgstore.memory", "hmgstore.util"],             # host memory hmgstore owns; device, timing, progress, CPU load
    ["hmgstore.rows"],                                # a table's rows: ids checked, formats, hotness, placement, stats
    ["hmgstore.gather"],                              # one gather: its plan and launch, the CPU's share, fused batches
    ["hmgstore.table"],                               # the tables: HybridTensor, from files, sharded, host-page reach
    ["hmgstore.graph"],                               # topology in tiers, sampling
    # batches made ahead: in a thread (Pipeline) or a process (Producer)
    ["hmgstore.prefetch"],
    ["hmgstore.distributed"],                         # several processes and machines
    ["hmgstore.data"],                                # synthetic and OGB graphs
    ["hmgstore"],                                     # the package's own public names
    ["hmgstore.plugins"],                             # PyG and DGL adapters
    ["hmgstore.bench", "hmgstore.cli"],               # commands: python -m hmgstore.bench, hmgstore.cli.partition
]
#: "About 400 lines": past this a module usually holds two ideas (CONTRIBUTING.md).
MAX_LINES = 420


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _resolve(name: str, level: int, module: str, is_package: bool) -> str:
    if level == 0:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _known(name: str) -> str | None:
    """The module of ours that ``name`` imports (the longest prefix that is one), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Our modules that ``module`` imports anywhere in it (a package importing its own children aside)."""
    path = MODULES[module]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(node.module, node.level, module, path.name == "__init__.py")
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            known = _known(name)
            if known and known != module and not known.startswith(module + "."):
                found.add(known)
    return found


def layer(module: str) -> int:
    best = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            inside = module == name or (module.startswith(name + ".") and name != "hmgstore")  # the root: itself only
            if inside and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    assert best is not None, f"{module} is in no layer: add it to LAYERS in tests/test_layers.py"
    return best[0]


def test_every_module_found():
    assert "hmgstore.table.tensor" in MODULES and "hmgstore.plugins.pyg.sampler" in MODULES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_its_layer_and_below(module):
    mine = layer(module)
    upward = sorted(m for m in imports(module) if layer(m) > mine and not module.startswith(m + "."))
    assert not upward, f"{module} (layer {mine}) imports {upward}, from layers above it"


def test_no_import_circles():
    graph = {m: {t for t in imports(m) if not m.startswith(t + ".")} for m in MODULES}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                circle = stack[stack.index(t):] + [t]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_fits_in_one_sitting(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): " \
                               "it probably holds two ideas; split it"


def test_layers_are_the_folders():
    """LAYERS names every folder of the package, and nothing else: the layers are what ``ls`` shows."""
    folders = {"hmgstore." + p.name for p in PACKAGES["hmgstore"].iterdir() if (p / "__init__.py").is_file()}
    folders |= {"hmgstore", "hmgstore.plugins"}
    named = {name for names in LAYERS for name in names}
    assert named == folders, f"LAYERS and the folders differ: only in LAYERS {sorted(named - folders)}, " \
                             f"only folders {sorted(folders - named)}"
    loose = sorted(p.name for p in PACKAGES["hmgstore"].glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside any layer folder in src/hmgstore: {loose}"


def test_the_checks_can_fail():
    """The import scan sees function-level imports and upward ones (a check that cannot fail proves nothing)."""
    assert "hmgstore.cuda.runtime" in imports("hmgstore.memory.owned")  # a function-level import
    assert layer("hmgstore.table.tensor") > layer("hmgstore.rows.placement") > layer("hmgstore.cuda.gather")
    assert layer("hmgstore.graph.sampler") > layer("hmgstore.table.tensor")


#: At most this many lines a function, its docstring included: one screen, one idea.
MAX_FUNCTION_LINES = 80


def long_functions(path: Path) -> dict[str, int]:
    """``{qualified name: lines}`` of the functions and methods in ``path`` longer than MAX_FUNCTION_LINES."""
    found = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                length = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > MAX_FUNCTION_LINES:
                    found[name] = length
                visit(child, name + ".")

    visit(ast.parse(path.read_text()), "")
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_functions_fit_in_one_screen(module):
    over = {f"{module}.{name}": n for name, n in long_functions(MODULES[module]).items()}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}; split them into steps with names"


def test_the_function_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"class C:\n    def f(self):\n{body.replace('    x', '        x')}\n\ndef g():\n    pass\n")
    assert long_functions(path) == {"C.f": MAX_FUNCTION_LINES + 1}


#: Words that tell the history of the work rather than what the product does; git and the results index keep it.
HISTORY = re.compile(r"session|issue [0-9]+", re.IGNORECASE)


def test_the_product_speaks_of_the_product():
    """No "session" or "issue N" in the code, the kernels or the examples (their story is in git)."""
    found = []
    for root in ("src", "plugins", "kernels", "examples"):
        for path in sorted((ROOT / root).rglob("*")):
            if path.suffix in (".py", ".cu", ".cuh", ".md", ".ipynb") and path.is_file():
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    if HISTORY.search(line):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "history in the product:\n" + "\n".join(found)
