"""A command's readout and its ``--json`` output: ``--json -`` sends the JSON alone to stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def report(result: dict[str, Any], print_table: Callable[[dict[str, Any], TextIO], None],
           target: str | None) -> None:  # fmt: skip
    """Print ``result``'s table, and write it as JSON to ``target`` (a path, ``-`` or None).

    With ``target == "-"`` the JSON is the only thing on stdout and the table
    goes to stderr, so a script can read the JSON from a pipe.
    """
    print_table(result, sys.stderr if target == "-" else sys.stdout)
    if not target:
        return
    text = json.dumps(result, indent=2)
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text + "\n")
