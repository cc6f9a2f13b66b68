"""Exact element-wise sums of whole arrays, and the compact words that carry them between processes.

:class:`DenseSum` is the exact accumulator of the folds' contract applied to
every element of an array of fixed shape (a gradient): ``add`` any number of
arrays, ``merge`` sums, ``result`` rounds each element once — the same bits
for every order and grouping of the additions. Its state is one float64 an
element while that float64 is exact (every addition is checked), and a row
of integer limbs only for the elements whose float64 sum would have rounded:
8 bytes an element for ordinary gradients, not a superaccumulator's 120.

The wire (used by :mod:`bitfold.distributed`): the elements are cut into
blocks of :data:`BLOCK`; every process computes each block's bounds (the
lowest set bit and the top bit of its exact values, and whether an element
may sum to ``-0.0``), the bounds are reduced with MAX over the processes,
and from them every process derives the same
:class:`WireLayout`: a block whose exact sums over all processes fit in 32
bits (sign included) travels as half an int64 an element, two elements
summed in one word as ``a + b·2^32`` (*half*: the bytes of float32; every
block of float16 or bfloat16 gradients), a block whose elements span at most
``2 (20 - g)`` bits (``2^g`` ranks or fewer: 38 bits for 2, 36 for 4; most
blocks of float32 gradients) as two 21-bit lanes an element, three lanes a
word (*thirds*: 1.33 times the bytes of float32), up to 63 bits as one int64
an element (*narrow*: twice the bytes of float32), up to 86
bits as one and a half (*wide*: three times), up to 118 bits as two
(*wider*), anything wider, and any NaN or infinity, as the whole limb row
(*full*). One all-reduce with SUM of those int64 words is then exact. The
sign of a zero sum (``-0.0`` only when every term on every process was) travels
only for the blocks where every process holds an element whose terms were all
``-0.0``: one flag an element of those blocks, reduced with MIN; elsewhere a
zero sum is ``+0.0``. Ordinary gradients have no such block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import from_numpy, to_numpy
from .errors import FoldError, FoldTypeError, ShapeError
from .formats import (
    FLOATS,
    decoding,
    dtype_name,
    held_shift,
    limb_format_for,
    resolve_out_dtype,
    rounding_target,
)
from .kernels import dense as kernels
from .kernels.cpu import start_thread_pool

#: Elements a block of the wire shares its bounds with.
BLOCK = 64
#: Most ranks whose low lanes still sum without overflow (wide: 24-bit lanes in 31 bits;
#: wider: 56-bit words in 63 bits).
WIDE_MAX_RANKS = (1 << (31 - kernels.LANE_BITS)) - 1
#: the float dtype of a result's integer width, for the float view the decode kernel reads
_FLOAT_OF_WIDTH = {2: np.float64, 4: np.float32, 8: np.float64}


@dataclass(frozen=True)
class WireLayout:
    """How every element of a :class:`DenseSum` travels: one layout, the same on every process."""

    size: int
    block: int
    classes: np.ndarray  # (blocks,) int64: HALF, THIRDS, NARROW, WIDE, WIDER or FULL
    lo: np.ndarray  # (blocks,) int64: the unit 2^lo of half, thirds, narrow and wide blocks
    offsets: np.ndarray  # (blocks + 1,) int64: where each block's words start
    signs: np.ndarray  # (blocks,) bool: blocks whose elements' zero signs travel
    split: int  # the low bits of a thirds element in its first lane (from the rank count)

    @property
    def words(self) -> int:
        """int64 words on the wire."""
        return int(self.offsets[-1])

    def sign_elements(self) -> np.ndarray:
        """Indices of the elements whose zero-sum signs travel (those of ``signs`` blocks)."""
        starts = np.flatnonzero(self.signs) * self.block
        if not starts.size:
            return np.empty(0, np.int64)
        every = (starts[:, None] + np.arange(self.block)).reshape(-1)
        return every[every < self.size]


def wire_layout(
    bounds: np.ndarray, size: int, ranks: int, limbs: int, block: int = BLOCK
) -> WireLayout:
    """The layout for bounds reduced with MAX over ``ranks`` processes (``(-lo, hi, -z)`` a block).

    ``z`` (1: every process has an element of the block that may sum to ``-0.0``) marks the
    blocks whose zero signs travel; a full block's rows carry their own.
    """
    growth = max(0, math.ceil(math.log2(ranks))) if ranks > 1 else 0
    blocks = bounds.shape[0]
    classes = np.empty(blocks, np.int64)
    lo = np.empty(blocks, np.int64)
    offsets = np.empty(blocks + 1, np.int64)
    signs = np.empty(blocks, np.bool_)
    kernels.wire_classes(np.ascontiguousarray(bounds, np.int32), size, block, growth, limbs,
                         ranks <= WIDE_MAX_RANKS, classes, lo, offsets, signs)  # fmt: skip
    split = kernels.THIRD_BITS - 1 - growth
    return WireLayout(size, block, classes, lo, offsets, signs, split)


def array_bounds(flat: np.ndarray, block: int = BLOCK) -> np.ndarray | None:
    """:meth:`DenseSum.bounds` of a sum that took only ``flat`` (float32 or float64, 1-D,
    contiguous), read straight from its bits; None when it holds a NaN or an infinity."""
    out = np.empty(((flat.size + block - 1) // block, 3), np.int32)
    f = FLOATS[flat.dtype.name]
    start_thread_pool()
    if flat.dtype == np.float32:
        done = kernels.array_bounds_narrow(flat.view(np.uint32), block, out)
    else:
        done = kernels.array_bounds(flat.view(np.int64), f.exponent_bits, f.fraction_bits,
                                    block, out)  # fmt: skip
    return out if done else None


def array_words(
    flat: np.ndarray, layout: WireLayout, spare: np.ndarray | None = None
) -> np.ndarray | None:
    """:meth:`DenseSum.encode` of a sum that took only ``flat`` (as :func:`array_bounds`
    accepted it), when every block of ``layout`` is narrow, half or thirds; else None. The words go
    into the front of ``spare`` (int64) when it is large enough: no new pages to fault in."""
    if not np.isin(layout.classes, (kernels.NARROW, kernels.HALF, kernels.THIRDS)).all():
        return None
    if spare is not None and spare.dtype == np.int64 and spare.size >= layout.words:
        words = spare[: layout.words]
    else:
        words = np.empty(layout.words, np.int64)
    f = FLOATS[flat.dtype.name]
    start_thread_pool()
    bits = flat.view(np.int64 if flat.dtype == np.float64 else np.uint32)
    kernels.array_words(bits, f.exponent_bits, f.fraction_bits, layout.block, layout.classes,
                        layout.lo, layout.offsets, layout.split, words)  # fmt: skip
    return words


class DenseSum:
    """Exact element-wise sums of arrays of one shape: ``add``, ``merge``, ``result``.

    Every element's result is the correctly rounded sum of every value added
    to it, with the zero, NaN and Inf rules of :mod:`bitfold.exact`: the same
    bits for any order and any grouping of the additions (micro-batches,
    processes). Values are float16, bfloat16 or float32 (float64 sums) or
    float64 (with float64's wider limbs), of any library; results come back
    in the library and on the device of the first array added.

    ``shape`` is a tuple or an int (a 1-D shape, as in NumPy).

    >>> import numpy as np
    >>> s = DenseSum(2)
    >>> _ = s.add(np.array([1.0, 2.0**-24], np.float32))
    >>> _ = s.add(np.array([2.0**-24, 2.0**-25], np.float32))
    >>> s.result().tolist()  # 1 + 2^-24 ties to 1.0; 2^-24 + 2^-25 is exact
    [1.0, 8.940696716308594e-08]
    """

    def __init__(self, shape: Any, dtype: Any = "float32") -> None:
        if isinstance(shape, int | np.integer):
            shape = (shape,)  # an int is a 1-D shape, as in NumPy
        self.shape = tuple(int(s) for s in shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.format = limb_format_for(dtype_name(dtype))
        self._wide = self.format.value_dtypes == ("float64",)
        # written by the first add (or emptied when read before one): ``_empty`` until then
        self._fast = np.empty(self.size)
        self._slow_of = np.empty(self.size, np.int32)
        self._slow = np.zeros((max(16, self.size // 256), self.format.width), np.int64)
        self._used = np.zeros(1, np.int64)
        self._empty = True
        self._words: np.ndarray | None = None  # encode(reuse=True)'s buffer
        # (-lo, hi, -z) of every block as the adds keep them (DIRTY_HI: to read again); valid
        # while ``_bounds_kept`` (from a first add until a merge)
        self._bounds = np.empty(((self.size + BLOCK - 1) // BLOCK, 3), np.int32)
        self._bounds_kept = False
        self._pending = np.empty((kernels.CHUNKS, 2), np.int64)
        self._tmp = np.empty(BLOCK)
        self.adds = 0
        self._like: Any = None

    def _materialise(self) -> None:
        """Write the empty state (every element ``-0.0``, fast) before it is read."""
        if self._empty:
            self._fast.fill(-0.0)
            self._slow_of.fill(-1)
            self._empty = False
            self._bounds_kept = False

    # -- what it holds ----------------------------------------------------------------------------
    @property
    def slow_elements(self) -> int:
        """Elements whose sum needed limbs (the others are exact float64s)."""
        return int(self._used[0])

    @property
    def nbytes(self) -> int:
        """Bytes of state."""
        slow = int(self._used[0]) * self._slow.shape[1] * 8
        return int(self._fast.nbytes + self._slow_of.nbytes + slow)

    def _grow(self) -> None:
        bigger = np.zeros((2 * self._slow.shape[0], self._slow.shape[1]), np.int64)
        bigger[: self._slow.shape[0]] = self._slow
        self._slow = bigger

    # -- adding -----------------------------------------------------------------------------------
    def add(self, values: Any) -> DenseSum:
        """Add an array of this sum's shape, element by element, exactly."""
        shape = tuple(int(s) for s in getattr(values, "shape", np.shape(values)))
        if shape != self.shape:
            raise ShapeError(f"this sum adds arrays of shape {self.shape}; got shape {shape}")
        self._add_parts([values])
        if self._like is None:
            self._like = values
        return self

    def add_parts(self, parts: Sequence[Any]) -> DenseSum:
        """Add one array given as its consecutive flat parts: ``add`` of their concatenation.

        Each part is an array (any shape, read flat; its own value dtype) or an
        int ``k``: ``k`` elements that take ``-0.0`` (nothing: a parameter
        without a gradient). The parts' sizes sum to this sum's size. Nothing is
        concatenated: each part is added where it lies. Results come back as
        NumPy arrays until an :meth:`add` names a library.
        """
        self._add_parts(parts)
        return self

    def _flat(self, values: Any) -> np.ndarray:
        name = dtype_name(values) if hasattr(values, "dtype") else np.asarray(values).dtype.name
        if name not in self.format.value_dtypes:
            raise FoldTypeError(
                f"this sum adds {', '.join(self.format.value_dtypes)} values; got {name}"
            )
        flat = np.ascontiguousarray(to_numpy(values) if hasattr(values, "dtype") else values)
        flat = flat.reshape(-1)
        if not flat.dtype.isnative:
            flat = flat.astype(flat.dtype.newbyteorder("="))
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)  # exact
        return flat

    def _add_parts(self, parts: Sequence[Any]) -> None:
        flats = [int(p) if isinstance(p, int | np.integer) else self._flat(p) for p in parts]
        total = sum(f if isinstance(f, int) else f.size for f in flats)
        if total != self.size:
            raise ShapeError(f"this sum adds {self.size} elements; the parts hold {total}")
        first = self._empty
        if first:  # the bounds are merged part by part into empty ones
            self._bounds[:, 0] = -kernels.NO_LO
            self._bounds[:, 1] = kernels.NO_HI
            self._bounds[:, 2] = 0
        start_thread_pool()  # the kernels below are parallel: the pool, sized once
        offset = 0
        for flat in flats:
            if isinstance(flat, int):  # -0.0: nothing to add, unless nothing was there
                if first and flat:
                    self._fast[offset : offset + flat] = -0.0
                    self._slow_of[offset : offset + flat] = -1
                    self._bounds[offset // BLOCK : (offset + flat - 1) // BLOCK + 1, 2] = -1
                offset += flat
                continue
            self._add_flat(flat, offset, first)
            offset += flat.size
        self._bounds_kept |= first
        self._empty = False
        self.adds += 1

    def _add_flat(self, flat: np.ndarray, offset: int, first: bool) -> None:
        """Add ``flat`` into elements ``offset ..``: whole blocks in parallel, limb rows after."""
        dec = decoding(flat.dtype.name, self.format)
        bits = flat.view(np.int64 if self._wide else np.uint32)
        args = (self._fast, self._slow_of, self._slow, self._used, flat, bits, offset)
        tail = (self.adds, self.format.unit_exp, dec, self._wide, self._bounds, BLOCK, first)
        kernels.add_blocks(*args, *tail, True, self._pending)
        for start, stop in self._pending.tolist():  # chunk by chunk: the rows' order is fixed
            while start >= 0:
                args = (self._fast, self._slow_of, self._slow, self._used, flat, bits, offset)
                start = kernels.add_span(*args, start, stop, *tail, False, self._tmp)
                if start >= 0:
                    self._grow()

    def merge(self, other: DenseSum) -> DenseSum:
        """Add ``other``'s sums into this one (same shape and format; ``other`` is unchanged)."""
        if not isinstance(other, DenseSum):
            raise FoldTypeError(f"can only merge another DenseSum; got {type(other).__qualname__}")
        if other.shape != self.shape or other.format is not self.format:
            raise ShapeError(
                f"cannot merge a sum of shape {other.shape} ({other.format.name}) into one of "
                f"shape {self.shape} ({self.format.name})"
            )
        self._materialise()
        other._materialise()
        start = 0
        while True:
            resume = kernels.merge_sums(
                self._fast[start:], self._slow_of[start:], self._slow, self._used,
                other._fast[start:], other._slow_of[start:], other._slow, self.adds, other.adds,
                self.format.unit_exp,
            )  # fmt: skip
            if resume < 0:
                break
            self._grow()
            start += resume
        self._bounds_kept = False
        self.adds += other.adds
        if self._like is None:
            self._like = other._like
        return self

    def reset(self) -> DenseSum:
        """Forget everything added (keep the shape, format and result library).

        Costs nothing: the next :meth:`add` writes the state instead of adding to it.
        """
        self._used[0] = 0
        self._empty = True
        self.adds = 0
        return self

    # -- the wire ---------------------------------------------------------------------------------
    def bounds(self, block: int = BLOCK, *, start: int = 0, stop: int | None = None) -> np.ndarray:
        """``(-lo, hi, -z)`` of every block (int32, MAX-reducible over processes).

        The block's values are multiples of ``2^lo`` below ``2^hi`` in magnitude; ``z`` is 1
        when one of its elements took only ``-0.0`` terms (or none), else 0. The adds keep
        them as they go (no pass of its own); only blocks they could not keep (a limb row,
        the edge of a part) are read again here — the same bounds either way.

        ``start``/``stop``: the bounds of elements ``start .. stop-1`` only, as if they were
        a sum of their own (its blocks start at ``start``; a shard of a reduce-scatter).
        """
        self._materialise()
        a, b = self._span(start, stop)
        whole = (a, b) == (0, self.size)
        if whole and block == BLOCK and self._bounds_kept:  # kept by the adds: read the rest
            out = self._bounds
        else:
            out = np.empty(((b - a + block - 1) // block, 3), np.int32)
        start_thread_pool()
        kernels.block_bounds(self._fast[a:b], self._slow_of[a:b], self._slow, block,
                             self.format.unit_exp, out, out is self._bounds)  # fmt: skip
        return out.copy() if out is self._bounds else out

    def _span(self, start: int, stop: int | None) -> tuple[int, int]:
        """``(start, stop)`` checked against this sum's elements (``stop`` None: the end)."""
        stop = self.size if stop is None else stop
        if not 0 <= start <= stop <= self.size:
            raise FoldError(f"elements {start} .. {stop} are not within this sum's {self.size}")
        return int(start), int(stop)

    def encode(
        self,
        layout: WireLayout,
        *,
        reuse: bool = False,
        start: int = 0,
        into: np.ndarray | None = None,
    ) -> np.ndarray:
        """This process's int64 words in ``layout`` (SUM-reducible over processes).

        With ``reuse`` the words go into a buffer this sum keeps from call to
        call (no new pages to fault in every step), overwritten by the next
        ``encode(..., reuse=True)``; with ``into`` (int64, at least ``layout.words``) into
        its front. ``start``: the words of elements ``start .. start + layout.size - 1``,
        in a layout made from their own :meth:`bounds` (``start=``, ``stop=``).
        """
        self._materialise()
        a, b = self._span(start, start + layout.size)
        if into is not None:
            words = into[: layout.words]
        elif not reuse:
            words = np.empty(layout.words, np.int64)
        else:
            if self._words is None or self._words.shape != (layout.words,):
                self._words = np.empty(layout.words, np.int64)
            words = self._words
        if b - a >= (1 << 16):
            start_thread_pool()
        kernels.encode(self._fast[a:b], self._slow_of[a:b], self._slow, self.adds,
                       self.format.unit_exp, layout.block, layout.classes, layout.lo,
                       layout.offsets, layout.split, words)  # fmt: skip
        return words

    def negzero(self, *, start: int = 0, stop: int | None = None) -> np.ndarray:
        """int32 flags: 1 where every term added was ``-0.0`` (or none was), else 0.

        MIN-reducible over processes; on the wire only ``layout.sign_elements()`` need them.
        ``start``/``stop``: the flags of those elements only.
        """
        self._materialise()
        a, b = self._span(start, stop)
        out = np.empty(b - a, np.int32)
        kernels.negzero_flags(self._fast[a:b], self._slow_of[a:b], self._slow, out)
        return out

    def decode(
        self,
        words: np.ndarray,
        layout: WireLayout,
        negzero: np.ndarray,
        out_dtype: Any = None,
        *,
        mean_over: int = 1,
        start: int = 0,
        stop: int | None = None,
    ) -> np.ndarray:
        """Round elements ``start .. stop-1`` of reduced ``words`` once (a NumPy array, flat).

        ``negzero`` is the reduced :meth:`negzero` (read for zero sums only; 0 outside
        ``layout.sign_elements()``), or empty when every zero sum is ``+0.0``;
        ``mean_over`` divides the exact sums first (one rounding in all).
        """
        stop = self.size if stop is None else stop
        out_name = resolve_out_dtype(self.format.value_dtypes[-1], out_dtype)
        if isinstance(mean_over, bool) or not isinstance(mean_over, int | np.integer):
            raise FoldTypeError(f"mean_over must be a positive integer; got {mean_over!r}")
        if not 0 < mean_over < (1 << 31):
            raise FoldError(f"mean_over must be in [1, 2**31); got {mean_over}")
        negzero = np.asarray(negzero)
        if negzero.shape not in ((0,), (self.size,)) or negzero.dtype != np.int32:
            raise FoldError(
                f"negzero must be {self.size} int32 flags (or none); got {negzero.shape} "
                f"{negzero.dtype}"
            )
        target = FLOATS[out_name]
        shift = held_shift(out_name)
        out_bits = np.empty(stop - start, np.int32 if shift else target.signed_bits_dtype)
        fast = out_name in ("float32", "float64")
        # out_f is read only when fast: a bfloat16 result's (int32 bits) takes float32's
        # compiled kernel, one signature fewer to compile
        out_f = out_bits.view(out_name) if fast else np.empty(1, _FLOAT_OF_WIDTH[out_bits.itemsize])
        if stop - start >= (1 << 16):
            start_thread_pool()
        kernels.decode(
            words, layout.classes, layout.lo, layout.offsets, layout.split, layout.block, self.size,
            self.format.unit_exp, self.format.limbs, negzero, int(mean_over), start, stop,
            out_f, out_bits, fast,
            rounding_target(out_name, self.format),
        )  # fmt: skip
        return out_bits.view(np.float32 if shift else out_name)

    # -- the result -------------------------------------------------------------------------------
    def result(self, out_dtype: Any = None, *, mean_over: int = 1) -> Any:
        """Every element's exact sum (divided by ``mean_over``) rounded once, in ``shape``.

        float32 by default (float64 for float64 values) or ``out_dtype``; in the
        library and on the device of the first array added.
        """
        layout = wire_layout(self.bounds(), self.size, 1, self.format.limbs)
        words = self.encode(layout)
        negzero = self.negzero() if self.adds else np.zeros(0, np.int32)  # empty: +0.0
        out = self.decode(words, layout, negzero, out_dtype, mean_over=mean_over)
        out = out.reshape(self.shape)
        if self._like is None:
            return out
        out_name = resolve_out_dtype(self.format.value_dtypes[-1], out_dtype)
        return from_numpy(out, like=self._like, dtype_name=out_name)

    def __repr__(self) -> str:
        return f"DenseSum(shape={self.shape}, format={self.format.name}, adds={self.adds})"


__all__ = ["BLOCK", "DenseSum", "WireLayout", "array_bounds", "array_words", "wire_layout"]
