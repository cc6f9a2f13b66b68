"""A quicker Triton interpreter for the suite: no second patching of ``triton.language``.

Under ``TRITON_INTERPRET=1`` a kernel's launch points ``triton.language``'s builtins at the
interpreter's versions (``_patch_lang``) for the launch, and restores them after. Triton
3.7 also does that patching again at *every call* of a ``@triton.jit`` helper from the
kernel (``InterpretedFunction.__call__``), with ``inspect.getmembers`` over four modules,
and never restores it: bitfold's kernels call their helpers once a value or more, and a
profile of ``tests/test_triton_backend.py``'s slowest case found 76,863 such calls, a third
of its time. :func:`quicker_interpreter` skips the patching of a helper called while a
launch of this thread already patched every language module the helper sees (the same
module objects, already pointing at the interpreter); any other call patches as before.
Nothing a kernel computes changes: the helper finds the same interpreted builtins.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

_launch = threading.local()  # .patched: ids of the language modules the running launch patched


def quicker_interpreter() -> None:
    """In this process, Triton's interpreter patches ``triton.language`` once a launch."""
    from triton import language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "once_a_launch", False):
        return
    patch_lang = interpreter._patch_lang
    launch = interpreter.GridExecutor.__call__

    def languages(fn: Any) -> set[int]:
        return {id(v) for v in fn.__globals__.values()
                if inspect.ismodule(v) and v in (tl, tl.core)}  # fmt: skip

    def _patch_lang(fn: Any) -> Any:
        patched = getattr(_launch, "patched", None)
        if patched is None:  # not inside a launch
            return patch_lang(fn)
        seen = languages(fn)
        if patched and seen <= patched:
            return interpreter._LangPatchScope()  # nothing to restore
        scope = patch_lang(fn)
        patched |= seen
        return scope

    def run_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_launch, "patched", None)
        _launch.patched = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launch.patched = outer

    _patch_lang.once_a_launch = True  # type: ignore[attr-defined]
    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = run_launch
