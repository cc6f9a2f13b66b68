"""The benchmark's cases: which (N, K, skew, dtype[, D]) points each sweep visits, and their inputs.

A case is fully described by a small dict (``Case.spec``), so that a worker
process can rebuild exactly the same index and values from it: every input
comes from ``numpy.random.default_rng(0)`` in a fixed order of draws. A case
of scalars folds N values (shape ``(N,)``) into K sums; a case of rows (``D``
set) folds N rows of D values (shape ``(N, D)``) into a ``(K, D)``
table, the index drawn exactly as for scalars. The specs of scalar cases have
no ``d`` key, so they are the same as before rows existed.

* ``uniform``: ``idx = rng.integers(0, K, N)``, then ``values = rng.normal(size=N)``
  cast to the value dtype. With N = 768 * 4096 and K = 433 this is the seed
  experiment's own draw, bit for bit.
* ``zipf1.1``, ``zipf1.3``: bucket ranks drawn with probability ∝ rank^-s
  (truncated to K ranks, inverse-CDF sampling), then mapped to buckets through a
  random permutation so hot buckets are spread over [0, K).
* ``hot``: one bucket (drawn at random) holds ``N // 2`` values at random
  positions; the others are uniform over the remaining K - 1 buckets.

Values are ``rng.normal(size=N)`` (``size=(N, D)`` for rows) cast to the
dtype; ``bfloat16`` values are those normals rounded to bfloat16 (to nearest,
ties to even) and kept in a float32 array, since NumPy has no bfloat16:
contenders that take bfloat16 convert them (exactly) to their own library's
bfloat16 (:class:`bitfold.cli.bench.contenders.Inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FoldError

#: The hashed layer experiment's configuration: a 768 x 4096 weight folded into 433 parameters.
SEED_N = 768 * 4096
SEED_K = 433

SKEWS = ("uniform", "zipf1.1", "zipf1.3", "hot")
DTYPES = ("float32", "float16", "bfloat16", "float64")
#: Bytes of one value of each dtype (bfloat16 is not a NumPy dtype).
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

#: The four shapes of folds of rows, (N, D, K): embedding gradients and graph messages.
ROW_SHAPES = ((262_144, 64, 50_000), (65_536, 768, 50_000), (1_000_000, 64, 100_000),
              (262_144, 64, 1_000_000))  # fmt: skip
#: The D sweep holds N * D at this many values (= 262,144 x 64), K = 50,000.
D_SWEEP_VALUES = 1 << 24
D_SWEEP = (1, 4, 16, 64, 256, 768)
#: The memory sweep's maps, into up to 10^7 buckets.
MEMORY_SKEWS = ("uniform", "zipf1.3", "hot")

#: sweep name -> (what it varies, full-run points, quick-run points); a point is
#: (N, K, skew, dtype), or (N, K, skew, dtype, D) for a fold of rows.
_Point = tuple[int, int, str, str] | tuple[int, int, str, str, int]
SWEEPS: dict[str, tuple[str, list[_Point], list[_Point]]] = {
    "seed": (
        "the hashed layer experiment: 3,145,728 float32 values into 433 buckets, uniform",
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
        "K from 1 to 1e7 (N = 3,145,728, uniform, float32)",
        [
            (SEED_N, k, "uniform", "float32")
            for k in (1, 10, 100, SEED_K, 10_000, 100_000, 1_000_000, 10_000_000)
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
        "value dtype float32, float16, bfloat16, float64 (N = 3,145,728, K = 433, uniform)",
        [(SEED_N, SEED_K, "uniform", d) for d in DTYPES],
        [(1_000_000, SEED_K, "uniform", d) for d in DTYPES],
    ),
    "memory": (
        "memory of a plan plus one exact fold: the Zipf(1.3) map of 3 million values "
        "into 100,000 buckets, then uniform, Zipf(1.3) and hot maps into up to 1e7 buckets",
        [(3_000_000, 100_000, "zipf1.3", "float32")]
        + [
            (3_000_000, k, s, "float32")
            for k in (100_000, 1_000_000, 10_000_000)
            for s in MEMORY_SKEWS
        ],
        [(3_000_000, 100_000, "zipf1.3", "float32")]
        + [(1_000_000, k, s, "float32") for k in (100_000, 1_000_000) for s in MEMORY_SKEWS],
    ),
    "rows": (
        "folds of rows: (N, D, K) = (262,144, 64, 50,000), (65,536, 768, 50,000), "
        "(1,000,000, 64, 100,000), (262,144, 64, 1,000,000), uniform, and two of them Zipf(1.3); "
        "float32",
        [(n, k, "uniform", "float32", d) for n, d, k in ROW_SHAPES]
        + [(n, k, "zipf1.3", "float32", d) for n, d, k in ROW_SHAPES[0::2]],
        [(n // 4, k, "uniform", "float32", d) for n, d, k in ROW_SHAPES]
        + [(ROW_SHAPES[0][0] // 4, ROW_SHAPES[0][2], "zipf1.3", "float32", ROW_SHAPES[0][1])],
    ),
    "oneshot": (
        "one-shot folds (the plan built in the call): the seed configuration, K = 1e5 and 1e6 "
        "(N = 3,145,728), and rows (262,144, 64, 50,000); uniform, float32",
        [(SEED_N, k, "uniform", "float32") for k in (SEED_K, 100_000, 1_000_000)]
        + [(n, k, "uniform", "float32", d) for n, d, k in ROW_SHAPES[:1]],
        [(SEED_N, SEED_K, "uniform", "float32")]
        + [(1_000_000, k, "uniform", "float32") for k in (100_000, 1_000_000)]
        + [(n // 4, k, "uniform", "float32", d) for n, d, k in ROW_SHAPES[:1]],
    ),
    "d": (
        "row width D from 1 to 768 at N x D = 2^24 values (K = 50,000, uniform, float32)",
        [(D_SWEEP_VALUES // d, 50_000, "uniform", "float32", d) for d in D_SWEEP],
        [(D_SWEEP_VALUES // 4 // d, 50_000, "uniform", "float32", d) for d in (1, 16, 64, 768)],
    ),
}


#: Rows against XLA: the ``rows`` sweep's six shapes (the same cases: they run once).
SWEEPS["xla-rows"] = (
    "rows against XLA: the six shapes of the rows sweep, Zipf(1.3) included",
    SWEEPS["rows"][1],
    SWEEPS["rows"][2],
)
#: Sweeps that are phases of their own rather than cases: timed apart from the case loop.
PHASE_SWEEPS: dict[str, str] = {
    "load": "the seed configuration with one extra busy process on the machine: "
    "bitfold-exact against np.add.at",
}
#: Every name ``--sweeps`` accepts, in the order of a full run.
ALL_SWEEPS = (*SWEEPS, *PHASE_SWEEPS)


@dataclass(frozen=True)
class Case:
    """One benchmark point; ``sweeps`` lists every sweep that visits it.

    ``d`` is the row width of a fold of rows, 0 for a fold of scalars.
    """

    n: int
    k: int
    skew: str
    dtype: str
    d: int = 0
    sweeps: tuple[str, ...] = field(default=(), compare=False)

    @property
    def id(self) -> str:
        """A stable name, e.g. ``n=3145728,k=433,uniform,float32`` or ``n=262144,d=64,k=...``."""
        rows = f",d={self.d}" if self.d else ""
        return f"n={self.n}{rows},k={self.k},{self.skew},{self.dtype}"

    @property
    def spec(self) -> dict[str, Any]:
        """A JSON-ready description from which :func:`make_inputs` rebuilds the inputs."""
        spec: dict[str, Any] = {"n": self.n, "k": self.k, "skew": self.skew, "dtype": self.dtype}
        if self.d:
            spec["d"] = self.d
        return spec

    @property
    def kind(self) -> str:
        """``"rows"`` or ``"scalar"``."""
        return "rows" if self.d else "scalar"

    @property
    def width(self) -> int:
        """Values per index entry: D for rows, 1 for scalars."""
        return self.d or 1

    @property
    def value_itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def out_itemsize(self) -> int:
        """Bytes of one sum: float64 for float64 values, float32 otherwise."""
        return 8 if self.dtype == "float64" else 4

    @property
    def output_bytes(self) -> int:
        """Bytes of the K (x D) sums."""
        return self.k * self.width * self.out_itemsize

    @property
    def min_bytes(self) -> int:
        """Bytes any fold must move: read N (x D) values and N int32 indices, write the sums.

        The sums are float64 for float64 values and float32 otherwise. This is
        the numerator of the reported effective bandwidth.
        """
        return self.n * (self.width * self.value_itemsize + 4) + self.output_bytes

    def describe(self) -> str:
        rows = f" D={self.d:,}" if self.d else ""
        return f"N={self.n:,}{rows} K={self.k:,} {self.skew} {self.dtype}"


def check_sweeps(names: list[str]) -> list[str]:
    """The sweep names, or a FoldError naming the unknown one and the valid ones."""
    for name in names:
        if name not in ALL_SWEEPS:
            raise FoldError(f"unknown sweep {name!r}; choose from: {', '.join(ALL_SWEEPS)}")
    return names


def build_cases(sweeps: list[str], *, quick: bool, scale: float = 1.0) -> list[Case]:
    """The distinct cases of ``sweeps`` in a fixed order; a case shared by sweeps runs once.

    ``scale`` multiplies every N (at least 1); it exists for smoke tests and
    quick looks, and is recorded in the results.
    """
    check_sweeps(sweeps)
    seen: dict[tuple[int, int, str, str, int], list[str]] = {}
    for name in (s for s in sweeps if s in SWEEPS):  # phase sweeps (load) have no cases
        _, full, fast = SWEEPS[name]
        for point in fast if quick else full:
            n, k, skew, dtype = point[:4]
            d = int(point[4]) if len(point) > 4 else 0  # type: ignore[misc]
            key = (max(1, round(n * scale)), k, skew, dtype, d)
            seen.setdefault(key, [])
            if name not in seen[key]:
                seen[key].append(name)
    return [Case(n, k, s, t, d, tuple(names)) for (n, k, s, t, d), names in seen.items()]


def describe_sweep(name: str, cases: list[Case]) -> str:
    """What a sweep varied over the cases actually run, and what it held fixed."""
    if name in PHASE_SWEEPS:
        return PHASE_SWEEPS[name]
    mine = [c for c in cases if name in c.sweeps]
    if not mine:
        return SWEEPS[name][0]
    if name == "seed":
        return f"{SWEEPS[name][0].split(':')[0]}: {mine[0].describe()}"
    if name == "memory":
        skews = ", ".join(dict.fromkeys(c.skew for c in mine))
        ks = ", ".join(f"{k:,}" for k in sorted({c.k for c in mine}))
        ns = ", ".join(f"{n:,}" for n in sorted({c.n for c in mine}))
        return (f"memory of a plan plus one exact fold ({mine[0].dtype}): maps {skews}; "
                f"K = {ks}; N = {ns}")  # fmt: skip
    if name == "oneshot":
        shapes = "; ".join(c.describe() for c in mine)
        return f"one-shot folds, the plan built in the call: {shapes}"
    if name in ("rows", "xla-rows"):
        shapes = ", ".join(f"({c.n:,}, {c.d:,}, {c.k:,}) {c.skew}" for c in mine)
        return f"folds of rows (N, D, K): {shapes}; {mine[0].dtype}"
    if name == "d":
        c0 = mine[0]
        ds = sorted(c.d for c in mine)
        return (f"row width D from {ds[0]:,} to {ds[-1]:,} at N x D = {c0.n * c0.d:,} values "
                f"(K = {c0.k:,}, {c0.skew}, {c0.dtype})")  # fmt: skip
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


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16 (to nearest, ties to even), as float32; finite ``x``."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def make_inputs(spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(index int64, values)`` of a case spec, deterministically (module docstring).

    Values have shape ``(N,)``, or ``(N, D)`` when the spec has a ``d``;
    bfloat16 values come as a float32 array of bfloat16 numbers.
    """
    n, k, skew, dtype = int(spec["n"]), int(spec["k"]), spec["skew"], spec["dtype"]
    d = int(spec.get("d") or 0)
    if dtype not in ITEMSIZE:
        raise FoldError(f"unknown value dtype {dtype!r}; choose from: {', '.join(DTYPES)}")
    rng = np.random.default_rng(0)
    if skew == "uniform":
        idx = rng.integers(0, k, n)
    elif skew.startswith("zipf"):
        idx = _zipf_index(rng, n, k, float(skew[4:]))
    elif skew == "hot":
        idx = _hot_index(rng, n, k)
    else:
        raise FoldError(f"unknown skew {skew!r}; choose from: {', '.join(SKEWS)}")
    values = rng.normal(size=(n, d) if d else n)
    if dtype == "bfloat16":
        values = round_to_bfloat16(values.astype(np.float32))
    else:
        values = values.astype(dtype)
    return idx.astype(np.int64, copy=False), values
