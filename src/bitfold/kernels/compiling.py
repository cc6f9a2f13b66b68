"""First use: one line on stderr while the Numba kernels compile, and about how long it takes.

The CPU kernels are compiled on their first call and cached on disk
(``cache=True``: next to the sources, or, where the package's directory is
not writable, in Numba's user cache directory, ``$XDG_CACHE_HOME/numba`` or
``~/.cache/numba``; ``NUMBA_CACHE_DIR`` overrides both). A first fold may
take tens of seconds, so the first compilation of a bitfold kernel in a
process prints one line, once for each thing compiled, e.g. ``bitfold:
compiling the exact fold kernels for float32 rows, buckets route (first
use, about 25 s; cached afterwards)``.

Numba signals a compilation only when neither memory nor the disk cache has
the kernel (its ``numba:compile`` event, fired after the cache was looked
up), so a process that finds the cache warm prints nothing. What is being
compiled is named by the caller's :func:`first_use` (the exact routes name
themselves); a compilation outside one is named after its kernel module
(:data:`MODULES`; the numba-cuda kernels, compiled for a GPU, say nothing).

Fewer compilations: :func:`read_only` passes the inputs a kernel only reads as
read-only arrays whatever the caller's flag, so that each dtype compiles once;
and :func:`one_compiler_at_a_time` makes processes that share a cache (the
ranks of a ``torchrun``, test workers) compile a kernel once between them: the
first compiles, the others wait for it and load what it saved.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any

import numpy as np
from numba.core import event
from numba.core.compiler_lock import global_compiler_lock

#: What a compilation outside :func:`first_use` is called, by kernel module, with about the
#: seconds of CPU its first use took on a 2-core VM with an empty cache (building a plan: 0.7;
#: an accumulator's add and result: 4.9; a DenseSum's add and result: 21.8).
MODULES: dict[str, tuple[str, int]] = {
    "planning": ("plan-building kernels", 1),
    "cpu": ("CPU kernels for accumulators, ordered folds and gathers", 5),
    "buckets": ("exact fold kernels", 25),
    "stream": ("exact fold kernels", 5),
    "dense": ("exact dense-sum kernels", 20),
}
_PACKAGE = __name__.rpartition(".")[0] + "."  # "bitfold.kernels."

_current: ContextVar[tuple[str, int] | None] = ContextVar("bitfold_first_use", default=None)
_said: set[str] = set()
_lock = threading.Lock()


class first_use:  # lower case: read as a function, ``with first_use(what, seconds):``
    """Within: a compilation of a bitfold kernel is announced as ``what`` (about ``seconds``).

    The outermost :func:`first_use` names it (a route that builds part of its
    plan says one line, not two). A class, not a generator: it wraps every
    exact fold, and costs well under a microsecond.
    """

    __slots__ = ("_named", "_token")

    def __init__(self, what: str, seconds: int) -> None:
        self._named = (what, seconds)
        self._token: Token[tuple[str, int] | None] | None = None

    def __enter__(self) -> None:
        if _current.get() is None:
            self._token = _current.set(self._named)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None


def read_only(arr: np.ndarray) -> np.ndarray:
    """A read-only view of ``arr`` (``arr`` itself is left as it is; a read-only array is
    returned as it is).

    Numba compiles a kernel once for each type of its arguments, and a read-only array is a type
    apart from a writable one: the inputs a kernel only reads are passed read-only, whatever the
    caller's flag, so that each dtype compiles once (the same machine code either way).
    """
    if not arr.flags.writeable:
        return arr
    view = arr.view()
    view.flags.writeable = False
    return view


def quietly() -> first_use:
    """Within: a compilation says nothing (a kernel that compiles in a fraction of a second)."""
    return first_use("", 0)


def message(what: str, seconds: int) -> str:
    """The line :func:`announce` prints."""
    return f"bitfold: compiling the {what} (first use, about {seconds} s; cached afterwards)"


def announce(module: str) -> bool:
    """Print the line for a compilation of a kernel of ``module`` (``bitfold.kernels.<name>``),
    unless this process said it already; True when printed."""
    named = _current.get()
    what, seconds = named if named is not None else MODULES.get(module.rpartition(".")[2], ("", 0))
    if not what:  # quietly(), or not a CPU kernel module (the numba-cuda kernels are for a GPU)
        return False
    with _lock:
        if what in _said:
            return False
        _said.add(what)
    print(message(what, seconds), file=sys.stderr, flush=True)
    return True


class _Listener(event.Listener):
    """Numba's ``numba:compile`` event (a cache miss, before compiling): announce ours."""

    def on_start(self, ev: event.Event) -> None:
        func = getattr(ev.data.get("dispatcher"), "py_func", None)
        module = getattr(func, "__module__", None) or ""
        if module.startswith(_PACKAGE):
            announce(module)

    def on_end(self, ev: event.Event) -> None:
        pass


event.register("numba:compile", _Listener())


# -- one process compiles, the others load ---------------------------------------------------------
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
    try:
        import fcntl
    except ImportError:  # not POSIX: each process compiles for itself
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

    compile.bitfold_serialised = True  # type: ignore[attr-defined]
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
        if not isinstance(value, CPUDispatcher) or value.py_func.__module__ != module:
            continue
        if getattr(value.compile, "bitfold_serialised", False):
            continue
        value.compile = _serialised(value, value.compile)


__all__ = ["MODULES", "announce", "first_use", "message", "one_compiler_at_a_time", "quietly"]
