"""The certified float32 row sums of the ``buckets`` route, at and past the certificate's limit.

A bucket of at least ``CERTIFY_MIN_TERMS`` float32 rows is summed in float64
without a test per addition; each column's largest and smallest magnitudes
certify that every float64 sum of its terms is exact (``log2(terms) + eH - eL
<= 29``), and a column without the certificate is summed again with checked
adds. Each case here is built so that a certificate claimed one binade too
far gives a float64 sum that is *not* exact: every result is checked against
the Fraction oracle, bit for bit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from oracle import bucket_oracle
from test_rows import assert_bits, rows_oracle

import bitfold
from bitfold import dispatch
from bitfold.kernels import buckets

F32_BIAS, F32_FRACTION = 127, 23


def f32(mantissa: int, biased_exponent: int, negative: bool = False) -> np.float32:
    """The float32 ``mantissa * 2^(biased_exponent - 150)`` (2^23 <= mantissa < 2^24), by bits."""
    assert 1 << F32_FRACTION <= mantissa < 1 << (F32_FRACTION + 1) and 0 < biased_exponent < 255
    raw = (int(negative) << 31) | (biased_exponent << F32_FRACTION) | (mantissa - (1 << 23))
    return np.array(raw, np.uint32).view(np.float32)[()]


def limit_column(n: int, span: int, high_exponent: int = 140) -> np.ndarray:
    """``n`` terms over ``span`` binades: ``n - 1`` large ones and one small, odd one.

    The large terms are ``(2^24 - 1) 2^span`` units of the small one's last
    place and the small one is odd in those units, so the exact sum is an odd
    number of units: a float64 holds it only below 2^53 units. With ``n`` a
    power of two that is true at ``span = 29 - log2(n)`` and false one binade
    further.
    """
    big = f32((1 << 24) - 1, high_exponent)
    small = f32((1 << 23) + 1, high_exponent - span)
    column = np.full(n, big, np.float32)
    column[n // 3] = small
    return column


def certified_span(n: int) -> int:
    return 29 - int(np.ceil(np.log2(n)))


def bits_of(x: np.float32) -> np.uint32:
    return np.array(x, np.float32).view(np.uint32)[()]


@pytest.mark.parametrize("n", [8, 9, 16, 1000, 1024])
def test_the_certificate_holds_up_to_the_limit_and_not_one_binade_further(n):
    """``_certified(largest, smallest - 1, ceil(log2 n))``, and what it claims: at the limit
    every float64 sum of the worst terms is exact; one binade further the exact sum is not a
    float64 at all (odd in units, past 2^53 of them)."""
    log2 = int(np.ceil(np.log2(n)))
    span = certified_span(n)
    for s, claimed in [(span - 1, True), (span, True), (span + 1, False), (span + 9, False)]:
        column = limit_column(n, s)
        high = max(bits_of(abs(x)) for x in column)
        below = min(bits_of(abs(x)) for x in column) - np.uint32(1)
        assert bool(buckets._certified(high, below, log2)) is claimed, (n, s)
        exact = sum((Fraction(float(x)) for x in column), Fraction(0))
        if 1 << log2 == n:  # n - 1 large terms: the sum is as large as the bound allows
            assert (Fraction(float(exact)) == exact) is claimed, (n, s)
        if claimed:  # any order: left to right, right to left, pairwise
            for order in (column, column[::-1], np.sort(column)):
                assert Fraction(float(np.sum(order.astype(np.float64)))) == exact
                assert Fraction(math.fsum(order.astype(np.float64))) == exact


@pytest.mark.parametrize(
    ("high", "below", "claimed"),
    [
        (0x7F800000, 0x3F7FFFFF, False),  # an infinity
        (0x7FC00000, 0x3F7FFFFF, False),  # a NaN
        (0x3F800000, 0x00012344, False),  # a subnormal (denormals-are-zero would read 0)
        (0x3F800000, 0x007FFFFF, False),  # 1.0 and the smallest normal: 126 binades apart
        (0x03800000, 0x007FFFFF, True),  # 2^-120 and the smallest normal: 6 binades apart
        (0, 0xFFFFFFFF, True),  # every term zero
    ],
)
def test_the_certificate_refuses_specials_and_takes_zeros(high, below, claimed):
    assert bool(buckets._certified(np.uint32(high), np.uint32(below), 3)) is claimed


@pytest.mark.parametrize("n", [8, 16, 256, 1024])
@pytest.mark.parametrize("out", ["float32", "float64"])
def test_a_column_at_the_limit_and_past_it_gives_the_oracle_bits(n, out):
    """End to end: columns at, one past and far past the limit, in a shuffled bucket of ``n``
    rows (four at a time, with a remainder), both signs, rounded to float32 and to float64."""
    assert n >= buckets.CERTIFY_MIN_TERMS and n <= buckets.ROW_CHUNK
    span = certified_span(n)
    columns = [limit_column(n, span), limit_column(n, span + 1), limit_column(n, span + 8)]
    values = np.stack(columns + [-c for c in columns], axis=1)
    index = np.zeros(n, np.int64)
    perm = np.random.default_rng(n).permutation(n)
    got = bitfold.Fold(index[perm], 2)(values[perm], out_dtype=out)
    assert_bits(got, rows_oracle(index, values, 2, out), f"n={n}")


@pytest.mark.parametrize("chunks", [2, 3])
def test_buckets_of_several_chunks_certify_each_chunk(chunks):
    """A bucket longer than ROW_CHUNK is summed a chunk at a time into its limbs."""
    n = buckets.ROW_CHUNK * chunks
    span = certified_span(buckets.ROW_CHUNK)
    chunk = buckets.ROW_CHUNK
    at_and_past = [limit_column(chunk, span + j % 2, 140 - 3 * j) for j in range(chunks)]
    past = [limit_column(chunk, span + 1, 100 + j) for j in range(chunks)]
    columns = [np.concatenate(at_and_past), np.concatenate(past)]
    values = np.stack(columns, axis=1)
    index = np.r_[np.zeros(n, np.int64), [1, 1, 1]]
    values = np.concatenate([values, np.ones((3, 2), np.float32)])
    assert_bits(bitfold.Fold(index, 3)(values), rows_oracle(index, values, 3), f"{chunks} chunks")


@pytest.mark.parametrize("where", ["init", "rows"])
def test_the_first_term_of_a_fold_into_an_array_counts_in_the_certificate(where):
    """Folding into ``init``: its entry is one more term, and may be the one that spans too far."""
    n = 15  # 16 terms with the init: log2 = 4
    span = certified_span(16) + 1  # one binade too many
    big = f32((1 << 24) - 1, 140)
    small = f32((1 << 23) + 1, 140 - span)
    column = np.full(n, big, np.float32)
    init = np.array([[big, 1.0]], np.float32)
    if where == "init":
        init[0, 0] = small
    else:
        column[7] = small
    values = np.stack([column, np.linspace(1, 2, n, dtype=np.float32)], axis=1)
    plan = bitfold.Fold(np.zeros(n, np.int64), 1)
    got = dispatch.fold(plan, values, init=init)
    want = [np.float32(bucket_oracle([float(init[0, d]), *map(float, values[:, d])]))
            for d in range(2)]  # fmt: skip
    assert_bits(got[0], np.array(want, np.float32), where)


SPECIALS = {
    "subnormal": np.array(0x00012345, np.uint32).view(np.float32),
    "nan": np.float32(np.nan),
    "inf": np.float32(np.inf),
    "-inf": np.float32(-np.inf),
    "-0.0": np.float32(-0.0),
    "huge": np.float32(2.0**120),
    "tiny normal": np.float32(2.0**-126),
}


@pytest.mark.parametrize("special", sorted(SPECIALS))
@pytest.mark.parametrize("row", [0, 3, 4, 7, 8])
def test_a_special_term_in_any_row_of_a_block_of_four(special, row):
    """Rows are added four at a time: a special term in each lane of a block, and in the rest."""
    n, D = 9, 12
    rng = np.random.default_rng(row)
    values = rng.standard_normal((n, D)).astype(np.float32)
    values[row, row % D] = SPECIALS[special]
    values[:, D - 1] = -0.0  # a column of negative zeros stays -0.0
    index = np.zeros(n, np.int64)
    assert_bits(bitfold.Fold(index, 1)(values), rows_oracle(index, values, 1), special)


@pytest.mark.parametrize("lane", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("apart", ["largest", "smallest"])
def test_the_largest_or_smallest_terms_in_one_lane_of_the_blocks_of_four(lane, apart):
    """Only rows ``lane`` and ``lane + 4`` of each bucket of 10 rows (lane 4: only row 8, the
    first after the blocks) hold the largest terms, or the smallest: the certificate must see
    them there, or it certifies float64 sums of terms 40 binades apart, whose roundings show
    in a float64 result."""
    rng = np.random.default_rng(lane)
    K, n, D = 40, 10, 4
    index = np.repeat(np.arange(K), n)
    mantissas = rng.integers(1 << 23, 1 << 24, (K * n, D)) | 1  # odd: every bit counts
    rows = np.arange(K * n) % n
    in_lane = (rows % 4 == lane % 4) & (rows < 8) if lane < 4 else rows == 8
    exponents = np.where(in_lane == (apart == "largest"), 140, 100)[:, None].repeat(D, 1)
    raw = (exponents << 23 | (mantissas - (1 << 23))).astype(np.uint32)
    raw[rng.random(raw.shape) < 0.5] |= np.uint32(1 << 31)
    values = raw.view(np.float32)
    got = bitfold.Fold(index, K)(values, out_dtype="float64")
    assert_bits(got, rows_oracle(index, values, K, "float64"), f"{apart} in lane {lane}")


@pytest.mark.parametrize("out", ["float32", "float64"])
def test_many_buckets_of_random_spans_match_the_oracle(out):
    """Buckets of 0..40 rows, columns whose spans fall either side of the limit. Rounded to
    float64, a float64 sum wrongly taken as exact shows in the result."""
    rng = np.random.default_rng(7)
    K, D = 300, 6
    counts = rng.integers(0, 41, K)
    index = np.repeat(np.arange(K), counts)
    scale = 2.0 ** rng.integers(-20, 20, (index.size, D))
    values = (rng.standard_normal((index.size, D)) * scale).astype(np.float32)
    values[rng.random(values.shape) < 0.05] = 0.0
    perm = rng.permutation(index.size)
    got = bitfold.Fold(index[perm], K)(values[perm], out_dtype=out)
    assert_bits(got, rows_oracle(index, values, K, out), "random spans")
