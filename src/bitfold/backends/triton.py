"""The Triton backend: folds of GPU tensors with Triton kernels, on their device and stream.

It serves torch tensors on the devices Triton compiles for (``cuda``, which is
also ROCm's device type in torch, and ``xpu``), and CuPy arrays through
DLPack (no copy). Under ``TRITON_INTERPRET=1`` it also serves CPU tensors
when asked by name (``backend="triton"``): Triton's interpreter runs the same
kernels on the CPU, which is how the suite tests them without a GPU.

Every step is a kernel or a torch operation queued on the values' current
stream; nothing waits for the host inside a fold, and every buffer comes from
torch's caching allocator, so a warm fold can be captured in a CUDA graph.
The plan's data on the device (sorted order, offsets, counts; built on the
device for a device index) comes from :func:`bitfold.backends.device_plan.plan_tensors`;
the table of hot buckets (those with more positions than a lane walks, cut in
chunks: :class:`HotChunkTable`) is made once per plan, device and tuning, and
kept by the plan under a :class:`HotChunksKey`; what an exact fold launches, under
a :class:`LaunchKey`.

Numeric contracts: :mod:`bitfold.kernels.triton`. ``exact`` gives the host's
bits (the correctly rounded sum), ``ordered`` the host ``ordered`` bits (NaN
results as the canonical NaN), ``atomic`` torch's ``index_add_``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import library_of, to_numpy
from ..errors import DeviceError, FoldTypeError
from ..formats import FLOATS, N_NOT_NEGZERO, N_TERMS, LimbFormat, decoding, limb_format_for
from ..plan_view import DeviceKey, PlanView
from ..validate import Values, positive_int_or_none
from . import host_state, selftest
from .device_plan import plan_tensors
from .registry import Backend, InitRule

NAME = "triton"
#: torch device types Triton compiles for (ROCm tensors are "cuda" in torch).
GPU_DEVICES = ("cuda", "xpu")
#: A bucket with at least this many positions is hot: chunks of it are summed by many programs.
HOT_MIN = 256
#: Values (positions times row size) a hot program sums.
CHUNK_VALUES = 8192
#: Values a hot program reads at a time (``BLOCK_N * BLOCK_D``): 16 a thread of 4 warps, so the
#: tile's words stay in registers (4096 spilled 336-660 bytes on sm_90).
HOT_TILE = 2048
#: Output elements (lanes) a program of the lanes kernel holds: float32-family and float64 limbs.
LANES = {"f32": 128, "f64": 32}
_HOT_MEANING = "positions from which a bucket is summed by many programs"
_CHUNK_MEANING = "positions one program of a hot bucket sums"
_BITS = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}
_MASKS = {"float16": 0xFFFF, "bfloat16": 0xFFFF, "float32": 0xFFFFFFFF, "float64": -1}


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def triton_loads() -> bool:
    """Whether Triton and torch are installed (nothing is imported; looked up once)."""
    return all(importlib.util.find_spec(m) is not None for m in ("triton", "torch"))


def runs_on(device: str) -> bool:
    """Whether the kernels can run on tensors of torch device type ``device`` here."""
    if device in GPU_DEVICES:
        return True
    return device == "cpu" and interpreting()


def why_not(device: str) -> str:
    """Why the kernels cannot run on tensors of torch device type ``device`` here, and what
    would let them (the registry's refusal of ``backend="triton"``)."""
    missing = [m for m in ("triton", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        return f"{' and '.join(missing)} {verb} not installed (pip install 'bitfold[triton]')"
    if device == "cpu":
        return (
            "CPU tensors run the Triton kernels only under TRITON_INTERPRET=1 (Triton's "
            "interpreter, for tests); leave backend= out to fold them on the host, or move "
            "them to a GPU"
        )
    return f"the Triton kernels run on {', '.join(GPU_DEVICES)} (and cpu in the interpreter)"


def _torch() -> Any:
    import torch

    return torch


@functools.cache
def _kernels() -> Any:
    from ..kernels import triton as kernels

    return kernels


# -- values ------------------------------------------------------------------------------------
def _as_torch(values: Any) -> tuple[Any, str]:
    """``(tensor, library)``: a torch view of ``values`` (CuPy through DLPack, no copy)."""
    lib = library_of(values)
    if lib == "torch":
        return values, lib
    if lib == "cupy":
        return _torch().from_dlpack(values), lib
    raise DeviceError(
        f"the triton backend folds torch tensors and CuPy arrays; got a {lib} array"
    )


def _back(t: Any, lib: str) -> Any:
    if lib == "cupy":
        import cupy

        return cupy.from_dlpack(t)
    return t


@contextlib.contextmanager
def launching(t: Any, lib: str = "torch") -> Iterator[None]:
    """Kernels launched here go to ``t``'s device, on its library's current stream.

    Triton launches on torch's current device and stream: the values' device
    is made current, and for CuPy arrays CuPy's current stream becomes torch's
    (an external stream, no copy, no wait). Every Triton launch of bitfold
    runs under it (the folds' here, the all-reduce words' in
    :mod:`bitfold.dense_device`): a tensor on ``cuda:1`` while ``cuda:0`` is
    current would otherwise be launched with ``cuda:1``'s pointers on
    ``cuda:0``.
    """
    torch = _torch()
    kind = t.device.type
    if kind == "cpu" or (kind == "cuda" and lib == "torch"
                         and t.device.index == torch.cuda.current_device()):  # fmt: skip
        yield  # nothing to switch: the common case costs no context
        return
    with contextlib.ExitStack() as stack:
        if t.device.type == "cuda":
            stack.enter_context(torch.cuda.device(t.device))
            if lib == "cupy":
                import cupy

                external = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr,
                                                     device=t.device)  # fmt: skip
                stack.enter_context(torch.cuda.stream(external))
        elif t.device.type == "xpu":
            stack.enter_context(torch.xpu.device(t.device))
        yield


def _check_device(t: Any) -> None:
    if not runs_on(t.device.type):
        raise DeviceError(
            f"the triton backend runs on GPUs ({', '.join(GPU_DEVICES)}); values on device "
            f"{str(t.device)!r} fold there only in Triton's interpreter (TRITON_INTERPRET=1)"
        )


def _bits(t: Any, dtype: str) -> Any:
    """The values' bit patterns as a flat contiguous integer tensor (a view where possible)."""
    torch = _torch()
    return t.contiguous().view(getattr(torch, _BITS[dtype])).reshape(-1)


def _out(like: Any, shape: tuple[int, ...], out_name: str) -> tuple[Any, Any]:
    """A result tensor of ``out_name`` and the integer view the kernels write its bits into."""
    torch = _torch()
    out = torch.empty(shape, dtype=getattr(torch, out_name), device=like.device)
    return out, out.view(getattr(torch, _BITS[out_name]))


@dataclass(frozen=True)
class Decode:
    """How the kernels read one value dtype in one limb format (their constexpr arguments)."""

    mask: int
    exp_bits: int
    frac_bits: int
    shift: int
    wide: bool

    @classmethod
    def of(cls, dtype: str, fmt: LimbFormat) -> Decode:
        exp_bits, frac_bits, shift = decoding(dtype, fmt)
        return cls(_MASKS[dtype], exp_bits, frac_bits, shift, dtype == "float64")

    def kwargs(self) -> dict[str, Any]:
        return dict(BITS_MASK=self.mask, EXP_BITS=self.exp_bits, FRAC_BITS=self.frac_bits,
                    SHIFT=self.shift, WIDE=self.wide)  # fmt: skip


def _limbs(fmt: LimbFormat) -> dict[str, Any]:
    return dict(L=fmt.limbs, L_PAD=_kernels().next_power_of_2(fmt.limbs))


def _target(out_name: str, fmt: LimbFormat) -> dict[str, Any]:
    t = FLOATS[out_name]
    return dict(UNIT=fmt.unit_exp, PREC=t.precision, TEXP=t.exponent_bits,
                SUBEXP=t.subnormal_exp, NAN_BITS=t.canonical_nan)  # fmt: skip


# -- hot buckets ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HotChunkTable:
    """The hot buckets of a plan on one device: which, and their chunks of the sorted order.

    Each hot bucket's run of the sorted order is cut in contiguous chunks of
    ``chunk`` positions (the last one shorter), one hot program a chunk; the
    numba-cuda kernels' :class:`bitfold.kernels.cuda.HotSegmentTable` interleaves
    its segments instead.
    """

    buckets: Any  # (H,) int64: the hot buckets, increasing
    chunks: Any  # (C, 3) int64: (rank among the hot buckets, start, end) a chunk
    count: int  # H
    nchunks: int  # C


@dataclass(frozen=True)
class HotChunksKey(DeviceKey):
    """The key of a plan's :class:`HotChunkTable` on one torch device (``str`` of it) and tuning."""

    hot_min: int
    chunk: int


def hot_chunk_table(plan: PlanView, device: Any, hot_min: int, chunk: int) -> HotChunkTable:
    """The hot chunk table (buckets of ``hot_min`` positions or more, cut in chunks of ``chunk``).

    Built once per plan, device and tuning with torch operations on the
    device; its two sizes are read once (one wait for the device), when it is built.
    """
    torch = _torch()

    def build() -> HotChunkTable:
        pt = plan_tensors(plan, device)
        counts = pt.counts.to(torch.int64)
        hot = counts >= hot_min
        H, C = (int(n) for n in torch.stack(  # the table's two sizes, in one read
            [hot.sum(), torch.where(hot, (counts + chunk - 1) // chunk, 0).sum()]).tolist())
        buckets = _first_true(hot, H)
        if H == 0:
            empty = torch.zeros((0, 3), dtype=torch.int64, device=device)
            return HotChunkTable(buckets, empty, 0, 0)
        per = (counts[buckets] + chunk - 1) // chunk
        rank = torch.repeat_interleave(torch.arange(H, device=device), per, output_size=C)
        first = torch.cumsum(per, 0) - per
        within = torch.arange(C, device=device) - first[rank]
        start = pt.offsets[buckets][rank] + within * chunk
        end = torch.minimum(start + chunk, pt.offsets[buckets + 1][rank])
        return HotChunkTable(buckets, torch.stack([rank, start, end], 1).contiguous(), H, C)

    return plan.prepared(HotChunksKey(str(device), hot_min, chunk), build)


def _first_true(mask: Any, count: int) -> Any:
    """The indices where ``mask`` (1-D bool) is true, increasing; ``count`` of them, known.

    A stable partition by scans and one scatter, on ``mask``'s device: no
    wait for the device (``torch.nonzero`` reads its size back first) and no
    ``torch.nonzero_static`` (missing on CUDA in older torch releases).
    Every element gets its own place (the true ones first, in order), so the
    scatter is deterministic.
    """
    torch = _torch()
    flags = mask.to(torch.int64)
    place = torch.where(mask, torch.cumsum(flags, 0), count + torch.cumsum(1 - flags, 0)) - 1
    order = torch.empty_like(place)
    order[place] = torch.arange(place.numel(), device=place.device)
    return order[:count]


# -- the strategies ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExactLaunch:
    """Everything an exact fold launches, worked out once per plan, device and shape of call.

    The plan's tensors, the hot chunk table, the grids and the kernels' constexpr
    arguments: a warm fold only allocates its result (and the hot buckets'
    state) and launches.
    """

    tensors: Any
    lanes_grid: tuple[int, ...]
    lanes: dict[str, Any]
    hot: HotChunkTable | None
    hot_grid: tuple[int, ...]
    hot_args: dict[str, Any]
    round_grid: tuple[int, ...]
    round_args: dict[str, Any]
    state_shape: tuple[int, int]


@dataclass(frozen=True)
class LaunchKey(DeviceKey):
    """The key of a plan's :class:`ExactLaunch` on one torch device (``str`` of it), per
    values' dtype, result dtype, row length, init and tuning."""

    dtype: str
    out_name: str
    D: int
    has_init: bool
    hot_min: int
    chunk: int


def exact_launch(
    plan: PlanView, device: Any, dtype: str, out_name: str, D: int, has_init: bool, hot_min: int,
    chunk: int,
) -> ExactLaunch:  # fmt: skip
    """The :class:`ExactLaunch` of a fold (made on first use, kept by the plan)."""

    def build() -> ExactLaunch:
        kernels = _kernels()
        fmt = limb_format_for(dtype)
        dec = Decode.of(dtype, fmt).kwargs()
        limbs, target = _limbs(fmt), _target(out_name, fmt)
        block_d = min(kernels.next_power_of_2(D), 64)
        block_k = max(1, LANES[fmt.name] // block_d)
        hot = hot_chunk_table(plan, device, hot_min, chunk) if plan.size >= hot_min else None
        hot = hot if hot is not None and hot.count else None
        block_n = max(1, min(kernels.next_power_of_2(chunk), HOT_TILE // block_d))
        rows = hot.count * D if hot is not None else 0
        block = LANES[fmt.name]
        return ExactLaunch(
            tensors=plan_tensors(plan, device),
            lanes_grid=(triton_cdiv(plan.K, block_k), triton_cdiv(D, block_d)),
            lanes=dict(**dec, HAS_INIT=has_init, **limbs, **target, BLOCK_K=block_k,
                       BLOCK_D=block_d, WORD=True),
            hot=hot,
            hot_grid=(hot.nchunks if hot is not None else 1, triton_cdiv(D, block_d)),
            hot_args=dict(**dec, **limbs, W=fmt.width, BLOCK_N=block_n, BLOCK_D=block_d),
            round_grid=(triton_cdiv(rows, block),),
            round_args=dict(**dec, HAS_TARGET=True, HAS_TERMS=True, HAS_INIT=has_init, **limbs,
                            W=fmt.width, **target, BLOCK=block),
            state_shape=(rows, fmt.width),
        )

    key = LaunchKey(str(device), dtype, out_name, D, has_init, hot_min, chunk)
    return plan.prepared(key, build)


def _tuning(hot_min: Any, chunk: Any, D: int) -> tuple[int, int]:
    """``(hot_min, chunk)`` of a fold of rows of ``D`` elements: the defaults, or the values
    given, checked by name before any work.

    Both are at most the kernels' carry bound (:data:`bitfold.kernels.triton.MAX_RUN`
    values): a lane sums a bucket of fewer than ``hot_min`` positions (and the
    init) in its limbs without a carry, and a hot program ``chunk`` positions;
    more could overflow the int64 limbs.
    """
    bound = _kernels().MAX_RUN
    why = "the most values the kernels' limbs add before a carry"
    hot = positive_int_or_none(hot_min, "hot_min", _HOT_MEANING, at_most=bound, why=why)
    cut = positive_int_or_none(chunk, "chunk", _CHUNK_MEANING, at_most=bound, why=why)
    return hot or HOT_MIN, cut or max(16, CHUNK_VALUES // max(D, 1))


def fold_exact(
    plan: PlanView,
    values: Any,
    spec: Values,
    out_name: str,
    *,
    init: Any = None,
    hot_min: int | None = None,
    chunk: int | None = None,
) -> Any:
    """The exact fold on the values' device: the host's bits, the correctly rounded sums.

    ``init`` ((K,) + trailing, the values' dtype and device) adds one term to
    every bucket. ``hot_min`` (positions from which a bucket is split over
    many programs) and ``chunk`` (positions a program of a hot bucket sums)
    tune the kernels; they never change the result. Two or three launches:
    the lanes; with hot buckets, their chunks and their rounding.
    """
    t, lib = _as_torch(values)
    _check_device(t)
    K, D = plan.K, spec.row_size
    hot_min, chunk = _tuning(hot_min, chunk, D)
    bits = _bits(t, spec.dtype)
    init_bits = bits
    if init is not None:
        it, _ = _as_torch(init)
        _same_place(it, t, spec.dtype)
        init_bits = _bits(it, spec.dtype)
    if D == 0:  # rows of no elements: nothing to sum, nothing to launch
        return _back(_out(t, (K, *spec.trailing), out_name)[0], lib)
    launch = exact_launch(plan, t.device, spec.dtype, out_name, D, init is not None, hot_min,
                          chunk)  # fmt: skip
    pt = launch.tensors
    kernels = _kernels()
    out, out_bits = _out(t, (K, D), out_name)
    out_flat = out_bits.reshape(-1)
    with launching(t, lib):
        kernels.lanes_kernel[launch.lanes_grid](
            bits, pt.order, pt.offsets, init_bits, out_flat, K, D, hot_min, **launch.lanes,
        )  # fmt: skip
        hot = launch.hot
        if hot is not None:
            torch = _torch()
            state = torch.zeros(launch.state_shape, dtype=torch.int64, device=t.device)
            kernels.hot_kernel[launch.hot_grid](
                bits, pt.order, hot.chunks, state, D, **launch.hot_args
            )  # fmt: skip
            kernels.round_rows_kernel[launch.round_grid](
                state, out_flat, hot.buckets, pt.counts, init_bits, launch.state_shape[0], D,
                **launch.round_args,
            )  # fmt: skip
    return _back(out.reshape((K, *spec.trailing)), lib)


def _round_rows(
    kernels: Any, state: Any, out_flat: Any, fmt: LimbFormat, target: dict[str, Any], *,
    rows: int,
) -> None:  # fmt: skip
    """Round ``rows`` state rows once each into ``out_flat`` (an accumulator's result)."""
    block = LANES[fmt.name]
    dec = Decode.of("float32" if fmt.name == "f32" else "float64", fmt)
    kernels.round_rows_kernel[(triton_cdiv(rows, block),)](
        state, out_flat, state, state, state, rows, 1, **dec.kwargs(), HAS_TARGET=False,
        HAS_TERMS=False, HAS_INIT=False, **_limbs(fmt), W=fmt.width, **target, BLOCK=block,
    )  # fmt: skip


def _same_place(it: Any, t: Any, dtype: str) -> None:
    from ..formats import dtype_name

    if it.device != t.device:
        raise DeviceError(f"init lives on device {it.device} and the values on {t.device}")
    if dtype_name(it) != dtype:
        raise FoldTypeError(
            f"the triton backend adds into an init of the values' dtype ({dtype}); got "
            f"{dtype_name(it)}"
        )


def fold_ordered(plan: PlanView, values: Any, spec: Values, out_name: str) -> Any:
    """The ``ordered`` fold on the device: the host ``ordered`` bits."""
    t, lib = _as_torch(values)
    _check_device(t)
    kernels = _kernels()
    K, D, N = plan.K, spec.row_size, spec.positions
    if D == 0:  # rows of no elements: nothing to add, nothing to launch
        return _back(_out(t, (K, *spec.trailing), out_name)[0], lib)
    rows = t.reshape(N, D)
    rows = rows.float() if spec.dtype in ("float16", "bfloat16") else rows
    rows = rows.contiguous()
    pt = plan_tensors(plan, t.device)
    out, out_bits = _out(t, (K, D), out_name)
    narrow = out_name in ("float16", "bfloat16")
    target = FLOATS[out_name]
    block_d = min(kernels.next_power_of_2(D), 64)
    block_k = max(1, 128 // block_d)
    with launching(t, lib):
        kernels.ordered_kernel[(triton_cdiv(K, block_k), triton_cdiv(D, block_d))](
            rows, pt.order, pt.offsets, out_bits.reshape(-1), K, D,
            NARROW=narrow, WIDE_ACC=out_name == "float64",
            VAL_NARROW=spec.dtype == "float64" and out_name != "float64",
            PREC=target.precision, TEXP=target.exponent_bits, SUBEXP=target.subnormal_exp,
            NAN_BITS=target.canonical_nan, BLOCK_K=block_k, BLOCK_D=block_d,
        )  # fmt: skip
    return _back(out.reshape((K, *spec.trailing)), lib)


def fold_atomic(plan: PlanView, values: Any, spec: Values, out_name: str) -> Any:
    """torch's float ``index_add_`` (float32, float64 for float64 output), rounded once after."""
    torch = _torch()
    t, lib = _as_torch(values)
    _check_device(t)
    K, D, N = plan.K, spec.row_size, spec.positions
    acc = torch.float64 if out_name == "float64" else torch.float32
    total = torch.zeros((K, D), dtype=acc, device=t.device)
    total.index_add_(0, plan_tensors(plan, t.device).index, t.reshape(N, D).to(acc))
    return _back(total.to(getattr(torch, out_name)).reshape((K, *spec.trailing)), lib)


def expand(plan: PlanView, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), on ``v``'s device."""
    t, lib = _as_torch(v)
    idx = plan_tensors(plan, t.device).index
    return _back(t.index_select(0, idx).reshape(plan.shape + tuple(trailing)), lib)


# -- exact states ----------------------------------------------------------------------------
def new_state(K: int, fmt: LimbFormat, trailing: tuple[int, ...] = (), like: Any = None) -> Any:
    """A zero state ``(K,) + trailing + (L + 5,)`` int64 on ``like``'s device (host without)."""
    if like is None:
        return host_state.new_state(K, fmt, trailing)
    t, _ = _as_torch(like)
    torch = _torch()
    return torch.zeros((K, *trailing, fmt.width), dtype=torch.int64, device=t.device)


def exact_state(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat) -> Any:
    """The state of ``values`` (plan positions ``spec.start ..``), carried, on their device."""
    torch = _torch()
    t, lib = _as_torch(values)
    _check_device(t)
    if spec.dtype not in fmt.value_dtypes:
        raise FoldTypeError(f"a {fmt.name} state holds sums of {', '.join(fmt.value_dtypes)}; "
                            f"got {spec.dtype} values")  # fmt: skip
    kernels = _kernels()
    K, D, N = plan.K, spec.row_size, spec.positions
    index = plan_tensors(plan, t.device).index[spec.start : spec.start + N]
    bits = _bits(t, spec.dtype)
    state = torch.zeros((K * D, fmt.width), dtype=torch.int64, device=t.device)
    block_d = min(kernels.next_power_of_2(D), 64)
    block_n = max(1, 1024 // block_d)
    step = kernels.MAX_RUN
    starts = range(0, N, step) if D else range(0)  # rows of no elements: nothing to launch
    for first in starts:  # at most MAX_RUN values reach a row a launch
        n = min(step, N - first)
        with launching(t, lib):
            kernels.scatter_kernel[(triton_cdiv(n, block_n), triton_cdiv(D, block_d))](
                bits[first * D :], index[first:], state, n, D,
                **Decode.of(spec.dtype, fmt).kwargs(), L=fmt.limbs, W=fmt.width,
                BLOCK_N=block_n, BLOCK_D=block_d,
            )  # fmt: skip
        state = _carried(state, fmt)
    counts = torch.bincount(index, minlength=K).repeat_interleave(D)
    state[:, fmt.limbs + N_TERMS] += counts
    state[:, fmt.limbs + N_NOT_NEGZERO] += counts
    return state.reshape((K, *spec.trailing, fmt.width))


def _carried(state: Any, fmt: LimbFormat) -> Any:
    from .portable.states import merge_states as carry_merge

    return carry_merge(state, _torch().zeros_like(state), fmt)


def add_to_state(
    state: Any, plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, **options: Any
) -> Any:
    """Add ``values`` into ``state`` exactly; the new state.

    A state on the values' device adds their state there; a state elsewhere
    (the host) gets it copied once (exact: integers).
    """
    ours = exact_state(plan, values, spec, fmt).reshape(tuple(int(s) for s in state.shape))
    if isinstance(state, np.ndarray):
        return host_state.merge_states(state, to_numpy(ours), fmt)
    torch = _torch()
    if state.device != ours.device:
        ours = ours.to(state.device)
    if not isinstance(state, torch.Tensor):
        raise FoldTypeError("a triton state is a torch tensor or a host NumPy array")
    return merge_states(state, ours, fmt)


def merge_states(into: Any, other: Any, fmt: LimbFormat) -> Any:
    """``into + other``, carried: two states of one plan, format and place."""
    from .portable.states import merge_states as carry_merge

    return carry_merge(into, other, fmt)


def round_state(state: Any, fmt: LimbFormat, out_name: str) -> Any:
    """Round every element of a state once to ``out_name``: an array of its place."""
    if isinstance(state, np.ndarray):
        return host_state.round_state(state, fmt, out_name)
    _check_device(state)
    kernels = _kernels()
    shape = tuple(int(s) for s in state.shape[:-1])
    flat = state.reshape(-1, fmt.width).contiguous()
    rows = int(flat.shape[0])
    out, out_bits = _out(state, (rows,), out_name)
    if rows:
        with launching(state, "torch"):
            _round_rows(kernels, flat, out_bits, fmt, _target(out_name, fmt), rows=rows)
    return out.reshape(shape)


def explain_route(plan: PlanView, values: Any, spec: Values, **options: Any) -> tuple[str, str]:
    """``plan.route``'s answer: lanes, and the hot buckets' chunks when there are any."""
    hot_min, _ = _tuning(options.get("hot_min"), options.get("chunk"), spec.row_size)
    built = plan.device_tensors  # a plan built on a device: counted there, not copied here
    hot = int(((plan.counts if built is None else built.counts) >= hot_min).sum())
    what = f"{spec.dtype} {'rows' if spec.trailing else 'scalars'} into {plan.K:,} buckets"
    paths = _lane_paths(plan, values, spec, hot_min, bool(options.get("init") is not None))
    if hot == 0:
        return "lanes", (f"{what}: a lane an output element sums its bucket exactly in "
                         f"registers and rounds it once{paths}")  # fmt: skip
    return "lanes+hot", (
        f"{what}: {hot:,} buckets of {hot_min:,} positions or more are cut in chunks summed "
        f"by many programs and merged with integer atomics; a lane each for the others{paths}"
    )


def _lane_paths(plan: PlanView, values: Any, spec: Values, hot_min: int, has_init: bool) -> str:
    """``"; of N lanes with terms, W sum one word a value, L the limbs"`` for these values.

    The lanes' own certificate (:func:`bitfold.kernels.triton.lanes_kernel`), evaluated on a
    host copy of the values' bits (a diagnostic: it reads the values back); an ``init``
    joins each lane's terms in the kernels and is not read here (its exponent can widen a
    lane's range: the count is then an upper bound). A plan built on a device is not
    copied to the host for this: its lanes are not counted.
    """
    if plan.device_tensors is not None and getattr(plan, "_order", None) is None:
        return "; its lanes' paths are counted for plans with a host copy (this one has none)"
    from ..formats import FLOATS

    t, _ = _as_torch(values)
    exp_bits, frac_bits = FLOATS[spec.dtype].exponent_bits, FLOATS[spec.dtype].fraction_bits
    raw = _bits(t, spec.dtype).detach().cpu().numpy().astype(np.int64) & _MASKS[spec.dtype]
    raw = raw.reshape(spec.positions, spec.row_size)[plan.order]
    e = (raw >> frac_bits) & ((1 << exp_bits) - 1)
    finite = (e != (1 << exp_bits) - 1) & ((raw & ((1 << (exp_bits + frac_bits)) - 1)) != 0)
    p = np.maximum(e - 1, 0)
    counts = plan.counts
    walked = (counts > 0) & (counts < hot_min)
    if not walked.any():
        return "; no lane walks its bucket here (every bucket is hot or empty)"
    starts = plan.offsets[:-1][walked]
    p_lo = np.minimum.reduceat(np.where(finite, p, 1 << 20), starts, axis=0)
    p_hi = np.maximum.reduceat(np.where(finite, p, -1), starts, axis=0)
    terms = counts[walked] + has_init
    bits_terms = np.floor(np.log2(terms)).astype(np.int64) + 1
    span = np.where(p_hi >= 0, p_hi - np.minimum(p_lo, p_hi), -1)
    special = e == (1 << exp_bits) - 1
    clean = ~np.logical_or.reduceat(special, starts, axis=0)  # no NaN or infinity
    # the word: a float64 sum of narrow values (53 bits), an int64 word of float64 ones (62)
    width, word_kind = (62, "int64") if spec.dtype == "float64" else (53, "float64")
    fits = clean & (bits_terms[:, None] + span + frac_bits + 1 <= width)
    lanes, word = int(fits.size), int(fits.sum())
    return (f"; of its {lanes:,} lanes with terms, {word:,} sum one {word_kind} word a value "
            f"(their certificate holds) and {lanes - word:,} the limbs")  # fmt: skip


def triton_cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch grids (at least 1)."""
    return max(1, -(-int(a) // int(b)))


# -- the known-answer test (bitfold.backends.selftest) -------------------------------------------
def device_of(values: Any) -> str:
    """The device of values this backend folds, as torch names it (``"cuda:0"``, ``"cpu"``).

    Asked at every fold (:func:`bitfold.backends.selftest.admits`): the name of each
    device object met is kept, so a warm fold only looks it up."""
    device = values.device
    try:
        return _DEVICE_NAMES[device]
    except (KeyError, TypeError):  # a device not met yet (or one that cannot be a key)
        pass
    t, _ = _as_torch(values)
    kind, index = t.device.type, t.device.index
    name = kind if kind == "cpu" else f"{kind}:{index or 0}"
    with contextlib.suppress(TypeError):
        _DEVICE_NAMES[device] = name
    return name


_DEVICE_NAMES: dict[Any, str] = {}


def place(bits: np.ndarray, dtype: str, values: Any) -> Any:
    """``bits`` (unsigned patterns of ``dtype``) as a ``dtype`` tensor on ``values``' device."""
    torch = _torch()
    t, _ = _as_torch(values)
    signed = np.ascontiguousarray(bits).view(np.dtype(_BITS[dtype]))
    return torch.from_numpy(signed).to(t.device).view(getattr(torch, dtype))


def about(values: Any) -> dict[str, str]:
    """The device the kernels run on, its driver and the compiler: for the self-test's verdict."""
    import triton  # its own version: ROCm and XPU ship it as another distribution

    torch = _torch()
    t, _ = _as_torch(values)
    kind = t.device.type
    compiler = f"Triton {triton.__version__}, torch {torch.__version__}"
    if kind == "cpu":
        return {"device": "the CPU, in Triton's interpreter (TRITON_INTERPRET=1)",
                "driver": "none", "compiler": compiler}  # fmt: skip
    index = t.device.index or 0
    name = getattr(torch, kind).get_device_name(index)
    if kind == "cuda" and torch.version.hip:
        driver = f"ROCm {torch.version.hip}"
    elif kind == "cuda":
        driver = f"NVIDIA {selftest.nvidia_driver() or 'unknown'}, CUDA {torch.version.cuda}"
    else:
        driver = "unknown"
    return {"device": name, "driver": driver, "compiler": compiler}


def busy(values: Any) -> bool:
    """True when the test cannot run now: values being traced, or a CUDA graph capture."""
    torch = _torch()
    t, _ = _as_torch(values)
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return True  # a fake or functional tensor: torch.compile or make_fx is tracing
    return t.device.type == "cuda" and bool(torch.cuda.is_current_stream_capturing())


#: How the known-answer test runs here: the problem set's folds with a hot bucket cut in chunks.
KNOWN_ANSWERS = selftest.KnownAnswers.from_functions(
    globals(),
    family="Triton",
    options={"scalars": ({"hot_min": 8, "chunk": 10},), "rows": ({"hot_min": 8, "chunk": 6},)},
)


#: The registry's entry: torch tensors and CuPy arrays on the GPUs Triton targets (CPU tensors
#: in the interpreter, when named), ahead of the numba-cuda kernels.
BACKEND = Backend.from_functions(
    globals(),
    name=NAME,
    families=("torch", "cupy"),
    devices=(*GPU_DEVICES, "cpu"),
    options={"exact": ("hot_min", "chunk"), "ordered": (), "atomic": (), "add_to_state": ()},
    init=InitRule(strategies=("exact",), mixed_dtypes=False),
    explain=explain_route,
    available=lambda: triton_loads(),  # looked up at each call: tests may replace it
    runs_on=runs_on,
    why_not=why_not,
    known_answers=KNOWN_ANSWERS,
    priority=200,  # below host, above the numba-cuda kernels: the default for GPU tensors
)

__all__ = [
    "BACKEND",
    "GPU_DEVICES",
    "KNOWN_ANSWERS",
    "NAME",
    "ExactLaunch",
    "HotChunkTable",
    "HotChunksKey",
    "LaunchKey",
    "about",
    "add_to_state",
    "busy",
    "device_of",
    "exact_launch",
    "exact_state",
    "expand",
    "fold_atomic",
    "fold_exact",
    "fold_ordered",
    "hot_chunk_table",
    "interpreting",
    "launching",
    "merge_states",
    "new_state",
    "place",
    "round_state",
    "runs_on",
    "why_not",
]
