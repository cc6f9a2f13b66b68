"""One process compiles a kernel, the others load it: a lock file per kernel and signature.

Numba compiles a ``cache=True`` kernel on its first call in a process and
saves it on disk; a process that starts while another is still compiling
finds nothing there and compiles the same kernel too (four ranks of a
``torchrun`` on a fresh install, four times the CPU). Each kernel module
calls :func:`one_compiler_at_a_time` on its ``globals()`` at its end: a
process missing a kernel in memory then takes a lock file beside the
kernel's disk cache before it looks there, so the second one waits and
loads what the first saved. Nothing changes a result: a kernel compiled or
loaded is the same machine code.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

from numba.core.compiler_lock import global_compiler_lock

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each process compiles for itself
    fcntl = None  # type: ignore[assignment]

#: How long a process waits for another one's compilation of the same kernel before it compiles
#: the kernel itself (a process that dies releases its lock at once).
WAIT_FOR_OTHER_S = 600.0
_held: set[str] = set()  # lock files this process holds (a recursive kernel asks again)


def _lock_path(dispatcher: Any, sig: Any) -> str | None:
    """The lock file of one kernel and signature, beside the kernel's disk cache (None: the
    kernel has no disk cache)."""
    index = getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None),
                    "_index_path", None)  # fmt: skip
    if index is None:
        return None
    digest = hashlib.sha1(str(sig).encode()).hexdigest()[:16]
    return f"{index}.{digest}.lock"


def _locked(path: str) -> int | None:
    """An open descriptor holding an exclusive lock on ``path`` (waiting for another process's
    at most :data:`WAIT_FOR_OTHER_S`); None where no lock can be had (no ``fcntl``, a read-only
    cache, the wait ran out)."""
    if fcntl is None:  # not POSIX: each process compiles for itself
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    deadline = time.monotonic() + WAIT_FOR_OTHER_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        except OSError:  # a file system without locks
            break
    os.close(fd)
    return None


def _serialised(dispatcher: Any, compile_: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def compile(sig: Any) -> Any:
        # Numba's own lock first, as its compile takes it: a thread never holds a file lock
        # while waiting for that one (which another thread, waiting for the file, could hold).
        with global_compiler_lock:
            path = _lock_path(dispatcher, sig)
            if path is None or path in _held:
                return compile_(sig)
            fd = _locked(path)
            if fd is None:
                return compile_(sig)
            _held.add(path)
            try:
                return compile_(sig)  # loads from the disk cache what another process saved
            finally:
                _held.discard(path)
                os.close(fd)  # releases the lock

    return compile


def one_compiler_at_a_time(namespace: dict[str, Any]) -> None:
    """Make each disk-cached Numba kernel defined in ``namespace`` (a kernel module's
    ``globals()``) compile in one process at a time, per signature.

    A process that finds no kernel in memory takes a lock file beside the kernel's disk cache
    before it looks there: when another process is compiling the same kernel for the same
    argument types, it waits, then loads what that process saved instead of compiling it too.
    The ranks of a job started together on a fresh install (and the workers of a test run)
    compile each kernel once between them instead of once each. Without a disk cache, or
    ``fcntl``, nothing changes. Numba's :class:`~numba.core.registry.CPUDispatcher` calls its
    ``compile`` method for every new signature (a call's, or a caller's being compiled), and
    that is what is wrapped.
    """
    from numba.core.registry import CPUDispatcher

    module = namespace.get("__name__")
    for value in list(namespace.values()):
        if isinstance(value, CPUDispatcher) and value.py_func.__module__ == module:
            value.compile = _serialised(value, value.compile)


__all__ = ["WAIT_FOR_OTHER_S", "one_compiler_at_a_time"]
