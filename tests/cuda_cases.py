"""GPU kernel cases against the CPU reference: under the numba-cuda simulator, or on a GPU.

Not collected by a plain ``pytest`` run (the name does not match
``test_*.py``): ``tests/test_cuda_sim.py`` runs this file in a subprocess,
because ``numba.cuda`` is either the simulator or the real target for a whole
process, decided when it is first imported, and ``tests/test_cuda_compile.py``
needs the real one in the main test process.

* ``NUMBA_ENABLE_CUDASIM=1``: every case runs on the simulator's device
  arrays, with small inputs (N up to ~10^4) and small launch shapes (several
  blocks, so the per-block merge and the grid-stride loops run).
* ``BITFOLD_CUDA_DEVICE=1`` (``scripts/gpu_check.sh``): every case runs on the
  real GPU, plus the cases that need one (torch and CuPy arrays, streams,
  CUDA graphs, the hashed layer's size).

``exact`` is compared bitwise with the CPU ``exact`` result and with the
Fraction oracle; ``ordered`` bitwise with the CPU ``ordered`` strategy and
with itself on a second run; ``atomic`` with a float64 reference and a
tolerance.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from oracle import boundary_buckets, exact_fold_oracle, ordered_fold_reference
from quicker_simulator import blocks_as_greenlets, small_fills

import bitfold

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
DEVICE = os.environ.get("BITFOLD_CUDA_DEVICE") == "1" and not SIM
#: the skip reason of cases that need a real GPU; test_cuda_sim.py accepts it in the simulator
NEEDS_DEVICE = "needs a real CUDA device (BITFOLD_CUDA_DEVICE=1)"

if not (SIM or DEVICE):
    pytest.skip(
        "set NUMBA_ENABLE_CUDASIM=1 (simulator) or BITFOLD_CUDA_DEVICE=1 (a GPU); "
        "tests/test_cuda_sim.py does this in a subprocess",
        allow_module_level=True,
    )
pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (pip install -e '.[cuda]')")

from numba import cuda  # noqa: E402  (after the mode checks above)

from bitfold import dispatch  # noqa: E402
from bitfold.arrays import is_cuda_array  # noqa: E402
from bitfold.backends import cuda as gpu  # noqa: E402
from bitfold.kernels import cuda as kernels  # noqa: E402

device_only = pytest.mark.skipif(not DEVICE, reason=NEEDS_DEVICE)
# The simulator adds to uint32 shared words with NumPy scalars, which warn on the wraparound
# that the hardware's 32-bit atomics perform silently (the exact kernels rely on it).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in scalar add")

# several blocks and a grid-stride loop even on small inputs; tiny on the simulator
LAUNCHES = (
    [kernels.LaunchShape(32, 3), kernels.LaunchShape(64, 1)]
    if SIM
    else [None, kernels.LaunchShape(128, 7), kernels.LaunchShape(1024, 2)]
)
N_SMALL = 1500 if SIM else 20000
N_TINY = 600 if SIM else 20000
N_LARGE = 10000 if SIM else 200000
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@pytest.fixture(autouse=True)
def _small_zero_fills(monkeypatch):
    """On the simulator (one Python thread per GPU thread), the zero fills that the backend
    launches without a shape (a state's first zeroing: one thread per element) take the small
    launch shape: its grid-stride loop clears the same elements at a fraction of the threads.
    The default shape's fill is checked once (test_a_default_zero_fill_clears_every_element)
    and on a GPU every fill keeps its own shape."""
    if SIM:
        monkeypatch.setattr(kernels, "launch_zero", small_fills(_launch_zero))


_launch_zero = kernels.launch_zero
if SIM:
    blocks_as_greenlets()


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(UINT[a.dtype.itemsize])


def _assert_bits_equal(got, want, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    bad = np.flatnonzero(_bits(got) != _bits(want))
    assert bad.size == 0, (
        f"{what}: {bad.size} buckets differ, first k={bad[0]}: "
        f"got {got[bad[0]]!r} ({_bits(got)[bad[0]]:#x}), want {want[bad[0]]!r} "
        f"({_bits(want)[bad[0]]:#x})"
    )


def _wide_values(rng, n, dtype=np.float32, spread=40):
    """Normal values scaled over 2^(±spread): exercises many limbs and cancellation."""
    v = rng.standard_normal(n) * np.exp2(rng.integers(-spread, spread, n))
    return v.astype(dtype)


def cuda_fold(plan, values, strategy="exact", out_dtype=None, **kw):
    """The one dispatch, with the CUDA backend's tuning options."""
    return dispatch.fold(plan, values, strategy, out_dtype=out_dtype, **kw)


def _fold(plan, values, strategy="exact", out_dtype=None, launch=None, **kw):
    dev = cuda.to_device(values)
    out = cuda_fold(plan, dev, strategy, out_dtype, launch=launch or LAUNCHES[0], **kw)
    return out.copy_to_host()


# -- exact -----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["shared", "global"])
@pytest.mark.parametrize("K", [1, 7, 433])
def test_exact_equals_cpu_and_oracle(K, path):
    rng = np.random.default_rng(K)
    idx = rng.integers(0, K, N_SMALL)
    vals = _wide_values(rng, N_SMALL)
    plan = bitfold.Fold(idx, K)
    want = plan(vals)
    _assert_bits_equal(want, exact_fold_oracle(idx, vals, K), "CPU vs oracle")
    for launch in LAUNCHES if (K < 100 or not SIM) else LAUNCHES[:1]:  # the simulator is slow
        got = _fold(plan, vals, launch=launch, exact_path=path)
        _assert_bits_equal(got, want, f"GPU {path} {launch} vs CPU")


def test_exact_larger_input_and_skewed_buckets():
    rng = np.random.default_rng(7)
    K = 50
    idx = np.minimum(rng.geometric(0.2, N_LARGE) - 1, K - 1)  # a few huge buckets, many tiny
    vals = _wide_values(rng, N_LARGE, spread=60)
    plan = bitfold.Fold(idx, K)
    want = exact_fold_oracle(idx, vals, K)
    _assert_bits_equal(_fold(plan, vals, launch=LAUNCHES[0]), want, "GPU vs oracle")
    _assert_bits_equal(plan(vals), want, "CPU vs oracle")


SPECIAL_CASES = {
    # name: (index, values, K)
    "nan": ([0, 0, 1], [1.0, np.nan, 2.0], 2),
    "inf+-inf": ([0, 0, 1, 1, 2, 2], [np.inf, -np.inf, np.inf, 1.0, -np.inf, -5.0], 3),
    "inf+nan": ([0, 0], [np.inf, np.nan], 1),
    "only -0": ([0, 0, 1, 1, 2], [-0.0, -0.0, -0.0, 0.0, 0.0], 4),
    "cancel to zero with -0": ([0, 0, 0], [1.5, -1.5, -0.0], 1),
    "cancel to zero": ([0, 0, 1, 1], [2.0**100, -(2.0**100), -(2.0**-149), 2.0**-149], 2),
    "subnormals": ([0, 0, 1, 1, 1], [2.0**-149, 2.0**-149, -(2.0**-140), 2.0**-149, 3e-39], 2),
    "overflow": ([0, 0, 1, 1, 1], [3.4e38, 3.4e38, -3.4e38, -3.4e38, 1e30], 2),
    "just below overflow": ([0, 0], [np.float32(3.4028235e38), np.float32(2.0**103)], 1),
    "ties": ([0, 0, 0, 1, 1, 1], [1.0, 2.0**-24, 2.0**-80, 1.0, 2.0**-24, 0.0], 2),
    "empty buckets": ([3, 3], [1.0, 2.0], 6),
    "max and min": ([0, 0, 0], [3.4028235e38, -3.4028235e38, 2.0**-149], 1),
}


@pytest.mark.parametrize("case", sorted(SPECIAL_CASES))
@pytest.mark.parametrize("path", ["shared", "global"])
def test_exact_special_values(case, path):
    idx, raw, K = SPECIAL_CASES[case]
    vals = np.array(raw, np.float32)
    plan = bitfold.Fold(np.array(idx), K)
    want = exact_fold_oracle(idx, vals, K)
    _assert_bits_equal(plan(vals), want, "CPU vs oracle")
    _assert_bits_equal(_fold(plan, vals, exact_path=path), want, f"GPU {path} vs oracle")


@pytest.mark.parametrize("out", ["float16", "float32", "float64", "bfloat16"])
def test_exact_output_dtypes(out):
    rng = np.random.default_rng(3)
    K = 31
    idx = rng.integers(0, K, N_SMALL)
    vals = _wide_values(rng, N_SMALL, spread=12)
    vals[:5] = [6e4, 6e4, 2.0**-30, -0.0, 7e4]  # float16 overflow and underflow
    idx[:5] = [0, 0, 1, 2, 3]
    plan = bitfold.Fold(idx, K)
    want = plan(vals, out_dtype=out)  # bfloat16: float32 holding bfloat16 values
    if out != "bfloat16":
        _assert_bits_equal(want, exact_fold_oracle(idx, vals, K, out), "CPU vs oracle")
    _assert_bits_equal(_fold(plan, vals, out_dtype=out), want, f"GPU {out} vs CPU")


@pytest.mark.parametrize(("dtype", "K"), [("float16", 9), ("float64", 7), ("float64", 120)])
def test_exact_float16_and_float64_values(dtype, K):
    rng = np.random.default_rng(K)
    idx = rng.integers(0, K, N_TINY)
    spread = 10 if dtype == "float16" else 300
    vals = _wide_values(rng, N_TINY, np.dtype(dtype), spread)
    vals[:4] = [np.inf, -np.inf, -0.0, np.nan]
    idx[:4] = [0, 1, 2, 2] if K > 2 else [0, 0, 0, 0]
    plan = bitfold.Fold(idx, K)
    out = "float64" if dtype == "float64" else "float32"
    want = plan(vals)
    _assert_bits_equal(want, exact_fold_oracle(idx, vals, K, out), "CPU vs oracle")
    for path in ("shared", "global"):
        if path == "shared" and kernels.exact_path(K, kernels.SOURCES[dtype][1]) != "shared":
            continue  # the limbs of K float64 buckets do not fit in shared memory
        _assert_bits_equal(_fold(plan, vals, exact_path=path), want, f"GPU {path}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_exact_state_equals_cpu_limb_state(dtype):
    rng = np.random.default_rng(11)
    K = 13
    idx = rng.integers(0, K, N_TINY)
    vals = _wide_values(rng, N_TINY, np.dtype(dtype), 100 if dtype == "float64" else 40)
    vals[:3] = [-0.0, np.inf, np.nan]
    plan = bitfold.Fold(idx, K)
    cpu = plan.accumulator(dtype, kernel="limbs").add(vals)
    dev = cuda.to_device(vals)
    state = gpu.exact_state(plan, dev, launch=LAUNCHES[0])
    np.testing.assert_array_equal(state.copy_to_host(), cpu.state)
    # a second addition into the same device state, as the CPU accumulator does
    gpu.exact_state(plan, dev, state, launch=LAUNCHES[0])
    cpu.add(vals)
    np.testing.assert_array_equal(state.copy_to_host(), cpu.state)
    back = bitfold.ExactAccumulator.from_state(plan, state.copy_to_host(), dtype)
    _assert_bits_equal(back.result(), cpu.result(), "rounded device state")


def test_exact_many_launches_settle_carries():
    """Values split into launches of 97 (the carry bound lowered): same state, same bits."""
    rng = np.random.default_rng(5)
    K = 5
    idx = rng.integers(0, K, N_TINY)
    # large same-sign values in one limb: the carries are exercised
    vals = (rng.random(N_TINY) * 2.0**31 + 2.0**31).astype(np.float32)
    plan = bitfold.Fold(idx, K)
    fmt = kernels.SOURCES["float32"][1]
    state = cuda.to_device(np.zeros((K, fmt.width), np.int64))
    counts = cuda.to_device(plan.counts)
    kernels.launch_exact(
        cuda.to_device(plan.index), cuda.to_device(vals).view(np.uint32), "float32", state,
        counts, cuda.default_stream(), shape=LAUNCHES[0], chunk=97,
    )  # fmt: skip
    cpu = plan.accumulator(kernel="limbs").add(vals)
    np.testing.assert_array_equal(state.copy_to_host(), cpu.state)


def test_exact_is_the_same_for_every_launch_shape_and_run():
    rng = np.random.default_rng(9)
    K = 61
    idx = rng.integers(0, K, N_SMALL)
    vals = _wide_values(rng, N_SMALL)
    plan = bitfold.Fold(idx, K)
    shapes = [*LAUNCHES, kernels.LaunchShape(32, 1), kernels.LaunchShape(32, 5)]
    results = {_fold(plan, vals, launch=s, exact_path=p).tobytes() for s in shapes
               for p in ("shared", "global")}  # fmt: skip
    assert results == {plan(vals).tobytes()}


# -- float64 values rounded to narrower outputs, at the rounding boundaries ---------------------


@pytest.mark.parametrize("out", ["float16", "bfloat16", "float32"])
def test_float64_values_round_to_narrower_outputs_at_the_boundaries(out):
    buckets = boundary_buckets(out)
    K = len(buckets)
    idx = np.array([k for k, b in enumerate(buckets) for _ in b])
    vals = np.array([t for b in buckets for t in b], np.float64)
    perm = np.random.default_rng(len(out)).permutation(idx.size)  # interleave the buckets
    idx, vals = idx[perm], vals[perm]
    plan = bitfold.Fold(idx, K)
    want = exact_fold_oracle(idx, vals, K, out)
    _assert_bits_equal(plan(vals, out_dtype=out), want, f"CPU float64 -> {out} vs oracle")
    for path in ("shared", "global", "buckets"):
        for launch in LAUNCHES:
            got = _fold(plan, vals, out_dtype=out, launch=launch, exact_path=path)
            _assert_bits_equal(got, want, f"GPU {path} {launch} float64 -> {out}")


# -- one bucket and a skewed map, every launch shape -----------------------------------------------
SHAPES = (
    [kernels.LaunchShape(32, 1), kernels.LaunchShape(32, 3), kernels.LaunchShape(64, 2, 2),
     kernels.LaunchShape(96, 5)]
    if SIM
    else [kernels.LaunchShape(t, b, m) for t, b, m in
          [(32, 1, 1), (64, 7, 1), (256, 264, 132), (256, 1056, 132), (1024, 66, 66)]]
)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mapping", ["K=1", "zipf"])
def test_one_bucket_and_a_zipf_map_equal_the_cpu_for_every_launch_shape(mapping, dtype):
    """K = 1 (every value on one limb run) and Zipf(1.2) (a few huge buckets), all paths."""
    rng = np.random.default_rng(12)
    n = N_TINY if SIM else N_LARGE
    K = 1 if mapping == "K=1" else 40
    idx = np.zeros(n, np.int64) if K == 1 else np.minimum(rng.zipf(1.2, n) - 1, K - 1)
    vals = _wide_values(rng, n, np.dtype(dtype), spread=20)
    vals[: n // 3] = np.abs(vals[: n // 3])  # long runs of one sign, and of one limb
    vals[5:9] = [-0.0, -0.0, 0.0, -0.0]
    plan = bitfold.Fold(idx, K)
    want = plan(vals)
    _assert_bits_equal(want, exact_fold_oracle(idx, vals, K, want.dtype.name), "CPU vs oracle")
    for path in ("shared", "global", "buckets"):
        for launch in SHAPES:
            got = _fold(plan, vals, launch=launch, exact_path=path)
            _assert_bits_equal(got, want, f"GPU {path} {launch}")


# -- the shared-memory guard, the scratch state, bfloat16 bits ------------------------------------
def test_a_shared_path_that_cannot_fit_is_refused():
    fmt = kernels.SOURCES["float32"][1]
    # the device's opt-in limit (an H200: 232,448 bytes; the simulator's 48 KiB)
    limit = kernels.device_limits(cuda.get_current_device()).shared_per_block
    K = limit // kernels.shared_bytes(1, fmt) + 1
    nbytes = kernels.shared_bytes(K, fmt)
    assert nbytes > limit
    rng = np.random.default_rng(2)
    idx = rng.integers(0, K, N_TINY)
    vals = _wide_values(rng, N_TINY)
    plan = bitfold.Fold(idx, K)
    with pytest.raises(bitfold.FoldError, match=f"needs {nbytes:,} bytes .* allows {limit:,}"):
        _fold(plan, vals, exact_path="shared")
    _assert_bits_equal(_fold(plan, vals), plan(vals), "auto (the bucket kernel) vs CPU")
    state = cuda.to_device(np.zeros((K, fmt.width), np.int64))
    with pytest.raises(ValueError, match=f"needs {nbytes:,} bytes"):
        kernels.launch_exact(cuda.to_device(plan.index), cuda.to_device(vals).view(np.uint32),
                             "float32", state, cuda.to_device(plan.counts), cuda.default_stream(),
                             path="shared")  # fmt: skip


def test_a_refused_shared_memory_opt_in_falls_back_or_is_named(monkeypatch):
    """A device that offers 227 KB but whose driver refuses the opt-in (the simulator does)."""
    K = 1000
    fmt = kernels.SOURCES["float32"][1]
    nbytes = kernels.shared_bytes(K, fmt)
    assert kernels.SHARED_LIMIT_BYTES < nbytes <= 227 * 1024
    rng = np.random.default_rng(13)
    idx = rng.integers(0, K, N_TINY)
    vals = _wide_values(rng, N_TINY)
    plan = bitfold.Fold(idx, K)
    _fold(plan, vals)  # uploads the plan
    entry = plan._prepared[gpu.UploadKey(0)]
    big = dataclasses.replace(entry.limits, shared_per_block=227 * 1024)
    monkeypatch.setitem(plan._prepared, gpu.UploadKey(0), dataclasses.replace(entry, limits=big))
    kernel = kernels.exact_shared_kernel("float32")
    assert kernels.allow_dynamic_shared(kernel, (), kernels.SHARED_LIMIT_BYTES) is True
    # on the simulator the opt-in is refused: auto takes the bucket kernel, a forced shared path
    # is refused by name; on a device the opt-in is real and the shared kernel runs with 96 KB
    _assert_bits_equal(_fold(plan, vals), plan(vals), "auto")
    if SIM:
        assert kernels.allow_dynamic_shared(kernel, (), nbytes) is False
        with pytest.raises(ValueError, match=f"did not let .* use {nbytes:,} bytes"):
            _fold(plan, vals, exact_path="shared")
    else:
        _assert_bits_equal(_fold(plan, vals, exact_path="shared"), plan(vals), "shared, 96 KB")


def test_a_default_zero_fill_clears_every_element():
    """The shape-less zero fill (256 threads a block, a block per 256 elements here) and the
    small shape's grid-stride loop both clear every element, and only those."""
    for shape in (None, LAUNCHES[0]):
        host = np.arange(1, 2 * 256 + 7 + 1, dtype=np.int64)
        dev = cuda.to_device(np.concatenate([host, [-5]]))
        _launch_zero(dev[:-1], cuda.default_stream(), shape)
        got = dev.copy_to_host()
        assert not got[:-1].any() and got[-1] == -5, shape


def test_the_scratch_state_is_left_zeroed_and_a_dirty_one_is_cleaned_first():
    rng = np.random.default_rng(4)
    K = 17
    idx = rng.integers(0, K, N_TINY)
    vals = _wide_values(rng, N_TINY)
    plan = bitfold.Fold(idx, K)
    first = _fold(plan, vals, exact_path="shared")
    entry = plan._prepared[gpu.UploadKey(0)]
    (scratch,) = [b for key, b in entry.scratch.items() if key.name == "exact-state"]
    assert not scratch.dirty
    assert not scratch.array.copy_to_host().any(), "the rounding kernel leaves the state zeroed"
    # a fold interrupted between its launches leaves a dirty state: the next one zeroes it first
    scratch.array.copy_to_device(np.full(tuple(scratch.array.shape), 12345, np.int64))
    scratch.dirty = True
    _assert_bits_equal(_fold(plan, vals, exact_path="shared"), first, "after a dirty state")
    assert len(entry.scratch) == 1, "one scratch state for one plan and device"


def test_bfloat16_bits_are_decoded_in_the_kernels():
    """bfloat16 patterns read as uint16: the state and the bucket sums of the widened float32."""
    rng = np.random.default_rng(8)
    K = 11
    idx = rng.integers(0, K, N_TINY)
    raw = (_wide_values(rng, N_TINY, spread=30).view(np.uint32) >> 16).astype(np.uint16)
    raw[:5] = [0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001]  # -0, +inf, -inf, NaN, a subnormal
    idx[:5] = [0, 1, 1, 2, 3]
    widened = (raw.astype(np.uint32) << 16).view(np.float32)  # exact
    plan = bitfold.Fold(idx, K)
    cpu = plan.accumulator("float32", kernel="limbs").add(widened)
    fmt = kernels.SOURCES["bfloat16"][1]
    for path in ("shared", "global"):
        state = cuda.to_device(np.zeros((K, fmt.width), np.int64))
        kernels.launch_exact(cuda.to_device(plan.index), cuda.to_device(raw), "bfloat16", state,
                             cuda.to_device(plan.counts), cuda.default_stream(),
                             shape=LAUNCHES[0], path=path)  # fmt: skip
        np.testing.assert_array_equal(state.copy_to_host(), cpu.state, err_msg=path)
    want = plan(widened, out_dtype="bfloat16")  # the float32 holding the bfloat16 sums
    bits = cuda.to_device(raw.reshape(-1, 1))
    out = cuda.device_array((K, 1), np.int32)
    kernels.launch_buckets(bits, bits, cuda.to_device(plan.order), cuda.to_device(plan.offsets),
                           "bfloat16", "bfloat16", out, cuda.default_stream(),
                           widen_bfloat16=True)  # fmt: skip
    _assert_bits_equal(out.copy_to_host().view(np.float32).reshape(K), want, "buckets bf16")


# -- rows and large K: one thread an element ------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("strategy", ["exact", "ordered", "atomic"])
def test_rows_equal_the_cpu(strategy, dtype):
    rng = np.random.default_rng(21)
    K, n, D = 9, 120 if SIM else 5000, 3
    idx = rng.integers(0, K, n)
    spread = 8 if dtype == "float16" else 40
    vals = _wide_values(rng, n * D, np.dtype(dtype), spread).reshape(n, D)
    vals[0, 1], vals[1, 2], vals[2, 0] = np.inf, -0.0, np.nan
    idx[:3] = [4, 4, 6]
    plan = bitfold.Fold(idx, K)
    want = plan(vals, strategy)
    got = cuda_fold(plan, cuda.to_device(vals), strategy).copy_to_host()
    assert got.shape == want.shape == (K, D)
    if strategy == "atomic":
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-3, atol=1e-3)
        return
    _assert_bits_equal(got, want, f"{strategy} rows")


@pytest.mark.parametrize("out", ["float16", "bfloat16", "float64"])
def test_rows_rounded_to_other_outputs(out):
    rng = np.random.default_rng(22)
    idx = rng.integers(0, 6, 200)
    vals = _wide_values(rng, 400, np.float32, 12).reshape(200, 2)
    plan = bitfold.Fold(idx, 6)
    got = cuda_fold(plan, cuda.to_device(vals), out_dtype=out).copy_to_host()
    _assert_bits_equal(got, plan(vals, out_dtype=out), f"rows -> {out}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_scalars_into_many_buckets_take_the_bucket_kernel(dtype):
    """Above the shared-memory limbs the scalar exact fold sums each bucket in registers."""
    rng = np.random.default_rng(23)
    K = 700  # 700 buckets x 10 limbs x 8 bytes > 48 KiB: no shared path
    fmt = kernels.SOURCES[dtype][1]
    assert kernels.exact_path(K, fmt) == "global"
    idx = rng.integers(0, K, N_TINY)
    vals = _wide_values(rng, N_TINY, np.dtype(dtype), 8 if dtype == "float16" else 60)
    vals[:3] = [np.inf, -0.0, np.nan]
    plan = bitfold.Fold(idx, K)
    want = plan(vals)
    _assert_bits_equal(want, exact_fold_oracle(idx, vals, K, want.dtype.name), "CPU vs oracle")
    _assert_bits_equal(_fold(plan, vals), want, "auto (buckets)")
    _assert_bits_equal(_fold(plan, vals, exact_path="buckets"), want, "buckets")
    with pytest.raises(bitfold.FoldError, match="folds scalars only"):
        cuda_fold(plan, cuda.to_device(np.ones((plan.size, 2), np.float32)), exact_path="global")


@pytest.mark.parametrize("D", [1, 3])
def test_folding_into_an_existing_array_equals_the_cpu(D):
    rng = np.random.default_rng(25)
    K, n = 7, 90
    idx = rng.integers(0, K, n)
    vals = _wide_values(rng, n * D, np.float32, 40).reshape(n, D)
    init = _wide_values(rng, K * D, np.float32, 40).reshape(K, D)
    init[0, 0], init[1, D - 1] = np.nan, -0.0
    plan = bitfold.Fold(idx, K)
    want = dispatch.fold(plan, vals, init=init)
    got = cuda_fold(plan, cuda.to_device(vals), init=cuda.to_device(init)).copy_to_host()
    _assert_bits_equal(got, want, "init")


def test_accumulator_of_device_rows_equals_the_host():
    """Rows of CUDA values are summed in a host state (their kernels keep no state)."""
    rng = np.random.default_rng(24)
    idx = rng.integers(0, 5, 60)
    vals = _wide_values(rng, 120, np.float32, 30).reshape(60, 2)
    plan = bitfold.Fold(idx, 5)
    acc = plan.accumulator(trailing=(2,))
    acc.add(cuda.to_device(vals[:20].copy()), start=0)
    acc.add(cuda.to_device(vals[20:].copy()), start=20)
    assert acc.backend == "cuda" and isinstance(acc._state, np.ndarray)
    result = acc.result()  # the library of the first values added: a numba device array
    assert is_cuda_array(result)
    _assert_bits_equal(result.copy_to_host(), plan(vals), "device rows accumulator")


def _bits_of(result):
    """A result of any library on the host (numba device arrays copied back)."""
    if is_cuda_array(result):
        return result.copy_to_host()
    return result.numpy() if hasattr(result, "numpy") else np.asarray(result)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_cuda_accumulator_keeps_a_device_state_and_rounds_to_the_oracle(dtype):
    """Values added in pieces into a state on the device; rounded there, to the oracle's bits,
    for every output dtype; ``copy`` and ``reset`` keep the state on the device."""
    rng = np.random.default_rng(26)
    K, n = 7, 500
    idx = rng.integers(0, K, n)
    vals = _wide_values(rng, n, np.dtype(dtype), 300 if dtype == "float64" else 60)
    vals[:4] = [-0.0, np.inf, 1.0, -1.0]
    plan = bitfold.Fold(idx, K)
    acc = plan.accumulator(dtype, launch=LAUNCHES[0])
    for lo, hi in [(0, 120), (120, 121), (121, n)]:
        acc.add(cuda.to_device(vals[lo:hi]), start=lo)
    assert acc.backend == "cuda" and is_cuda_array(acc._state)
    assert acc.state.shape == (K, kernels.SOURCES[dtype][1].width)
    limbs = plan.accumulator(dtype, kernel="limbs").add(vals)  # the device kernels' counters
    np.testing.assert_array_equal(acc.state, limbs.state)
    outs = ["float64", "float32", "float16"] if dtype == "float64" else ["float32", "float16"]
    for out in [*outs, "bfloat16"]:
        got = acc.result(out)
        assert is_cuda_array(got)
        want = exact_fold_oracle(idx, vals, K, "float32" if out == "bfloat16" else out)
        if out == "bfloat16":  # float32 holding bfloat16 values, as the host gives
            want = np.asarray(plan(vals, out_dtype="bfloat16"))
        _assert_bits_equal(got.copy_to_host(), want, f"{dtype} -> {out}")
    twin = acc.copy()
    acc.reset()
    assert is_cuda_array(twin._state) and is_cuda_array(acc._state) and not acc.state.any()
    _assert_bits_equal(twin.result().copy_to_host(), plan(vals), "copy")


def test_device_states_merge_on_the_device_and_stay_carried():
    """Two CUDA accumulators merge by a kernel (add, then carry): the limbs stay below 2^32
    however many merges, and the sum rounds to the oracle's bits."""
    rng = np.random.default_rng(27)
    idx = rng.integers(0, 3, 90)
    big = np.full(90, np.finfo(np.float32).max / 8, np.float32)
    plan = bitfold.Fold(idx, 3)
    part = plan.accumulator().add(cuda.to_device(big))
    total = plan.accumulator().add(cuda.to_device(big))
    for _ in range(9):
        total.merge(part)
    assert total.backend == "cuda" and is_cuda_array(total._state)
    limbs = total.state[:, : kernels.SOURCES["float32"][1].limbs]
    assert (limbs[:, :-1] >= 0).all() and (limbs[:, :-1] < 2**32).all()
    host = plan.accumulator(kernel="limbs").add(big)  # the device kernels' counters
    for _ in range(9):
        host.merge(plan.accumulator(kernel="limbs").add(big))
    np.testing.assert_array_equal(total.state, host.state)
    _assert_bits_equal(total.result(out_dtype="float64").copy_to_host(),
                       host.result(out_dtype="float64"), "ten merged states")  # fmt: skip
    small = _wide_values(rng, 90, np.float32, 60)
    a = plan.accumulator().add(cuda.to_device(small[:40]), start=0)
    a += plan.accumulator().add(cuda.to_device(small[40:]), start=40)
    _assert_bits_equal(a.result().copy_to_host(), exact_fold_oracle(idx, small, 3), "a + b")


@pytest.mark.parametrize("other_kind", ["host", "portable"])
@pytest.mark.parametrize("receiver", ["cuda", "other"])
def test_a_cuda_accumulator_merges_with_a_host_or_portable_one_either_way(other_kind, receiver):
    """A device state and a host state (or a portable state beside CPU tensors) add, in either
    direction, to the oracle's bits; the merged state lives where the receiver's did."""
    if other_kind == "portable":
        torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(25)
    idx = rng.integers(0, 6, 400)
    vals = _wide_values(rng, 400, np.float32, 60)
    vals[7] = -0.0
    plan = bitfold.Fold(idx, 6)
    want = exact_fold_oracle(idx, vals, 6)
    gpu_acc = plan.accumulator(launch=LAUNCHES[0]).add(cuda.to_device(vals[:250]), start=0)
    if other_kind == "portable":
        other = plan.accumulator(backend="portable").add(torch.from_numpy(vals[250:]), start=250)
    else:
        other = plan.accumulator().add(vals[250:], start=250)
    assert (gpu_acc.backend, other.backend) == ("cuda", other_kind)
    into, given = (gpu_acc, other) if receiver == "cuda" else (other, gpu_acc)
    before = given.state.copy()
    into.merge(given)
    assert into.backend == ("cuda" if receiver == "cuda" else other_kind)
    assert is_cuda_array(into._state) == (receiver == "cuda")
    np.testing.assert_array_equal(given.state, before)  # the other is unchanged
    _assert_bits_equal(_bits_of(into.result()), want, f"merged into the {into.backend} one")



# -- hot buckets split across threads and blocks ----------------------------------------------
HOT_CASES = {
    # name: (positions, K, D, map)
    "K=1 rows": (700, 1, 3, "one"),
    "K=1 scalar": (900, 1, 1, "one"),
    "zipf rows": (800, 40, 2, "zipf"),
    "zipf scalars, large K": (900, 700, 1, "zipf"),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # NaN in the simulator's adds
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", sorted(HOT_CASES))
def test_hot_buckets_split_into_segments_equal_the_cpu_and_the_oracle(case, dtype):
    """Buckets longer than a segment are summed by many threads into limbs, rounded once."""
    n, K, D, mapping = HOT_CASES[case]
    rng = np.random.default_rng(31)
    idx = np.zeros(n, np.int64) if mapping == "one" else np.minimum(rng.zipf(1.3, n) - 1, K - 1)
    spread = 8 if dtype == "float16" else 30
    vals = _wide_values(rng, n * D, np.dtype(dtype), spread).reshape((n, D) if D > 1 else n)
    flat = vals.reshape(n, D)
    flat[: n // 3] = np.abs(flat[: n // 3])
    flat[3, 0], flat[4, 0], flat[5, D - 1] = -0.0, np.inf, np.nan  # in the hot bucket 0
    plan = bitfold.Fold(idx, K)
    want = plan(vals)
    if D == 1:
        _assert_bits_equal(want, exact_fold_oracle(idx, vals, K, want.dtype.name), "CPU vs oracle")
    table = kernels.hot_segment_table(plan.offsets, 16)
    assert table.hot >= 1 and table.segments > table.hot, "the case must have split buckets"
    for segment in (16, 37, n):  # split (two lengths) and whole (one thread a bucket)
        got = _fold(plan, vals, exact_path="buckets", segment=segment)
        _assert_bits_equal(got.reshape(want.shape), want, f"{case} segment={segment}")
    init = _wide_values(rng, K * D, np.dtype(dtype), spread).reshape((K, D) if D > 1 else K)
    init.reshape(K, D)[0, 0] = -0.0
    want_init = dispatch.fold(plan, vals, init=init)
    got = cuda_fold(plan, cuda.to_device(vals), init=cuda.to_device(init), segment=16)
    _assert_bits_equal(got.copy_to_host(), want_init, f"{case} init, split")


def test_a_hot_state_is_left_zeroed_and_reused():
    rng = np.random.default_rng(32)
    idx = np.zeros(500, np.int64)
    vals = _wide_values(rng, 1000).reshape(500, 2)
    plan = bitfold.Fold(idx, 1)
    first = _fold(plan, vals, segment=16)
    entry = plan._prepared[gpu.UploadKey(0)]
    (scratch,) = [b for key, b in entry.scratch.items() if key.name == "hot-state"]
    assert scratch.array.shape[0] == 2 and not scratch.array.copy_to_host().any()
    scratch.array.copy_to_device(np.full(tuple(scratch.array.shape), 7, np.int64))
    scratch.dirty = True  # an interrupted fold: the next one zeroes the state first
    _assert_bits_equal(_fold(plan, vals, segment=16), first, "after a dirty hot state")
    _assert_bits_equal(first, plan(vals), "split K=1 rows vs CPU")


def test_segment_lengths_balance_the_work_and_bound_the_state():
    W = kernels.SOURCES["float32"][1].width
    threads = 132 * 2048
    assert kernels.segment_length(10**8, 1, W, threads) == 512  # K = 1 at 10^8: 195,313 segments
    # K = 1, D = 4096 over 1,000 positions: 16 segments x 4096 columns (was 4096 threads)
    assert kernels.segment_length(1000, 4096, W, threads) == kernels.SEGMENT_MIN == 64
    assert kernels.segment_length(262_144, 64, W, threads) == 64
    assert kernels.segment_length(10, 1, W, threads) == kernels.SEGMENT_MIN
    n = 10**9
    length = kernels.segment_length(n, 64, W, threads)
    assert (n // length) * 64 * W * 8 <= kernels.HOT_STATE_BYTES
    table = kernels.hot_segment_table(np.array([0, 100, 100, 1100]), 64)
    assert table.buckets.tolist() == [0, 2] and table.starts.tolist() == [0, 2, 18]
    assert table.segment_bucket.tolist() == [0] * 2 + [1] * 16


# -- the known-answer test (bitfold.backends.selftest) --------------------------------------------
def test_the_numba_cuda_kernels_pass_their_known_answers_here():
    """The problem set the kernels meet before they first fold on a device: every value dtype
    numba arrays hold, into its default output and float16 (each path: shared, buckets, hot
    segments); a folded numba array brings the test to its device and keeps the verdict."""
    from bitfold.backends import selftest

    like = cuda.to_device(np.zeros(1, np.float32))
    pairs = [("float32", "float32"), ("float16", "float16"), ("float64", "float64"),
             ("float64", "float16")]  # fmt: skip
    with selftest.fresh():
        verdict = selftest.check(gpu.BACKEND, like, pairs, bitfold.Fold)
        assert verdict.passed, verdict.failure
        assert verdict.device == "cuda:0" and verdict.about["compiler"].startswith("numba-cuda")
        plan = bitfold.Fold(np.array([0, 1, 1]), 2)
        assert cuda_fold(plan, cuda.to_device(np.ones(3, np.float32))).copy_to_host()[1] == 2.0
        (kept,) = selftest.verdicts()
        assert (kept.backend, kept.device) == ("cuda", "cuda:0")
        assert kept.passed and kept.checked == ["float32 -> float32"]


@device_only
def test_the_known_answers_of_torch_tensors_on_the_gpu_pass_bfloat16_too():
    import torch

    from bitfold.backends import selftest
    from bitfold.backends.registry import get_backend

    like = torch.zeros(1, device="cuda")
    pairs = [("bfloat16", "bfloat16"), ("bfloat16", "float32")]
    for backend in (gpu.BACKEND, get_backend("triton")):
        verdict = selftest.check(backend, like, pairs, bitfold.Fold)
        assert verdict.passed, verdict.failure


# -- streams: scratch shared by every stream, ordered, never allocated twice -------------------
def _allocations(monkeypatch):
    """Record the shape of every device allocation the backend makes through numba (the
    folds' own: the known-answer test, which allocates its cases, is off)."""
    monkeypatch.setenv("BITFOLD_SELFTEST", "off")
    seen = []
    real_array, real_to_device = cuda.device_array, cuda.to_device

    def device_array(shape, *a, **kw):
        seen.append(("device_array", tuple(np.atleast_1d(shape))))
        return real_array(shape, *a, **kw)

    def to_device(ary, *a, **kw):
        seen.append(("to_device", np.shape(ary)))
        return real_to_device(ary, *a, **kw)

    monkeypatch.setattr(cuda, "device_array", device_array)
    monkeypatch.setattr(cuda, "to_device", to_device)
    return seen


@pytest.mark.parametrize("path", ["shared", "buckets"])
def test_a_second_fold_on_another_stream_reuses_the_scratch_after_waiting(monkeypatch, path):
    """One scratch a plan and device: a fold on stream B waits for the one on stream A and
    allocates nothing but its result, even while a capture is reported (no warm-up needed
    on B)."""
    rng = np.random.default_rng(33)
    K = 9 if path == "shared" else 1
    idx = rng.integers(0, K, 400)
    vals = _wide_values(rng, 400)
    plan = bitfold.Fold(idx, K)
    want = plan(vals)
    a, b = cuda.stream(), cuda.stream()
    first = cuda_fold(plan, cuda.to_device(vals).bind(a), exact_path=path, segment=16,
                      launch=LAUNCHES[0])  # fmt: skip
    _assert_bits_equal(first.copy_to_host(), want, "stream A")
    entry = plan._prepared[gpu.UploadKey(0)]
    (scratch,) = entry.scratch.values()
    uses, waits = scratch.uses, scratch.waits
    on_b = cuda.to_device(vals).bind(b)  # a numba array's stream is its own
    seen = _allocations(monkeypatch)
    monkeypatch.setattr(gpu, "capturing", lambda stream: True)  # as inside a graph capture
    if not SIM:  # the driver refuses external event nodes outside a real capture (H200: 401)
        wait, record = gpu._wait_event, gpu._record_event
        monkeypatch.setattr(gpu, "_wait_event", lambda st, ev, in_capture: wait(st, ev, False))
        monkeypatch.setattr(gpu, "_record_event", lambda ev, st, in_capture: record(ev, st, False))
    second = cuda_fold(plan, on_b, exact_path=path, segment=16, launch=LAUNCHES[0])
    assert seen == [("device_array", (K, 1))], f"only the result is allocated: {seen}"
    assert list(entry.scratch.values()) == [scratch], "the same scratch serves stream B"
    assert (scratch.uses, scratch.waits) == (uses + 1, waits + 1), "B waited for A's fold"
    _assert_bits_equal(second.copy_to_host(), want, "stream B")


def test_the_first_fold_of_a_plan_inside_a_capture_is_refused_by_name(monkeypatch):
    plan = bitfold.Fold(np.array([0, 1, 1]), 2)
    vals = cuda.to_device(np.ones(3, np.float32))
    monkeypatch.setattr(gpu, "capturing", lambda stream: True)
    with pytest.raises(bitfold.FoldError, match="before capturing it"):
        cuda_fold(plan, vals)
    monkeypatch.setattr(gpu, "capturing", lambda stream: False)
    assert cuda_fold(plan, vals).copy_to_host().tolist() == [1.0, 2.0]


def test_uploads_and_the_state_copy_run_on_the_values_stream(monkeypatch):
    """The plan's upload, a part's counts and the state follow the values' stream.

    The state lives on the device: adding copies nothing back; reading ``acc.state``
    copies it on the stream that wrote it (the state array is bound to it).
    """
    rng = np.random.default_rng(34)
    idx = rng.integers(0, 5, 300)
    vals = _wide_values(rng, 300)
    plan = bitfold.Fold(idx, 5)
    s = cuda.stream()
    streams = []
    real_to_device = cuda.to_device
    monkeypatch.setenv("BITFOLD_SELFTEST", "off")  # the uploads counted are the fold's own

    def to_device(ary, stream=0, **kw):
        streams.append(stream)
        return real_to_device(ary, stream=stream, **kw)

    monkeypatch.setattr(cuda, "to_device", to_device)
    acc = plan.accumulator()
    acc.add(real_to_device(vals[:100]).bind(s), start=0)  # uploads the plan, then a part's counts
    assert len(streams) == 5 and all(x is s for x in streams), streams
    assert acc.backend == "cuda" and is_cuda_array(acc._state)
    assert acc._state.stream is s, "the device state is made on the values' stream"
    copies = []
    array_type = type(acc._state)
    real_copy = array_type.copy_to_host

    def copy_to_host(self, ary=None, stream=0):
        copies.append(stream or self.stream)
        return real_copy(self, ary, stream=stream)

    monkeypatch.setattr(array_type, "copy_to_host", copy_to_host)
    acc.add(real_to_device(vals[100:]).bind(s), start=100)
    assert copies == [], "adding keeps the state on the device: nothing is copied back"
    state = acc.state
    assert copies == [s], "reading the state copies it on the stream that wrote it"
    monkeypatch.setattr(array_type, "copy_to_host", real_copy)
    rebuilt = bitfold.ExactAccumulator.from_state(plan, state)
    _assert_bits_equal(rebuilt.result(), plan(vals), "the state read on the host")
    _assert_bits_equal(acc.result().copy_to_host(), plan(vals), "accumulated on a stream")


def test_per_thread_default_streams_of_several_threads_share_one_ordered_scratch():
    import threading

    rng = np.random.default_rng(35)
    idx = rng.integers(0, 7, 300)
    vals = _wide_values(rng, 300)
    plan = bitfold.Fold(idx, 7)
    want = plan(vals)
    cuda_fold(plan, cuda.to_device(vals))  # the plan's upload and scratch
    results, errors = [], []

    def work():
        try:
            stream = cuda.per_thread_default_stream()
            for _ in range(2):
                out = cuda_fold(plan, cuda.to_device(vals).bind(stream), launch=LAUNCHES[0])
                results.append(out.copy_to_host())
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    entry = plan._prepared[gpu.UploadKey(0)]
    (scratch,) = entry.scratch.values()
    assert scratch.uses == 5 and scratch.waits >= 4, "every fold after the first waited"
    for got in results:
        _assert_bits_equal(got, want, "per-thread default stream")


# -- ordered -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dtype", "out"),
    [("float32", "float32"), ("float32", "float64"), ("float32", "float16"),
     ("float16", "float32"), ("float64", "float64"), ("float64", "float32")],
)  # fmt: skip
def test_ordered_equals_cpu_ordered_and_repeats(dtype, out):
    rng = np.random.default_rng(2)
    K = 23
    idx = rng.integers(0, K, N_SMALL)
    vals = _wide_values(rng, N_SMALL, np.dtype(dtype), 8 if "float16" in (dtype, out) else 30)
    plan = bitfold.Fold(idx, K)
    want = plan(vals, "ordered", out_dtype=out)
    if out != "float16" or dtype != "float16":
        _assert_bits_equal(want, ordered_fold_reference(idx, vals, K, out), "CPU vs reference")
    first = _fold(plan, vals, "ordered", out)
    _assert_bits_equal(first, want, "GPU ordered vs CPU ordered")
    _assert_bits_equal(_fold(plan, vals, "ordered", out), first, "second run")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator adds in NumPy scalars
def test_ordered_specials_and_canonical_nan():
    idx = np.array([0, 0, 1, 1, 2, 2, 3, 4, 4, 5])
    vals = np.array(
        [np.inf, -np.inf, np.nan, 1.0, -0.0, -0.0, 2.0**-149, 3.4e38, 3.4e38, -0.0], np.float32
    )
    plan = bitfold.Fold(idx, 7)
    got = _fold(plan, vals, "ordered")
    want = plan(vals, "ordered")
    nan = np.isnan(want)
    assert list(np.flatnonzero(nan)) == [0, 1]
    assert np.array_equal(np.isnan(got), nan)
    assert set(_bits(got)[nan].tolist()) == {bitfold.CANONICAL_NAN_BITS["float32"]}
    _assert_bits_equal(got[~nan], want[~nan], "non-NaN buckets")


# -- atomic ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("out", ["float32", "float64", "float16"])
def test_atomic_is_close_to_a_float64_reference(out):
    rng = np.random.default_rng(4)
    K = 17
    idx = rng.integers(0, K, N_SMALL)
    vals = rng.standard_normal(N_SMALL).astype(np.float32)
    plan = bitfold.Fold(idx, K)
    ref = np.zeros(K)
    np.add.at(ref, idx, vals.astype(np.float64))
    got = _fold(plan, vals, "atomic", out, launch=LAUNCHES[0])
    assert got.dtype == np.dtype(out)
    tol = {"float16": 2e-2, "float32": 1e-4, "float64": 1e-12}[out]
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


# -- every strategy: empty inputs, the plan cache, refusals --------------------------------------
@pytest.mark.parametrize("strategy", bitfold.strategies())
def test_empty_plan_gives_positive_zeros(strategy):
    plan = bitfold.Fold(np.zeros(0, np.int64), 3)
    got = _fold(plan, np.zeros(0, np.float32), strategy)
    _assert_bits_equal(got, np.zeros(3, np.float32), strategy)


def test_plan_data_is_uploaded_once_per_device():
    plan = bitfold.Fold(np.array([0, 1, 1]), 2)
    vals = cuda.to_device(np.ones(3, np.float32))
    cuda_fold(plan, vals)
    entry = plan._prepared[gpu.UploadKey(0)]
    cuda_fold(plan, vals, "ordered")
    cuda_fold(plan, vals, "atomic")
    assert plan._prepared[gpu.UploadKey(0)] is entry
    np.testing.assert_array_equal(entry.index.copy_to_host(), plan.index)


def test_is_device_array_tells_gpu_values_from_host_values():
    assert is_cuda_array(cuda.to_device(np.ones(3, np.float32)))
    assert not is_cuda_array(np.ones(3, np.float32))
    assert not is_cuda_array([1.0, 2.0])


def test_refusals_name_the_problem():
    plan = bitfold.Fold(np.array([0, 1, 1]), 2)
    with pytest.raises(bitfold.DeviceError, match="CUDA device"):
        gpu.device_values(np.ones(3, np.float32))
    with pytest.raises(bitfold.ShapeError, match="4 elements"):
        cuda_fold(plan, cuda.to_device(np.ones(4, np.float32)))
    with pytest.raises(bitfold.FoldTypeError, match="int32"):
        cuda_fold(plan, cuda.to_device(np.ones(3, np.int32)))
    with pytest.raises(bitfold.UnknownStrategyError, match="exact, atomic, ordered"):
        cuda_fold(plan, cuda.to_device(np.ones(3, np.float32)), "fastest")
    with pytest.raises(bitfold.FoldTypeError, match="bfloat16"):
        cuda_fold(plan, cuda.to_device(np.ones(3, np.float32)), "ordered", "bfloat16")
    with pytest.raises(bitfold.FoldError, match="contiguous"):
        cuda_fold(plan, cuda.to_device(np.ones(6, np.float32))[::2])
    with pytest.raises(bitfold.ShapeError, match="int64 with shape"):
        gpu.exact_state(
            plan, cuda.to_device(np.ones(3, np.float32)), cuda.to_device(np.zeros((2, 3)))
        )


def test_a_transposed_gradient_is_refused_on_the_device():
    plan = bitfold.Fold(np.zeros((2, 3), np.int64), 1)
    with pytest.raises(bitfold.ShapeError, match=r"shape \(3, 2\) but the index has shape"):
        cuda_fold(plan, cuda.to_device(np.ones((3, 2), np.float32)))
    with pytest.raises(bitfold.ShapeError, match=r"shape \(3, 2\) but the index has shape"):
        plan.accumulator().add(cuda.to_device(np.ones((3, 2), np.float32)))
    assert cuda_fold(plan, cuda.to_device(np.ones((2, 3), np.float32))).copy_to_host()[0] == 6.0


def test_a_state_or_cached_plan_on_another_device_is_refused(monkeypatch):
    plan = bitfold.Fold(np.array([0, 1, 1]), 2)
    vals = cuda.to_device(np.ones(3, np.float32))
    state = gpu.exact_state(plan, vals)
    real = gpu.device_values_of_state
    monkeypatch.setattr(
        gpu, "device_values_of_state", lambda s: gpu._StateView(1, real(s).array)
    )
    with pytest.raises(bitfold.DeviceError, match="state lives on CUDA device 1"):
        gpu.exact_state(plan, vals, state)
    entry = plan._prepared[gpu.UploadKey(0)]
    monkeypatch.setitem(
        plan._prepared, gpu.UploadKey(0), dataclasses.replace(entry, device=1)
    )
    with pytest.raises(bitfold.DeviceError, match="cached for CUDA device 1"):
        cuda_fold(plan, vals)


# -- a real GPU only: foreign arrays, streams, graphs, the hashed layer's size ---------------------
@device_only
def test_seed_configuration_exact_equals_cpu():
    rng = np.random.default_rng(0)
    K, N = 433, 768 * 4096
    idx = rng.integers(0, K, N)
    vals = (rng.standard_normal(N) * 1e-3).astype(np.float32)
    plan = bitfold.Fold(idx, K)
    want = plan(vals)
    for path in ("shared", "global"):
        _assert_bits_equal(_fold(plan, vals, exact_path=path), want, path)
    _assert_bits_equal(_fold(plan, vals, "ordered"), plan(vals, "ordered"), "ordered")


@device_only
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_cuda_tensors_in_and_out(dtype):
    torch = pytest.importorskip("torch", reason="torch is needed for torch CUDA tensors")
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA: " + NEEDS_DEVICE)
    rng = np.random.default_rng(1)
    K = 433
    idx = rng.integers(0, K, 50000)
    plan = bitfold.Fold(idx, K)
    host = torch.from_numpy(_wide_values(rng, 50000, np.float32, 10)).to(getattr(torch, dtype))
    dev = host.cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # kernels must follow torch's current stream
        got = cuda_fold(plan, dev)
        got_bf = cuda_fold(plan, dev, out_dtype="bfloat16")
    stream.synchronize()
    want = plan(host)
    assert got.is_cuda and got.device == dev.device and got.dtype == want.dtype
    _assert_bits_equal(got.cpu().numpy(), want.numpy(), f"torch {dtype}")
    want_bf = plan(host, out_dtype="bfloat16")
    assert got_bf.dtype == torch.bfloat16 == want_bf.dtype
    assert torch.equal(got_bf.cpu().view(torch.int16), want_bf.view(torch.int16))
    strided = torch.stack([dev, dev], 1)[:, 0]  # non-contiguous
    _assert_bits_equal(cuda_fold(plan, strided).cpu().numpy(), want.numpy(), "strided")
    # the one dispatch folds a CPU tensor on the host; the CUDA backend itself refuses it
    with pytest.raises(bitfold.DeviceError, match=r"cuda backend does not fold .* device 'cpu'"):
        cuda_fold(plan, host, backend="cuda")


@device_only
def test_exact_mode_reuses_the_plan_of_a_cuda_index_and_never_a_stale_one():
    """bitfold.torch's plan cache on a device: a CUDA index met a third time hits (checked with
    ``torch.equal`` on the device), one changed in place gets a new plan; bits against the
    oracle each time."""
    torch = pytest.importorskip("torch", reason="torch is needed for torch CUDA tensors")
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA: " + NEEDS_DEVICE)
    import bitfold.torch as bt
    from bitfold.torch import plan_cache

    rng = np.random.default_rng(8)
    K, n = 433, 50000
    idx = torch.from_numpy(rng.integers(0, K, n)).cuda()
    vals = _wide_values(rng, n)
    dev_vals = torch.from_numpy(vals).cuda()
    bt.clear_plan_cache()
    for step in range(4):  # met, kept, reused, changed in place
        if step == 3:
            idx[17] = (idx[17] + 1) % K  # in place, same data pointer
        hits = plan_cache.PLANS.hits
        with bt.exact_mode():
            got = torch.zeros(K, device="cuda").index_add_(0, idx, dev_vals)
        assert plan_cache.PLANS.hits == hits + (step == 2), f"step {step}"
        want = exact_fold_oracle(idx.cpu().numpy(), vals, K)
        _assert_bits_equal(got.cpu().numpy(), want, f"step {step}")
    bt.clear_plan_cache()


@device_only
def test_cupy_arrays_in_and_out():
    cupy = pytest.importorskip("cupy", reason="CuPy is needed for CuPy arrays")
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 433, 50000)
    vals = _wide_values(rng, 50000)
    plan = bitfold.Fold(idx, 433)
    for strategy in bitfold.strategies():
        got = cuda_fold(plan, cupy.asarray(vals), strategy)
        assert isinstance(got, cupy.ndarray)
        if strategy != "atomic":
            _assert_bits_equal(cupy.asnumpy(got), plan(vals, strategy), strategy)


@device_only
def test_cuda_graph_capture_replays_the_same_bits():
    torch = pytest.importorskip("torch", reason="torch is needed for CUDA graphs")
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA: " + NEEDS_DEVICE)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 433, 100000)
    plan = bitfold.Fold(idx, 433)
    host = _wide_values(rng, 100000)
    static = torch.from_numpy(host).cuda()
    cuda_fold(plan, static)  # warm-up: compiles and uploads outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = cuda_fold(plan, static)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    _assert_bits_equal(out.cpu().numpy(), plan(host), "graph replay")
    new = _wide_values(rng, 100000)
    static.copy_(torch.from_numpy(new))
    graph.replay()
    torch.cuda.synchronize()
    _assert_bits_equal(out.cpu().numpy(), plan(new), "graph replay with new values")
