"""The one dispatch: validate once, pick the backend from where the values live, call its impl.

Every way into a fold — ``plan(values)``, ``plan.expand(v)``, the
accumulator, the PyTorch and JAX adapters — comes through here, so every
library and device gets the same checks, the same errors and the same
numeric contract.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import family_of
from .backends import cuda, host
from .errors import DeviceError, FoldTypeError
from .formats import LimbFormat, resolve_out_dtype
from .strategies import get_strategy
from .validate import Values, check_expand_input, check_init, check_values

if TYPE_CHECKING:
    from .plan import Fold

#: The backends, asked in order which one serves a device.
BACKENDS: tuple[ModuleType, ...] = (host, cuda)


def backend_for(values: Any) -> ModuleType:
    """The backend module that serves ``values``, by the device they live on."""
    family = family_of(values)
    device = family.device(values)
    for backend in BACKENDS:
        if backend.serves(device):
            return backend
    raise DeviceError(
        f"values live on device {device!r} ({type(values).__module__}."
        f"{type(values).__qualname__}); bitfold folds host arrays and CUDA arrays "
        "(CuPy, torch CUDA, numba, __cuda_array_interface__): move them with .cpu() or to a "
        "CUDA device"
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
    change an ``exact`` or ``ordered`` result.
    """
    strat = get_strategy(strategy)
    values = _as_array(values)
    spec = validate(plan, values)
    backend = backend_for(values)
    if init is not None:
        init = _as_array(init)
        init_name = check_init(plan.K, spec, family_of(init).shape(init), init.dtype)
        if backend_for(init) is not backend:
            raise DeviceError(
                f"init lives on {family_of(init).device(init)!r} and the values on "
                f"{family_of(values).device(values)!r}: pass both on one device"
            )
        out_dtype = init_name if out_dtype is None else out_dtype
        options["init"] = init
    out_name = strat.check_out_dtype(resolve_out_dtype(spec.dtype, out_dtype))
    return strat.impl(backend.NAME)(plan, values, spec, out_name, **options)


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
    backend_for(values).add_to_state(state, plan, values, spec, fmt, **options)
    return spec


def expand(plan: Fold, v: Any) -> Any:
    """``v[plan.index]``: ``v`` of shape ``(K,) + trailing`` gives ``index.shape + trailing``."""
    v = _as_array(v)
    trailing = check_expand_input(plan.K, family_of(v).shape(v))
    return backend_for(v).expand(plan, v, trailing)


__all__ = ["BACKENDS", "add_to_state", "backend_for", "expand", "fold", "validate"]
