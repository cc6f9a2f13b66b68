"""Load numba-cuda's typing registries under NumPy releases newer than it knows.

numba-cuda 0.30 registers an overload of ``np.row_stack`` when its CUDA target
first compiles a kernel (``numba.cuda.np.arrayobj``, imported while the
typing context loads its registries). NumPy 2.5 removed ``np.row_stack``, so
with that NumPy every numba-cuda compile fails with ``AttributeError: module
'numpy' has no attribute 'row_stack'`` — bitfold's GPU kernels included
(first seen on an H200 on 2026-12-04). Numba's CPU target already guards the
same registration.

:func:`load_registries` imports that module once with a stand-in
``np.row_stack`` in place and removes it again: NumPy is left as it was, and
the overload is registered against the stand-in, a function nothing calls.
Where NumPy still has ``row_stack`` (or under the simulator, which compiles
nothing) it does nothing. No arithmetic is involved.
"""

from __future__ import annotations

import importlib
import os
from functools import cache

import numpy as np

#: The numba-cuda module that registers ``np.row_stack`` (older releases use Numba's own, guarded).
_ARRAY_OVERLOADS = "numba.cuda.np.arrayobj"
#: The NumPy function it registers that NumPy 2.5 no longer has.
_REMOVED = "row_stack"


def _removed_row_stack(*arrays: object, **kwargs: object) -> object:
    """Stand-in for NumPy's removed ``row_stack`` (``vstack``), present only while registering."""
    return np.vstack(*arrays, **kwargs)


@cache
def load_registries() -> None:
    """Import numba-cuda's typing registries with ``np.row_stack`` present (once a process)."""
    if hasattr(np, _REMOVED) or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return
    setattr(np, _REMOVED, _removed_row_stack)
    try:
        importlib.import_module(_ARRAY_OVERLOADS)
    except ModuleNotFoundError:
        pass  # a numba-cuda without its own array overloads: nothing registers row_stack
    finally:
        delattr(np, _REMOVED)
