"""Exact products as sums of float64 terms: what a fold of products (a matrix product) folds.

A product of two floats is not a float, but it is an exact sum of a few
float64 terms, and the exact fold sums float64 terms exactly and rounds once.
:func:`product_terms` gives the terms of ``scale * a * b`` elementwise:

* float32, float16, bfloat16 factors: ``a * b`` is exact in float64 (at most
  48 significant bits, exponents far inside float64's range); a ``scale``
  that is not a power of two adds Dekker's two-product: 2 terms. Always
  exact.
* float64 factors: Dekker's two-product ``a * b = hi + lo`` (Veltkamp's
  split, no fused multiply-add: every step is a separate torch op, each
  rounded once), 2 terms; a ``scale`` that is not a power of two doubles
  them. Exact unless a product leaves float64's range: a magnitude from
  2^1023 up (``hi`` overflows) or below about 2^-969 (``lo`` needs bits below
  2^-1074 and is itself rounded).

Non-finite products keep their value in the first term (the others are 0),
so the fold's NaN and infinity rules apply to them. Every function here
takes and returns plain tensors and records no autograd.
"""

from __future__ import annotations

import math

import torch

#: Veltkamp's splitting constant for float64: 2^27 + 1
_SPLITTER = 134217729.0
#: above this magnitude ``a * _SPLITTER`` could overflow: such values are split scaled down
_SPLIT_LIMIT = 2.0**995
_SPLIT_SCALE = 2.0**-54

#: the factor dtypes whose products are exact in float64
_NARROW = (torch.float16, torch.bfloat16, torch.float32)


def is_power_of_two(x: float) -> bool:
    """True for ``±2^k`` (a scale that multiplies every float64 exactly, barring range)."""
    if x == 0 or not math.isfinite(x):
        return False
    return math.frexp(abs(x))[0] == 0.5


def split(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Veltkamp's split of float64 ``a``: ``a == hi + lo`` exactly, each of at most 26 bits.

    Finite values only (the callers mask the others); values above 2^995
    are split scaled down by 2^-54 (exact), so that nothing overflows.
    """
    big = a.abs() > _SPLIT_LIMIT
    scale = torch.where(big, _SPLIT_SCALE, 1.0).to(a.dtype)
    b = a * scale
    c = b * _SPLITTER
    hi = c - (c - b)
    lo = b - hi
    return hi / scale, lo / scale


def two_product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dekker's two-product of float64 tensors: ``a * b == hi + lo`` exactly (module docstring).

    ``hi`` is the rounded product; ``lo`` its rounding error (0 where ``hi``
    is not finite). Broadcasts like ``a * b``.
    """
    hi = a * b
    a_hi, a_lo = split(torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0))
    b_hi, b_lo = split(torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0))
    lo = ((a_hi * b_hi - hi) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    lo = torch.where(torch.isfinite(hi), lo, 0.0)
    return hi, lo


def scale_terms(terms: list[torch.Tensor], scale: float) -> list[torch.Tensor]:
    """Float64 terms whose exact sum is ``scale`` times that of ``terms`` (module docstring)."""
    if scale == 1:
        return terms
    if scale == 0 or is_power_of_two(scale) or not math.isfinite(scale):
        return [t * scale for t in terms]
    factor = torch.tensor(scale, dtype=torch.float64, device=terms[0].device)
    out: list[torch.Tensor] = []
    for t in terms:
        out.extend(two_product(t, factor))
    return out


def product_terms(a: torch.Tensor, b: torch.Tensor, scale: float = 1.0) -> list[torch.Tensor]:
    """Float64 terms whose exact sum is ``scale * a * b`` elementwise (broadcasting).

    ``a`` and ``b`` have one floating dtype; ``scale`` is a Python float
    already rounded to it (as torch's kernels take ``alpha``). See the module
    docstring for when the terms are exact.
    """
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    if a.dtype in _NARROW and b.dtype in _NARROW:
        return scale_terms([a64 * b64], scale)
    return scale_terms(list(two_product(a64, b64)), scale)


def as_dtype(x: float, dtype: torch.dtype) -> float:
    """The Python float ``x`` rounded to ``dtype``, as torch's kernels read a scalar argument."""
    return float(torch.tensor(float(x), dtype=torch.float64).to(dtype).item())


__all__ = ["as_dtype", "is_power_of_two", "product_terms", "scale_terms", "split", "two_product"]
