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
and processes that share a cache compile each kernel once between them
(:mod:`bitfold.kernels.compile_lock`).
"""

from __future__ import annotations

import sys
import threading
from contextvars import ContextVar, Token

import numpy as np
from numba.core import event

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

__all__ = ["MODULES", "announce", "first_use", "message", "quietly"]
