#!/usr/bin/env python3
"""Write the known-answer problem set of the GPU kernels' self-test, with the oracle's bits.

    python scripts/selftest_cases.py [--check]

Writes ``src/bitfold/backends/selftest_cases.json`` (:mod:`bitfold.backends.selftest`
reads it): for each value dtype (float16, bfloat16, float32, float64) two folds,
``scalars`` and ``rows`` (3 columns), given as the values' bit patterns and the
index, and for each output dtype the bits of the exact fold computed by the
Fraction oracle (``tests/oracle.py``, which shares no code with bitfold). The
problems: ties and round-half-to-even at every output precision, the oracle's
boundary buckets (subnormal floor, overflow threshold), subnormal sums crossing
into the normal range, ``-0.0`` (alone, with ``+0.0``, cancelled sums), NaN
(non-canonical payloads), infinities of both signs, a hot bucket whose terms span
the whole exponent range and cancel across chunks, a Zipf-shaped map, an empty
bucket. Everything is made from integers (no random generator), so the file is
the same on every machine; ``--check`` exits 1 when the file differs from what
this script makes (tests/test_selftest.py checks the same, and the bits against
the oracle).
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "bitfold" / "backends" / "selftest_cases.json"
sys.path.insert(0, str(ROOT / "tests"))

from oracle import FORMATS, boundary_buckets, exact_fold_oracle  # noqa: E402

VALUE_DTYPES = ("float16", "bfloat16", "float32", "float64")
OUT_DTYPES = ("bfloat16", "float16", "float32", "float64")
#: (exponent bits, fraction bits) of each format
LAYOUT = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}
#: the positions from which a bucket is hot in the self-test's folds (the tuning it passes)
HOT_MIN = 8
ROW_SIZE = 3


# -- bits and values --------------------------------------------------------------------------
def to_bits(x: float, dtype: str) -> int | None:
    """The bit pattern of ``x`` in ``dtype`` when ``x`` is exactly a value of it (else None)."""
    if math.isnan(x):
        return None
    if dtype == "float64":
        return struct.unpack("<Q", struct.pack("<d", x))[0]
    if dtype == "bfloat16":
        b32 = to_bits(x, "float32")
        return None if b32 is None or b32 & 0xFFFF else b32 >> 16
    with np.errstate(over="ignore"):
        y = np.array(x, np.float64).astype(dtype)
    if float(y) != x or (x == 0 and math.copysign(1, float(y)) != math.copysign(1, x)):
        return None
    return int(y.view(np.uint16 if dtype == "float16" else np.uint32))


def to_float(bits: int, dtype: str) -> float:
    """The value of a bit pattern of ``dtype`` (NaN payloads become NaN)."""
    if dtype == "float64":
        return struct.unpack("<d", struct.pack("<Q", bits))[0]
    if dtype == "bfloat16":
        return to_float(bits << 16, "float32")
    if dtype == "float32":
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return float(np.array(bits, np.uint16).view(np.float16))


def make(sign: int, exp_field: int, frac: int, dtype: str) -> int:
    """The pattern with these sign, biased exponent and fraction fields."""
    e_bits, f_bits = LAYOUT[dtype]
    return (sign << (e_bits + f_bits)) | (exp_field << f_bits) | (frac & ((1 << f_bits) - 1))


def scramble(i: int) -> int:
    """A fixed 64-bit mix of ``i`` (splitmix64): the problem set's only 'randomness'."""
    z = (i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return z ^ (z >> 31)


def spread(i: int, dtype: str, lo: int, hi: int) -> int:
    """A value with a scrambled sign and fraction and a biased exponent in ``[lo, hi]``."""
    z = scramble(i)
    return make(z & 1, lo + (z >> 1) % (hi - lo + 1), z >> 12, dtype)


def specials(dtype: str) -> dict[str, int]:
    """Patterns every format has: signed zeros and infinities, NaNs off the canonical one."""
    e_bits, f_bits = LAYOUT[dtype]
    top = (1 << e_bits) - 1
    return {
        "-0": make(1, 0, 0, dtype), "+0": 0,
        "+inf": make(0, top, 0, dtype), "-inf": make(1, top, 0, dtype),
        "snan": make(0, top, 1, dtype), "-qnan": make(1, top, 1 << (f_bits - 1), dtype),
        "max": make(0, top - 1, -1, dtype), "-max": make(1, top - 1, -1, dtype),
        "sub_min": make(0, 0, 1, dtype), "-sub_min": make(1, 0, 1, dtype),
        "sub_max": make(0, 0, -1, dtype), "normal_min": make(0, 1, 0, dtype),
    }  # fmt: skip


# -- the buckets ------------------------------------------------------------------------------
def scalar_buckets(dtype: str, out: str) -> list[list[int]]:
    """The ``scalars`` fold's buckets for ``dtype`` values rounded to ``out``, as lists of bit
    patterns; bucket 0 is the hot one."""
    e_bits = LAYOUT[dtype][0]
    bias, top = (1 << (e_bits - 1)) - 1, (1 << e_bits) - 2
    s = specials(dtype)
    one = make(0, bias, 0, dtype)
    big = make(0, top - 1, 0, dtype)  # 2^(emax - 1)
    # hot: terms from the subnormal floor to near the top, cancelling across chunks
    hot = [spread(100 + i, dtype, 0, top) for i in range(14)]
    hot += [big, s["sub_min"], make(1, top - 1, 0, dtype), one, s["-sub_min"], s["sub_max"]]
    hot = [hot[(7 * i) % len(hot)] for i in range(len(hot))]  # big and -big in other chunks
    buckets: list[list[int]] = [hot]
    # ties and their neighbours at the output's precision (where the value dtype holds them),
    # then the oracle's boundaries of the output format: the subnormal floor, the overflow edge
    p = FORMATS[out][0]
    ties = [[1.0, 2.0**-p], [1.0 + 2.0 ** (1 - p), 2.0**-p], [-1.0, -(2.0**-p)],
            [1.0, 2.0**-p, 2.0 ** (-p - 20)], [1.0, 2.0**-p, -(2.0 ** (-p - 20))]]  # fmt: skip
    for terms in ties + boundary_buckets(out):
        bits = [to_bits(t, dtype) for t in terms]
        if terms and all(b is not None for b in bits):
            buckets.append(bits)  # type: ignore[arg-type]
    # subnormal sums: below the floor, across into the normal range, cancelling
    buckets += [
        [s["sub_min"]] * 3, [s["sub_max"], s["sub_min"]], [s["sub_max"], s["sub_max"]],
        [s["normal_min"], s["-sub_min"]], [s["-sub_min"], s["-sub_min"], s["sub_min"]],
    ]  # fmt: skip
    # signed zeros, specials, overflow
    buckets += [
        [s["-0"], s["-0"], s["-0"]], [s["-0"], s["+0"]], [one, one | s["-0"]], [s["+inf"], one],
        [s["-inf"], s["-inf"]], [s["+inf"], s["-inf"]], [s["snan"], one], [s["-qnan"], one],
        [s["max"], s["max"]], [s["-max"], s["-max"], s["max"]],
        [],  # an empty bucket: +0.0
    ]  # fmt: skip
    # a Zipf tail: bucket sizes 6, 3, 2, 2, 1, 1 of scrambled values near one
    sizes = [max(1, round(6 / (r + 1) ** 1.1)) for r in range(6)]
    buckets += [[spread(1000 + 10 * r + j, dtype, bias - 6, bias + 6) for j in range(n)]
                for r, n in enumerate(sizes)]  # fmt: skip
    return _unique(buckets)


def row_buckets(dtype: str) -> list[list[list[int]]]:
    """The ``rows`` fold's buckets: lists of rows of :data:`ROW_SIZE` patterns; bucket 0 hot."""
    e_bits, f_bits = LAYOUT[dtype]
    bias, top = (1 << (e_bits - 1)) - 1, (1 << e_bits) - 2
    s = specials(dtype)
    one = make(0, bias, 0, dtype)
    p = f_bits + 1
    half = make(0, bias - p, 0, dtype)  # half an ulp of 1 in the value dtype
    hot = [[spread(2000 + 3 * i + d, dtype, 0, top) for d in range(ROW_SIZE)] for i in range(11)]
    hot[3][1], hot[8][1] = make(0, top - 1, 0, dtype), make(1, top - 1, 0, dtype)
    hot[5][2] = s["-0"]
    return [
        hot,
        [[one, s["sub_min"], s["-0"]], [half, s["sub_min"], s["-0"]]],
        [[one, s["sub_max"], s["+inf"]], [half | s["-0"], s["sub_min"], one]],
        [[s["max"], s["-0"], s["snan"]], [s["max"], s["+0"], s["-inf"]]],
        [],
        [[spread(3000 + d, dtype, bias - 3, bias + 3) for d in range(ROW_SIZE)]],
    ]


def _unique(buckets: list[list[int]]) -> list[list[int]]:
    seen: set[tuple[int, ...]] = set()
    kept = []
    for b in buckets:
        if tuple(b) not in seen or not b:
            seen.add(tuple(b))
            kept.append(b)
    return kept


# -- the folds --------------------------------------------------------------------------------
def interleave(sizes: list[int]) -> list[int]:
    """An index whose bucket ``k`` has ``sizes[k]`` positions, the buckets interleaved (a fixed
    permutation: the plan's sorted order is not the identity)."""
    index = [k for k, n in enumerate(sizes) for _ in range(n)]
    n = len(index)
    stride = next(s for s in range(n // 2 + 1, 2 * n + 2) if math.gcd(s, n) == 1)
    return [index[(stride * i) % n] for i in range(n)]


def fold_case(
    name: str, dtype: str, buckets: list[Any], out: str, rows: bool = False
) -> dict[str, Any]:
    """One fold of the problem set: index, value bits, and the oracle's bits in ``out``."""
    K = len(buckets)
    index = interleave([len(b) for b in buckets])
    taken = [0] * K
    bits: list[Any] = []
    for k in index:
        bits.append(buckets[k][taken[k]])
        taken[k] += 1
    cols = ROW_SIZE if rows else 1
    grid = np.array(bits, dtype=object).reshape(len(index), cols)
    values = np.array([[to_float(int(b), dtype) for b in row] for row in grid], np.float64)
    held = "float32" if out == "bfloat16" else out
    width = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[held]
    columns = [exact_fold_oracle(index, values[:, d], K, out).view(width) for d in range(cols)]
    result = np.stack(columns, axis=1).astype(np.uint64)
    if out == "bfloat16":
        result = result >> np.uint64(16)
    shape = [len(index), ROW_SIZE] if rows else [len(index)]
    return {"name": name, "K": K, "shape": shape, "index": index,
            "bits": [int(b) for b in grid.reshape(-1)],
            "expected": [int(b) for b in result.reshape(-1)]}  # fmt: skip


def build() -> dict[str, Any]:
    """The whole problem set, as written to the data file: per value dtype and output dtype,
    the ``scalars`` and ``rows`` folds."""
    cases = {
        dtype: {out: [fold_case("scalars", dtype, scalar_buckets(dtype, out), out),
                      fold_case("rows", dtype, row_buckets(dtype), out, rows=True)]
                for out in OUT_DTYPES}
        for dtype in VALUE_DTYPES
    }  # fmt: skip
    return {
        "about": "known answers of bitfold's GPU kernel self-test: exact folds, the Fraction "
        "oracle's bits (tests/oracle.py); written by scripts/selftest_cases.py, do not edit",
        "hot_min": HOT_MIN,
        "cases": cases,
    }


def dumps(data: dict[str, Any]) -> str:
    """The file's text: one list a line, so that a change reads as a small diff."""
    lines = ["{", f'  "about": {json.dumps(data["about"])},', f'  "hot_min": {data["hot_min"]},',
             '  "cases": {']  # fmt: skip
    pairs = [(d, o) for d in data["cases"] for o in data["cases"][d]]
    for i, (dtype, out) in enumerate(pairs):
        if i == 0 or pairs[i - 1][0] != dtype:
            lines.append(f'    "{dtype}": {{')
        lines.append(f'      "{out}": [')
        folds = data["cases"][dtype][out]
        for j, case in enumerate(folds):
            lines.append(f'        {{"name": {json.dumps(case["name"])}, "K": {case["K"]}, '
                         f'"shape": {json.dumps(case["shape"])},')  # fmt: skip
            lines.append(f'         "index": {json.dumps(case["index"])},')
            lines.append(f'         "bits": {json.dumps(case["bits"])},')
            lines.append(f'         "expected": {json.dumps(case["expected"])}}}'
                         + ("," if j < len(folds) - 1 else ""))  # fmt: skip
        last_of_dtype = i == len(pairs) - 1 or pairs[i + 1][0] != dtype
        lines.append("      ]" + ("" if last_of_dtype else ","))
        if last_of_dtype:
            lines.append("    }" + ("," if i < len(pairs) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the stored file differs from what this script makes")
    args = parser.parse_args(argv)
    text = dumps(build())
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)}: {'up to date' if same else 'STALE: run this script'}")
        return 0 if same else 1
    OUT.write_text(text)
    data = json.loads(text)
    sizes = {f"{d} -> {o}": [(c["name"], len(c["index"]), c["K"]) for c in cs]
             for d, outs in data["cases"].items() for o, cs in outs.items()}  # fmt: skip
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text):,} bytes)")
    for pair, folds in sizes.items():
        print(f"  {pair}: " + ", ".join(f"{n}: {p} positions, K = {k}" for n, p, k in folds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
