"""The one dispatch: validate once, pick the backend from the registry, call its implementation.

Every way into a fold — ``plan(values)``, ``plan.expand(v)``, the
accumulator, the PyTorch and JAX adapters — comes through here, so every
library and device gets the same checks, the same errors and the same
numeric contract. The backend is the first registered one serving the
values' array family on their device (:mod:`bitfold.backends.registry`);
its options are checked per operation against what its entry declares, and
``init`` against its :class:`~bitfold.backends.registry.InitRule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import family_of
from .backends import registry, selftest
from .backends.registry import Backend, check_options
from .errors import DeviceError, FoldError, FoldTypeError, UnknownOptionError
from .formats import VALUE_DTYPES, LimbFormat, default_out_dtype, dtype_name, resolve_out_dtype
from .plan_view import PlanView
from .strategies import get_strategy
from .validate import Values, check_expand_input, check_has_data, check_init, check_values

#: The keywords of a plan call (``plan(values, ...)``) besides the backend's options.
FOLD_KEYWORDS = ("strategy", "out_dtype", "init", "backend")
#: The keywords of ``plan.route(values, ...)`` besides the backend's options.
ROUTE_KEYWORDS = ("strategy", "backend")


def backend_for(
    values: Any,
    what: str = "values",
    backend: str | None = None,
    *,
    plan: PlanView | None = None,
    dtype: str | None = None,
    out_name: str | None = None,
) -> Backend:
    """The registered backend that serves ``values``, by their array family and device.

    Backends are asked by priority (:mod:`bitfold.backends`): host values take
    the host backend; torch GPU tensors (CUDA, ROCm, XPU) and CuPy arrays the
    Triton kernels when Triton loads; other CUDA arrays the numba-cuda kernels
    when numba-cuda loads; anything else (MPS, TPU, JAX on a GPU, a GPU without
    either) the portable path. ``backend`` (a name of
    :func:`bitfold.backend_names`) forces one, refused unless it serves them.
    Values on a device without data (torch's ``meta``) are refused by name.

    With ``plan`` (the values, of ``dtype``, are to be folded by it into ``out_name``;
    defaults: the values' dtype and its default output dtype), a GPU kernel family must
    also pass its
    known-answer test on the values' device (:mod:`bitfold.backends.selftest`,
    run once per process, device and dtype pair): one that fails is passed over
    for the next backend (a :class:`bitfold.errors.SelfTestWarning`, once), or
    raises :class:`bitfold.errors.SelfTestError` when forced by name or with
    ``BITFOLD_SELFTEST=strict``.
    """
    check_has_data(values, what)
    family = family_of(values)
    admits = None
    if plan is not None:
        name = dtype or dtype_name(values)
        out = out_name or (default_out_dtype(name) if name in VALUE_DTYPES else name)
        plan_type = type(plan)  # the cases' plans are made by the caller's plan class

        def admits(chosen: Backend, forced: bool) -> bool:
            return selftest.admits(chosen, values, name, out, plan_type, forced)

    return registry.backend_for(family.name, family.device(values), what, backend, admits)


def _as_array(values: Any) -> Any:
    return values if hasattr(values, "dtype") else np.asarray(values)


def _wanted_out(dtype: str, asked: Any) -> str:
    """The output dtype a fold of ``dtype`` values asks for (``out_dtype``, or ``init``'s
    dtype); the default where that is no output dtype (refused later, by name)."""
    try:
        return resolve_out_dtype(dtype, None if asked is None else dtype_name(asked))
    except FoldError:
        return resolve_out_dtype(dtype)


def validate(
    plan: PlanView,
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


def _check_init(plan: PlanView, backend: Backend, strategy: str, spec: Values, init: Any) -> str:
    """``init``'s dtype name, refused unless ``backend``'s init rule takes it for ``strategy``."""
    init_name = check_init(plan.K, spec, family_of(init).shape(init), init.dtype)
    if backend_for(init, "init", backend.name) is not backend:
        raise DeviceError(
            f"init lives on {family_of(init).device(init)!r} and the values on the "
            f"{backend.name} backend: pass both on one device"
        )
    rule = backend.init
    if strategy not in rule.strategies:
        raise FoldError(
            f"the {backend.name} backend's {strategy} fold adds into zeros only; init= is "
            f"taken by {', '.join(rule.strategies)} there — use 'exact' with init"
        )
    if not rule.mixed_dtypes and init_name != spec.dtype:
        raise FoldTypeError(
            f"on the {backend.name} backend, init must have the values' dtype ({spec.dtype}); "
            f"got {init_name}"
        )
    return init_name


def fold(
    plan: PlanView,
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
    computes with one rounding; which strategies take it, and in which
    dtypes, is the backend's init rule (the host: every strategy, any float
    dtype; CUDA: ``exact``, the values' dtype). ``options`` tune one
    backend's kernels (``route=``, ``kernel=``, ``carry_every=`` on the host;
    ``exact_path=``, ``launch=`` on CUDA) and never change an ``exact`` or
    ``ordered`` result; one the backend does not take for ``strategy`` is a
    :class:`bitfold.FoldError` listing the valid ones. ``backend`` forces a
    backend by name (``"portable"`` runs anywhere, the CPU included).
    """
    strat = get_strategy(strategy)
    values = _as_array(values)
    spec = validate(plan, values)
    wanted = _wanted_out(spec.dtype, init if out_dtype is None else out_dtype)
    chosen = backend_for(values, backend=backend, plan=plan, dtype=spec.dtype, out_name=wanted)
    check_options(chosen, strat.name, options, FOLD_KEYWORDS, "plan(values)")
    if init is not None:
        init = _as_array(init)
        init_name = _check_init(plan, chosen, strat.name, spec, init)
        out_dtype = init_name if out_dtype is None else out_dtype
        options["init"] = init
    out_name = strat.check_out_dtype(resolve_out_dtype(spec.dtype, out_dtype))
    return chosen.fold(strat.name)(plan, values, spec, out_name, **options)


@dataclass(frozen=True)
class Addition:
    """Values on their way into an accumulator: validated, with the backend that adds them.

    ``options`` are the accumulator's options this backend takes for ``add_to_state``.
    """

    values: Any
    spec: Values
    backend: Backend
    options: dict[str, Any]


def addition(
    plan: PlanView,
    fmt: LimbFormat,
    values: Any,
    *,
    start: int | None = None,
    trailing: tuple[int, ...] = (),
    backend: str | None = None,
    **options: Any,
) -> Addition:
    """Validate ``values`` for an accumulator of ``plan`` in limb format ``fmt``; their backend.

    ``options`` are those of the accumulator, which may hold values of
    several backends: each option must be one some backend takes for
    ``add_to_state`` (else a :class:`bitfold.FoldError` listing them), and the
    backend of ``values`` receives the ones it takes.
    """
    values = _as_array(values)
    spec = validate(plan, values, start=start, trailing=trailing)
    if spec.dtype not in fmt.value_dtypes:
        raise FoldTypeError(
            f"this accumulator sums {', '.join(fmt.value_dtypes)} values; got {spec.dtype}"
        )
    chosen = backend_for(values, backend=backend, plan=plan, dtype=spec.dtype,
                         out_name=fmt.default_out)
    check_accumulator_options(options)
    mine = {k: v for k, v in options.items() if k in chosen.options.get("add_to_state", ())}
    return Addition(values, spec, chosen, mine)


def check_accumulator_options(options: dict[str, Any]) -> None:
    """Refuse an accumulator option no registered backend takes, listing the valid ones.

    ``backend=`` (a registered name) is always valid: it forces the backend of every add.
    """
    valid = (*registry.known_options("add_to_state"), "backend")
    bad = sorted(set(options) - set(valid))
    if bad:
        raise UnknownOptionError(
            f"the accumulator takes no option {', '.join(f'{o}=' for o in bad)}; valid "
            f"options: {', '.join(f'{o}=' for o in valid)} (each backend uses its own: "
            + "; ".join(f"{b.name}: {', '.join(b.options.get('add_to_state', ())) or 'none'}"
                        for b in registry.backends())
            + ")"
        )


def expand(plan: PlanView, v: Any, backend: str | None = None) -> Any:
    """``v[plan.index]``: ``v`` of shape ``(K,) + trailing`` gives ``index.shape + trailing``."""
    v = _as_array(v)
    trailing = check_expand_input(plan.K, family_of(v).shape(v))
    return backend_for(v, backend=backend).expand(plan, v, trailing)


@dataclass(frozen=True)
class Route:
    """Which backend, and which of its paths, would serve a fold, and why."""

    backend: str
    route: str
    reason: str


def route(
    plan: PlanView, values: Any, strategy: str = "exact", backend: str | None = None, **options: Any
) -> Route:
    """The backend and route ``fold(plan, values, strategy, **options)`` would take, with why.

    Validates like :func:`fold`; folds nothing. A backend without a choice of
    routes for ``strategy`` reports the strategy's name as its route.
    """
    strat = get_strategy(strategy)
    values = _as_array(values)
    spec = validate(plan, values)
    chosen = backend_for(values, backend=backend, plan=plan, dtype=spec.dtype)
    check_options(chosen, strat.name, options, ROUTE_KEYWORDS, "plan.route(values)")
    if chosen.explain is None or strat.name != "exact":
        return Route(chosen.name, strat.name, f"the {chosen.name} backend's {strat.name} fold")
    name, reason = chosen.explain(plan, values, spec, **options)
    return Route(chosen.name, name, reason)


__all__ = [
    "Addition",
    "Route",
    "addition",
    "backend_for",
    "check_accumulator_options",
    "expand",
    "fold",
    "route",
    "validate",
]
