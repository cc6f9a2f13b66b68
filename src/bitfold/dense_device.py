"""The wire words of one array, made and read where the array lives (a GPU, or any device).

:mod:`bitfold.dense` makes the exact all-reduce's words on the host, with
Numba: the array is read into NumPy first. This module makes the *same*
words — bit for bit, the one format of :class:`bitfold.dense.WireLayout` —
with PyTorch's own tensor operations on the tensor's device, and reads the
reduced words back into rounded sums there, so that a CUDA gradient never
crosses to the host:

* :func:`array_bounds`: each block's ``(-lo, hi, -z)`` straight from the
  values' bits (integer operations only: subnormals are read exactly in any
  floating-point mode), equal to :func:`bitfold.dense.array_bounds`'s; a
  block holding a NaN or an infinity gets ``hi = SPECIAL_HI``, as a
  :class:`~bitfold.dense.DenseSum`'s bounds give it.
* :func:`device_layout`: the layout of :func:`bitfold.dense.wire_layout`
  from the reduced bounds, on the device.
* :func:`array_words`: the half, thirds and narrow words of every block —
  one integer scatter-add of each element's lanes into its word, exact and
  order-free.
* :func:`decode`: each element's reduced sum ``S·2^lo`` (divided by
  ``mean_over``), rounded once to float16, bfloat16, float32 or float64, to
  nearest even, with integer operations only.

Two engines make them, as the backend registry answers for torch tensors on
the device (:data:`WORD_ENGINES`): where that is the triton backend (a CUDA or
XPU device, Triton installed), one Triton kernel a step
(:mod:`bitfold.kernels.triton_words`: one read of the values for the bounds,
one for the words, one pass for the decode), each launched
under the folds' device guard (:func:`bitfold.backends.triton.launching`:
the tensor's device made current, so a tensor on ``cuda:1`` is never
launched on ``cuda:0``); elsewhere (MPS,
XPU without Triton, the CPU) the tensor operations below. ``engine="triton"``
runs the kernels on CPU tensors under ``TRITON_INTERPRET=1`` (the tests).

The wide, wider and full blocks (a span over 63 bits, a NaN, an infinity)
are rare; a layout holding any is encoded and decoded on the host
(:mod:`bitfold.distributed` decides, from one read of the layout's totals).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backends import registry
from .formats import FLOATS
from .kernels.dense import (
    FULL,
    HALF,
    HALF_BITS,
    LANE_BITS,
    NARROW,
    NO_HI,
    NO_LO,
    SPECIAL_HI,
    THIRD_BITS,
    THIRDS,
    WIDE,
    WIDE_LOW_BITS,
    WIDER,
)

__all__ = [
    "ENGINES",
    "DeviceLayout",
    "array_bounds",
    "array_words",
    "decode",
    "device_layout",
    "widened",
]

#: The ways the words are made: Triton kernels, or PyTorch's tensor operations.
ENGINES = ("triton", "torch")
#: The backend that folds torch tensors on a device -> the engine making the words there
#: (every other backend: ``torch``).
WORD_ENGINES = {"triton": "triton"}
#: Blocks a Triton program takes (a tile of ``BLOCKS * BLOCK`` elements).
_TRITON_BLOCKS = 16


def _engine(flat: torch.Tensor, engine: str | None) -> str:
    """``engine``, or the registry's: Triton where the triton backend folds torch tensors on
    ``flat``'s device (a GPU it targets, Triton installed), else torch's operations."""
    if engine is not None:
        return engine
    return WORD_ENGINES.get(registry.backend_for("torch", flat.device.type).name, "torch")


def _bits_view(flat: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
    """``flat``'s bits as integers, and the kernels' constants that read them."""
    f = FLOATS["float64" if flat.dtype == torch.float64 else "float32"]
    if flat.dtype == torch.float64:
        return flat.view(torch.int64), {"EXP_BITS": f.exponent_bits,
                                         "FRAC_BITS": f.fraction_bits, "BITS_MASK": -1}
    return flat.view(torch.int32), {"EXP_BITS": f.exponent_bits, "FRAC_BITS": f.fraction_bits,
                                     "BITS_MASK": 0xFFFFFFFF}  # fmt: skip


def _grid(blocks: int) -> tuple[int]:
    return (max(1, -(-blocks // _TRITON_BLOCKS)),)


def widened(x: torch.Tensor) -> torch.Tensor:
    """``x`` flat, as float32 (float16 and bfloat16 widen exactly) or float64."""
    flat = x.detach().reshape(-1)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    return flat.contiguous()


def _parts(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each value's ``(raw, special, m, e)``: value ``±m·2^e`` unless ``special``; ``raw`` the
    bits as int64 (the sign is bit ``width - 1``)."""
    f = FLOATS["float64" if flat.dtype == torch.float64 else "float32"]
    if flat.dtype == torch.float64:
        raw = flat.view(torch.int64)
    else:
        raw = flat.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    top = (1 << f.exponent_bits) - 1
    ef = (raw >> f.fraction_bits) & top
    m = (raw & ((1 << f.fraction_bits) - 1)) | ((ef != 0).to(torch.int64) << f.fraction_bits)
    e = torch.clamp(ef, min=1) - (f.bias + f.fraction_bits)
    return raw, ef == top, m, e


def _bit_length(m: torch.Tensor) -> torch.Tensor:
    """Bits of each ``0 <= m < 2^63`` (0 for 0): the exponent of its float64, less one where
    the conversion rounded up to the next power of two."""
    length = torch.frexp(m.to(torch.float64)).exponent.to(torch.int64)
    return length - ((m >> torch.clamp(length - 1, 0, 62)) == 0).to(torch.int64) * (m != 0)


def _blocked(x: torch.Tensor, block: int, fill: int) -> torch.Tensor:
    """``x`` as ``(blocks, block)``, the last block padded with ``fill``."""
    pad = (-x.numel()) % block
    if pad:
        x = torch.cat([x, x.new_full((pad,), fill)])
    return x.view(-1, block)


def array_bounds(flat: torch.Tensor, block: int, engine: str | None = None) -> torch.Tensor:
    """Each block's ``(-lo, hi, -z)`` (int32, on ``flat``'s device) of float32 or float64 values.

    ``lo``: the lowest set bit's exponent over the block's non-zero values
    (``NO_LO`` for none); ``hi``: the top bit's exponent plus one (``NO_HI``
    for none; ``SPECIAL_HI`` for a block holding a NaN or an infinity);
    ``z``: 1 when the block holds a ``-0.0``.
    """
    blocks = -(-flat.numel() // block)
    if _engine(flat, engine) == "triton":
        from .backends import triton as backend
        from .kernels.triton_words import bounds_kernel

        bits, consts = _bits_view(flat)
        out = torch.empty((blocks, 3), dtype=torch.int32, device=flat.device)
        with backend.launching(flat):
            bounds_kernel[_grid(blocks)](bits, out, flat.numel(), blocks, **consts, NO_LO=NO_LO,
                                         NO_HI=NO_HI, SPECIAL_HI=SPECIAL_HI, BLOCK=block,
                                         BLOCKS=_TRITON_BLOCKS)  # fmt: skip
        return out
    raw, special, m, e = _parts(flat)
    width = 64 if flat.dtype == torch.float64 else 32
    sign = (raw >> (width - 1)) & 1
    negzero = (m == 0) & (sign == 1) & ~special
    live = (m != 0) & ~special
    low = e + _bit_length(m & -m) - 1
    top = e + _bit_length(m)
    lo = _blocked(torch.where(live, low, NO_LO), block, NO_LO).amin(1)
    hi = _blocked(torch.where(live, top, NO_HI), block, NO_HI).amax(1)
    hi = torch.where(_blocked(special, block, 0).any(1), SPECIAL_HI, hi)
    z = _blocked(negzero, block, 0).any(1)
    return torch.stack([-lo, hi, -z.to(torch.int64)], 1).to(torch.int32)


@dataclass(frozen=True)
class DeviceLayout:
    """:class:`bitfold.dense.WireLayout`'s arrays, on the device (the same values)."""

    size: int
    block: int
    classes: torch.Tensor  # (blocks,) int64
    lo: torch.Tensor  # (blocks,) int64
    offsets: torch.Tensor  # (blocks + 1,) int64
    signs: torch.Tensor  # (blocks,) bool
    split: int

    def totals(self) -> tuple[int, bool, bool]:
        """``(words, every block half, thirds or narrow, any zero signs travel)``: one read."""
        fast = torch.isin(self.classes, self.classes.new_tensor([HALF, THIRDS, NARROW]))
        words, all_fast, any_sign = torch.stack(
            [self.offsets[-1], fast.all().to(torch.int64), self.signs.any().to(torch.int64)]
        ).tolist()
        return int(words), bool(all_fast), bool(any_sign)

    def sign_elements(self) -> torch.Tensor:
        """Indices of the elements whose zero-sum signs travel (those of ``signs`` blocks)."""
        every = self.signs.repeat_interleave(self.block)[: self.size]
        return torch.nonzero(every).reshape(-1)


def device_layout(
    bounds: torch.Tensor, size: int, ranks: int, block: int, lanes_fit: bool, limbs: int
) -> DeviceLayout:
    """:func:`bitfold.dense.wire_layout` of reduced ``bounds``, made on their device."""
    growth = max(0, (ranks - 1).bit_length()) if ranks > 1 else 0
    b = bounds.to(torch.int64)
    low, hi = -b[:, 0], b[:, 1]
    first = torch.arange(b.shape[0], device=b.device) * block
    count = torch.clamp(size - first, max=block)
    bits = hi - low + growth + 1
    split = THIRD_BITS - 1 - growth
    thirds = (hi - low <= 2 * split) if split >= 1 else torch.zeros_like(hi, dtype=torch.bool)
    c = torch.full_like(hi, FULL)
    if lanes_fit:
        c = torch.where(bits <= WIDE_LOW_BITS + 62, WIDER, c)
        c = torch.where(bits <= LANE_BITS + 62, WIDE, c)
    c = torch.where(bits <= 63, NARROW, c)
    c = torch.where(thirds, THIRDS, c)
    c = torch.where(bits <= HALF_BITS, HALF, c)
    c = torch.where(hi >= SPECIAL_HI, FULL, c)
    c = torch.where(hi == NO_HI, NARROW, c)
    low = torch.where(hi == NO_HI, 0, low)
    words = torch.where(c == NARROW, count, count * (limbs + 5))
    words = torch.where(c == HALF, (count + 1) // 2, words)
    words = torch.where(c == THIRDS, (2 * count + 2) // 3, words)
    words = torch.where(c == WIDE, count + (count + 1) // 2, words)
    words = torch.where(c == WIDER, 2 * count, words)
    offsets = torch.cat([words.new_zeros(1), torch.cumsum(words, 0)])
    signs = (b[:, 2] < 0) & (c != FULL)
    return DeviceLayout(size, block, c, low, offsets, signs, split)


def _element_places(layout: DeviceLayout) -> tuple[torch.Tensor, ...]:
    """Every element's block facts: ``(class, lo, first word, j, count, a, rw)``.

    ``j``: its place in the block; ``a = count // 2`` (a thirds block's paired words); ``rw``:
    the words of the rest after them (see :func:`bitfold.kernels.dense._pack`).
    """
    n, block = layout.size, layout.block
    i = torch.arange(n, device=layout.classes.device)
    b = i // block
    j = i - b * block
    count = torch.clamp(n - b * block, max=block)
    a = count // 2
    r = count - a + count % 2
    return layout.classes[b], layout.lo[b], layout.offsets[b], j, count, a, (r + 2) // 3


def _lane_place(k: torch.Tensor, a: torch.Tensor, rw: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Word (after the block's first) and lane of entry ``k`` of a thirds block's rest."""
    return a + k % rw, k // rw


def array_words(
    flat: torch.Tensor, layout: DeviceLayout, words: int, engine: str | None = None
) -> torch.Tensor:
    """The ``words`` int64 words of ``flat`` (no NaN or infinity; every block half, thirds or
    narrow), equal to :func:`bitfold.dense.array_words`'s."""
    if _engine(flat, engine) == "triton":
        from .backends import triton as backend
        from .kernels.triton_words import words_kernel

        bits, consts = _bits_view(flat)
        out = torch.empty(words, dtype=torch.int64, device=flat.device)
        blocks = layout.classes.numel()
        with backend.launching(flat):
            words_kernel[_grid(blocks)](bits, layout.classes, layout.lo, layout.offsets, out,
                                        flat.numel(), blocks, layout.split, **consts,
                                        BLOCK=layout.block, BLOCKS=_TRITON_BLOCKS)  # fmt: skip
        return out
    raw, _, m, e = _parts(flat)
    klass, lo, base, j, _, a, rw = _element_places(layout)
    shift = e - lo
    x = torch.where(shift >= 0, m << torch.clamp(shift, 0, 63), m >> torch.clamp(-shift, 0, 63))
    width = 64 if flat.dtype == torch.float64 else 32
    x = torch.where(((raw >> (width - 1)) & 1) == 1, -x, x)
    split = layout.split
    low, high = x & ((1 << split) - 1), x >> split
    lane = 1 << THIRD_BITS
    # narrow: the element is its word; half: two a word, the second times 2^32
    place1 = torch.where(klass == HALF, base + j // 2, base + j)
    part1 = torch.where((klass == HALF) & (j % 2 == 1), x * (1 << HALF_BITS), x)
    place2 = place1
    part2 = torch.zeros_like(x)
    # thirds: word w < a is (low of w, high of w, low of a + w); the rest hold the highs of
    # a .. count - 1, then the low of the last element when count is odd
    paired, second = j < a, (j >= a) & (j < 2 * a)
    k_high = torch.where(second, j - a, a)  # the high's place in the rest (the last: a)
    w_high, l_high = _lane_place(k_high, a, rw)
    w_low, l_low = _lane_place(a + 1, a, rw)  # the odd last element's low
    thirds = klass == THIRDS
    place1 = torch.where(thirds, base + torch.where(paired, j, torch.where(second, j - a, w_low)),
                         place1)  # fmt: skip
    part1 = torch.where(thirds, torch.where(paired, low + high * lane, torch.where(
        second, low * (lane * lane), low << (THIRD_BITS * l_low))), part1)  # fmt: skip
    place2 = torch.where(thirds & ~paired, base + w_high, place2)
    scale = torch.ones_like(high) << (THIRD_BITS * l_high)
    part2 = torch.where(thirds & ~paired, high * scale, part2)
    out = torch.zeros(words, dtype=torch.int64, device=flat.device)
    out.index_add_(0, place1, part1)
    out.index_add_(0, place2, part2)
    return out


def _sign_extend(t: torch.Tensor, bits: int) -> torch.Tensor:
    """The low ``bits`` of ``t`` as a signed integer."""
    half = 1 << (bits - 1)
    return ((t & ((1 << bits) - 1)) ^ half) - half


def _thirds_lane(t: torch.Tensor, lane: torch.Tensor) -> torch.Tensor:
    """Lane 0, 1 or 2 of reduced thirds words ``t``, recovered from the bottom up."""
    a = _sign_extend(t, THIRD_BITS)
    t = (t - a) >> THIRD_BITS
    b = _sign_extend(t, THIRD_BITS)
    c = (t - b) >> THIRD_BITS
    return torch.where(lane == 0, a, torch.where(lane == 1, b, c))


def element_sums(words: torch.Tensor, layout: DeviceLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element's reduced exact sum ``S`` (int64) and its unit ``lo``: ``S·2^lo``."""
    klass, lo, base, j, _, a, rw = _element_places(layout)
    last = words.numel() - 1

    def word(at: torch.Tensor) -> torch.Tensor:
        return words[torch.clamp(at, 0, last)]

    narrow = word(base + j)
    t = word(base + j // 2)
    half_low = _sign_extend(t, HALF_BITS)
    half = torch.where(j % 2 == 1, (t - half_low) >> HALF_BITS, half_low)
    paired, second = j < a, (j >= a) & (j < 2 * a)
    w_high, l_high = _lane_place(torch.where(second, j - a, a), a, rw)
    w_low, l_low = _lane_place(a + 1, a, rw)
    at_low = torch.where(paired, j, torch.where(second, j - a, w_low))
    lane_low = torch.where(paired, 0, torch.where(second, 2, l_low))
    at_high = torch.where(paired, j, w_high)
    lane_high = torch.where(paired, 1, l_high)
    thirds = _thirds_lane(word(base + at_low), lane_low) + (
        _thirds_lane(word(base + at_high), lane_high) * (1 << layout.split))  # fmt: skip
    s = torch.where(klass == HALF, half, torch.where(klass == THIRDS, thirds, narrow))
    return s, lo


def _rounded_bits(
    mag: torch.Tensor, unit: torch.Tensor, sticky: torch.Tensor, out_name: str
) -> torch.Tensor:
    """``mag·2^unit`` (``0 <= mag < 2^63``; ``sticky``: more below it) rounded to nearest even
    into ``out_name``'s unsigned bits, subnormals and overflow to infinity included."""
    f = FLOATS[out_name]
    P, F, S = f.precision, f.fraction_bits, f.subnormal_exp
    length = _bit_length(mag)
    q = torch.clamp(unit + length - P, min=S)  # the exponent of the result's last bit
    sh = q - unit
    exact = mag << torch.clamp(-sh, 0, 62)
    d = torch.clamp(sh - 1, 0, 63)
    x = mag >> d  # the significand and the guard bit
    below = (mag - (x << d)) != 0
    sticky = sticky | below
    kept = x >> 1
    rounded = kept + ((x & 1) & ((sticky.to(torch.int64)) | (kept & 1)))
    m = torch.where(sh <= 0, exact, rounded)
    biased = (q - S) + (m >> F)
    top = (1 << f.exponent_bits) - 1
    over = biased >= top
    bits = (torch.clamp(biased, 0, top) << F) | torch.where(over, 0, m & ((1 << F) - 1))
    return torch.where((mag == 0) & ~sticky, 0, bits)


def _divided(
    mag: torch.Tensor, unit: torch.Tensor, mean_over: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mag·2^unit / mean_over`` as ``(T, unit', sticky)``: ``T`` of 62 bits (for a non-zero
    ``mag``), the quotient's top, and whether anything is left below it."""
    s = 62 - _bit_length(mag)
    shifted = mag << torch.clamp(s, 0, 62)
    q1, r1 = shifted // mean_over, shifted % mean_over
    r1 = r1 << 31
    q2, r2 = r1 // mean_over, r1 % mean_over  # q1·2^31 + q2 + r2 / mean_over
    t = torch.clamp(62 - _bit_length(q1), 0, 31)
    drop = 31 - t
    top = (q1 << t) | (q2 >> drop)
    sticky = ((q2 - ((q2 >> drop) << drop)) != 0) | (r2 != 0)
    return top, unit - s - t, sticky


def decode(
    words: torch.Tensor,
    layout: DeviceLayout,
    negzero: torch.Tensor | None,
    out_name: str,
    mean_over: int = 1,
    engine: str | None = None,
) -> torch.Tensor:
    """Every element's reduced sum (divided by ``mean_over``) rounded once, flat, in ``out_name``.

    ``negzero`` (int32 an element, 1 where every term on every rank was ``-0.0``) signs the
    zero sums; None: every zero sum is ``+0.0``.
    """
    f = FLOATS[out_name]
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
             "float64": torch.float64}[out_name]  # fmt: skip
    ints = {16: torch.int16, 32: torch.int32, 64: torch.int64}[f.width]
    if _engine(words, engine) == "triton":
        from .backends import triton as backend
        from .kernels.triton_words import decode_kernel

        out = torch.empty(layout.size, dtype=ints, device=words.device)
        blocks = layout.classes.numel()
        with backend.launching(words):
            decode_kernel[_grid(blocks)](
                words, layout.classes, layout.lo, layout.offsets,
                words if negzero is None else negzero, out, layout.size, blocks, layout.split,
                mean_over, HAS_SIGNS=negzero is not None, PREC=f.precision, TEXP=f.exponent_bits,
                SUBEXP=f.subnormal_exp, BLOCK=layout.block, BLOCKS=_TRITON_BLOCKS,
            )  # fmt: skip
        return out.view(dtype)
    s, unit = element_sums(words, layout)
    neg = s < 0
    mag = torch.where(neg, -s, s)
    sticky = torch.zeros_like(neg)
    if mean_over > 1:
        mag, unit, sticky = _divided(mag, unit, mean_over)
    bits = _rounded_bits(mag, unit, sticky, out_name)
    zero_sign = (s == 0) & (negzero != 0) if negzero is not None else torch.zeros_like(neg)
    signed = bits + torch.where(neg | zero_sign, -(1 << (f.width - 1)), 0)
    return signed.to(ints).view(dtype)
