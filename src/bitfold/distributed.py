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

For ``DistributedDataParallel``: :func:`exact_allreduce_hook` (register it
with ``model.register_comm_hook(None, exact_allreduce_hook)``) makes each
bucket's all-reduce exact — world-size invariant when each rank runs one
micro-batch per step. With gradient accumulation (several micro-batches per
rank and step), use :class:`GradientSum`.
"""

from __future__ import annotations

import hashlib
import numbers
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import dense_device
from .arrays import from_numpy, to_numpy
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
from .validate import check_has_data, checked_options, positive_int_or_none

__all__ = ["WORDS", "GradientSum", "exact_all_reduce", "exact_allreduce_hook"]

#: Where the words of an array's exact all-reduce are made and read: ``"host"`` (NumPy and
#: Numba, after one copy of the array to the host) or ``"device"`` (PyTorch's operations on
#: the tensor's own device, :mod:`bitfold.dense_device`). The default: ``"device"`` for a
#: tensor off the CPU, ``"host"`` otherwise. Both make the same words: ranks of one group may
#: use either.
WORDS = ("host", "device")

#: Each thread's words buffer for exact all-reduces of arrays, kept between calls.
_SPARE = threading.local()


def _device_of(group: Any) -> torch.device:
    """Where a group's collectives want their tensors: CUDA for NCCL, the CPU otherwise."""
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _collective(tensor: torch.Tensor, op: Any, group: Any, timeout: float, what: str) -> None:
    """``all_reduce(tensor, op)`` in place, waiting at most ``timeout`` seconds."""
    try:
        work = dist.all_reduce(tensor, op=op, group=group, async_op=True)
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
    """``t`` where the group's collectives take it (a CUDA device for NCCL; else where it is)."""
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


def _all_reduce_array(x: Any, group: Any, timeout: float, out_dtype: Any, mean_over: int) -> Any:
    """:func:`exact_all_reduce` of one array, through a :class:`DenseSum`, back in its kind."""
    name, out_name = _checked_array(x, out_dtype)
    s = DenseSum(tuple(int(n) for n in x.shape), "float64" if name == "float64" else "float32")
    flat = np.ascontiguousarray(to_numpy(x)).reshape(-1)  # bfloat16 comes widened: exact
    if flat.dtype == np.float16 or not flat.dtype.isnative:
        flat = flat.astype(np.float32 if flat.dtype.itemsize <= 4 else np.float64)  # exact
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
