"""``DenseSum`` (exact element-wise sums of arrays) and its wire, against the Fraction oracle.

The wire is checked without processes here: several sums stand for ranks,
their bounds are reduced with MAX, their words with SUM and their zero signs
with MIN — exactly what :mod:`bitfold.distributed` asks torch.distributed to
do — and the decoded result must equal one sum of everything.
"""

from __future__ import annotations

import doctest
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle import bucket_oracle, round_fraction

import bitfold.dense
from bitfold.dense import DenseSum, wire_layout
from bitfold.kernels import dense as kernels

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(a):
    a = np.atleast_1d(np.asarray(a))
    return a.view(UINT[a.dtype.itemsize])


def oracle(arrays, out="float32", mean_over=1):
    """Element by element: the exact sum (divided by mean_over) rounded once (bfloat16: held in
    a float32)."""
    n = arrays[0].size
    want = np.empty(n, "float32" if out == "bfloat16" else out)
    for i in range(n):
        terms = [float(a.reshape(-1)[i]) for a in arrays]
        special = any(math.isnan(t) or math.isinf(t) for t in terms)
        if mean_over == 1 or special:
            value = bucket_oracle(terms, out)
            if special and mean_over != 1:
                value = value / mean_over  # NaN and infinities divide to themselves
        else:
            total = sum((Fraction(t) for t in terms), Fraction(0)) / mean_over
            negzero = terms and all(t == 0 and math.copysign(1, t) < 0 for t in terms)
            value = round_fraction(total, out) if total else (-0.0 if negzero else 0.0)
        want[i] = value
    nan = np.isnan(want)
    held = 16 if out == "bfloat16" else 0  # a bfloat16's bits are a float32's high half
    want.view(UINT[want.itemsize])[nan] = bitfold.CANONICAL_NAN_BITS[out] << held
    return want


def test_docstring_examples():
    result = doctest.testmod(bitfold.dense)
    assert result.attempted > 0 and result.failed == 0


# -- sums ---------------------------------------------------------------------------------------
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


@given(st.integers(1, 6), st.integers(1, 30), st.data())
def test_property_sums_equal_the_oracle(adds, n, data):
    arrays = [np.array(data.draw(st.lists(floats32, min_size=n, max_size=n)), np.float32)
              for _ in range(adds)]  # fmt: skip
    s = DenseSum((n,))
    for a in arrays:
        s.add(a)
    assert np.array_equal(bits(s.result()), bits(oracle(arrays)))


@pytest.mark.parametrize("mean_over", [1, 3, 96])
@pytest.mark.parametrize(("dtype", "out", "spread"), [
    ("float32", "float32", 60), ("float32", "float32", 4), ("float16", "float32", 8),
    ("float64", "float64", 300), ("float32", "float16", 10),
])  # fmt: skip
def test_sums_and_means_equal_the_oracle(dtype, out, spread, mean_over):
    rng = np.random.default_rng(spread + mean_over)
    n, adds = 200, 6
    arrays = [(rng.standard_normal(n) * 2.0 ** rng.integers(-spread, spread, n)).astype(dtype)
              for _ in range(adds)]  # fmt: skip
    arrays[1][:5] = [-0.0, np.inf, np.nan, 0.0, -0.0]
    for a in arrays:
        a[10] = -0.0
    s = DenseSum((n,), dtype)
    for a in arrays:
        s.add(a)
    got = s.result(None if out == "float64" or dtype != "float32" else out, mean_over=mean_over)
    assert np.array_equal(bits(got), bits(oracle(arrays, out, mean_over)))
    assert bits(got)[10] == 1 << (8 * np.dtype(out).itemsize - 1)  # -0.0: every term was


@pytest.mark.parametrize("mean_over", [1, 3])
def test_bfloat16_results_held_in_float32_equal_the_oracle(mean_over):
    """A bfloat16 result of NumPy values comes as the float32 that holds it, rounded once."""
    rng = np.random.default_rng(16 + mean_over)
    arrays = [(rng.standard_normal(200) * 2.0 ** rng.integers(-12, 12, 200)).astype("float32")
              for _ in range(5)]  # fmt: skip
    arrays[1][:4] = [-0.0, np.inf, np.nan, 0.0]
    for a in arrays:
        a[10] = -0.0
    s = DenseSum((200,))
    for a in arrays:
        s.add(a)
    got = s.result("bfloat16", mean_over=mean_over)
    assert got.dtype == np.float32
    assert np.array_equal(bits(got), bits(oracle(arrays, "bfloat16", mean_over)))
    assert bits(got)[10] == 1 << 31 and (bits(got) & 0xFFFF).max() == 0


@pytest.mark.parametrize(("out", "mean_over"), [("float32", 3), ("float32", 5), ("float32", 4),
                                                ("float64", 3)])  # fmt: skip
def test_means_on_a_midpoint_or_beside_one_round_once(out, mean_over):
    """A mean whose float64 quotient is a float32 midpoint (exactly, or by rounding) ties to
    even as the exact quotient says, never as the float64 quotient would."""
    rng = np.random.default_rng(mean_over)
    n = 4 * 64
    eps = 2.0**-24
    targets = np.array([1 + eps, 1 + 3 * eps, -(1 + eps), 2 + 6 * eps])  # float32 midpoints
    quotients = np.resize(targets, n) * 2.0 ** rng.integers(-8, 8, n)  # narrow blocks
    sums = quotients * mean_over  # exact in float64: the mean of each is its midpoint
    sums[1::7] += np.spacing(sums[1::7])  # exact quotients beside a midpoint, either side
    sums[2::7] -= np.spacing(sums[2::7])
    dtype = "float64" if out == "float64" else "float32"
    terms, rest = [], sums.copy()
    for _ in range(3):  # float32 terms whose exact sum is ``sums``
        terms.append(rest.astype(dtype))
        rest -= terms[-1]
    assert not rest.any()
    s = DenseSum((n,), dtype)
    for a in terms:
        s.add(a)
    got = s.result(out, mean_over=mean_over)
    assert np.array_equal(bits(got), bits(oracle(terms, out, mean_over)))


def test_split_and_merge_give_the_same_bits():
    rng = np.random.default_rng(1)
    arrays = [(rng.standard_normal((4, 25)) * 2.0 ** rng.integers(-40, 40, (4, 25)))
              .astype(np.float32) for _ in range(7)]  # fmt: skip
    whole = DenseSum((4, 25))
    for a in arrays:
        whole.add(a)
    parts = [DenseSum((4, 25)) for _ in range(3)]
    for i, a in enumerate(arrays):
        parts[i % 3].add(a)
    merged = DenseSum((4, 25)).merge(parts[2]).merge(parts[0]).merge(parts[1])
    assert merged.adds == 7
    assert np.array_equal(bits(merged.result()), bits(whole.result()))
    assert merged.result().shape == (4, 25)


def test_a_sum_of_nothing_is_positive_zero_and_results_keep_the_library():
    assert bits(DenseSum((3,)).result()).tolist() == [0, 0, 0]
    torch = pytest.importorskip("torch", reason="torch is not installed")
    s = DenseSum((2,)).add(torch.tensor([1.0, 2.0])).add(torch.tensor([3.0, 4.0]))
    assert isinstance(s.result(), torch.Tensor) and s.result().tolist() == [4.0, 6.0]
    assert s.result(torch.bfloat16).dtype == torch.bfloat16


def test_a_reset_sum_is_an_empty_one_whatever_it_held():
    """reset() writes nothing: the next add writes the state, a read first empties it."""
    rng = np.random.default_rng(3)
    n = 3000
    wild = [(rng.standard_normal(n) * 2.0 ** rng.integers(-100, 100, n)).astype(np.float32)
            for _ in range(2)]  # fmt: skip
    wild[0][:4] = [np.nan, np.inf, -np.inf, -0.0]
    tame = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    tame[1][5:9] = [np.inf, -0.0, -0.0, 0.0]
    tame[0][6:8] = [-0.0, -0.0]
    tame[2][6:8] = [-0.0, -0.0]
    s = DenseSum((n,))
    for a in wild:
        s.add(a)
    assert s.slow_elements > 0
    s.reset()
    assert s.adds == 0 and s.slow_elements == 0
    assert bits(s.result()).tolist() == [0] * n  # read before any add: the empty sum
    s.add(wild[0]).add(wild[1]).reset()  # limb rows and NaNs from before the reset
    for a in tame:
        s.add(a)
    fresh = DenseSum((n,))
    for a in tame:
        fresh.add(a)
    assert np.array_equal(bits(s.result()), bits(fresh.result()))
    assert np.array_equal(bits(s.result()), bits(oracle(tame)))
    assert s.result()[6] == 0 and math.copysign(1, s.result()[6]) < 0  # -0.0 + -0.0 + -0.0
    other = DenseSum((n,)).add(tame[0])
    assert np.array_equal(bits(DenseSum((n,)).merge(other).result()), bits(other.result()))
    assert np.array_equal(bits(other.merge(DenseSum((n,))).result()), bits(oracle(tame[:1])))


def _recomputed_bounds(s):
    """The bounds read from the state alone, as they were before the adds kept them."""
    out = np.empty_like(s.bounds())
    kernels.block_bounds(s._fast, s._slow_of, s._slow, bitfold.dense.BLOCK, s.format.unit_exp, out)
    return out


def test_parts_and_kept_bounds_equal_one_add_and_bounds_read_from_the_state():
    """add_parts is add of the concatenation (an int part: -0.0 there); the bounds the adds keep
    are those read again from the state, after every add, whatever the parts' edges."""
    rng = np.random.default_rng(5)
    n = 64 * 2100 + 37  # more blocks than chunks, a short last block
    cuts = [0, 5, 64, 130, 7000, 7001, 70000, n]
    arrays = [(rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
              for _ in range(3)]  # fmt: skip
    arrays[1][100:200] *= np.float32(2.0**60)  # inexact float64 sums: limb rows
    arrays[2][[3, 900, 80000]] = [np.nan, np.inf, -0.0]
    gone = (1, 5)  # parts without values in the second and third adds
    whole, parts = DenseSum((n,)), DenseSum((n,))
    for k, a in enumerate(arrays):
        pieces = [a[lo:hi] for lo, hi in itertools.pairwise(cuts)]
        if k:
            pieces = [int(p.size) if j in gone else p for j, p in enumerate(pieces)]
        for j in gone if k else ():
            a = a.copy()
            a[cuts[j] : cuts[j + 1]] = -0.0
        whole.add(a)
        parts.add_parts(pieces)
        assert np.array_equal(parts.bounds(), _recomputed_bounds(parts))
        assert np.array_equal(whole.bounds(), _recomputed_bounds(whole))
    assert parts.slow_elements > 0
    assert np.array_equal(bits(parts.result()), bits(whole.result()))
    empty_first = DenseSum((n,)).add_parts([int(n - 10), arrays[0][-10:]])
    assert np.array_equal(empty_first.bounds(), _recomputed_bounds(empty_first))
    with pytest.raises(bitfold.errors.ShapeError):
        DenseSum((n,)).add_parts([arrays[0][:10]])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_array_read_from_its_bits_travels_as_a_sum_that_took_it(dtype):
    """array_bounds and array_words (an exact all-reduce of one array) give the bounds and words
    of a DenseSum that took that array: zeros of both signs and subnormals included."""
    rng = np.random.default_rng(9)
    n = 64 * 300 + 5
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-8, 8, n)).astype("float32").astype(dtype)
    a[:64] = -0.0  # a block of negative zeros: its signs travel
    a[70:80] = 0.0
    tiny = np.finfo(dtype).smallest_subnormal
    a[192:256] = tiny * np.arange(1, 65)  # a block of subnormals
    s = DenseSum((n,), dtype).add(a)
    assert np.array_equal(bitfold.dense.array_bounds(a), s.bounds())
    for ranks in (1, 3):
        layout = wire_layout(s.bounds(), n, ranks, s.format.limbs)
        # the subnormals' block spans 7 bits: half words; the others (spread 2^16) thirds or
        # narrow, as their lowest bits fall
        assert layout.classes[3] == kernels.HALF
        others = np.delete(layout.classes, 3)
        assert np.isin(others, (kernels.NARROW, kernels.THIRDS)).all()
        assert (others == kernels.NARROW).any()
        assert (others == kernels.THIRDS).any() == (ranks == 1)  # 40 bits: thirds for one rank
        assert np.array_equal(bitfold.dense.array_words(a, layout), s.encode(layout))
    wide = a.copy()
    wide[100] = 2.0**40
    layout = wire_layout(DenseSum((n,), dtype).add(wide).bounds(), n, 1, s.format.limbs)
    assert bitfold.dense.array_words(wide, layout) is None  # a wide block: take a DenseSum
    wide[3] = np.nan
    assert bitfold.dense.array_bounds(wide) is None


@pytest.mark.parametrize("seed", range(4))
def test_float32_bounds_read_in_32_bit_lanes_are_a_sums_bounds(seed):
    """array_bounds of float32 (its own 32-bit kernel) against the bounds of a DenseSum that took
    the array, at every exponent: subnormals of every width, zeros of both signs, blocks of
    one element's kind only, a short last block; an infinity or a NaN anywhere: None."""
    rng = np.random.default_rng(seed)
    n = 64 * 200 + int(rng.integers(1, 64))
    a = np.clip(rng.standard_normal(n) * 2.0 ** rng.integers(-150, 128, n), -3e38,
                3e38).astype(np.float32)  # fmt: skip
    sub = rng.random(n) < 0.2
    a[sub] = (rng.integers(-(2**23), 2**23, sub.sum()) * 2.0**-149).astype(np.float32)
    a[rng.random(n) < 0.1] = 0.0
    a[rng.random(n) < 0.05] = -0.0
    a[:64] = -0.0  # -0.0 only: the signs travel
    a[64:128] = 0.0  # +0.0 only
    a[128:192] = np.float32(2.0**-149)  # the least subnormal only
    a[192:256] = np.float32(3.0 * 2.0**126)  # near the largest only
    assert np.isfinite(a).all()
    assert np.array_equal(bitfold.dense.array_bounds(a), DenseSum((n,)).add(a).bounds())
    for special in (np.inf, -np.inf, np.nan):
        b = a.copy()
        b[int(rng.integers(0, n))] = special
        assert bitfold.dense.array_bounds(b) is None


def test_the_limb_rows_grow_when_many_elements_need_them():
    n = 5000
    s = DenseSum((n,))
    rng = np.random.default_rng(2)
    arrays = [(rng.standard_normal(n) * 2.0 ** rng.integers(-100, 100, n)).astype(np.float32)
              for _ in range(3)]  # fmt: skip
    for a in arrays:
        s.add(a)
    assert s.slow_elements > n // 2 > 16  # far beyond the first allocation
    assert np.array_equal(bits(s.result()), bits(oracle(arrays)))


def test_refusals():
    s = DenseSum((3,))
    with pytest.raises(bitfold.ShapeError, match=r"shape \(3,\); got shape \(4,\)"):
        s.add(np.ones(4, np.float32))
    with pytest.raises(bitfold.FoldTypeError, match="float64"):
        s.add(np.ones(3))
    with pytest.raises(bitfold.FoldError, match="mean_over"):
        s.result(mean_over=0)
    with pytest.raises(bitfold.ShapeError, match="cannot merge"):
        s.merge(DenseSum((2,)))


# -- the wire -----------------------------------------------------------------------------------
def _exchange(sums, ranks=None):
    """What the collectives do: MAX the bounds, SUM the words, MIN the zero signs that travel."""
    ranks = ranks or len(sums)
    bounds = np.maximum.reduce([s.bounds() for s in sums])
    layout = wire_layout(bounds, sums[0].size, ranks, sums[0].format.limbs)
    words = sum(s.encode(layout) for s in sums)
    negzero = np.zeros(sums[0].size, np.int32)
    signs = layout.sign_elements()
    negzero[signs] = np.minimum.reduce([s.negzero()[signs] for s in sums])
    return layout, words, negzero


@pytest.mark.parametrize("mean_over", [1, 3])
def test_decode_reads_no_zero_signs_as_positive_zeros_and_refuses_flags_of_another_size(
    mean_over,
):
    """Without a -0.0 anywhere no flag travels: an empty ``negzero`` decodes every zero sum
    (here x + -x, in every block) to +0.0, the same bits as a full array of zero flags."""
    n = 200
    a = np.random.default_rng(9).standard_normal(n).astype(np.float32)
    sums = [DenseSum((n,)).add(a), DenseSum((n,)).add(-a)]
    sums[1].add(np.where(np.arange(n) % 3 == 0, np.float32(1.5), np.float32(0)))
    layout, words, negzero = _exchange(sums)
    assert layout.sign_elements().size == 0 and not negzero.any()
    full = sums[0].decode(words, layout, negzero, mean_over=mean_over)
    none = sums[0].decode(words, layout, np.zeros(0, np.int32), mean_over=mean_over)
    assert np.array_equal(bits(none), bits(full))
    zero = np.arange(n) % 3 != 0
    assert not bits(none)[zero].any()  # +0.0
    assert np.array_equal(none[~zero], np.full((~zero).sum(), 1.5 / mean_over, np.float32))
    with pytest.raises(bitfold.FoldError, match=r"negzero must be 200 int32 flags.*\(5,\)"):
        sums[0].decode(words, layout, np.zeros(5, np.int32))
    with pytest.raises(bitfold.FoldError, match="int64"):
        sums[0].decode(words, layout, np.zeros(n, np.int64))


@pytest.mark.parametrize(("spread", "klass"), [(6, kernels.NARROW), (18, kernels.WIDE),
                                               (40, kernels.WIDER), (90, kernels.FULL)])
@pytest.mark.parametrize("world", [2, 3, 5])
def test_the_wire_carries_the_exact_sum_in_every_class(spread, klass, world):
    rng = np.random.default_rng(spread * world)
    n, per_rank = 300, 2
    arrays = [[(rng.standard_normal(n) * 2.0 ** rng.integers(-spread, spread, n))
               .astype(np.float32) for _ in range(per_rank)] for _ in range(world)]  # fmt: skip
    for r in range(world):
        for a in arrays[r]:
            a[:2] = [-0.0, -0.0 if r else 0.0]  # element 0: all -0.0; element 1: one +0.0
    sums, whole = [], DenseSum((n,))
    for r in range(world):
        s = DenseSum((n,))
        for a in arrays[r]:
            s.add(a)
            whole.add(a)
        sums.append(s)
    layout, words, negzero = _exchange(sums)
    assert (layout.classes == klass).sum() >= layout.classes.size - 1
    flat = [a for r in arrays for a in r]
    for mean in (1, 7):
        got = sums[0].decode(words, layout, negzero, mean_over=mean)
        want = oracle(flat, mean_over=mean)  # the Fraction oracle, not the same wire path
        assert np.array_equal(bits(got), bits(want))
        assert np.array_equal(bits(whole.result(mean_over=mean)), bits(want))
    assert bits(sums[0].decode(words, layout, negzero))[:2].tolist() == [0x80000000, 0]
    per_element = layout.words * 8 / n
    assert per_element <= {kernels.NARROW: 8.2, kernels.WIDE: 12.2, kernels.WIDER: 16.3,
                           kernels.FULL: 121}[klass]  # fmt: skip


@pytest.mark.parametrize("packing", ["half", "thirds"])
@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("n", [301, 64 * 5])
def test_packed_blocks_carry_the_exact_sum(packing, world, n):
    """Values of few bits (gradients often are): two elements a word (half), or two 21-bit
    lanes an element and three lanes a word (thirds); every lane's sum recovered exactly,
    negative lanes, the extremes the class allows and an odd last block included."""
    rng = np.random.default_rng(world * n)
    per_rank = 2  # each rank's sum takes two arrays: one bit more
    growth = int(np.ceil(np.log2(world)))
    most = 31 - growth if packing == "half" else 2 * (20 - growth)  # the class's widest
    top = (1 << most) // per_rank
    unit = 2.0**-60 if packing == "thirds" else 2.0**-40
    arrays = [[(rng.integers(-top, top, n) * unit).astype(np.float64)
               for _ in range(per_rank)] for _ in range(world)]  # fmt: skip
    for r in range(world):
        # the extremes: each rank's sums span ``most`` bits, their sum over the ranks the lanes
        arrays[r][0][:4] = [-top * unit, (top - 1) * unit, -0.0, 0.0]
        arrays[r][1][:4] = [-(top - 1) * unit, (top - 1) * unit, -0.0, 0.0]
        arrays[r][0][5] = arrays[r][1][5] = -0.0  # every term -0.0: its sign travels
        arrays[r][0][6], arrays[r][1][6] = unit, 0.0  # the lowest bit
    sums = [DenseSum((n,), "float64").add(arrays[r][0]).add(arrays[r][1]) for r in range(world)]
    layout, words, negzero = _exchange(sums)
    klass = kernels.HALF if packing == "half" else kernels.THIRDS
    assert layout.classes[0] == klass and np.isin(layout.classes, (klass, kernels.HALF)).all()
    flat = [a for r in arrays for a in r]
    for out in ("float64", "float32"):
        for mean in (1, 7):
            got = sums[0].decode(words, layout, negzero, out, mean_over=mean)
            want = oracle(flat, out, mean_over=mean)
            assert np.array_equal(bits(got), bits(want))
    got = sums[0].decode(words, layout, negzero)
    assert bits(got)[5] == 1 << 63  # -0.0
    a = arrays[0][0]  # one array read from its bits packs its words the same way
    one = wire_layout(bitfold.dense.array_bounds(a), n, world, sums[0].format.limbs)
    assert one.classes[0] == klass
    assert np.array_equal(bitfold.dense.array_words(a, one),
                          DenseSum((n,), "float64").add(a).encode(one))  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("subnormal_block", ["narrow", "half"])
def test_limb_rows_and_subnormals_in_narrow_and_half_blocks_travel_exactly(dtype,
                                                                          subnormal_block):
    """Narrow blocks of exact float64s, limb rows, subnormals and zeros of either sign; the
    subnormals' block spans few bits (half words) unless one larger term widens it."""
    tiny = np.finfo(dtype).smallest_subnormal
    n, world = 256, 3  # four blocks of 64
    rng = np.random.default_rng(5)
    arrays = []
    for r in range(world):
        a = rng.integers(-4, 5, n).astype(dtype)
        b = np.zeros(n, dtype)
        b[:128:5] = 2.0**-56  # 4 + 2^-56 rounds in float64: those elements take limbs
        a[128:192] = tiny * rng.integers(-9, 10, 64)  # subnormal sums
        b[128:192] = tiny * (r + 1)
        if subnormal_block == "narrow":
            b[130] = tiny * 2.0**40  # 45 bits in the block: one int64 an element
        a[192:], b[192:] = -0.0, 0.0 if r else -0.0
        a[200:210] = b[200:210] = -0.0  # every term -0.0
        arrays.append([a, b])
    sums = [DenseSum((n,), dtype).add(a).add(b) for a, b in arrays]
    assert all(s.slow_elements > 0 for s in sums)
    layout, words, negzero = _exchange(sums)
    klass = kernels.HALF if subnormal_block == "half" else kernels.NARROW
    assert layout.classes.tolist() == [kernels.NARROW, kernels.NARROW, klass, kernels.NARROW]
    got = sums[0].decode(words, layout, negzero, None if dtype == "float64" else "float32")
    want = oracle([x for pair in arrays for x in pair], dtype)
    assert np.array_equal(bits(got), bits(want))
    assert bits(got)[200:210].tolist() == [bits(np.array(-0.0, dtype))[0]] * 10


def test_zero_signs_travel_only_for_blocks_where_every_rank_has_a_negative_zero():
    n = 192  # three blocks of 64
    rng = np.random.default_rng(8)
    base = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    ordinary = [DenseSum((n,)).add(a) for a in base]
    layout, _, _ = _exchange(ordinary)
    assert layout.sign_elements().size == 0  # no -0.0 anywhere: no flag travels
    arrays = [a.copy() for a in base]
    arrays[0][5] = -0.0  # block 0: only rank 0 holds a -0.0
    for r, a in enumerate(arrays):  # block 1: -0.0 on every rank, at 70 only on all of them
        a[70], a[71 + r] = -0.0, -0.0
    arrays[1][130] = arrays[2][130] = -0.0  # block 2: rank 0 has none (its sum there is +0.0)
    negated = -arrays[0]
    negated[[5, 70, 71]] = -0.0
    sums = [DenseSum((n,)).add(a) for a in arrays] + [DenseSum((n,))]  # a rank with no terms
    sums[0].add(negated)  # rank 0's sums are zeros: +0.0 but at 5, 70 and 71
    layout, words, negzero = _exchange(sums)
    assert layout.sign_elements().tolist() == list(range(64, 128))
    got = sums[0].decode(words, layout, negzero)
    whole = DenseSum((n,))
    for a in [*arrays, negated]:
        whole.add(a)
    assert np.array_equal(bits(got), bits(whole.result()))
    assert bits(got)[70] == 0x80000000  # -0.0 from every rank, every term


def test_a_limb_row_that_sums_to_zero_is_positive_zero():
    """1 + 2^-60 - 1 - 2^-60 takes a limb row and sums to zero: +0.0, beside a -0.0 sum."""
    terms = [np.array([x, -0.0], np.float32) for x in (1.0, 2.0**-60, -1.0, -(2.0**-60))]
    one = DenseSum((2,))
    for t in terms:
        one.add(t)
    assert one.slow_elements == 1
    assert bits(one.result()).tolist() == bits(oracle(terms)).tolist() == [0, 0x80000000]
    ranks = [DenseSum((2,)).add(terms[0]).add(terms[1]), DenseSum((2,)).add(terms[2]).add(terms[3])]
    layout, words, negzero = _exchange(ranks)  # element 1 is -0.0 on both: the signs travel
    assert layout.sign_elements().tolist() == [0, 1]
    assert bits(ranks[0].decode(words, layout, negzero)).tolist() == [0, 0x80000000]


def test_nan_and_infinity_go_full_on_every_rank():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([np.inf, 2.0, -np.inf], np.float32)
    sa, sb = DenseSum((3,)).add(a), DenseSum((3,)).add(b)
    layout, words, negzero = _exchange([sa, sb])
    assert layout.classes.tolist() == [kernels.FULL]
    got = sa.decode(words, layout, negzero)
    assert got.tolist() == [np.inf, 4.0, -np.inf]


def test_too_many_ranks_for_the_lanes_go_full():
    bounds = np.array([[10, 60, 0]])  # (-lo, hi, -z): lo = -10, 70 bits: wide for few ranks
    assert wire_layout(bounds, 64, 4, 10).classes.tolist() == [kernels.WIDE]
    assert wire_layout(bounds, 64, 1000, 10).classes.tolist() == [kernels.FULL]


def test_an_int_shape_is_a_one_dimensional_sum():
    s = DenseSum(4)
    assert s.shape == (4,)
    arrays = [np.array([1.0, 2.0**-24, -0.0, 3.0], np.float32),
              np.array([2.0**-24, 2.0**-24, -0.0, 2.0**-30], np.float32),
              np.array([2.0**-24, 2.0**-26, -0.0, 2.0**-23], np.float32)]  # fmt: skip
    for a in arrays:
        s.add(a)
    got = s.result()
    want = np.array([bucket_oracle([float(a[i]) for a in arrays]) for i in range(4)], np.float32)
    assert want[0] == np.float32(1 + 2.0**-23)  # where a float32 sum left to right gives 1.0
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_the_packed_classes_take_exactly_the_blocks_whose_lane_sums_fit():
    """HALF: top - lowest + growth over the ranks + sign <= 32 bits, two elements a word;
    THIRDS: top - lowest <= 2 (20 - growth) bits, two 21-bit lanes an element, three a word."""
    for ranks, growth in ((1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (1 << 19, 19)):
        def klass(magnitude, size=64, ranks=ranks):
            bounds = np.array([[7, magnitude - 7, 0]], np.int32)  # (-lo, hi, -z): lo = -7
            layout = wire_layout(bounds, size, ranks, 10)
            return layout.classes.tolist()[0], layout.words

        assert klass(31 - growth) == (kernels.HALF, 32)
        assert klass(31 - growth, size=63) == (kernels.HALF, 32)  # an odd block: a lane alone
        thirds = 2 * (20 - growth)
        if thirds > 31 - growth:
            assert klass(32 - growth) == (kernels.THIRDS, 43)  # 128 lanes, three a word
            assert klass(thirds) == (kernels.THIRDS, 43)
            assert klass(thirds, size=5) == (kernels.THIRDS, 4)  # 10 lanes
        assert klass(max(thirds, 31 - growth) + 1) == (kernels.NARROW, 64)


def test_the_kernels_take_the_threads_a_launcher_shares_out():
    """``OMP_NUM_THREADS`` (set by ``torchrun``) sizes Numba's pool unless
    ``NUMBA_NUM_THREADS`` says otherwise: processes sharing cores do not all take every one."""
    import os
    import subprocess
    import sys

    code = ("import numba, numpy as np; from bitfold.dense import DenseSum; "
            "DenseSum(3).add(np.ones(3, np.float32)); print(numba.get_num_threads())")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",
                                                             "NUMBA_NUM_THREADS")}  # fmt: skip

    def threads(**extra: str) -> int:
        done = subprocess.run([sys.executable, "-c", code], env={**env, **extra},
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    assert threads(OMP_NUM_THREADS="1") == 1
    assert threads(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="2") == 2
