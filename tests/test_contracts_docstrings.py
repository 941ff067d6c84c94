"""Every public entry point states its contract: what it accepts and what it raises, in its docstring.

The tests beside each module (tests/test_contracts_*.py) check the lines;
this one checks that no public function or class of the public modules goes
without them, so a new entry point cannot arrive without its contract.
"""
from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ["hmgstore", "hmgstore.graph", "hmgstore.distributed", "hmgstore.data", "hmgstore.plugins.pyg",
           "hmgstore.plugins.dgl", "hmgstore.rows.hotness", "hmgstore.cli.partition"]


def _public(module) -> list[tuple[str, object]]:
    """The module's public functions and classes: its ``__all__``, else what it defines itself (not imports)."""
    exported = getattr(module, "__all__", None)
    names = exported or [n for n in vars(module) if not n.startswith("_")]
    found = []
    for name in names:
        obj = getattr(module, name, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or issubclass_of_exception(obj):
            continue
        home = getattr(obj, "__module__", "")
        if home.startswith("hmgstore") and (exported or home == module.__name__):
            found.append((name, obj))
    return found


def issubclass_of_exception(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def _contract_text(obj) -> str:
    text = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and "__init__" in vars(obj):
        text += "\n" + (inspect.getdoc(obj.__init__) or "")
    return text


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_entry_point_says_what_it_raises(module_name):
    module = importlib.import_module(module_name)
    silent = [name for name, obj in _public(module) if "raise" not in _contract_text(obj).lower()]
    assert not silent, (f"{module_name}: {silent} state no contract; say in the docstring what is accepted and "
                        "which error each bad input raises (a 'Raises:' section), or that nothing is raised")


def test_the_check_sees_a_docstring_without_a_contract():
    def documented_but_silent(x):
        """Does something with x."""

    assert "raise" not in _contract_text(documented_but_silent).lower()
    assert _public(importlib.import_module("hmgstore"))  # the public names are found at all
