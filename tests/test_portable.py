"""The portable backend on the CPU: the very code a device runs, bit for bit against the oracle.

``plan(values, backend="portable")`` folds torch tensors (and NumPy arrays,
when forced) with the array family's operations only. Compared bitwise with
the Fraction oracle (hypothesis: every dtype, rows, special values, empty
input, K = 1, large K at small N, out_dtype, init) and with the host path;
a torch fold traces with fake tensors to ATen ops and compiles with
``fullgraph=True``; states merge across backends; routing picks it where
the kernels do not serve.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle import exact_fold_oracle, ordered_fold_reference

import bitfold
from bitfold import arrays, dispatch
from bitfold.backends import cuda, host, portable, portable_torch, triton
from bitfold.backends.portable import digits, narrow, paths, shared_unit, states
from bitfold.backends.portable.terms import NARROW, Terms
from bitfold.formats import FLOATS, limb_format_for
from bitfold.validate import check_values

torch = pytest.importorskip("torch", reason="the portable path is tested through torch")

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 2.0**-149, -(2.0**-149), 2.0**-1074, 3.0e38,
            -3.0e38, 1.7e308, 65504.0, 1.0, 2.0**-24, 2.0**-80]  # fmt: skip


def _bits(x, out):
    """Bit patterns of a result (torch or NumPy); bfloat16 as the float32 holding it."""
    if isinstance(x, torch.Tensor):
        x = x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
    x = np.asarray(x)
    if out == "bfloat16":
        return x.astype(np.float32).view(np.uint32)
    return x.view(UINT[x.dtype.itemsize])


def _as(values64, dtype):
    """float64 test values as a torch tensor of ``dtype`` and the float64 values it holds."""
    t = torch.from_numpy(values64).to(getattr(torch, dtype))
    return t, t.double().numpy()


def _oracle(index, held, K, out, init=None):
    """The oracle per trailing column: (K, D) bits; ``init`` (K, D) adds one term a bucket."""
    D = held.shape[1]
    cols = []
    for d in range(D):
        idx, vals = index, held[:, d]
        if init is not None:
            idx, vals = np.concatenate([index, np.arange(K)]), np.concatenate([vals, init[:, d]])
        cols.append(exact_fold_oracle(idx, vals, K, out))
    return _bits(np.stack(cols, axis=1) if cols else np.zeros((K, 0), np.float32), out)


finite_or_special = st.one_of(
    st.sampled_from(SPECIALS),
    st.builds(lambda m, e: m * 2.0**e, st.floats(-2, 2, allow_nan=False), st.integers(-160, 140)),
)


@st.composite
def folds(draw):
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32", "float64"]))
    K = draw(st.one_of(st.integers(1, 6), st.integers(1000, 5000)))
    n = draw(st.integers(0, 40))
    D = draw(st.sampled_from([None, 1, 3]))
    shape = (n,) if D is None else (n, D)
    values = np.array(draw(st.lists(finite_or_special, min_size=n * (D or 1),
                                    max_size=n * (D or 1))), np.float64).reshape(shape)  # fmt: skip
    index = np.array(draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n)), np.int64)
    outs = ["float32", "float16", "bfloat16"] + (["float64"] if dtype == "float64" else [])
    out = draw(st.sampled_from([None, *outs, "float64"]))
    with_init = draw(st.booleans())
    return dtype, K, index, values, out, with_init


@given(folds())
def test_portable_exact_against_the_oracle(case):
    dtype, K, index, values, out, with_init = case
    with np.errstate(over="ignore"):
        t, held = _as(values, dtype)
    plan = bitfold.Fold(index, K)
    D = int(np.prod(t.shape[1:], dtype=np.int64))
    init = init_held = None
    if with_init:
        start = np.linspace(-3, 3, K * D)
        start[:3] = [-0.0, 2.0**-30, 1e4][: start.size]
        init, init_held = _as(start.reshape((K, *t.shape[1:])), dtype)
    got = (
        plan(t, backend="portable", out_dtype=out)
        if init is None
        else dispatch.fold(plan, t, out_dtype=out, init=init, backend="portable")
    )
    out_name = bitfold.formats.resolve_out_dtype(dtype, out if init is None or out else dtype)
    assert got.shape == (K, *t.shape[1:])
    rows = held.reshape(len(index), D)
    start = None if init_held is None else init_held.reshape(K, D)
    want = _oracle(index, rows, K, out_name, start)
    assert np.array_equal(_bits(got, out_name).reshape(K, -1), want)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(5000,), (600, 4)])
def test_portable_is_the_host_path_bit_for_bit(dtype, shape):
    rng = np.random.default_rng(3)
    K = 97
    values = (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape)).astype(dtype)
    values.reshape(-1)[:7] = [np.nan, np.inf, -0.0, 0.0, 1e-30, -np.inf, 2.0**-24]
    plan = bitfold.Fold(rng.integers(0, K, shape[0]), K)
    for out in (None, "float16", "bfloat16"):
        want = plan(values, out_dtype=out)
        with warnings.catch_warnings():  # NaN and infinity are not the user's mistake here
            warnings.simplefilter("error")
            got_np = plan(values, backend="portable", out_dtype=out)  # the NumPy family
        got_t = plan(torch.from_numpy(values), backend="portable", out_dtype=out)
        name = bitfold.formats.resolve_out_dtype(dtype, out)
        assert np.array_equal(_bits(got_np, name), _bits(want, name))
        assert np.array_equal(_bits(got_t, name), _bits(want, name))


# -- the narrow path: one int64 word a value, where every bucket fits one -----------------------
narrow_values = st.builds(lambda s, m, e: s * m * 2.0**e, st.sampled_from([1, -1]),
                          st.floats(1, 2, exclude_max=True), st.integers(-12, 12))  # fmt: skip


@st.composite
def narrow_folds(draw):
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float32"]))
    K = draw(st.integers(1, 6))
    n = draw(st.integers(0, 40))
    D = draw(st.sampled_from([None, 3]))
    shape = (n,) if D is None else (n, D)
    pool = st.one_of(narrow_values, st.sampled_from([0.0, -0.0, 1.0, -1.0]))
    values = np.array(draw(st.lists(pool, min_size=n * (D or 1), max_size=n * (D or 1))),
                      np.float64).reshape(shape)  # fmt: skip
    index = np.array(draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n)), np.int64)
    out = draw(st.sampled_from([None, "float32", "float16", "bfloat16", "float64"]))
    return dtype, K, index, values, out, draw(st.booleans()), draw(st.booleans())


@given(narrow_folds())
def test_the_narrow_path_against_the_oracle(case):
    """Values whose buckets fit one word (no special, span within 63 bits) take the narrow path,
    with words scaled in float64 or shifted as integers: the oracle's bits either way; -0.0
    buckets, zero sums, empty buckets and an init included."""
    dtype, K, index, values, out, with_init, scaled = case
    t, held = _as(values, dtype)
    plan = bitfold.Fold(index, K)
    D = int(np.prod(t.shape[1:], dtype=np.int64))
    start = np.linspace(-3, 3, K * D).reshape((K, *t.shape[1:]))
    start.reshape(-1)[:1] = -0.0
    init, init_held = _as(start, dtype) if with_init else (None, None)
    groups = [(torch.from_numpy(index), t, dtype)]
    counts = torch.from_numpy(np.bincount(index, minlength=K).astype(np.int64) + with_init)
    shape = (K,) if D == 1 and t.ndim == 1 else (K, D)
    if init is not None:
        groups.append((torch.arange(K), init.reshape(shape), dtype))
    out_name = bitfold.formats.resolve_out_dtype(dtype, out)
    fmt = limb_format_for(dtype)
    flat_counts = counts.repeat_interleave(D)
    counts = counts.reshape(-1, *([1] * (len(shape) - 1))).expand(shape).contiguous()
    groups = [(i, v.reshape((-1, *shape[1:])), d) for i, v, d in groups]
    terms = Terms(arrays.family_of(t), t, fmt, shape, groups)
    got, bad = narrow.narrow_fold(terms, counts, out_name, scaled=scaled)
    assert not bool(bad)
    rows = held.reshape(len(index), D)
    want = _oracle(index, rows, K, out_name, None if init is None else init_held.reshape(K, D))
    assert np.array_equal(_bits(got, out_name).reshape(K, -1), want)
    # the fold itself takes the same path: same bits
    via = _exact_sums(t, index, K, out_name, init=init, scaled=scaled, counts=flat_counts)
    assert np.array_equal(_bits(via, out_name).reshape(K, -1), want)
    if scaled:  # the default where the library scales exactly (float64 on the CPU)
        kw = {} if init is None else {"init": init}
        via = dispatch.fold(plan, t, out_dtype=out_name, backend="portable", **kw)
        assert np.array_equal(_bits(via, out_name).reshape(K, -1), want)


def _exact_sums(t, index, K, out_name, *, init=None, counts=None, **kw):
    """:func:`paths.exact_sums` of torch values ``t`` by the host ``index`` ((K·D,) flat),
    ``kw`` its keywords (``words``, ``scaled``); ``counts``, the flat counts, from ``index``."""
    D = int(np.prod(t.shape[1:], dtype=np.int64))
    word = kw["words"].word if "words" in kw else "int64"
    if counts is None:
        counts = torch.from_numpy(np.repeat(np.bincount(index, minlength=K), D))
    bound = max(int(counts.max()) if counts.numel() else 0, 1)
    ops = arrays.family_of(t)
    index_t = torch.from_numpy(np.asarray(index).astype(word))
    counts = counts.to(getattr(torch, word))
    return paths.exact_sums(ops, t, index_t, counts, init, K, D, bound, out_name, **kw)


@pytest.mark.parametrize("scaled", [True, False])
def test_the_narrow_path_flags_what_it_cannot_hold(scaled):
    """A bucket spanning more than a word, a NaN, an infinity (and, scaled, a subnormal) set the
    flag; the fold then takes the digit path and gives the oracle's bits."""
    index = np.array([0, 0, 1, 1, 2])
    for odd in [2.0**-70, np.nan, np.inf, 1e-40]:
        values = np.array([1.0 if odd != 1e-40 else 3e-40, odd, 3.0, 1.5, -2.0], np.float32)
        t = torch.from_numpy(values)
        counts = torch.from_numpy(np.bincount(index, minlength=3).astype(np.int64))
        terms = Terms(arrays.family_of(t), t, limb_format_for("float32"), (3,),
                               [(torch.from_numpy(index), t, "float32")])  # fmt: skip
        _, bad = narrow.narrow_fold(terms, counts, "float32", scaled=scaled)
        assert bool(bad) == (scaled or odd != 1e-40)
        want = exact_fold_oracle(index, values.astype(np.float64), 3)
        got = _exact_sums(t, index, 3, "float32", scaled=scaled)
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
        got = bitfold.Fold(index, 3)(t, backend="portable")
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))


# -- the shared-unit path: one unit for every element, where every term is a multiple of it ----
def _shared(t, index, K, dtype, bound=None):
    """(unit, serves) of :func:`shared_unit.shared_unit_plan` for one group of values."""
    shape = (K,) if t.ndim == 1 else (K, t.shape[1])
    groups = [(torch.from_numpy(index), t, dtype)]
    bound = int(np.bincount(index, minlength=K).max()) if bound is None else bound
    layout = shared_unit.shared_words("int64", bound)
    terms = Terms(arrays.family_of(t), t, limb_format_for(dtype), shape, groups)
    unit, good = shared_unit.shared_unit_plan(terms, layout)
    return int(unit), bool(good)


@given(narrow_folds())
def test_the_shared_unit_path_against_the_oracle(case):
    """Values of a few binary orders share one unit: the fold takes the shared-unit path
    (checked) and gives the oracle's bits: -0.0 buckets, zero sums, empty buckets, an init."""
    dtype, K, index, values, out, with_init, _ = case
    t, held = _as(values, dtype)
    D = int(np.prod(t.shape[1:], dtype=np.int64))
    if len(index):
        assert _shared(t, index, K, dtype)[1]
    start = np.linspace(-3, 3, K * D).reshape((K, *t.shape[1:]))
    start.reshape(-1)[:1] = -0.0
    init, init_held = _as(start, dtype) if with_init else (None, None)
    out_name = bitfold.formats.resolve_out_dtype(dtype, out)
    kw = {} if init is None else {"init": init}
    got = dispatch.fold(bitfold.Fold(index, K), t, out_dtype=out_name, backend="portable", **kw)
    rows = held.reshape(len(index), D)
    want = _oracle(index, rows, K, out_name, None if init is None else init_held.reshape(K, D))
    assert np.array_equal(_bits(got, out_name).reshape(K, -1), want)


@given(narrow_folds(), st.sampled_from([1, 40_000]))
def test_the_shared_unit_in_int32_digits_against_the_oracle(case, bound):
    """JAX's 32-bit mode has no int64: the shared unit cuts each term into 16-bit digits (8-bit
    past 2^15 terms an element), one int32 column each, rounded by the digit tables' rounding:
    the oracle's bits (here with torch tensors and int32 words; no float64 results, which need
    x64 in JAX)."""
    dtype, K, index, values, out, _, _ = case
    t, held = _as(values, dtype)
    D = int(np.prod(t.shape[1:], dtype=np.int64))
    shape = (K,) if t.ndim == 1 else (K, D)
    bound = max(bound, int(np.bincount(index, minlength=K).max(initial=0)))
    layout = shared_unit.shared_words("int32", bound)
    assert layout.digit_bits == (16 if bound < 2**15 else 8)
    ops, fmt = arrays.family_of(t), limb_format_for(dtype)
    groups = [(torch.from_numpy(index.astype(np.int32)), t, dtype)]
    terms = Terms(ops, t, fmt, shape, groups)
    unit, good = shared_unit.shared_unit_plan(terms, layout)
    assert unit.dtype == torch.int32 and (bool(good) or not len(index))
    counts = torch.from_numpy(np.bincount(index, minlength=K).astype(np.int32))
    counts = counts.reshape(-1, *([1] * (len(shape) - 1))).expand(shape).contiguous()
    out_name = bitfold.formats.resolve_out_dtype(dtype, "float32" if out == "float64" else out)
    got, _ = shared_unit.shared_unit_fold(terms, counts, unit, layout, out_name)
    want = _oracle(index, held.reshape(len(index), D), K, out_name)
    assert np.array_equal(_bits(got, out_name).reshape(K, -1), want)


def test_the_shared_unit_serves_down_to_its_last_bit_and_not_one_below():
    """Two terms of 2^20 in a bucket: the unit is 2^(20 + 1 + 2 - 63) = 2^-40 (float32 units:
    -40 + 149 = 109). A term whose last significand bit is 2^-40 fits; one at 2^-41 does not,
    and the fold then takes the per-element path, still the oracle's bits. So do a NaN, an
    infinity and a subnormal term."""
    index = np.array([0, 0, 1])
    for least, serves in [(2.0**-17, True), (2.0**-18, False), (1e-40, False), (np.nan, False),
                          (np.inf, False)]:  # fmt: skip
        values = np.array([2.0**20, -(2.0**20), least * 1.5], np.float32)  # 1.5: two bits
        t = torch.from_numpy(values)
        unit, good = _shared(t, index, 2, "float32")
        assert good == serves, least
        if least == 2.0**-17:
            assert unit == 109
        got = bitfold.Fold(index, 2)(t, backend="portable")
        want = exact_fold_oracle(index, values.astype(np.float64), 2)
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))


@st.composite
def word_sums(draw):
    """int64 sums of one unit, rounded halfway cases and their neighbours included."""
    out = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    exponent = draw(st.integers(-190, 110))
    sums = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["any", "tie", "small"]))
        if kind == "any":
            v = draw(st.integers(-(2**62), 2**62))
        elif kind == "small":
            v = draw(st.integers(-(2**30), 2**30))
        else:  # a halfway case between two results, give or take one unit
            keep = FLOATS[out].precision
            top = draw(st.integers(keep + 1, 62))
            v = (draw(st.integers(2 ** (keep - 1), 2**keep - 1)) * 2 + 1) << (top - keep - 1)
            v = (v + draw(st.sampled_from([-1, 0, 1]))) * draw(st.sampled_from([1, -1]))
        sums.append(v)
    return out, exponent, sums


@given(word_sums())
def test_rounding_one_word_by_floats_is_the_integer_rounding(case):
    """:func:`shared_unit.round_words` (round to odd, then one float conversion) gives the bits of
    :func:`digits.round_table` (integer operations, checked against the oracle) wherever it
    does not flag a result below the normal range."""
    out, exponent, sums = case
    fmt = limb_format_for("float32")
    s = torch.tensor(sums, dtype=torch.int64)
    ops = arrays.family_of(s)
    counts = torch.ones_like(s)
    zero = s - s
    got, tiny = shared_unit.round_words(ops, s, torch.tensor(exponent), zero != 0, out)
    cols = [s & ((1 << 32) - 1), s >> 32, counts, counts, zero, zero, zero]
    want = digits.round_table(ops, torch.stack(cols, 1), NARROW, fmt, out,
                                shift=zero + (exponent - fmt.unit_exp))  # fmt: skip
    if not bool(tiny):
        assert _bits(got, out).tolist() == _bits(want, out).tolist()
    else:
        normal = FLOATS[out].subnormal_exp + FLOATS[out].precision - 1
        assert min(abs(v) for v in sums if v) < 2.0 ** (normal - exponent + 2)


@pytest.mark.parametrize("family", ["torch", "numpy"])
def test_the_shared_unit_path_finds_buckets_of_only_minus_zero(family):
    """A bucket whose sum is zero is -0.0 only when every term is -0.0: looked at by a second
    scatter only when some sum is zero (here: cancellation, -0.0 only, +0.0 and -0.0, empty)."""
    index = np.array([0, 0, 1, 1, 2, 2, 4, 4])
    values = np.array([1.5, -1.5, -0.0, -0.0, 0.0, -0.0, 2.0, 0.25], np.float32)
    v = torch.from_numpy(values) if family == "torch" else values
    assert _shared(torch.from_numpy(values), index, 5, "float32")[1]
    got = np.asarray(bitfold.Fold(index, 5)(v, backend="portable"))
    want = exact_fold_oracle(index, values.astype(np.float64), 5)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.signbit(got).tolist() == [False, True, False, False, False]


@pytest.mark.parametrize("strategy", ["ordered", "atomic"])
def test_ordered_and_atomic(strategy):
    rng = np.random.default_rng(4)
    values = rng.standard_normal(300).astype(np.float32)
    values[5] = np.nan
    index = rng.integers(0, 13, 300)
    plan = bitfold.Fold(index, 13)
    got = plan(torch.from_numpy(values), strategy, backend="portable").numpy()
    if strategy == "ordered":  # the host's documented order, bit for bit
        want = ordered_fold_reference(index, values, 13)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    else:
        want = exact_fold_oracle(index, values.astype(np.float64), 13)
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-5)
        assert np.isnan(got[~ok]).all()


def test_expand_and_refusals():
    plan = bitfold.Fold(np.array([[0, 2], [1, 2]]), 3)
    v = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(
        dispatch.expand(plan, v, backend="portable"), v[torch.tensor([[0, 2], [1, 2]])]
    )
    with pytest.raises(bitfold.FoldError, match=r"takes no option route=; valid options: none"):
        dispatch.fold(plan, torch.ones(2, 2), backend="portable", route="limbs")
    with pytest.raises(bitfold.FoldError, match="host, triton, cuda, portable"):
        plan(torch.ones(2, 2), backend="tpu")


def test_chunked_carries_give_the_same_bits():
    """More additions than a word absorbs are taken in chunks with a carry between them; where
    no word can get that many (3 terms a bucket here), many more positions than that go in one
    pass."""
    rng = np.random.default_rng(8)
    values = (rng.standard_normal(3000) * 2.0 ** rng.integers(-100, 100, 3000)).astype(np.float32)
    fmt = limb_format_for("float32")
    few, many = rng.integers(0, 3, 3000), np.arange(3000) % 1000
    for int64, index in [(True, few), (False, few), (True, many), (False, many)]:
        K = int(index.max()) + 1
        want = bitfold.Fold(index, K)(values)
        w = digits.words_for(fmt, int64, 1)
        tiny = digits.Words(w.word, w.word_bits, 8 if not int64 else 32,
                              fmt.limbs * 32 // (8 if not int64 else 32), 7)  # fmt: skip
        got = _exact_sums(torch.from_numpy(values), index, K, "float32", words=tiny)
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))


# -- no host synchronisation: fake tensors, torch.compile ---------------------------------------
def _fold_fn(plan, **kw):
    return lambda x: dispatch.fold(plan, x, backend="portable", **kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_a_torch_fold_traces_with_fake_tensors_to_aten_ops(dtype):
    from torch.fx.experimental.proxy_tensor import make_fx

    rng = np.random.default_rng(9)
    plan = bitfold.Fold(rng.integers(0, 11, 64), 11)
    x = torch.from_numpy(rng.standard_normal((64, 2))).to(getattr(torch, dtype))
    gm = make_fx(_fold_fn(plan), tracing_mode="fake")(x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets and all(isinstance(t, torch._ops.OpOverload) for t in targets)
    names = {str(t) for t in targets}
    assert all(n.startswith("aten.") for n in names)
    assert not names & {"aten._local_scalar_dense.default", "aten.nonzero.default"}  # .item()
    bits = torch.int64 if dtype == "float64" else torch.int32  # bfloat16 values: float32 sums
    assert torch.equal(gm(x).view(bits), _fold_fn(plan)(x).view(bits))


def test_a_torch_fold_compiles_with_fullgraph():
    rng = np.random.default_rng(10)
    plan = bitfold.Fold(rng.integers(0, 7, 40), 7)
    x = torch.from_numpy(rng.standard_normal((40, 3)).astype(np.float32))
    x[0, 0] = float("nan")
    fold = _fold_fn(plan)
    fold(x)  # the plan meets the device once, eagerly (its constants are kept)
    compiled = torch.compile(fold, fullgraph=True)
    for trial in range(2):
        y = x * (trial + 1)
        assert torch.equal(compiled(y).view(torch.int32),
                           torch.from_numpy(plan(y.numpy())).view(torch.int32))  # fmt: skip


def test_a_compiled_cpu_fold_takes_the_shared_unit_in_the_graph_and_the_eager_fold_else(
    monkeypatch,
):
    """Under ``torch.compile`` a CPU fold sums by the shared unit inside the graph; where the unit
    does not serve (a wide span, a NaN, a subnormal) or a sum is zero (its sign needs the
    terms), one operator makes the eager fold. Every result is the host's bits; the eager fold
    runs only for the inputs that need it."""
    rng = np.random.default_rng(11)
    index = rng.integers(0, 8, 64)
    index[:2] = 8  # bucket 8: the two terms below, alone
    plan = bitfold.Fold(index, 9)
    base = rng.standard_normal((64, 2)).astype(np.float32)
    base[:2] = 1.0
    eager_folds = []
    fold = _fold_fn(plan)
    fold(torch.from_numpy(base))  # the plan meets the device once, eagerly
    real = portable_torch._EAGER_FOLD[0]  # the fold the operator makes where the graph's fails

    def counted(*args):
        eager_folds.append(1)
        return real(*args)

    monkeypatch.setattr(portable_torch, "_EAGER_FOLD", [counted])
    compiled = torch.compile(fold, fullgraph=True)
    cases = {"normal": (None, False), "wide": (2.0**-90, True), "nan": (np.nan, True),
             "subnormal": (1e-41, True), "cancel": (-1.0, True),
             "minus zero": (-0.0, True)}  # fmt: skip
    for name, (odd, redo) in cases.items():
        values = base.copy()
        if odd is not None:
            values[0, 0] = odd
            values[1, 0] = -0.0 if odd == -0.0 else values[1, 0]
        eager_folds.clear()
        got = compiled(torch.from_numpy(values))
        assert np.array_equal(got.numpy().view(np.uint32), plan(values).view(np.uint32)), name
        assert bool(eager_folds) == redo, name


# -- states across backends ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_device_states_merge_with_host_states(dtype):
    rng = np.random.default_rng(11)
    index = rng.integers(0, 9, 200)
    plan = bitfold.Fold(index, 9)
    values = (rng.standard_normal(200) * 2.0 ** rng.integers(-200, 200, 200)).astype(dtype)
    t = torch.from_numpy(values)
    fmt = limb_format_for(dtype)
    spec = check_values(plan.shape, (200,), dtype)
    device_state = states.exact_state(plan, t, spec, fmt)
    assert device_state.dtype == torch.int64 and tuple(device_state.shape) == (9, fmt.width)
    host_acc = plan.accumulator(dtype).add(values)
    merged = bitfold.ExactAccumulator.from_state(plan, device_state.numpy(), dtype).merge(host_acc)
    want = exact_fold_oracle(np.concatenate([index, index]), np.concatenate([values] * 2), 9, dtype)
    assert np.array_equal(_bits(merged.result(), dtype), _bits(want, dtype))
    # rounding a merged state on the device gives the same bits
    both = states.merge_states(device_state, torch.from_numpy(host_acc.state.copy()), fmt)
    assert np.array_equal(_bits(states.round_state(both, fmt, dtype), dtype), _bits(want, dtype))
    # an accumulator fed by the portable path, in pieces
    acc = plan.accumulator(dtype, backend="portable")
    acc.add(t[:120], start=0).add(t[120:], start=120)
    # (states need not be equal column for column: the host's binned kernel counts bins)
    assert np.array_equal(_bits(acc.result(), dtype), _bits(host_acc.result(), dtype))


def test_32_bit_digit_tables_convert_to_the_host_layout():
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(12)
    index = rng.integers(0, 5, 300)
    plan = bitfold.Fold(index, 5)
    values = rng.standard_normal((300, 2)) * 2.0 ** rng.integers(-120, 120, (300, 2))
    values = values.astype(np.float32)
    acc = plan.accumulator("float32", trailing=(2,))
    acc.add(jnp.asarray(values[:100]), start=0)  # JAX in 32-bit mode: int32 words, 16-bit digits
    acc.add(values[100:], start=100)
    host_acc = plan.accumulator("float32", trailing=(2,)).add(values)
    assert np.array_equal(_bits(acc.result(), "float32"), _bits(host_acc.result(), "float32"))


# -- routing -------------------------------------------------------------------------------------
def test_routing(monkeypatch):
    t = torch.ones(3)
    name = lambda x, **k: dispatch.backend_for(x, **k).name  # noqa: E731
    assert name(np.ones(3)) == host.NAME and name(t) == host.NAME
    assert name(t, backend="portable") == portable.NAME
    names = bitfold.backend_names()  # by priority: host first, the portable path last
    assert names[0] == host.NAME and names[-1] == portable.NAME and cuda.NAME in names
    monkeypatch.setattr(arrays._Torch, "device", lambda self, x: "mps")
    assert name(t) == portable.NAME  # MPS, XPU, ROCm: the portable path
    with pytest.raises(bitfold.DeviceError, match="the host backend does not fold"):
        name(t, backend="host")
    monkeypatch.setattr(arrays._Torch, "device", lambda self, x: "cuda")
    monkeypatch.setattr(triton, "triton_loads", lambda: False)
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: False)
    assert name(t) == portable.NAME  # CUDA without Triton or numba-cuda
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: True)
    assert name(t) == cuda.NAME
    monkeypatch.setattr(triton, "triton_loads", lambda: True)
    assert name(t) == triton.NAME  # the Triton kernels first
    jnp = pytest.importorskip("jax.numpy")
    monkeypatch.setattr(arrays._Jax, "device", lambda self, x: "cuda")
    assert name(jnp.ones(3)) == portable.NAME  # the kernels do not read JAX arrays


def test_a_forced_portable_fold_on_the_cpu_is_the_default_host_fold():
    plan = bitfold.Fold(np.array([0, 1, 0, 1]), 2)
    v = torch.tensor([1.0, 2.0**-24, 2.0**-24, 3.0])
    assert torch.equal(plan(v, backend="portable"), plan(v))
    assert plan(v, backend="portable").tolist() == [1.0, 3.0]


# -- what the portable path asks of each library: its family's operations and capabilities ---
@pytest.mark.parametrize("spread", [4, 120])  # the shared unit serves; the digits do
def test_the_family_capabilities_choose_paths_and_chunks_never_bits(monkeypatch, spread):
    """Whether a family branches on a device flag (``branches_on_device``, with its ``cond``),
    reads its flags where they lie and takes eager folds in chunks (``chunks_eager_folds``)
    decide which paths run and how, never the bits: capabilities turned the other way, or a
    library that cannot read its flags, give the host's bits."""
    from bitfold.backends.portable import checks, flags, terms

    assert checks.FAMILIES == ("torch", "cupy", "jax", "numpy")
    rng = np.random.default_rng(11)
    n, K = 300_000, 40
    plan = bitfold.Fold(rng.integers(0, K, n), K)
    held = rng.standard_normal((n, 1)) * 2.0 ** rng.integers(-spread, spread, (n, 1))
    t = torch.from_numpy(held[:, 0].astype(np.float32))
    ops = arrays.family_of(t)
    want = _bits(plan(t), "float32")
    assert flags.runs_one_path(ops, t) and len(terms.eager_chunks(ops, t, n, 1, K)) > 1
    assert np.array_equal(_bits(plan(t, backend="portable"), "float32"), want)
    branched = []

    def cond(self, flag, if_set, if_clear):  # a conditional of its own, read on the host
        branched.append(bool(flag))
        return if_set() if bool(flag) else if_clear()

    monkeypatch.setattr(arrays._Torch, "branches_on_device", lambda self, like: True)
    monkeypatch.setattr(arrays._Torch, "cond", cond)
    monkeypatch.setattr(arrays._Torch, "chunks_eager_folds", lambda self, like: False)
    monkeypatch.setattr(arrays._Torch, "reads_without_sync", lambda self, like: False)
    assert terms.eager_chunks(ops, t, n, 1, K) == [(0, n)]  # no chunks, a branch of its own
    assert flags.runs_one_path(ops, t)
    assert np.array_equal(_bits(plan(t, backend="portable"), "float32"), want)
    assert branched  # the family's conditional chose the path
    monkeypatch.setattr(arrays._Torch, "branches_on_device", lambda self, like: False)
    assert not flags.runs_one_path(ops, t)  # both paths made, one selected by `where`
    assert np.array_equal(_bits(plan(t, backend="portable"), "float32"), want)
    jnp = pytest.importorskip("jax.numpy")
    assert flags.runs_one_path(arrays.family_of(jnp.ones(3)), jnp.ones(3))  # lax.cond


def test_an_eager_fold_hands_itself_to_the_graphs_fallback_where_the_family_compiles(
    monkeypatch,
):
    """The fold a compiled CPU graph falls back to is handed over by an eager portable fold
    of a family that ``compiles_for_host`` (torch), and by no other."""
    plan = bitfold.Fold(np.array([0, 1, 0]), 2)
    v = torch.tensor([1.0, 2.0, 3.0])
    monkeypatch.setattr(portable_torch, "_EAGER_FOLD", [])
    monkeypatch.setattr(arrays._Torch, "compiles_for_host", lambda self: False)
    assert plan(v, backend="portable").tolist() == [4.0, 2.0]
    assert portable_torch._EAGER_FOLD == []
    monkeypatch.setattr(arrays._Torch, "compiles_for_host", lambda self: True)
    assert plan(v, backend="portable").tolist() == [4.0, 2.0]
    assert portable_torch._EAGER_FOLD == [paths.eager_torch_sums]


def test_a_new_family_inherits_the_defaults_of_what_it_does_not_differ_in():
    """A family defines only what its library differs in: its conditional reads the flag on
    the host, it neither branches on the device nor chunks eager folds, and an operation it
    lacks is refused by name like every other missing operation."""
    from bitfold.errors import FoldTypeError

    class Toy(arrays.ArrayFamily):
        name = "toy"

    toy, flag = Toy(), np.asarray(True)
    assert toy.cond(flag, lambda: "set", lambda: "clear") == "set"
    assert toy.cond(~flag, lambda: "set", lambda: "clear") == "clear"
    assert not toy.branches_on_device(flag) and not toy.chunks_eager_folds(flag)
    assert not toy.compiles_for_host()
    for op in ("scatter_add", "scatter_max", "scatter_min"):
        with pytest.raises(FoldTypeError, match=f"toy arrays have no '{op}' operation"):
            getattr(toy, op)(None, None, None)


@pytest.mark.parametrize("how", ["max", "min"])
@pytest.mark.parametrize("D", [1, 3])
@pytest.mark.parametrize("family", ["numpy", "torch", "jax"])
def test_every_family_scatters_maxima_and_minima_of_values_and_rows(family, how, D):
    """``scatter_max`` / ``scatter_min``: each family's own scatter, the same integers as
    NumPy's ``maximum.at`` / ``minimum.at``, values ``(n,)`` and rows ``(n, D)``."""
    make = {"numpy": np.asarray, "torch": torch.from_numpy}.get(family)
    if family == "jax":
        make = pytest.importorskip("jax.numpy").asarray
    rng = np.random.default_rng(5)
    n, K = 500, 7
    shape = (n,) if D == 1 else (n, D)
    index = rng.integers(0, K, n)
    src = rng.integers(-(1 << 40), 1 << 40, shape) if family != "jax" else rng.integers(
        -(1 << 30), 1 << 30, shape).astype(np.int32)  # fmt: skip
    start = np.zeros((K, *shape[1:]), src.dtype) - (1 if how == "max" else -1)
    want = start.copy()
    getattr(np, {"max": "maximum", "min": "minimum"}[how]).at(want, index, src)
    ops = arrays.family_of(make(start.copy()))
    got = getattr(ops, f"scatter_{how}")(make(start.copy()), make(index), make(src))
    assert ops.name == family and np.array_equal(arrays.to_numpy(got), want)
