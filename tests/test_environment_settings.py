"""Settings read from the environment (hmgstore.cuda.settings.choice): a value none of those a setting takes
warns, naming them, and the default holds; every HMGSTORE_* setting with a fixed set of values reads through it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hmgstore.cuda.settings import choice


def test_choice_takes_allowed_values_and_warns_on_others(monkeypatch):
    monkeypatch.delenv("HMGSTORE_TEST_SETTING", raising=False)
    assert choice("HMGSTORE_TEST_SETTING", ("all", "remote"), "all") == "all"
    monkeypatch.setenv("HMGSTORE_TEST_SETTING", "remote")
    assert choice("HMGSTORE_TEST_SETTING", ("all", "remote"), "all") == "remote"
    monkeypatch.setenv("HMGSTORE_TEST_SETTING", "Remote")
    with pytest.warns(UserWarning, match=r"HMGSTORE_TEST_SETTING='Remote' is not one of 'all', 'remote': using 'all'"):
        assert choice("HMGSTORE_TEST_SETTING", ("all", "remote"), "all") == "all"


def test_the_librarys_settings_warn_on_a_misspelt_value():
    """Each module reads its setting when imported: misspelt, each warns and keeps its default."""
    env = {"HMGSTORE_CAPPED_ROWS": "remot", "HMGSTORE_WHOLE_SMS": "yes", "HMGSTORE_SAMPLER_STREAM": "on",
           "HMGSTORE_PEER_MEMORY": "nvlink", "PYTHONWARNINGS": "always"}
    code = ("import hmgstore.cuda.gather as g, hmgstore.graph.sampling_stream as s, hmgstore.cuda.peer as p; "
            "print(g.CAPPED_ROWS, g.EXCLUSIVE, s.OWN_STREAM, p.SHARE_WITH)")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["all", "False", "False", "vmm"]
    for variable, value in env.items():
        if variable.startswith("HMGSTORE_"):
            assert f"{variable}={value!r} is not one of" in res.stderr
