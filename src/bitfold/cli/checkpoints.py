"""Checkpoints of ``bitfold train``'s data-parallel runs: written atomically, read safely, checked.

A checkpoint is one file, ``DIR/checkpoint.pt``, written by :func:`save`
with ``torch.save`` into a temporary file in ``DIR``, flushed to disk, then
renamed over the old one with ``os.replace`` (atomic on POSIX and Windows):
a run killed while saving leaves the previous checkpoint whole, and a later
save removes the temporary file it left behind.

The file holds plain containers of tensors, numbers and strings only (no
pickled objects), so :func:`load` reads it with ``weights_only=True``.
:func:`check_config` refuses to continue a run whose configuration differs
from the checkpoint's, naming each difference.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from ..errors import FoldError
from ..repro.checkpoint import load_torch_file

#: The checkpoint's file name inside DIR.
FILE = "checkpoint.pt"
#: The format tag written into, and required of, every checkpoint.
FORMAT = "bitfold-train-checkpoint/1"
_TEMP_PREFIX = f".{FILE}."
_TEMP_SUFFIX = ".tmp"


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    """The checkpoint file of ``directory`` (a path to the file itself is taken as it is)."""
    d = Path(directory)
    return d if d.is_file() else d / FILE


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable where the platform allows it (not on Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(torch: Any, directory: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` (and the format tag) to ``DIR/checkpoint.pt`` atomically; return the path."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{_TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{_TEMP_SUFFIX}"
        f = open(tmp, "xb")  # closed below; the umask applies (mkstemp would make it 0600)
    except OSError as err:
        raise FoldError(
            f"--save {str(directory)!r}: cannot write a checkpoint there ({err.strerror})"
        ) from None
    final = d / FILE
    try:
        with f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(d)
    for stale in d.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}"):  # left by a run killed mid-save
        with contextlib.suppress(OSError):
            stale.unlink()
    return final


def load(torch: Any, directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the checkpoint of ``directory`` (``weights_only``); refuse anything else clearly.

    The file is read by :func:`bitfold.repro.checkpoint.load_torch_file`, the one
    reader that decides, for every command, what is damaged or truncated (it imports
    torch itself; ``torch`` is taken for symmetry with :func:`save`).
    """
    path = checkpoint_path(directory)
    if not path.exists():
        raise FoldError(
            f"--resume {str(directory)!r}: no checkpoint there (expected {str(path)!r}, written "
            "by bitfold train --save)"
        )
    try:
        state = load_torch_file(path)
    except FoldError as err:
        raise FoldError(f"--resume: {err}") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise FoldError(
            f"--resume: {str(path)!r} is not a bitfold train checkpoint (format "
            f"{state.get('format') if isinstance(state, dict) else None!r}, expected {FORMAT!r})"
        )
    return state


def check_config(saved: dict[str, Any], current: dict[str, Any], where: str) -> None:
    """Refuse to resume when any setting that defines the run differs from the checkpoint's."""
    keys = sorted(set(saved) | set(current))
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, this run {current.get(k)!r}"
             for k in keys if saved.get(k) != current.get(k)]  # fmt: skip
    if diffs:
        raise FoldError(
            f"--resume {where!r}: the checkpoint was written by a different configuration ("
            + "; ".join(diffs)
            + "); resume with the options it was saved with (only --steps, --world-size, "
            "--timeout, --save and --save-every may change)"
        )


def resume_state(torch: Any, where: str, config: dict[str, Any], steps: int) -> dict[str, Any]:
    """The checkpoint of ``where``, checked: same configuration, not past ``steps``."""
    state = load(torch, where)
    if not isinstance(state.get("config"), dict) or not isinstance(state.get("step"), int):
        raise FoldError(
            f"--resume {where!r}: not a whole bitfold train checkpoint (its 'config' or 'step' "
            "is missing); resume from a checkpoint written by bitfold train --save"
        )
    check_config(state["config"], config, where)
    if int(state["step"]) > steps:
        raise FoldError(
            f"--resume {where!r}: the checkpoint is at step {state['step']}, past --steps {steps}; "
            "--steps counts every step of the run, resumed or not"
        )
    return state
