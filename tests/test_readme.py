"""The README's commands work as written: its ```python blocks run, in order, in one namespace (on the CPU
in CI), and each alone or after the blocks its first line says it continues; the commands it names exist.
Blocks the README marks ```py are illustrations (several GPUs)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_the_readme_has_runnable_blocks():
    assert len(python_blocks()) >= 4


def test_python_blocks_run_in_order():
    pytest.importorskip("torch_geometric")
    pytest.importorskip("hmgstore.plugins.dgl")
    namespace: dict = {"__name__": "readme"}
    for k, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README.md python block {k + 1}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"README python block {k + 1} fails: {type(err).__name__}: {err}\n{block}") from err


def sections_of_blocks() -> list[str]:
    """The ``## `` heading each ```python block sits under ("the introduction" above the first)."""
    sections, heading = [], "the introduction"
    for line in re.findall(r"^## .*$|^```python$", README, flags=re.M):
        if line.startswith("## "):
            heading = line[3:]
        else:
            sections.append(heading)
    return sections


def continued(k: int) -> list[int]:
    """The blocks block ``k`` continues, as its first line documents them (``# continues the block(s) of: A
    (names it takes), B (...)``, a name being a section heading or a heading's start), each with the blocks
    it continues in turn, in README order; none for a block that runs alone."""
    block, sections = python_blocks()[k], sections_of_blocks()
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
    for name in names:
        hits = [j for j, section in enumerate(sections[:k]) if section.startswith(name)]
        assert hits, f"README python block {k + 1} continues {name!r}: no block above sits under such a heading"
        for j in hits:
            found |= {j, *continued(j)}
    return sorted(found)


@pytest.mark.parametrize("k", range(len(python_blocks())), ids=lambda k: f"block{k + 1}")
def test_each_block_runs_as_documented(k):
    """Each ```python block runs alone in a fresh namespace, or after the blocks its first line says it continues
    (a reader who jumps to the PyG or DGL section copies one block)."""
    pytest.importorskip("torch_geometric")
    pytest.importorskip("hmgstore.plugins.dgl")
    blocks = python_blocks()
    namespace: dict = {"__name__": "readme"}
    for j in [*continued(k), k]:
        try:
            exec(compile(blocks[j], f"README.md python block {j + 1}", "exec"), namespace)
        except Exception as err:
            alone = "" if j != k or continued(k) else " alone (mark the blocks it continues, or make it self-contained)"
            raise AssertionError(f"README python block {j + 1} fails{alone}: {type(err).__name__}: {err}\n"
                                 f"{blocks[j]}") from err


NAMED_BENCHMARKS = sorted(set(re.findall(r"python -m hmgstore\.bench (\w+)", README)))


def test_the_readme_names_every_benchmark():
    from hmgstore.bench.__main__ import BENCHMARKS

    assert set(NAMED_BENCHMARKS) == set(BENCHMARKS), "the README and `python -m hmgstore.bench` list different ones"


@pytest.mark.parametrize("benchmark", NAMED_BENCHMARKS)
def test_named_benchmarks_exist(benchmark):
    assert "hmgstore.bench" in README
    done = subprocess.run([sys.executable, "-m", "hmgstore.bench", benchmark, "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr


def test_named_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"`make ([a-z-]+)", README):
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"README names make {target}, the Makefile has none"


def test_named_files_exist():
    for path in ("examples/pyg_graphsage.py", "examples/dgl_graphsage.py", "examples/multi_gpu_pyg.py",
                 "benchmarks/NOTES.md", "benchmarks/run_gpu.sh", "kernels/gather_job.cuh"):
        assert path in README or path.endswith(".cuh") or path.endswith(".sh"), path
        assert (ROOT / path).exists(), path


def test_the_cpu_torchrun_commands_run_as_written(tmp_path):
    """Every `torchrun --standalone --nproc-per-node 2 examples/...` the README gives for a machine without GPUs
    runs as written (GPUs hidden), here in CI too."""
    import os
    import shlex
    import signal

    commands = sorted(set(re.findall(r"`(torchrun --standalone --nproc-per-node 2 examples/[^`]+)`", README)))
    assert commands, "the README names no CPU form of a torchrun example"
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
            raise AssertionError(f"{command}: still running after 600 s")
        assert proc.returncode == 0, f"{command} failed:\n{err[-3000:]}"
        assert "2 ranks (gloo)" in out, out

