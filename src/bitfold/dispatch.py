"""The one dispatch: validate once, pick the backend from where the values live, call its impl.

Every way into a fold — ``plan(values)``, ``plan.expand(v)``, the
accumulator, the PyTorch and JAX adapters — comes through here, so every
library and device gets the same checks, the same errors and the same
numeric contract.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import family_of
from .backends import cuda, host, portable
from .errors import DeviceError, FoldError, FoldTypeError
from .formats import LimbFormat, resolve_out_dtype
from .strategies import get_strategy
from .validate import Values, check_expand_input, check_init, check_values

if TYPE_CHECKING:
    from .plan import Fold

#: The backends, asked in order which one serves a device.
BACKENDS: tuple[ModuleType, ...] = (host, cuda)


#: Array families the numba-cuda kernels read (JAX arrays on a GPU are not among them).
CUDA_FAMILIES = ("torch", "cupy", "numba", "cuda-interface")


@functools.cache
def numba_cuda_loads() -> bool:
    """True when numba-cuda imports and finds a device (or its simulator)."""
    try:
        from numba import cuda as numba_cuda

        return bool(numba_cuda.is_available())
    except Exception:  # no numba-cuda, no driver: the portable path serves CUDA values
        return False


def backend_for(values: Any, backend: str | None = None) -> ModuleType:
    """The backend module that serves ``values``: by family and device, or the one named.

    Host values take the host path; CUDA values the numba-cuda kernels when
    numba-cuda loads (and reads their family), else the portable path; values
    on any other device (MPS, XPU, ROCm, TPU, JAX on a GPU) the portable path.
    ``backend`` (``"host"``, ``"cuda"`` or ``"portable"``) forces one.
    """
    family = family_of(values)
    device = family.device(values)
    if backend is not None:
        chosen = {b.NAME: b for b in (*BACKENDS, portable)}.get(backend)
        if chosen is None:
            raise FoldError(
                f"unknown backend {backend!r}; choose one of: host, cuda, {portable.NAME}"
            )
        return chosen
    if host.serves(device):
        return host
    if device == "cuda" and family.name in CUDA_FAMILIES and numba_cuda_loads():
        return cuda
    if portable.serves_family(family.name, device):
        return portable
    raise DeviceError(
        f"values live on device {device!r} ({type(values).__module__}."
        f"{type(values).__qualname__}); bitfold folds host arrays, CUDA arrays "
        "(CuPy, torch CUDA, numba, __cuda_array_interface__) and torch, CuPy and JAX arrays on "
        "any device: move them with .cpu() or to a device their library runs on"
    )


def _as_array(values: Any) -> Any:
    return values if hasattr(values, "dtype") else np.asarray(values)


def validate(
    plan: Fold,
    values: Any,
    *,
    start: int | None = None,
    trailing: tuple[int, ...] | None = None,
) -> Values:
    """What the one validator says of ``values`` for ``plan`` (or a refusal)."""
    family = family_of(values)
    return check_values(
        plan.shape, family.shape(values), values.dtype, start=start, trailing=trailing
    )


def fold(
    plan: Fold,
    values: Any,
    strategy: str = "exact",
    *,
    out_dtype: Any = None,
    init: Any = None,
    backend: str | None = None,
    **options: Any,
) -> Any:
    """Fold ``values`` into ``plan.K`` sums with ``strategy``, in the values' library and device.

    ``values`` have the index's shape (or ``(N,)``) followed by a trailing
    shape, ``()`` for a scalar fold; the result has shape ``(K,) + trailing``.
    ``out_dtype`` defaults to float32 (float64 for float64 values), or to
    ``init``'s dtype. ``init`` (shape ``(K,) + trailing``, same library and
    device) is an existing array the values are added into: each bucket's
    result is the correctly rounded sum of ``init[k]`` and its values (with
    ``exact``), what ``out = init.clone().index_add_(0, index, values)``
    computes with one rounding. ``options`` tune one backend's kernels (e.g.
    ``launch=`` on CUDA, ``route=`` on the host for ``exact``) and never
    change an ``exact`` or ``ordered`` result. ``backend`` (``"host"``,
    ``"cuda"``, ``"portable"``) forces a backend (:func:`backend_for`).
    """
    strat = get_strategy(strategy)
    values = _as_array(values)
    spec = validate(plan, values)
    chosen = backend_for(values, backend)
    if init is not None:
        init = _as_array(init)
        init_name = check_init(plan.K, spec, family_of(init).shape(init), init.dtype)
        if family_of(init).device(init) != family_of(values).device(values):
            raise DeviceError(
                f"init lives on {family_of(init).device(init)!r} and the values on "
                f"{family_of(values).device(values)!r}: pass both on one device"
            )
        out_dtype = init_name if out_dtype is None else out_dtype
        options["init"] = init
    out_name = strat.check_out_dtype(resolve_out_dtype(spec.dtype, out_dtype))
    if chosen is portable:
        impl = getattr(portable, f"fold_{strat.name}")
    else:
        impl = strat.impl(chosen.NAME)
    return impl(plan, values, spec, out_name, **options)


def add_to_state(
    plan: Fold,
    state: np.ndarray,
    fmt: LimbFormat,
    values: Any,
    *,
    start: int | None = None,
    trailing: tuple[int, ...] = (),
    **options: Any,
) -> Values:
    """Add ``values`` exactly into the host ``state`` of ``plan`` in limb format ``fmt``."""
    values = _as_array(values)
    spec = validate(plan, values, start=start, trailing=trailing)
    if spec.dtype not in fmt.value_dtypes:
        raise FoldTypeError(
            f"this accumulator sums {', '.join(fmt.value_dtypes)} values; got {spec.dtype}"
        )
    backend = backend_for(values, options.pop("backend", None))
    backend.add_to_state(state, plan, values, spec, fmt, **options)
    return spec


def expand(plan: Fold, v: Any, backend: str | None = None) -> Any:
    """``v[plan.index]``: ``v`` of shape ``(K,) + trailing`` gives ``index.shape + trailing``."""
    v = _as_array(v)
    trailing = check_expand_input(plan.K, family_of(v).shape(v))
    return backend_for(v, backend).expand(plan, v, trailing)


__all__ = [
    "BACKENDS",
    "add_to_state",
    "backend_for",
    "expand",
    "fold",
    "numba_cuda_loads",
    "validate",
]
