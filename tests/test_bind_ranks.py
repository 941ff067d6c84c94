"""benchmarks/bind_ranks.py, the wrapper that binds each torchrun rank to CPUs: its CPU lists and its refusals."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bind_ranks.py"


@pytest.fixture(scope="module")
def bind_ranks():
    spec = importlib.util.spec_from_file_location("bind_ranks", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_lists_read_as_the_kernel_writes_them(bind_ranks):
    assert bind_ranks.cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert bind_ranks.cpu_list("5") == [5]
    assert bind_ranks.cpu_list("") == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_split_gives_each_rank_its_own_cpus(bind_ranks):
    before = os.sched_getaffinity(0)
    allowed = sorted(before)
    try:
        seen = []
        for rank in range(2):
            os.sched_setaffinity(0, allowed)
            bind_ranks.bind("split", rank, 2)
            seen.append(os.sched_getaffinity(0))
        share = len(allowed) // 2
        assert seen == [set(allowed[:share]), set(allowed[share:2 * share])]
        os.sched_setaffinity(0, allowed)
        bind_ranks.bind("off", 0, 2)
        assert os.sched_getaffinity(0) == before
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.parametrize("env, says", [({"BIND": "sockets"}, "BIND='sockets'"), ({"GC": "later"}, "GC='later'")])
def test_unknown_settings_are_refused(env, says):
    run = subprocess.run([sys.executable, str(PATH), "--help"], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0 and says in run.stderr
