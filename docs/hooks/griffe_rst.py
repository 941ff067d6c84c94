"""griffe extension: the docstrings' reST habits, read as Markdown by the API reference.

The docstrings are Google style (``Args:``, ``Returns:``) with two reST habits: roles (:class:`HybridTensor`,
:func:`hmgstore.load`, :mod:`.node`) and a paragraph ending ``::`` before an indented example. Roles become
code spans (not links: many name internal modules that the reference does not list), and ``::`` becomes ``:``
(the indented example is then a Markdown code block as it is).
"""
from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const|ref):`~?([^`]+)`")
LITERAL = re.compile(r"(\S)::(\s*\n)")


def markdown_of(text: str) -> str:
    return LITERAL.sub(r"\1:\2", ROLE.sub(r"`\1`", text))


class RestToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
