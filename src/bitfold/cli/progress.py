"""Progress bars on stderr: tqdm when it is installed and stderr is a terminal, else silence."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any


class _Bar:
    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def tick(self, n: int = 1) -> None:
        """Advance by ``n`` steps."""
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        """Show ``text`` beside the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool = True) -> Iterator[_Bar]:
    """A bar of ``total`` steps; off when disabled, when stderr is no terminal, or without tqdm."""
    show = enabled and sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None
    if not show:
        yield _Bar(None)
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, file=sys.stderr, leave=False, unit="step") as bar:
        yield _Bar(bar)
