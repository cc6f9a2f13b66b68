"""Every fact about float formats and dtype names, in one table.

Three tables, read by every layer (validation, backends, kernels, adapters):

* :data:`FLOATS` — the IEEE binary formats bitfold folds: exponent and
  fraction widths, and from them the bias, the exponent of the smallest
  subnormal and of the largest finite binade, the bit-pattern dtype and the
  canonical NaN that every NaN result is written as;
* :data:`LIMBS` — the integer *limb formats* that hold exact sums: how many
  32-bit limbs a bucket has, what limb 0 weighs, which value dtypes they
  serve and how many values may be added between carry normalisations;
* the dtype names: :func:`dtype_name` turns a NumPy, PyTorch, CuPy or JAX
  dtype (or an array) into one canonical name, and
  :func:`resolve_out_dtype` applies the output-dtype rule (float64 values
  give float64 sums, every other value dtype float32, unless asked).

Nothing here imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import FoldTypeError


@dataclass(frozen=True)
class FloatFormat:
    """An IEEE-754 binary format: ``±M·2^e`` with ``exponent_bits`` and ``fraction_bits``."""

    name: str
    exponent_bits: int
    fraction_bits: int
    canonical_nan: int  # the bit pattern every NaN result takes (a positive quiet NaN)

    @property
    def precision(self) -> int:
        """Significant bits, the hidden bit included (24 for float32)."""
        return self.fraction_bits + 1

    @property
    def bias(self) -> int:
        """The exponent bias (127 for float32)."""
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def subnormal_exp(self) -> int:
        """Exponent of the smallest subnormal, ``2^subnormal_exp`` (-149 for float32)."""
        return 1 - self.bias - self.fraction_bits

    @property
    def max_exp(self) -> int:
        """Exponent of the largest finite binade (127 for float32)."""
        return self.bias

    @property
    def width(self) -> int:
        """Bits of one value."""
        return 1 + self.exponent_bits + self.fraction_bits

    @property
    def bits_dtype(self) -> np.dtype:
        """The unsigned integer dtype of a value's bit pattern."""
        return np.dtype(f"uint{self.width}")

    @property
    def signed_bits_dtype(self) -> np.dtype:
        """The signed integer dtype of the same width (what the rounding kernels write)."""
        return np.dtype(f"int{self.width}")


#: The float formats bitfold folds, by canonical dtype name.
FLOATS: dict[str, FloatFormat] = {
    "float16": FloatFormat("float16", 5, 10, 0x7E00),
    "bfloat16": FloatFormat("bfloat16", 8, 7, 0x7FC0),
    "float32": FloatFormat("float32", 8, 23, 0x7FC00000),
    "float64": FloatFormat("float64", 11, 52, 0x7FF8000000000000),
}

#: Canonical NaN bit pattern of each output dtype (a positive quiet NaN).
CANONICAL_NAN_BITS: dict[str, int] = {name: f.canonical_nan for name, f in FLOATS.items()}

#: dtype names accepted as fold values.
VALUE_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")
#: dtype names a fold can round to.
OUT_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32", "float64")


@dataclass(frozen=True)
class LimbFormat:
    """How exact sums of one family of value dtypes are held in integer limbs.

    A bucket holds ``limbs`` int64 limbs; limb ``j`` weighs
    ``2^(32 j + unit_exp)``. A value ``±M·2^(p + unit_exp)`` (integer ``M``,
    shift ``p >= 0``) adds ``±M << (p mod 32)``, cut into 32-bit pieces, to limbs
    ``p // 32`` and up. After the limbs come five counters: ``n_terms``,
    ``n_not_negzero``, ``n_nan``, ``n_posinf``, ``n_neginf``.
    """

    name: str
    limbs: int
    unit_exp: int
    value_dtypes: tuple[str, ...]
    carry_every: int  # values one private copy may add between carry normalisations

    @property
    def width(self) -> int:
        """Columns of a state row: the limbs and the five counters."""
        return self.limbs + 5

    @property
    def default_out(self) -> str:
        """The output dtype of sums in this format when none is asked for."""
        return "float64" if self is F64 else "float32"


F32 = LimbFormat("f32", 10, -149, ("float16", "bfloat16", "float32"), 1 << 30)
F64 = LimbFormat("f64", 67, -1074, ("float64",), 1 << 29)
#: The limb formats by name.
LIMBS: dict[str, LimbFormat] = {"f32": F32, "f64": F64}

#: Counter columns after the limbs of a state row.
N_TERMS, N_NOT_NEGZERO, N_NAN, N_POSINF, N_NEGINF = range(5)


def limb_format_for(value_dtype: str) -> LimbFormat:
    """The limb format that holds sums of ``value_dtype`` values exactly."""
    for fmt in LIMBS.values():
        if value_dtype in fmt.value_dtypes:
            return fmt
    raise FoldTypeError(
        f"no exact accumulator for dtype {value_dtype}; supported: {', '.join(VALUE_DTYPES)}"
    )


def decode_shift(value_dtype: str, fmt: LimbFormat) -> int:
    """What to add to ``max(biased exponent, 1) - 1`` to get a value's limb shift ``p``.

    A finite value of ``value_dtype`` is ``±M·2^(max(e, 1) - 1 - bias - fraction_bits + 1)``
    with ``e`` its biased exponent field; in units of ``2^fmt.unit_exp`` that is
    a shift of ``max(e, 1) - 1 + decode_shift``. 0 for float32 in the f32
    format and float64 in the f64 format; 125 for float16 and 16 for bfloat16.
    """
    f = FLOATS[value_dtype]
    return f.subnormal_exp - fmt.unit_exp


# -- dtype names ----------------------------------------------------------------------------------
_ALIASES = {"bool_": "bool", "float": "float32", "double": "float64", "half": "float16"}


def decoding(value_dtype: str, fmt: LimbFormat | None = None) -> tuple[int, int, int]:
    """``(exp_bits, frac_bits, shift)``: how the kernels decode ``value_dtype``'s bits.

    The exponent and fraction widths of the format and its :func:`decode_shift`
    into ``fmt`` (default: the limb format that holds its sums).
    """
    f = FLOATS[value_dtype]
    return f.exponent_bits, f.fraction_bits, decode_shift(value_dtype, fmt or limb_format_for(
        value_dtype))  # fmt: skip


def held_shift(out_name: str) -> int:
    """Bits a result's pattern is shifted left when held in a wider type: 16 for bfloat16
    (NumPy has none: bitfold returns bfloat16 results as the float32 holding them), else 0."""
    return 16 if out_name == "bfloat16" else 0


def rounding_target(out_name: str, fmt: LimbFormat) -> tuple[int, int, int, int, int, int]:
    """``(unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift)``: what the
    kernels need to round sums held in ``fmt`` once to ``out_name`` (see
    :func:`bitfold.kernels.ieee.round_row`)."""
    t = FLOATS[out_name]
    return (fmt.unit_exp, t.precision, t.exponent_bits, t.subnormal_exp, t.canonical_nan,
            held_shift(out_name))  # fmt: skip


def dtype_name(x: Any) -> str:
    """The canonical name (``"float32"``, ``"bfloat16"``, ``"int64"``, ...) of an array or dtype.

    Accepts arrays of any library (anything with ``.dtype``), NumPy, PyTorch
    and JAX dtypes, and names.
    """
    dt = x if isinstance(x, type) else getattr(x, "dtype", x)
    if isinstance(dt, str):
        name = dt
    elif isinstance(dt, np.dtype):
        name = dt.name
    elif isinstance(dt, type) and issubclass(dt, np.generic):
        name = np.dtype(dt).name
    else:
        name = str(dt)
    name = name.removeprefix("torch.")
    return _ALIASES.get(name, name)


def check_value_dtype(name: str) -> str:
    """``name`` if it is a dtype bitfold folds, else a :class:`FoldTypeError` naming it."""
    if name not in VALUE_DTYPES:
        raise FoldTypeError(
            f"values must be floating point ({', '.join(VALUE_DTYPES)}); got dtype {name}"
        )
    return name


def default_out_dtype(value_dtype: str) -> str:
    """float64 sums for float64 values, float32 sums for every other value dtype."""
    return "float64" if value_dtype == "float64" else "float32"


def resolve_out_dtype(value_dtype: str, out_dtype: Any = None) -> str:
    """The output dtype name for values of ``value_dtype`` and an optional ``out_dtype``.

    ``out_dtype`` may be a name, a NumPy, PyTorch or JAX dtype; ``None`` means
    :func:`default_out_dtype`.
    """
    if out_dtype is None:
        return default_out_dtype(value_dtype)
    name = dtype_name(out_dtype)
    if name not in OUT_DTYPES:
        try:
            name = np.dtype(out_dtype).name
        except TypeError:
            pass
    if name not in OUT_DTYPES:
        raise FoldTypeError(f"out_dtype must be one of {', '.join(OUT_DTYPES)}; got {out_dtype!r}")
    return name


__all__ = [
    "CANONICAL_NAN_BITS",
    "F32",
    "F64",
    "FLOATS",
    "LIMBS",
    "OUT_DTYPES",
    "VALUE_DTYPES",
    "FloatFormat",
    "LimbFormat",
    "check_value_dtype",
    "decode_shift",
    "decoding",
    "default_out_dtype",
    "dtype_name",
    "held_shift",
    "limb_format_for",
    "resolve_out_dtype",
    "rounding_target",
]
