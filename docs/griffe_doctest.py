"""A Griffe extension for the API reference: docstring examples (``>>>``) as code blocks.

bitfold's docstrings hold doctest examples in plain text; Markdown would read
their ``>>>`` as nested quotes and their ``**`` as bold. Each run of example
lines (a ``>>>`` line, its ``...`` continuations and its printed output, up to
a blank line) becomes a fenced ``pycon`` block before mkdocstrings renders it.
"""

from __future__ import annotations

from typing import Any

import griffe


def fenced(text: str) -> str:
    """``text`` with every run of doctest lines inside a ```` ```pycon ```` fence."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        stripped = line.lstrip()
        if not inside and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            inside = True
        elif inside and not stripped:
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fence the doctest examples of every docstring Griffe loads."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fenced(obj.docstring.value)
