"""The strategy registry: one entry a strategy, with its guarantee and an implementation a backend.

An entry is a :class:`Strategy`: its name, what it guarantees and the output
dtypes it can round to. Its implementation on a backend comes from the
backend registry (:mod:`bitfold.backends.registry`: each backend lists one
function a strategy, and is refused when it lacks one). Every implementation
has one signature, ``(plan, values, spec, out_name, **options)`` (``init=``
where the backend's init rule takes it), and receives values the one
validator (:mod:`bitfold.validate`) has already accepted, so every strategy
refuses the same bad input with the same errors.

A new strategy is one entry here, its name in
:data:`bitfold.backends.registry.FOLDS`, and one function in each backend's
entry; a new backend touches nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backends.registry import FOLDS
from .errors import FoldTypeError, UnknownStrategyError
from .formats import OUT_DTYPES
from .validate import checked_options


@dataclass(frozen=True)
class Strategy:
    """A named way to compute the fold, what it guarantees, and the dtypes it rounds to."""

    name: str
    guarantee: str
    out_dtypes: tuple[str, ...]

    def check_out_dtype(self, out_name: str) -> str:
        """``out_name`` if this strategy can round to it, else a clear refusal."""
        if out_name not in self.out_dtypes:
            raise FoldTypeError(
                f"out_dtype {out_name} is available with the exact strategy only "
                f"(got {self.name!r}); use one of {', '.join(self.out_dtypes)}"
            )
        return out_name


_ROUNDED = ("float16", "float32", "float64")  # no bfloat16 arithmetic: only exact rounds to it

_REGISTRY: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "exact",
            "correctly rounded: same bits for every order, thread count, backend and "
            "floating-point mode (flush-to-zero, denormals-are-zero)",
            OUT_DTYPES,
        ),
        Strategy(
            "ordered",
            "same bits on every run of the same backend (a fixed, documented order) in the "
            "same floating-point mode: a float sum, it follows flush-to-zero",
            _ROUNDED,
        ),
        Strategy(
            "atomic",
            "none: the order of the additions is the backend's choice (a float sum, it "
            "follows flush-to-zero)",
            _ROUNDED,
        ),
    )
}


if set(_REGISTRY) != set(FOLDS):  # the backends implement exactly the registered strategies
    raise ImportError(f"strategies {sorted(_REGISTRY)} but backends implement {sorted(FOLDS)}")


@checked_options
def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name lists the valid ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownStrategyError(
            f"unknown strategy {name!r}; choose one of: {', '.join(strategies())}"
        ) from None


@checked_options
def strategies() -> tuple[str, ...]:
    """Names of the registered strategies, the default (``exact``) first."""
    return tuple(sorted(_REGISTRY, key=lambda n: (n != "exact", n)))


__all__ = ["Strategy", "get_strategy", "strategies"]
