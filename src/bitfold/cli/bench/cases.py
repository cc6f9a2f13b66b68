"""The benchmark's cases: which (N, K, skew, dtype) points each sweep visits, and their inputs.

A case is fully described by a small dict (``Case.spec``), so that a worker
process can rebuild exactly the same index and values from it: every input
comes from ``numpy.random.default_rng(0)`` in a fixed order of draws.

* ``uniform``: ``idx = rng.integers(0, K, N)``, then ``values = rng.normal(size=N)``
  cast to the value dtype. With N = 768 * 4096 and K = 433 this is the seed
  experiment's own draw, bit for bit.
* ``zipf1.1``, ``zipf1.3``: bucket ranks drawn with probability ∝ rank^-s
  (truncated to K ranks, inverse-CDF sampling), then mapped to buckets through a
  random permutation so hot buckets are spread over [0, K).
* ``hot``: one bucket (drawn at random) holds ``N // 2`` values at random
  positions; the others are uniform over the remaining K - 1 buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FoldError

#: The seed experiment's configuration: a 768 x 4096 weight folded into 433 parameters.
SEED_N = 768 * 4096
SEED_K = 433

SKEWS = ("uniform", "zipf1.1", "zipf1.3", "hot")
DTYPES = ("float32", "float16", "float64")

#: sweep name -> (what it varies, full-run points, quick-run points); a point is
#: (N, K, skew, dtype).
_Point = tuple[int, int, str, str]
SWEEPS: dict[str, tuple[str, list[_Point], list[_Point]]] = {
    "seed": (
        "the seed experiment: 3,145,728 float32 values into 433 buckets, uniform",
        [(SEED_N, SEED_K, "uniform", "float32")],
        [(SEED_N, SEED_K, "uniform", "float32")],
    ),
    "n": (
        "N from 1e5 to 3e7 (K = 433, uniform, float32)",
        [
            (n, SEED_K, "uniform", "float32")
            for n in (100_000, 300_000, 1_000_000, SEED_N, 10_000_000, 30_000_000)
        ],
        [(n, SEED_K, "uniform", "float32") for n in (100_000, 1_000_000, SEED_N)],
    ),
    "k": (
        "K from 1 to 1e6 (N = 3,145,728, uniform, float32)",
        [
            (SEED_N, k, "uniform", "float32")
            for k in (1, 10, 100, SEED_K, 10_000, 100_000, 1_000_000)
        ],
        [(1_000_000, k, "uniform", "float32") for k in (1, 100, 10_000, 1_000_000)],
    ),
    "skew": (
        "index skew: uniform, Zipf 1.1, Zipf 1.3, one hot bucket with half the values "
        "(N = 3e6, K = 1e5, float32)",
        [(3_000_000, 100_000, s, "float32") for s in SKEWS],
        [(1_000_000, 100_000, s, "float32") for s in SKEWS],
    ),
    "dtype": (
        "value dtype float32, float16, float64 (N = 3,145,728, K = 433, uniform)",
        [(SEED_N, SEED_K, "uniform", d) for d in DTYPES],
        [(1_000_000, SEED_K, "uniform", d) for d in DTYPES],
    ),
    "memory": (
        "issue 3's memory goal: Zipf(1.3), 3 million values into 100,000 buckets, float32",
        [(3_000_000, 100_000, "zipf1.3", "float32")],
        [(3_000_000, 100_000, "zipf1.3", "float32")],
    ),
}


@dataclass(frozen=True)
class Case:
    """One benchmark point; ``sweeps`` lists every sweep that visits it."""

    n: int
    k: int
    skew: str
    dtype: str
    sweeps: tuple[str, ...] = field(default=(), compare=False)

    @property
    def id(self) -> str:
        """A stable name, e.g. ``n=3145728,k=433,uniform,float32``."""
        return f"n={self.n},k={self.k},{self.skew},{self.dtype}"

    @property
    def spec(self) -> dict[str, Any]:
        """A JSON-ready description from which :func:`make_inputs` rebuilds the inputs."""
        return {"n": self.n, "k": self.k, "skew": self.skew, "dtype": self.dtype}

    @property
    def value_itemsize(self) -> int:
        return int(np.dtype(self.dtype).itemsize)

    @property
    def min_bytes(self) -> int:
        """Bytes any fold must move: read N values and N int32 indices, write K sums.

        The sums are float64 for float64 values and float32 otherwise. This is
        the numerator of the reported effective bandwidth.
        """
        out = 8 if self.dtype == "float64" else 4
        return self.n * (self.value_itemsize + 4) + self.k * out

    def describe(self) -> str:
        return f"N={self.n:,} K={self.k:,} {self.skew} {self.dtype}"


def check_sweeps(names: list[str]) -> list[str]:
    """The sweep names, or a FoldError naming the unknown one and the valid ones."""
    for name in names:
        if name not in SWEEPS:
            raise FoldError(f"unknown sweep {name!r}; choose from: {', '.join(SWEEPS)}")
    return names


def build_cases(sweeps: list[str], *, quick: bool, scale: float = 1.0) -> list[Case]:
    """The distinct cases of ``sweeps`` in a fixed order; a case shared by sweeps runs once.

    ``scale`` multiplies every N (at least 1); it exists for smoke tests and
    quick looks, and is recorded in the results.
    """
    check_sweeps(sweeps)
    seen: dict[tuple[int, int, str, str], list[str]] = {}
    for name in sweeps:
        _, full, fast = SWEEPS[name]
        for n, k, skew, dtype in fast if quick else full:
            key = (max(1, round(n * scale)), k, skew, dtype)
            seen.setdefault(key, [])
            if name not in seen[key]:
                seen[key].append(name)
    return [Case(n, k, s, d, tuple(names)) for (n, k, s, d), names in seen.items()]


def describe_sweep(name: str, cases: list[Case]) -> str:
    """What a sweep varied over the cases actually run, and what it held fixed."""
    mine = [c for c in cases if name in c.sweeps]
    if not mine:
        return SWEEPS[name][0]
    if name in ("seed", "memory"):
        return f"{SWEEPS[name][0].split(':')[0]}: {mine[0].describe()}"
    fixed = []
    for key, fmt in (("n", "N = {:,}"), ("k", "K = {:,}"), ("skew", "{}"), ("dtype", "{}")):
        if key != name:
            fixed.append(fmt.format(getattr(mine[0], key)))
    points = [getattr(c, name) for c in mine]
    if name in ("n", "k"):
        varied = f"{name.upper()} from {min(points):,} to {max(points):,}"
    else:
        varied = f"{'index skew' if name == 'skew' else 'value dtype'} {', '.join(points)}"
    return f"{varied} ({', '.join(fixed)})"


def _zipf_index(rng: np.random.Generator, n: int, k: int, s: float) -> np.ndarray:
    weights = np.arange(1, k + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n), side="right")
    np.minimum(ranks, k - 1, out=ranks)
    return rng.permutation(k)[ranks]


def _hot_index(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    hot = int(rng.integers(0, k))
    if k == 1:
        return np.zeros(n, np.int64)
    idx = rng.integers(0, k - 1, n)
    idx[idx >= hot] += 1
    idx[rng.permutation(n)[: n // 2]] = hot
    return idx


def make_inputs(spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(index int64, values)`` of a case spec, deterministically (module docstring)."""
    n, k, skew, dtype = int(spec["n"]), int(spec["k"]), spec["skew"], spec["dtype"]
    rng = np.random.default_rng(0)
    if skew == "uniform":
        idx = rng.integers(0, k, n)
    elif skew.startswith("zipf"):
        idx = _zipf_index(rng, n, k, float(skew[4:]))
    elif skew == "hot":
        idx = _hot_index(rng, n, k)
    else:
        raise FoldError(f"unknown skew {skew!r}; choose from: {', '.join(SKEWS)}")
    values = rng.normal(size=n).astype(dtype)
    return idx.astype(np.int64, copy=False), values
