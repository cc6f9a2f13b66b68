"""Exact data-parallel gradients over ``torch.distributed``: the same bits on any process count.

With a fixed micro-batch size, each micro-batch's gradient is the same
whatever process computes it; :class:`GradientSum` adds those gradients
exactly (:class:`bitfold.dense.DenseSum`) and sums them over the processes
with an exact all-reduce, so every parameter's ``.grad`` after
:meth:`GradientSum.reduce` is the correctly rounded sum over every
micro-batch of every rank — bit for bit the same on 1, 2 or 64 processes,
however the micro-batches were spread over them.

The exact all-reduce (:func:`exact_all_reduce`) moves integers: a first
all-reduce (MAX) of three int32 per block of 64 elements, the bounds of
their exact values and whether a sum there may be ``-0.0``; then one
all-reduce (SUM) of int64 words: half a word an element where a block's
sums fit 32 bits (the bytes of a float32 all-reduce; every block of float16
or bfloat16 gradients), two thirds of one where its elements span at most
38 bits (2 ranks; 36 for 4: most blocks of float32 gradients, 1.35x to
1.43x the bytes of a float32 all-reduce in all, measured), one an element up to 63
bits, a word and a half, or two, for wider ranges, a whole superaccumulator
only for the rare block that needs it (see :mod:`bitfold.dense`); last,
only for blocks where every rank holds an element whose terms were all
``-0.0``, one flag an element (MIN): the sign of a zero sum.
``torch.distributed`` is the engine — gloo for CPU tensors, NCCL for CUDA
tensors; bitfold chooses what to send. The words of a tensor on a GPU are
made and read on that GPU (Triton kernels, :mod:`bitfold.dense_device`: no
copy of a gradient to the host, one host read of the layout's size); those
of a CPU tensor on the host (Numba). Both are the same words, so ranks may
mix them (``words=`` on :func:`exact_all_reduce` and :class:`GradientSum`).

Faults: every collective waits at most ``timeout`` seconds; a rank that died
or hangs makes the others raise :class:`bitfold.errors.DistributedError`
within it, never a silent hang or a partial result. Parameter lists that
differ between ranks are refused before any reduction.

Sharded data parallelism (FSDP's gradient reduce-scatter): :func:`exact_reduce_scatter`
sends the same words — the bounds of every shard's blocks (MAX, in the all-reduce that checks
what the ranks pass), then one reduce-scatter (SUM) of the int64 words — and each
rank rounds only its shard: the bits of the all-reduce's elements, on any number of ranks.
With a ``replicate_group`` (HSDP) the shard's words are also all-reduced over the replicas
before the rounding. :func:`exact_fsdp` plugs it into FSDP2 (``fully_shard``, 1-D or HSDP meshes).

For ``DistributedDataParallel``: :func:`exact_allreduce_hook` (register it
with ``model.register_comm_hook(None, exact_allreduce_hook)``) makes each
bucket's all-reduce exact — world-size invariant when each rank runs one
micro-batch per step. With gradient accumulation (several micro-batches per
rank and step), use :class:`GradientSum`.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import threading
import weakref
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import dense_device
from .arrays import from_numpy, to_numpy
from .backends import registry
from .dense import (
    BLOCK,
    WIDE_MAX_RANKS,
    DenseSum,
    WireLayout,
    array_bounds,
    array_words,
    wire_layout,
)
from .errors import DistributedError, FoldError, FoldTypeError
from .formats import VALUE_DTYPES, dtype_name, resolve_out_dtype
from .kernels.dense import HALF, NARROW, THIRDS
from .validate import check_has_data, checked_options, positive_int_or_none

__all__ = [
    "WORDS",
    "ExactFSDP",
    "GradientSum",
    "exact_all_reduce",
    "exact_allreduce_hook",
    "exact_fsdp",
    "exact_reduce_scatter",
]

#: Where the words of an array's exact all-reduce are made and read: ``"host"`` (NumPy and
#: Numba, after one copy of the array to the host) or ``"device"`` (PyTorch's operations on
#: the tensor's own device, :mod:`bitfold.dense_device`). The default: ``"device"`` for a
#: tensor off the CPU, ``"host"`` otherwise. Both make the same words: ranks of one group may
#: use either.
WORDS = ("host", "device")

#: Each thread's words buffer for exact all-reduces of arrays, kept between calls.
_SPARE = threading.local()


def _device_of(group: Any) -> torch.device:
    """Where a group's collectives want their tensors: the current device of the type the
    registry names for the group's library (:func:`registry.collective_device_type`: CUDA for
    NCCL, the CPU for gloo and any library it does not list)."""
    kind = registry.collective_device_type(str(dist.get_backend(group)))
    current = getattr(getattr(torch, kind, None), "current_device", None)
    index = current() if current is not None else None  # torch.cpu's says "cpu": no index
    return torch.device(kind, index) if isinstance(index, int) else torch.device(kind)


def _collective(tensor: torch.Tensor, op: Any, group: Any, timeout: float, what: str) -> None:
    """``all_reduce(tensor, op)`` in place, waiting at most ``timeout`` seconds."""
    _waited(lambda: dist.all_reduce(tensor, op=op, group=group, async_op=True), group, timeout,
            what)  # fmt: skip


def _waited(start: Callable[[], Any], group: Any, timeout: float, what: str) -> None:
    """Run the collective ``start`` begins (``async_op=True``), waiting at most ``timeout``
    seconds; a failure or a wait past it is a :class:`DistributedError` naming ``what``."""
    try:
        work = start()
        if not work.wait(timeout=timedelta(seconds=timeout)):
            raise RuntimeError(f"no result after {timeout:g} s")
    except RuntimeError as err:
        raise DistributedError(
            f"{what} failed on rank {dist.get_rank(group)} of {dist.get_world_size(group)} "
            f"(collectives wait at most {timeout:g} s): a rank died, hung or left the group "
            f"({err})"
        ) from err


def _reduce(array: np.ndarray, op: Any, group: Any, timeout: float, what: str) -> np.ndarray:
    device = _device_of(group)
    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    _collective(tensor, op, group, timeout, what)
    return tensor.cpu().numpy()


def _check_timeout(timeout: Any) -> float:
    """``timeout`` as seconds: a positive number, or a refusal naming it."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
        raise FoldError(f"timeout must be a positive number of seconds; got timeout={timeout!r}")
    return float(timeout)


def _check_words(words: Any, arrays: list[Any]) -> str:
    """Where the words of ``arrays`` are made: ``words`` checked (None: ``"device"`` when every
    one is a tensor off the CPU, else ``"host"``)."""
    if words is None:
        on_device = all(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in arrays)
        return "device" if arrays and on_device else "host"
    if words not in WORDS:
        raise FoldError(f"words must be one of {WORDS} or None (by the device); got {words!r}")
    for x in arrays:
        if words == "device" and not isinstance(x, torch.Tensor):
            raise FoldTypeError(
                f"words='device' makes the words with PyTorch on the tensor's device; got a "
                f"{type(x).__qualname__} (pass a torch.Tensor, or words='host')"
            )
    return str(words)


def _check_process_group(what: str) -> None:
    """Refuse, before any work, a call made where no ``torch.distributed`` group is initialised.

    ``what`` starts the message: what the call does over the group."""
    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedError(
            f"{what} over a torch.distributed process group, and none is initialised in this "
            "process: call torch.distributed.init_process_group('gloo' for CPU tensors or "
            "'nccl' for CUDA tensors, ...) first, or launch with torchrun or "
            "`bitfold train --world-size N`"
        )


def _checked_params(params: Any) -> list[Any]:
    """``params`` (an iterable of parameters) as a list, or a refusal naming what came instead:
    a module (its ``parameters()`` were meant), one tensor, something not iterable, nothing."""
    if isinstance(params, torch.nn.Module):
        raise FoldTypeError(
            f"GradientSum takes the parameters, not the module: pass model.parameters() "
            f"(got a {type(params).__qualname__} module)"
        )
    if isinstance(params, torch.Tensor):
        raise FoldTypeError(
            f"GradientSum takes an iterable of parameters; got one tensor of shape "
            f"{tuple(params.shape)} (pass [tensor], or model.parameters())"
        )
    try:
        items = iter(params)
    except TypeError:
        raise FoldTypeError(
            f"GradientSum takes an iterable of parameters, such as model.parameters(); got "
            f"{type(params).__qualname__}"
        ) from None
    listed = list(items)
    if not listed:
        raise FoldError(
            "GradientSum got no parameters: params is empty (pass model.parameters(); a "
            "generator of parameters can be read once only, so one already given to an "
            "optimizer is empty: pass list(model.parameters()) to both)"
        )
    return listed


def _check_mean_over(mean_over: Any) -> int:
    """``mean_over`` as a count to divide by: a positive integer (None: 1), or a refusal."""
    count = positive_int_or_none(mean_over, "mean_over", "the count the sum is divided by")
    return 1 if count is None else count


@checked_options
def exact_all_reduce(
    s: Any,
    *,
    group: Any = None,
    timeout: float = 300.0,
    out_dtype: Any = None,
    mean_over: int = 1,
    ranges: list[tuple[int, int, Any]] | None = None,
    words: str | None = None,
) -> Any:
    """Sum ``s`` over every rank of ``group`` exactly; each element rounded once.

    ``s`` is an array (a tensor on any device, a NumPy array) or a
    :class:`DenseSum`; every rank passes one of the same shape and dtype.

    * An array: returns the element-wise sum over the ranks, each element the
      correctly rounded exact sum (divided by ``mean_over`` first, one
      rounding), in the array's shape, dtype (or ``out_dtype``), library and
      device — what ``dist.all_reduce(t)`` computes, exact and the same bits
      for any number of ranks.
    * A :class:`DenseSum` (the exact sum of several arrays, e.g. micro-batch
      gradients): ``ranges`` lists ``(start, stop, out_dtype)`` slices of its
      flat elements to round (default: everything, in ``out_dtype``); returns
      one flat NumPy array a range.

    The same bits on every rank. ``timeout`` (seconds), ``mean_over`` (a
    positive integer) and the array are checked before any collective, and a
    call where no process group is initialised is refused (a
    :class:`bitfold.errors.DistributedError`) before any work. ``words`` (``"host"`` or
    ``"device"``) says where an array's words are made and read: on a tensor's device
    (``"device"``, the default off the CPU: no copy of the array to the host,
    one host read of the layout's size) or on the host; the bits are the same.
    """
    timeout = _check_timeout(timeout)
    mean_over = _check_mean_over(mean_over)
    if not isinstance(s, DenseSum):
        where = _check_words(words, [s])
        _checked_array(s, out_dtype)  # a bad array is refused by name first
        _check_process_group("exact_all_reduce sums arrays")
        if where == "device":
            return _all_reduce_on_device(s, group, timeout, out_dtype, mean_over)
        return _all_reduce_array(s, group, timeout, out_dtype, mean_over)
    if words not in (None, "host"):
        raise FoldError(f"a DenseSum's words are made on the host: words must be None or "
                        f"'host'; got {words!r}")  # fmt: skip
    _check_process_group("exact_all_reduce sums arrays")
    ranges = ranges or [(0, s.size, out_dtype)]
    words, layout, negzero = _exchange(s, s.bounds(), lambda layout: s.encode(layout, reuse=True),
                                       s.negzero, group, timeout)  # fmt: skip
    return [s.decode(words, layout, negzero, dt, mean_over=mean_over, start=a, stop=b)
            for a, b, dt in ranges]  # fmt: skip


def _exchange(
    s: DenseSum,
    bounds: np.ndarray,
    encode: Callable[[WireLayout], np.ndarray],
    negzero: Callable[[], np.ndarray],
    group: Any,
    timeout: float,
) -> tuple[np.ndarray, WireLayout, np.ndarray]:
    """The collectives: bounds (MAX), words (SUM), zero signs where they travel (MIN).

    ``bounds``, ``encode`` and ``negzero`` give this rank's share (:class:`DenseSum`'s, or
    those of one array read straight from its bits); returns the reduced words, their layout
    and the zero-sum signs (empty when no zero sum can be ``-0.0``), ready for
    :meth:`DenseSum.decode`.
    """
    ranks = dist.get_world_size(group)
    bounds = _reduce(bounds, dist.ReduceOp.MAX, group, timeout, "the bounds all-reduce")
    layout = wire_layout(bounds, s.size, ranks, s.format.limbs)
    words, negzero = _exchange_words(s, layout, encode, negzero, group, timeout)
    return words, layout, negzero


def _exchange_words(
    s: DenseSum,
    layout: WireLayout,
    encode: Callable[[WireLayout], np.ndarray],
    negzero: Callable[[], np.ndarray],
    group: Any,
    timeout: float,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_exchange` after the bounds: the words (SUM) and the zero signs (MIN)."""
    words = _reduce(encode(layout), dist.ReduceOp.SUM, group, timeout, "the exact all-reduce")
    signs = layout.sign_elements()
    if not signs.size:  # known from the bounds: no collective when no block needs it, and
        return words, np.zeros(0, np.int32)  # every zero sum is +0.0
    flags = np.zeros(s.size, np.int32)  # +0.0 for a zero sum, but where the signs travel
    flags[signs] = _reduce(negzero()[signs], dist.ReduceOp.MIN, group, timeout,
                           "the zero signs")  # fmt: skip
    return words, flags


def _negative_zeros(flat: Any) -> Any:
    """1 (int32) where an element of float32 or float64 ``flat`` (NumPy or torch) is ``-0.0``."""
    if isinstance(flat, torch.Tensor):
        ints = flat.view(torch.int64 if flat.dtype == torch.float64 else torch.int32)
        return (ints == torch.iinfo(ints.dtype).min).to(torch.int32)
    ints = flat.view(f"i{flat.itemsize}")
    return (ints == np.iinfo(ints.dtype).min).astype(np.int32)


def _on_group_device(t: torch.Tensor, group: Any) -> torch.Tensor:
    """``t`` where the group's collectives take it (:func:`_device_of`: a CUDA device for
    NCCL; where it is for a library that takes CPU tensors, gloo)."""
    device = _device_of(group)
    return t if device.type == "cpu" else t.to(device)


def _checked_array(x: Any, out_dtype: Any) -> tuple[str, str]:
    """``(dtype, out dtype)`` names of an array to all-reduce, or a refusal naming it."""
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise FoldTypeError(
            "exact_all_reduce sums a tensor, a NumPy array or a DenseSum; got "
            f"{type(x).__qualname__}"
        )
    check_has_data(x, "the tensor to all-reduce")
    name = dtype_name(x)
    if name not in VALUE_DTYPES:
        raise FoldTypeError(
            f"exact_all_reduce sums float16, bfloat16, float32 or float64 values; got {name}"
        )
    return name, resolve_out_dtype(name, name if out_dtype is None else out_dtype)


def _all_reduce_on_device(
    x: torch.Tensor, group: Any, timeout: float, out_dtype: Any, mean_over: int
) -> torch.Tensor:
    """:func:`exact_all_reduce` of one tensor with its words made and read on its device."""
    _, out_name = _checked_array(x, out_dtype)
    flat = dense_device.widened(x)
    (out,) = _reduce_on_device(flat, group, timeout, [(0, flat.numel(), out_name)], mean_over)
    return out.reshape(x.shape)


def _reduce_on_device(
    flat: torch.Tensor,
    group: Any,
    timeout: float,
    ranges: list[tuple[int, int, str]],
    mean_over: int,
) -> list[torch.Tensor]:
    """The exact sum over the ranks of ``flat`` (float32 or float64), ``(start, stop, dtype)``
    ranges of it each rounded once, with the words made and read where ``flat`` lies.

    The bounds, the layout, the words and the rounding are PyTorch operations on ``flat``'s
    device; the host reads three integers of the layout (its size, whether every block is
    half, thirds or narrow, whether zero signs travel). A layout with a wide, wider or full
    block (a span over 63 bits, a NaN, an infinity) is encoded and decoded on the host
    instead: the same words, so the ranks agree whichever way each went.
    """
    s = DenseSum((flat.numel(),), "float64" if flat.dtype == torch.float64 else "float32")
    ranks = dist.get_world_size(group)
    bounds = _on_group_device(dense_device.array_bounds(flat, BLOCK), group)
    _collective(bounds, dist.ReduceOp.MAX, group, timeout, "the bounds all-reduce")
    layout = dense_device.device_layout(bounds.to(flat.device), s.size, ranks, BLOCK,
                                        ranks <= WIDE_MAX_RANKS, s.format.limbs)  # fmt: skip
    count, fast, any_sign = layout.totals()
    if not fast:  # the rare wide, wider and full blocks: their words are made on the host
        s.add(flat.cpu().numpy())
        host_layout = wire_layout(bounds.cpu().numpy(), s.size, ranks, s.format.limbs)
        words, negzero = _exchange_words(s, host_layout, s.encode, s.negzero, group, timeout)
        return [_host_tensor(s.decode(words, host_layout, negzero, dt, mean_over=mean_over,
                                      start=a, stop=b), dt).to(flat.device)
                for a, b, dt in ranges]  # fmt: skip
    words = _on_group_device(dense_device.array_words(flat, layout, count), group)
    _collective(words, dist.ReduceOp.SUM, group, timeout, "the exact all-reduce")
    flags = None
    if any_sign:  # only where every rank holds a -0.0 in a block: the signs of zero sums
        at = layout.sign_elements()
        signs = _on_group_device(_negative_zeros(flat)[at], group)
        _collective(signs, dist.ReduceOp.MIN, group, timeout, "the zero signs")
        flags = torch.zeros(s.size, dtype=torch.int32, device=flat.device)
        flags[at] = signs.to(flat.device)
    words = words.to(flat.device)
    rounded = {dt: dense_device.decode(words, layout, flags, dt, mean_over)
               for dt in dict.fromkeys(dt for _, _, dt in ranges)}  # fmt: skip
    return [rounded[dt][a:b] for a, b, dt in ranges]


def _host_tensor(result: np.ndarray, out_name: str) -> torch.Tensor:
    """A host decode's ``result`` as a CPU tensor of ``out_name`` (a bfloat16 result comes as
    float32 holding its values: the cast is exact)."""
    t = torch.from_numpy(result)
    return t.to(torch.bfloat16) if out_name == "bfloat16" else t


def _host_flat(x: Any) -> np.ndarray:
    """``x`` (a tensor or a NumPy array of float values) flat on the host, as float32 or
    float64 (float16 and bfloat16 widened: exact), native byte order, contiguous."""
    flat = np.ascontiguousarray(to_numpy(x)).reshape(-1)  # bfloat16 comes widened: exact
    if flat.dtype == np.float16 or not flat.dtype.isnative:
        flat = flat.astype(np.float32 if flat.dtype.itemsize <= 4 else np.float64)  # exact
    return flat


def _all_reduce_array(x: Any, group: Any, timeout: float, out_dtype: Any, mean_over: int) -> Any:
    """:func:`exact_all_reduce` of one array, through a :class:`DenseSum`, back in its kind."""
    name, out_name = _checked_array(x, out_dtype)
    s = DenseSum(tuple(int(n) for n in x.shape), "float64" if name == "float64" else "float32")
    flat = _host_flat(x)
    bounds = array_bounds(flat)
    if bounds is None:  # a NaN or an infinity: this rank's share through a DenseSum
        s.add(x)
        (result,) = exact_all_reduce(s, group=group, timeout=timeout, out_dtype=out_name,
                                     mean_over=mean_over)  # fmt: skip
    else:  # one array: bounds and words straight from its bits, no state written

        def encode(layout: WireLayout) -> np.ndarray:
            spare = getattr(_SPARE, "words", None)
            words = array_words(flat, layout, spare)
            if words is not None and words.base is not spare:
                _SPARE.words = words  # this thread's next all-reduce reuses the pages
            return s.add(flat.reshape(s.shape)).encode(layout) if words is None else words

        words, layout, negzero = _exchange(
            s, bounds, encode, lambda: _negative_zeros(flat), group, timeout
        )
        result = s.decode(words, layout, negzero, out_name, mean_over=mean_over)
    return from_numpy(result.reshape(s.shape), like=x, dtype_name=out_name)


def _fingerprint(params: list[torch.Tensor]) -> int:
    h = hashlib.sha256(f"{len(params)};".encode())
    for p in params:
        h.update(f"{tuple(p.shape)}:{p.dtype};".encode())
    return int.from_bytes(h.digest()[:7], "little")


class GradientSum:
    """Exact gradients summed over micro-batches and processes: ``add``, then ``reduce``.

    ``params``: the parameters, at least one (``model.parameters()``; a module
    itself, one tensor or an empty iterable is refused by name), in an
    initialised ``torch.distributed`` process group.

    ``add()`` takes every parameter's ``.grad`` exactly into its running sum
    and sets ``.grad`` to None (parameters without a gradient are skipped).
    ``reduce(mean_over=None)`` sums those exact sums over every rank of the
    group (:func:`exact_all_reduce`) and sets each ``.grad`` to the correctly
    rounded sum over every micro-batch of every rank — or that exact sum
    divided by ``mean_over``, rounded once — in the parameter's dtype and on
    its device; then the sums are empty again for the next step. A parameter
    that had no gradient on any rank keeps ``.grad = None``.

    Any floating parameters: float16, bfloat16 and float32 gradients share
    one sum (exact in float64 while it can be, in integer limbs where it
    cannot), float64 gradients another; NaN and Inf follow the fold's
    contract. Every collective waits at most ``timeout`` seconds and raises
    :class:`bitfold.errors.DistributedError` past it.

    ``words`` (``"host"`` or ``"device"``; default: ``"device"`` when every parameter is
    off the CPU): with device words, a step's single ``add`` stays on the device and its
    all-reduce words are made and read there; a second ``add`` in the step takes the sum to
    the host. The bits are the same either way.
    """

    @checked_options
    def __init__(
        self,
        params: Iterable[Any],
        *,
        group: Any = None,
        timeout: float = 300.0,
        words: str | None = None,
    ) -> None:
        self.params = _checked_params(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, torch.Tensor) or dtype_name(p) not in VALUE_DTYPES:
                what = p.dtype if isinstance(p, torch.Tensor) else type(p).__qualname__
                raise FoldTypeError(
                    f"GradientSum sums floating tensors (float16, bfloat16, float32, float64); "
                    f"parameter {i} is {what}"
                )
            check_has_data(p, f"parameter {i}")
        timeout = _check_timeout(timeout)
        self.words = _check_words(words, self.params)
        _check_process_group("GradientSum sums gradients")
        self.group = group
        self.timeout = timeout
        self._families: dict[str, list[int]] = {}
        for i, p in enumerate(self.params):
            family = "float64" if p.dtype == torch.float64 else "float32"
            self._families.setdefault(family, []).append(i)
        self._sums = {
            family: DenseSum((sum(self.params[i].numel() for i in members),), family)
            for family, members in self._families.items()
        }
        self._had_grad = np.zeros(len(self.params), np.int32)
        #: Each family's one step's gradients, flat, kept on their device until a second
        #: add or the reduce (device words only).
        self._pending: dict[str, torch.Tensor] = {}

    def _flat_grads(self, family: str) -> torch.Tensor | None:
        """The family's gradients in one flat tensor (-0.0 for a parameter without one: it adds
        nothing), widened exactly to float32 or float64; None when none has a gradient."""
        members = self._families[family]
        if all(self.params[i].grad is None for i in members):
            return None
        dtype = torch.float64 if family == "float64" else torch.float32
        parts = []
        for i in members:
            p = self.params[i]
            if p.grad is None:
                parts.append(torch.full((p.numel(),), -0.0, dtype=dtype, device=p.device))
            else:
                self._had_grad[i] = 1
                parts.append(p.grad.detach().reshape(-1).to(dtype))
        device = parts[0].device
        return torch.cat([q.to(device) for q in parts])

    def add(self) -> GradientSum:
        """Take every parameter's ``.grad`` into the exact sums; set ``.grad`` to None.

        With device words, one add a step stays on the device (it is its own exact sum); a
        second add in the same step takes both into the host's exact sum."""
        for family, members in self._families.items():
            if self.words == "device" and not self._sums[family].adds:
                if family not in self._pending:
                    flat = self._flat_grads(family)
                    if flat is not None:
                        self._pending[family] = flat
                    for i in members:
                        self.params[i].grad = None
                    continue
                self._sums[family].add(self._pending.pop(family).cpu().numpy())
            parts: list[Any] = []
            any_grad = False
            for i in members:
                p = self.params[i]
                if p.grad is None:  # -0.0 adds nothing and leaves the sign of zero alone
                    parts.append(p.numel())
                    continue
                any_grad = True
                self._had_grad[i] = 1
                parts.append(p.grad.detach().reshape(-1))  # added where it lies: no copy
            if any_grad:
                self._sums[family].add_parts(parts)
            for i in members:
                self.params[i].grad = None
        return self

    @checked_options
    def reduce(self, group: Any = None, mean_over: int | None = None) -> GradientSum:
        """Sum over every rank exactly; set each ``.grad`` (module docstring); be ready again.

        ``mean_over`` (a positive integer, or None for the sum) is checked before any
        collective."""
        mean = _check_mean_over(mean_over)
        group = self.group if group is None else group
        fingerprint = _fingerprint(self.params)
        seen = np.array([fingerprint, -fingerprint], np.int64)
        seen = _reduce(seen, dist.ReduceOp.MAX, group, self.timeout, "the parameter check")
        if seen[0] != fingerprint or seen[1] != -fingerprint:
            raise DistributedError(
                f"the parameter lists differ between ranks (rank {dist.get_rank(group)} has "
                f"{len(self.params)} parameters of shapes "
                f"{[tuple(p.shape) for p in self.params][:6]}...): every rank must sum the same "
                "parameters, in the same order"
            )
        had = _reduce(self._had_grad, dist.ReduceOp.MAX, group, self.timeout, "the gradient check")
        for family, members in self._families.items():
            s = self._sums[family]
            ranges, start = [], 0
            for i in members:
                n = self.params[i].numel()
                ranges.append((start, start + n, dtype_name(self.params[i])))
                start += n
            pending = self._pending.pop(family, None)
            if pending is None and self.words == "device" and not s.adds:
                pending = torch.full((s.size,), -0.0, device=self.params[members[0]].device,
                                     dtype=torch.float64 if family == "float64" else torch.float32)
            if pending is not None:  # one add on the device: its words made there
                results = _reduce_on_device(pending, group, self.timeout, ranges, mean)
            else:
                results = exact_all_reduce(s, group=group, timeout=self.timeout,
                                           mean_over=mean, ranges=ranges)  # fmt: skip
            for i, out in zip(members, results, strict=True):
                p = self.params[i]
                if not had[i]:
                    p.grad = None
                    continue
                t = out if isinstance(out, torch.Tensor) else _host_tensor(out, dtype_name(p))
                p.grad = t.reshape(p.shape).to(p.device)
            s.reset()
        self._had_grad[:] = 0
        return self

    def __repr__(self) -> str:
        return f"GradientSum({len(self.params)} parameters, families={list(self._families)})"


def exact_allreduce_hook(state: Any, bucket: Any) -> Any:
    """A DDP communication hook: each bucket's gradients averaged over the ranks exactly.

    ``model.register_comm_hook(group_or_None, exact_allreduce_hook)``. The
    result is the exact sum over the ranks divided by the world size, rounded
    once (DDP averages): world-size invariant when each rank runs one
    micro-batch per step. With gradient accumulation, use :class:`GradientSum`.

    The all-reduce runs when DDP hands over the bucket, in the backward's
    thread, and the future it returns is already complete: on a machine whose
    cores the ranks already fill, a worker thread measured no faster (the
    exact all-reduce is CPU work, see ``benchmarks/allreduce.py``).
    """
    group = state
    tensor = bucket.buffer()
    result = exact_all_reduce(tensor.detach(), group=group, mean_over=dist.get_world_size(group))
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return future


# DDP's register_comm_hook reads the hook's signature and refuses annotations other than the
# classes themselves (this module's annotations are strings): give it the classes.
if hasattr(dist, "GradBucket"):  # absent where torch.distributed is not built
    exact_allreduce_hook.__annotations__.update(
        bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]}
    )


# -- the exact reduce-scatter ---------------------------------------------------------------------

#: Integers a rank tells the others before an exact reduce-scatter (one row of the metadata
#: all-reduce): input dtype, numel, ndim, six dims, a hash of the shape; output dtype, numel;
#: op, mean_over, words.
_META = 15
#: Dtype codes of the metadata: the value dtypes from 1, others named from 10, then unnamed.
_NAMED_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                 "uint64", "complex32", "complex64", "complex128", "float8_e4m3fn",
                 "float8_e5m2")  # fmt: skip
_NOT_ARRAY, _NO_DATA, _OTHER_DTYPE = -1, -2, 99
_SUM, _AVG, _BAD = 0, 1, -1


def _dtype_code(x: Any) -> int:
    """``x``'s dtype as a metadata code (:data:`_NOT_ARRAY`, :data:`_NO_DATA` for a tensor on a
    device without data, 1.. for :data:`VALUE_DTYPES`, 10.. for :data:`_NAMED_DTYPES`)."""
    if isinstance(x, DenseSum):
        return 1 + VALUE_DTYPES.index(x.format.value_dtypes[-1])
    if not isinstance(x, torch.Tensor | np.ndarray):
        return _NOT_ARRAY
    try:
        check_has_data(x, "the array")
    except FoldError:
        return _NO_DATA
    name = dtype_name(x)
    if name in VALUE_DTYPES:
        return 1 + VALUE_DTYPES.index(name)
    return 10 + _NAMED_DTYPES.index(name) if name in _NAMED_DTYPES else _OTHER_DTYPE


def _dtype_label(code: int) -> str:
    """The name behind a metadata dtype code."""
    if 1 <= code <= len(VALUE_DTYPES):
        return VALUE_DTYPES[code - 1]
    if 10 <= code < 10 + len(_NAMED_DTYPES):
        return _NAMED_DTYPES[code - 10]
    return "a dtype that is not float16, bfloat16, float32 or float64"


def _op_code(op: Any) -> int:
    """``op`` (None: SUM) as :data:`_SUM`, :data:`_AVG` or :data:`_BAD`."""
    if op is None:
        return _SUM
    try:
        return _SUM if op == dist.ReduceOp.SUM else _AVG if op == dist.ReduceOp.AVG else _BAD
    except (TypeError, RuntimeError):  # an object ReduceOp cannot compare with
        return _BAD


def _meta_row(output: Any, x: Any, op: Any, mean_over: Any, words: Any) -> np.ndarray:
    """This rank's row of the reduce-scatter's metadata (:data:`_META` int64)."""
    row = np.zeros(_META, np.int64)
    row[0] = code = _dtype_code(x)
    if code not in (_NOT_ARRAY,):
        shape = tuple(int(n) for n in x.shape)
        row[1], row[2] = math.prod(shape), len(shape)
        row[3:9] = (list(shape[:6]) + [-1] * 6)[:6]
        row[9] = int.from_bytes(hashlib.sha256(repr(shape).encode()).digest()[:6], "little")
    row[10] = _dtype_code(output)
    if row[10] != _NOT_ARRAY:
        row[11] = math.prod(int(n) for n in output.shape)
    row[12] = _op_code(op)
    try:
        count = positive_int_or_none(mean_over, "mean_over", "")
        row[13] = 0 if count is None else count if count < (1 << 31) else _BAD
    except FoldError:
        row[13] = _BAD
    try:
        row[14] = WORDS.index(_check_words(words, [x] if row[0] > 0 else []))
    except FoldError:
        row[14] = _BAD
    return row


def _shape_label(row: np.ndarray) -> str:
    """A metadata row's input dtype and shape, as a message names them."""
    ndim = int(row[2])
    if ndim > 6:
        return f"{_dtype_label(int(row[0]))} of {ndim} dimensions, {int(row[1])} elements"
    return f"{_dtype_label(int(row[0]))} {tuple(int(n) for n in row[3 : 3 + ndim])}"


def _meta_problems(table: np.ndarray, shards: int | None = None) -> list[str]:
    """What the ranks' metadata rows (``table``, one a rank) refuse, the same on every rank:
    each problem names the ranks with it; empty when the reduce-scatter can go ahead.
    ``shards``: how many shards the input is cut into (None: one a rank of ``table``)."""
    ranks = table.shape[0] if shards is None else shards
    floats = len(VALUE_DTYPES)
    problems = []
    for r, row in enumerate(table.tolist()):
        for at, what in ((0, "input"), (10, "output")):
            if row[at] == _NOT_ARRAY:
                problems.append(f"rank {r}'s {what} is not a torch.Tensor or a NumPy array")
            elif row[at] == _NO_DATA:
                problems.append(f"rank {r}'s {what} is on a device that holds no data (meta)")
            elif not 1 <= row[at] <= floats:
                problems.append(f"rank {r}'s {what} has dtype {_dtype_label(row[at])}: "
                                "exact_reduce_scatter sums and writes float16, bfloat16, "
                                "float32 or float64 values")  # fmt: skip
        if row[12] == _BAD:
            problems.append(
                f"rank {r} passes an op other than ReduceOp.SUM or ReduceOp.AVG "
                "(an exact reduce-scatter sums, or averages with one rounding)"
            )
        if row[13] == _BAD:
            problems.append(f"rank {r} passes a mean_over that is not None or a positive "
                            "integer below 2**31")  # fmt: skip
        elif row[12] == _AVG and row[13] > 0:
            problems.append(f"rank {r} passes op=ReduceOp.AVG and mean_over: AVG divides by "
                            "the world size; give one divisor")  # fmt: skip
        if row[14] == _BAD:
            problems.append(
                f"rank {r} passes words that are not {WORDS} or None for its "
                "input (words='device' takes a torch.Tensor)"
            )
    if problems:
        return problems
    if len({(row[0], row[1], row[2], *row[3:10]) for row in table.tolist()}) > 1:
        listed = ", ".join(f"rank {r}: {_shape_label(row)}" for r, row in enumerate(table))
        problems.append(f"the ranks pass inputs of different shapes or dtypes ({listed}); "
                        "every rank passes one of the same shape and dtype")  # fmt: skip
    if len({row[10] for row in table.tolist()}) > 1:
        listed = ", ".join(f"rank {r}: {_dtype_label(int(row[10]))}"
                           for r, row in enumerate(table))  # fmt: skip
        problems.append(f"the ranks pass outputs of different dtypes ({listed})")
    if len({(row[12], row[13]) for row in table.tolist()}) > 1:
        listed = ", ".join(
            f"rank {r}: op {'AVG' if row[12] == _AVG else 'SUM'}, mean_over {row[13] or None}"
            for r, row in enumerate(table.tolist())
        )
        problems.append(f"the ranks pass different op or mean_over ({listed})")
    if problems:
        return problems
    numel = int(table[0, 1])
    if numel % ranks:
        problems.append(f"input.numel() = {numel} does not split into {ranks} equal shards "
                        f"(the world size)")  # fmt: skip
    for r, row in enumerate(table.tolist()):
        if not numel % ranks and row[11] != numel // ranks:
            problems.append(f"rank {r}'s output holds {row[11]} elements; input.numel() / "
                            f"world_size = {numel} / {ranks} = {numel // ranks}")  # fmt: skip
    return problems


class _ArrayShare:
    """One shard of an array (float32 or float64, flat, on the host) as the words read it: its
    bounds and words straight from its bits, or through a :class:`DenseSum` when it holds a NaN
    or an infinity, or a block needs wider words (the same words either way)."""

    def __init__(self, flat: np.ndarray, family: str) -> None:
        self.flat = flat
        self.family = family
        self._sum: DenseSum | None = None

    def _summed(self) -> DenseSum:
        if self._sum is None:
            self._sum = DenseSum((self.flat.size,), self.family).add(self.flat)
        return self._sum

    def bounds(self) -> np.ndarray:
        """:meth:`DenseSum.bounds` of this shard."""
        bounds = array_bounds(self.flat)
        return self._summed().bounds() if bounds is None else bounds

    def encode(self, layout: WireLayout, into: np.ndarray) -> None:
        """This shard's words in ``layout``, written into the front of ``into``."""
        if self._sum is None and array_words(self.flat, layout, into) is not None:
            return
        self._summed().encode(layout, into=into)

    def negzero(self) -> np.ndarray:
        """:meth:`DenseSum.negzero` of this shard: 1 where an element is ``-0.0``."""
        return _negative_zeros(self.flat)


class _SumShare:
    """Elements ``start .. stop-1`` of a :class:`DenseSum` as the words read them: their
    bounds, words and zero flags as those of a sum of their own."""

    def __init__(self, s: DenseSum, start: int, stop: int) -> None:
        self.s, self.start, self.stop = s, start, stop

    def bounds(self) -> np.ndarray:
        """:meth:`DenseSum.bounds` of these elements."""
        return self.s.bounds(start=self.start, stop=self.stop)

    def encode(self, layout: WireLayout, into: np.ndarray) -> None:
        """These elements' words in ``layout``, written into the front of ``into``."""
        self.s.encode(layout, start=self.start, into=into)

    def negzero(self) -> np.ndarray:
        """:meth:`DenseSum.negzero` of these elements."""
        return self.s.negzero(start=self.start, stop=self.stop)


#: Per process group: the length (int32) of the check all-reduce its last exact
#: reduce-scatter agreed on — the metadata table, then every shard's block bounds of the
#: input size the ranks passed. The next call on the group makes one of that length: with its
#: bounds where its input has that size (one collective before the words, as long as the
#: size stays), else the table only, padded, and the bounds after (a size that changed).
#: Every rank of a group sees the same checks, so each computes the same length.
_AGREED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
#: Where a rank's slot of the check holds nothing: below every metadata and bounds value.
_NONE = np.iinfo(np.int32).min


def _check_length(ranks: int, numel: int) -> int:
    """The int32 of a check all-reduce over ``ranks`` ranks: the metadata table, then three a
    block of every shard of ``numel`` elements (cut into ``ranks``)."""
    return 2 * ranks * _META + ranks * -(-(numel // ranks) // BLOCK) * 3


def _check_with_bounds(
    row: np.ndarray, bounds: Callable[[], Any] | None, group: Any, timeout: float
) -> tuple[list[str], Any]:
    """What the ranks' metadata rows (``row`` is this rank's) refuse (:func:`_meta_problems`,
    the same on every rank) and, where the group's last check agreed on this input size,
    every shard's block bounds reduced (MAX) in the same all-reduce; None for them otherwise.

    ``bounds`` makes this rank's bounds (a NumPy array or a tensor, int32) — None where its
    input is refused here already. The table travels as int32 halves, each rank's in its own
    slot and :data:`_NONE` in the others': MAX gives every rank's values exactly. The length
    of the all-reduce is the group's agreed one (:data:`_AGREED`), whatever this rank passes,
    so ranks that pass different sizes meet in a collective of one size and are refused by the
    table; a rank sends its bounds only where they fill that length, and they are used only
    where the table shows that every rank's do.
    """
    ranks, me = dist.get_world_size(group), dist.get_rank(group)
    key = group if group is not None else dist.group.WORLD
    head, length = _check_length(ranks, 0), _AGREED.get(key, _check_length(ranks, 0))
    size = _check_length(ranks, int(row[1]))
    table = np.full((ranks, 2 * _META), _NONE, np.int32)
    table[me] = row.view(np.int32)
    message = torch.full((length,), _NONE, dtype=torch.int32)
    message[:head] = torch.from_numpy(table.reshape(-1))
    mine = bounds() if bounds is not None and size == length > head else None
    message = _on_group_device(message, group)
    if mine is not None:
        mine = mine if isinstance(mine, torch.Tensor) else torch.from_numpy(mine)
        message[head:] = mine.reshape(-1).to(message.device)
    _collective(message, dist.ReduceOp.MAX, group, timeout, "the reduce-scatter's check")
    table = message[:head].cpu().numpy().view(np.int64).reshape(ranks, _META)
    problems = _meta_problems(table)
    if problems:
        return problems, None  # refused on every rank; the agreed length stays
    agreed = _check_length(ranks, int(table[0, 1]))
    _AGREED[key] = agreed
    if agreed != length or agreed == head:
        return problems, None
    return problems, message[head:].view(-1, 3)


def _shard_layouts(
    bounds: np.ndarray, size: int, shards: int, ranks: int, limbs: int
) -> list[WireLayout]:
    """Each of ``shards`` shards' layout (``size`` elements each, summed over ``ranks`` ranks)
    from the reduced bounds of every shard."""
    nb = -(-size // BLOCK)
    return [wire_layout(bounds[r * nb : (r + 1) * nb], size, ranks, limbs)
            for r in range(shards)]  # fmt: skip


def _size(group: Any) -> int:
    """The number of ranks of ``group`` (None here: no group, one rank)."""
    return 1 if group is None else dist.get_world_size(group)


def _reduce_scatter_one() -> Callable[..., Any]:
    """torch.distributed's reduce-scatter of one tensor: ``reduce_scatter_single`` where torch
    has it (torch 2.13 deprecates ``reduce_scatter_tensor``, the same collective, for it),
    else ``reduce_scatter_tensor``."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _scatter(words: torch.Tensor, group: Any, timeout: float, replicate: Any = None
             ) -> torch.Tensor:  # fmt: skip
    """The reduce-scatter (SUM, :func:`_reduce_scatter_one`) of ``words`` (``(shards, L)``
    int64): this rank's ``(L,)`` row of the sums, where ``words`` lies; then, with a
    ``replicate`` group, that row all-reduced (SUM) over it — integers: exact in any order."""
    got = torch.empty(words.shape[1], dtype=torch.int64, device=words.device)
    scatter = _reduce_scatter_one()
    _waited(lambda: scatter(got, words.reshape(-1), op=dist.ReduceOp.SUM, group=group,
                            async_op=True),
            group, timeout, "the exact reduce-scatter")  # fmt: skip
    if replicate is not None and dist.get_world_size(replicate) > 1:
        _collective(got, dist.ReduceOp.SUM, replicate, timeout, "the replicas' all-reduce")
    return got


def _max_bounds(bounds: Any, groups: list[Any], timeout: float) -> Any:
    """Block bounds (a NumPy array, or a tensor reduced in place) reduced (MAX) over each of
    ``groups``."""
    for g in groups:
        if isinstance(bounds, torch.Tensor):
            _collective(bounds, dist.ReduceOp.MAX, g, timeout, "the bounds all-reduce")
        else:
            bounds = _reduce(bounds, dist.ReduceOp.MAX, g, timeout, "the bounds all-reduce")
    return bounds


def _scatter_words(
    shares: list[Any],
    bounds: np.ndarray,
    size: int,
    family: str,
    group: Any,
    timeout: float,
    out_name: str,
    mean_over: int,
    replicate: Any = None,
) -> np.ndarray:
    """The words of every shard (reduced ``bounds`` known) reduce-scattered, and this rank's
    shard rounded once: a flat NumPy array of ``out_name`` (bfloat16 held in float32).
    ``replicate`` (a group, or None): the shard's words are also summed over its ranks.

    Shard ``r``'s words, then one int64 flag an element whose zero sign travels (1: all its
    terms were ``-0.0``; summed, the world size means every rank's were), padded with zeros
    to the longest shard's, make row ``r`` of the reduce-scatter's input: one collective.
    """
    shards, me = dist.get_world_size(group), dist.get_rank(group)
    ranks = shards * _size(replicate)  # every rank whose terms meet in a sum
    s = DenseSum((size,), family)  # the decoder of this rank's shard
    layouts = _shard_layouts(bounds, size, shards, ranks, s.format.limbs)
    signs = [layout.sign_elements() for layout in layouts]
    width = max(layout.words + at.size for layout, at in zip(layouts, signs, strict=True))
    spare = getattr(_SPARE, "scatter", None)
    if spare is None or spare.size < shards * width:
        spare = _SPARE.scatter = np.empty(shards * width, np.int64)  # this thread's, kept
    rows = spare[: shards * width].reshape(shards, width)
    for r, (share, layout, at) in enumerate(zip(shares, layouts, signs, strict=True)):
        share.encode(layout, rows[r])
        rows[r, layout.words : layout.words + at.size] = share.negzero()[at] if at.size else 0
        rows[r, layout.words + at.size :] = 0
    got = _scatter(_on_group_device(torch.from_numpy(rows), group), group, timeout, replicate)
    got = got.cpu().numpy()
    layout, at = layouts[me], signs[me]
    negzero = np.zeros(0, np.int32)  # every zero sum +0.0, but where the signs travel
    if at.size:
        negzero = np.zeros(size, np.int32)
        negzero[at] = got[layout.words : layout.words + at.size] == ranks
    return s.decode(got[: layout.words], layout, negzero, out_name, mean_over=mean_over)


def _host_shares(x: Any, ranks: int) -> tuple[list[Any], str, int]:
    """``x`` (an array or a :class:`DenseSum`) cut into ``ranks`` shards as the host's words
    read them: the shares, their family, the size of each."""
    if isinstance(x, DenseSum):
        family, size = x.format.value_dtypes[-1], x.size // ranks
        return [_SumShare(x, r * size, (r + 1) * size) for r in range(ranks)], family, size
    flat = _host_flat(x)
    family, size = ("float64" if flat.dtype == np.float64 else "float32"), flat.size // ranks
    shares = [_ArrayShare(flat[r * size : (r + 1) * size], family) for r in range(ranks)]
    return shares, family, size


def _device_bounds(flat: torch.Tensor, shards: int, group: Any) -> torch.Tensor:
    """Every shard's block bounds of ``flat`` (float32 or float64) made on its device, where
    the group's collectives take them."""
    pieces = flat.view(shards, flat.numel() // shards)
    return _on_group_device(torch.cat([dense_device.array_bounds(pieces[r], BLOCK)
                                       for r in range(shards)]), group)  # fmt: skip


def _reduce_scatter_on_device(
    flat: torch.Tensor,
    bounds: torch.Tensor,
    group: Any,
    timeout: float,
    out_name: str,
    mean_over: int,
    replicate: Any = None,
) -> torch.Tensor:
    """:func:`exact_reduce_scatter` of ``flat`` (float32 or float64) with its words made and
    read on its device (:mod:`bitfold.dense_device`; one host read of every shard's layout
    totals; ``bounds``: every shard's block bounds, reduced); a layout with a wide, wider or
    full block goes to the host, as the all-reduce's."""
    shards, me = dist.get_world_size(group), dist.get_rank(group)
    ranks = shards * _size(replicate)  # every rank whose terms meet in a sum
    size = flat.numel() // shards
    family = "float64" if flat.dtype == torch.float64 else "float32"
    limbs = DenseSum((1,), family).format.limbs
    pieces = flat.view(shards, size)
    bounds = bounds.to(flat.device)
    nb = -(-size // BLOCK)
    layouts = [dense_device.device_layout(bounds[r * nb : (r + 1) * nb], size, ranks, BLOCK,
                                          ranks <= WIDE_MAX_RANKS, limbs)
               for r in range(shards)]  # fmt: skip
    counts = torch.clamp(size - torch.arange(nb, device=flat.device) * BLOCK, max=BLOCK)
    fast = torch.tensor([HALF, THIRDS, NARROW], dtype=torch.int64, device=flat.device)
    facts = torch.stack([torch.stack([layout.offsets[-1],
                                      torch.isin(layout.classes, fast).all().to(torch.int64),
                                      (layout.signs.to(torch.int64) * counts).sum()])
                         for layout in layouts]).tolist()  # one read  # fmt: skip
    if not all(f[1] for f in facts):  # a wide, wider or full block: the host's words
        shares = [_ArrayShare(pieces[r].cpu().numpy(), family) for r in range(shards)]
        got = _scatter_words(shares, bounds.cpu().numpy(), size, family, group, timeout,
                             out_name, mean_over, replicate)  # fmt: skip
        return _host_tensor(got, out_name).to(flat.device)
    width = max(f[0] + f[2] for f in facts)
    rows = torch.zeros((shards, width), dtype=torch.int64, device=flat.device)
    for r, (layout, (words, _, signs)) in enumerate(zip(layouts, facts, strict=True)):
        rows[r, :words] = dense_device.array_words(pieces[r], layout, words)
        if signs:
            rows[r, words : words + signs] = _negative_zeros(pieces[r])[layout.sign_elements()]
    got = _scatter(_on_group_device(rows, group), group, timeout, replicate).to(flat.device)
    words, _, signs = facts[me]
    flags = None
    if signs:
        flags = torch.zeros(size, dtype=torch.int32, device=flat.device)
        flags[layouts[me].sign_elements()] = (got[words : words + signs] == ranks).to(torch.int32)
    return dense_device.decode(got[:words], layouts[me], flags, out_name, mean_over)


@checked_options
def exact_reduce_scatter(
    output: Any,
    input: Any,  # the name torch.distributed.reduce_scatter_tensor gives it
    group: Any = None,
    *,
    op: Any = None,
    timeout: float = 300.0,
    mean_over: int | None = None,
    words: str | None = None,
    replicate_group: Any = None,
) -> Any:
    """Reduce-scatter ``input`` over ``group`` exactly: each rank's shard rounded once.

    What ``dist.reduce_scatter_tensor(output, input)`` computes, exact: every
    rank passes an ``input`` of the same shape and dtype (float16, bfloat16,
    float32 or float64; a ``torch.Tensor`` on any device, or a NumPy array),
    read flat and cut into ``world_size`` equal shards; rank ``r``'s
    ``output`` (any shape of ``input.numel() / world_size`` elements, a float
    dtype) is overwritten with shard ``r`` of the element-wise sum over the
    ranks: each element the correctly rounded exact sum of its terms (divided
    by ``mean_over`` first, or by the world size for ``op=ReduceOp.AVG``: one
    rounding in all), with the fold's rules for ``-0.0``, NaN and infinities.
    The bits do not depend on the number of ranks, their order, the backend or
    ``words``: shard ``r`` of a run on ``W`` ranks equals the same elements of
    :func:`exact_all_reduce` on any number of ranks. Returns ``output``.

    ``input`` may also be a :class:`DenseSum` (a rank's micro-batch gradients
    summed exactly; its ``size`` plays ``numel()``): then the result is the
    correctly rounded sum over every micro-batch of every rank, however the
    micro-batches were dealt — the same bits on 1, 2 or 64 ranks.

    The words are the all-reduce's (:mod:`bitfold.dense`): one all-reduce (MAX)
    of every shard's block bounds, then one reduce-scatter (SUM) of
    int64 words, exact in any order — each shard's words (and the zero-sign
    flags of the rare blocks that need them) padded to the longest shard's —
    and each rank decodes and rounds only its shard.

    Refusals come on every rank, before any collective on the values and
    before ``output`` is written: the ranks first all-reduce (MAX) a small table
    of what each passes (dtypes, shapes, output size, ``op``, ``mean_over``) —
    with every shard's block bounds in the same all-reduce where the group's
    previous exact reduce-scatter had an input of this size (so a run of calls
    of one size makes two collectives, the check and the words) — and
    an input of another dtype, inputs of different shapes or dtypes, an output
    whose size is not ``input.numel() / world_size``, an ``op`` other than
    ``ReduceOp.SUM`` or ``ReduceOp.AVG`` (or AVG with ``mean_over``) raise the
    same :class:`bitfold.errors.DistributedError` naming the problem and the
    ranks. No initialised process group, or a bad ``timeout``, is refused
    before any collective. Every collective waits at most ``timeout``
    seconds. ``words`` (``"host"`` or ``"device"``) says where the words are
    made and read, as for :func:`exact_all_reduce`.

    ``replicate_group`` (HSDP: the ranks that hold the same shard as this one,
    one in each copy of ``group``): the sum runs over the ranks of ``group``
    and of every replica of it — the shard's words are all-reduced (SUM) over
    ``replicate_group`` before the one rounding, and ``ReduceOp.AVG`` divides
    by both sizes. The same bits as :func:`exact_all_reduce` over all of them.
    """
    timeout = _check_timeout(timeout)
    _check_process_group("exact_reduce_scatter sums arrays")
    ranks = dist.get_world_size(group)
    copies = _size(replicate_group)
    row = _meta_row(output, input, op, mean_over, words)
    numel, floats = int(row[1]), len(VALUE_DTYPES)
    prepared: Any = None  # this rank's input ready for its words, where it looks right here
    if 1 <= row[0] <= floats and row[14] != _BAD and numel and not numel % ranks:
        if WORDS[row[14]] == "device":
            prepared = dense_device.widened(input)
        else:
            prepared = _host_shares(input, ranks)

    def bounds() -> Any:
        if isinstance(prepared, torch.Tensor):
            return _device_bounds(prepared, ranks, group)
        return np.concatenate([share.bounds() for share in prepared[0]])

    problems, reduced = _check_with_bounds(row, None if prepared is None else bounds, group,
                                           timeout)  # fmt: skip
    if copies > 1:  # the replicas pass the same: checked on every rank before any raises
        replicas = np.zeros((copies, _META), np.int64)
        replicas[dist.get_rank(replicate_group)] = row
        replicas = _reduce(replicas, dist.ReduceOp.SUM, replicate_group, timeout,
                           "the reduce-scatter's check")  # fmt: skip
        problems += [f"among the replicas (replicate_group), {p}"
                     for p in _meta_problems(replicas, ranks)]  # fmt: skip
    if problems:
        also = f", {copies} replicas" if copies > 1 else ""
        raise DistributedError(
            f"exact_reduce_scatter refused on every rank of the group ({ranks} ranks{also}): "
            + "; ".join(problems)
        )
    if numel == 0:
        return output  # every rank knows: nothing to sum
    mean = ranks * copies if _op_code(op) == _AVG else _check_mean_over(mean_over)
    out_name = dtype_name(output)
    replicate = replicate_group if copies > 1 else None
    pending = ([] if reduced is not None else [group]) + ([replicate] if replicate else [])
    got = _max_bounds(bounds() if reduced is None else reduced, pending, timeout)
    if isinstance(prepared, torch.Tensor):
        result = _reduce_scatter_on_device(prepared, got, group, timeout, out_name, mean,
                                           replicate)  # fmt: skip
    else:  # the host's words
        shares, family, size = prepared
        got = got.cpu().numpy() if isinstance(got, torch.Tensor) else got
        host = _scatter_words(shares, got, size, family, group, timeout, out_name, mean,
                              replicate)  # fmt: skip
        result = _host_tensor(host, out_name) if isinstance(output, torch.Tensor) else host
    if isinstance(output, torch.Tensor):
        output.copy_(result.reshape(output.shape))
    else:
        result = result.cpu().numpy() if isinstance(result, torch.Tensor) else result
        output[...] = result.reshape(output.shape)
    return output


# -- FSDP2: the exact reduce-scatter as the gradients' comm ---------------------------------------


class _ExactFSDPComm:
    """One FSDP module's gradient reduction: its reduce-scatter (``set_custom_reduce_scatter``:
    ``allocate`` and ``__call__``) and its all-reduce hook (``set_all_reduce_hook``), which FSDP
    runs after every reduction — after the reduce-scatter, and after HSDP's float all-reduce.

    FSDP2 (torch 2.13) has no custom all-reduce for HSDP's replicate dimension: there, the
    comm sums over the shard and the replicate groups at once (:func:`exact_reduce_scatter`
    with ``replicate_group``), keeps the result and hands FSDP ``-0.0``, which its float
    all-reduce sums to ``-0.0`` exactly; the hook then writes the result. Where the shard
    group has one rank, FSDP copies the gradient instead of calling the comm: the hook sums the
    buffer FSDP allocated through ``allocate`` (this rank's gradient, untouched) over the
    replicas, exactly, and overwrites what the float all-reduce made.
    """

    def __init__(self, owner: ExactFSDP, replicate: Any, round_to: torch.dtype | None) -> None:
        self.owner = owner
        self.replicate = replicate  # HSDP's replicate group (more than one rank), or None
        #: The parameters' dtype where it is narrower than FSDP's reduce_dtype (None
        #: otherwise): the sum is rounded to it once, and FSDP's cast to it is then exact.
        self.round_to = round_to
        self._sum: DenseSum | None = None  # this module's micro-batches held back, exactly
        self._input: torch.Tensor | None = None  # the reduction's input buffer (allocate)
        self._allocated = 0  # buffers allocated for the reduction under way: input, output
        self._called = False  # the comm ran for this reduction
        self._result: torch.Tensor | None = None  # HSDP: the exact result the hook writes

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers for the reduction, as its default comm makes them: the input, then
        the output (the input is kept until the hook)."""
        if self._allocated >= 2:
            raise FoldError(
                "exact_fsdp: an FSDP module's previous gradient reduction ended without its "
                "all-reduce hook (set_requires_all_reduce(False) skips it and sums partial "
                "gradients in floats); to accumulate micro-batches, run their backward inside "
                "`with handle.no_reduce():` instead"
            )
        t = torch.empty(*size, dtype=dtype, device=device)
        if self._allocated == 0:
            self._input = t
        self._allocated += 1
        return t

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any = None,
        async_op: bool = False,
    ) -> None:
        """Reduce-scatter ``input_tensor`` exactly into ``output_tensor`` (or hold it back)."""
        self._called = True
        try:
            self._reduce(output_tensor, input_tensor, group)
        except BaseException:  # no hook follows: the next reduction starts afresh
            self._result, self._input, self._allocated, self._called = None, None, 0, False
            raise
        if self.replicate is not None:  # HSDP: FSDP's float all-reduce sums -0.0s, exactly
            self._result = output_tensor.clone()
            output_tensor.fill_(-0.0)

    def hook(self, reduce_output: torch.Tensor) -> None:
        """After the reduction: ``reduce_output`` gets the exact result, where the comm did not
        write it already."""
        try:
            if self._result is not None:  # HSDP: the comm's result, kept past the all-reduce
                reduce_output.copy_(self._result)
            elif not self._called:  # one rank a shard group: FSDP copied, and did not call
                x = reduce_output if self.replicate is None else self._input
                if x is None:
                    raise FoldError("exact_fsdp: FSDP reduced a gradient that it did not "
                                    "allocate through bitfold's comm")  # fmt: skip
                self._reduce(reduce_output, x, None)
        finally:
            self._result, self._input, self._allocated, self._called = None, None, 0, False

    def _reduce(self, output: torch.Tensor, x: torch.Tensor, group: Any) -> None:
        narrow = self.round_to
        if narrow is not None and narrow != output.dtype and (
            torch.finfo(narrow).bits < torch.finfo(output.dtype).bits
        ):  # round once to the parameters' dtype; widening it into output is exact
            rounded = torch.empty(output.shape, dtype=narrow, device=output.device)
            self._reduce_into(rounded, x, group)
            output.copy_(rounded)
        else:
            self._reduce_into(output, x, group)

    def _reduce_into(self, output: torch.Tensor, x: torch.Tensor, group: Any) -> None:
        owner, replicate = self.owner, self.replicate
        flat = x.detach().reshape(-1)
        held = self._sum is not None and self._sum.adds > 0
        alone = group is None and replicate is None  # one rank in all
        if owner.holding or held or (alone and owner.mean_over is not None):
            family = "float64" if x.dtype == torch.float64 else "float32"
            if self._sum is None or self._sum.size != flat.numel() or (
                self._sum.format.value_dtypes[-1] != family
            ):
                self._sum = DenseSum((flat.numel(),), family)
            self._sum.add(flat)
            if owner.holding:  # -0.0 adds nothing to the gradient FSDP keeps
                output.fill_(-0.0)
                return
        s = self._sum if self._sum is not None and self._sum.adds else None
        out_name = dtype_name(output)
        if group is not None:  # the exact reduce-scatter (over the replicas too, for HSDP)
            exact_reduce_scatter(output, flat if s is None else s, group, timeout=owner.timeout,
                                 mean_over=owner.mean_over, replicate_group=replicate)  # fmt: skip
        elif replicate is not None:  # one rank a shard: the exact all-reduce over the replicas
            mean = owner.mean_over or 1
            if s is None:
                result = exact_all_reduce(flat, group=replicate, timeout=owner.timeout,
                                          mean_over=mean)  # fmt: skip
            else:
                ranges = [(0, s.size, out_name)]
                (got,) = exact_all_reduce(s, group=replicate, timeout=owner.timeout,
                                          mean_over=mean, ranges=ranges)  # fmt: skip
                result = _host_tensor(got, out_name)
            output.copy_(result.reshape(output.shape))
        elif s is not None:  # one rank: its sum rounded once (without one, x is exact already)
            result = s.result(out_name, mean_over=owner.mean_over or 1)
            output.copy_(torch.as_tensor(result).reshape(output.shape))
        if s is not None:
            s.reset()


class ExactFSDP:
    """The handle :func:`exact_fsdp` returns: ``no_reduce()``, ``mean_over``, ``timeout``.

    ``mean_over`` (None: the sum) divides every reduced gradient, rounded once; it may be
    changed between steps. Inside ``with handle.no_reduce():`` a backward's gradients are
    held back in exact sums (no communication; FSDP's gradients stay ``-0.0``); the next
    backward outside it reduces them with its own, exactly. ``mesh`` names the data-parallel
    shape: ``(shards,)`` for FSDP, ``(replicas, shards)`` for HSDP.
    """

    def __init__(self, mean_over: int | None, timeout: float, mesh: tuple[int, ...]) -> None:
        self.mean_over = mean_over
        self.timeout = timeout
        self.mesh = mesh
        self.holding = False

    def no_reduce(self) -> Any:
        """A context manager: backward passes inside it hold their gradients back, exactly."""
        import contextlib

        @contextlib.contextmanager
        def holding() -> Any:
            before, self.holding = self.holding, True
            try:
                yield self
            finally:
                self.holding = before

        return holding()

    def __repr__(self) -> str:
        return f"ExactFSDP(mesh={self.mesh}, mean_over={self.mean_over}, holding={self.holding})"


def _own_dtype(module: Any) -> torch.dtype | None:
    """The dtype of the trainable parameters an FSDP module manages itself (not those of FSDP
    modules inside it): the dtype FSDP casts its reduced gradients to; None without any."""
    from torch.distributed.fsdp import FSDPModule

    stack, dtypes = [module], set()
    while stack:
        m = stack.pop()
        dtypes |= {p.dtype for p in m.parameters(recurse=False) if p.requires_grad}
        stack.extend(c for c in m.children() if not isinstance(c, FSDPModule))
    return dtypes.pop() if len(dtypes) == 1 else None


_FLOAT_ACCUMULATION = (
    "exact_fsdp: set_requires_gradient_sync(False) makes FSDP accumulate the micro-batches' "
    "unsharded gradients in floats, whose bits depend on how many micro-batches a rank runs; "
    "run all but a rank's last backward of a step inside `with handle.no_reduce():` instead"
)


def _refusing_float_accumulation(module: Any) -> Callable[..., None]:
    """``module.set_requires_gradient_sync`` that refuses ``False`` (FSDP's float accumulation,
    which no reduction can see afterwards) before it changes anything; ``True`` is FSDP's."""
    original = module.set_requires_gradient_sync

    def set_requires_gradient_sync(requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        if not requires_gradient_sync:
            raise FoldError(_FLOAT_ACCUMULATION)
        original(requires_gradient_sync, recurse=recurse)

    return set_requires_gradient_sync


def _fsdp_mesh(module: Any) -> tuple[Any, tuple[int, ...]] | None:
    """An FSDP module's replicate group (None for 1-D FSDP) and data-parallel mesh shape, read
    from its parameters' DTensor placements; None for a module without parameters. A mesh that
    is neither ``(Shard,)`` nor ``(Replicate, Shard)`` is refused by name."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    for p in module.parameters():
        if not isinstance(p, DTensor):
            continue
        mesh, placements = p.device_mesh, tuple(p.placements)
        kinds = tuple(type(q) for q in placements)
        if kinds == (Shard,):
            return None, (mesh.size(0),)
        if kinds == (Replicate, Shard):
            return mesh.get_group(0), (mesh.size(0), mesh.size(1))
        raise FoldError(
            f"exact_fsdp reduces FSDP (a 1-D mesh, placements (Shard(0),)) and HSDP (a 2-D "
            f"mesh (replicate, shard), placements (Replicate(), Shard(0))) gradients; "
            f"{type(module).__qualname__}'s parameters have placements {placements} on a "
            f"mesh of shape {tuple(mesh.shape)}"
        )
    return None


@checked_options
def exact_fsdp(model: Any, *, mean_over: int | None = None, timeout: float = 300.0) -> ExactFSDP:
    """Make FSDP2's gradient reduction exact: the same gradient bits on any number of ranks.

    ``model``: a module after ``torch.distributed.fsdp.fully_shard``, on a
    1-D mesh (FSDP) or a 2-D ``(replicate, shard)`` mesh (HSDP). Every FSDP
    module in it gets :func:`exact_reduce_scatter` as its reduce-scatter
    (``set_custom_reduce_scatter``) and an all-reduce hook
    (``set_all_reduce_hook``); FSDP's own division is switched off
    (``set_force_sum_reduction_for_comms(True)``,
    ``set_gradient_divide_factor(1.0)``). Each sharded ``.grad`` is then the
    correctly rounded sum over every rank of the gradients (divided by
    ``mean_over`` first, one rounding): the same bits on 1, 2 or 64 ranks and
    for every mesh shape (1x4, 2x2, 4x1 ...). HSDP: FSDP2 offers no custom
    all-reduce for the replicate dimension, so the comm sums the integer words
    over the shard group and the replicate group and rounds once, and the
    hook writes that result over what FSDP's float all-reduce made (it moves
    ``-0.0``, or, with one rank a shard, the gradient: a wasted collective,
    never a change to the bits).

    World-size invariance needs the same terms on every world size: with a
    fixed micro-batch size and several micro-batches a rank, run all but a
    rank's last backward of a step inside ``with handle.no_reduce():`` — those
    gradients are held back in exact sums (no communication) and reduced with
    the last one's, so FSDP's float accumulation never adds two gradients.
    FSDP's own ways to skip a reduction accumulate in floats:
    ``set_requires_gradient_sync(False)`` is refused when called (or by
    ``exact_fsdp`` when called before), ``set_requires_all_reduce(False)`` at
    the next reduction — use ``no_reduce()``. Clear the gradients between
    steps (``zero_grad``).

    Mixed precision (``MixedPrecisionPolicy``): gradients reach the comm in
    FSDP's ``reduce_dtype``, widened exactly or rounded once from the compute
    dtype by FSDP itself (per micro-batch, so the same on any world size); the
    exact sum is rounded once, to the narrower of ``reduce_dtype`` and the
    parameters' dtype, so FSDP's cast after it is exact (bf16 compute reduced
    in float32: one rounding, to float32 parameters or to bf16 ones; float32
    parameters reduced in bf16: each micro-batch's gradient rounded to bf16,
    then the sum once).
    Returns the :class:`ExactFSDP` handle.
    """
    from torch.distributed.fsdp import FSDPModule

    timeout = _check_timeout(timeout)
    count = positive_int_or_none(mean_over, "mean_over", "the count the sum is divided by")
    if not isinstance(model, FSDPModule):
        raise FoldTypeError(
            f"exact_fsdp takes a module sharded by torch.distributed.fsdp.fully_shard; got a "
            f"{type(model).__qualname__} (call fully_shard(model, ...) first)"
        )
    _check_process_group("exact_fsdp reduces gradients")
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    meshes = [_fsdp_mesh(m) for m in modules]  # every module checked before any is changed
    shapes = {found[1] for found in meshes if found is not None}
    if len(shapes) > 1:
        raise FoldError(f"exact_fsdp needs one data-parallel mesh for the whole model; its "
                        f"FSDP modules use meshes of shapes {sorted(shapes)}")  # fmt: skip
    for module in modules:  # a float accumulation asked for before exact_fsdp
        groups = getattr(module._get_fsdp_state(), "_fsdp_param_groups", ())
        if any(not getattr(g, "reduce_grads", True) for g in groups):
            raise FoldError(_FLOAT_ACCUMULATION)
    handle = ExactFSDP(count, timeout, shapes.pop() if shapes else (1,))
    for module, found in zip(modules, meshes, strict=True):
        module.set_requires_gradient_sync = _refusing_float_accumulation(module)
        replicate = found[0] if found is not None else None
        comm = _ExactFSDPComm(handle, replicate if _size(replicate) > 1 else None,
                              _own_dtype(module))  # fmt: skip
        module.set_custom_reduce_scatter(comm)  # type: ignore[arg-type]
        module.set_all_reduce_hook(comm.hook)
        module.set_force_sum_reduction_for_comms(True)
        module.set_gradient_divide_factor(1.0)
    return handle
