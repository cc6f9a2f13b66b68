"""Host memory a plan hands out again: its large outputs and scratch, once nothing else holds them.

A fold that allocates a fresh 100 MB output on every call pays the kernel
for zeroed pages each time, and on a machine where NumPy's transparent
huge-page advice meets fragmented memory, a stall in the kernel's page
compaction (measured: a (10^6, 64) float32 output took 277 ms a call against
25 ms into reused memory). A plan is built once and called every step, so
:func:`reused_empty` keeps, per plan, up to :data:`KEEP` arrays of each
shape and dtype of at least :data:`MIN_BYTES`, and hands one out again when
no other reference to it is left: not the caller's result, nor any view of
it (a view holds its base), nor a tensor or buffer made from it (they hold
the array). The memory is then overwritten by the next fold, whose result it
becomes; a result still held is never touched.

What a plan keeps is at most :data:`KEEP` arrays a shape while the plan
lives (``KEEP = 2``: a training loop holds the last step's result while the
next is computed, and the two alternate). The one-shot folds
(``bitfold.segment_sum``, ``bitfold.add_at``), which build a plan in every
call, share :data:`ONE_SHOT` instead: the same rule, for at most
:data:`ONE_SHOT_SHAPES` shapes, the least recently used forgotten first. The
reuse changes where results live, never their values. It needs CPython's
reference counts: elsewhere (another implementation, a free-threaded build)
every call allocates.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any, TypeVar

import numpy as np

from ..plan_view import PlanKey, PlanView

P = TypeVar("P", bound=PlanView)

#: Arrays smaller than this are allocated fresh (the allocator reuses them cheaply).
MIN_BYTES = 1 << 20
#: At most this many arrays of one shape and dtype are kept by a plan.
KEEP = 2
#: Shapes (with dtypes) whose arrays the one-shot folds' shared buffers keep at once.
ONE_SHOT_SHAPES = 8


class BuffersKey(PlanKey):
    """The key of a plan's :class:`HostBuffers` among what it keeps (:meth:`bitfold.Fold.prepared`).

    One a plan: every ``BuffersKey()`` is equal, and equal to no other cache's key.
    """


#: The key of a plan's :class:`HostBuffers`.
PREPARED_KEY = BuffersKey()


def _count_of_unreferenced() -> int | None:
    """``sys.getrefcount(kept[i])`` for an array only the list ``kept`` holds, or None
    where reference counts cannot say it (no ``getrefcount``, or no GIL)."""
    if not hasattr(sys, "getrefcount") or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None
    probe = [np.empty(1)]
    return sys.getrefcount(probe[0])


_UNREFERENCED = _count_of_unreferenced()


class HostBuffers:
    """The arrays one plan keeps for reuse (see the module's docstring); safe across threads."""

    def __init__(self, max_shapes: int | None = None) -> None:
        """``max_shapes``: keep arrays of at most this many shapes (None: of every shape)."""
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[tuple[int, ...], str], list[np.ndarray]] = OrderedDict()
        self._max_shapes = max_shapes

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array: kept memory no one holds, else a new array."""
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        if _UNREFERENCED is None or int(np.prod(shape)) * dtype.itemsize < MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:  # a block handed out is referenced before another thread looks
            key = (shape, dtype.str)
            kept = self._kept.setdefault(key, [])
            self._kept.move_to_end(key)
            if self._max_shapes is not None and len(self._kept) > self._max_shapes:
                self._kept.popitem(last=False)  # forgotten: arrays still held stay alive
            for i in range(len(kept)):
                if sys.getrefcount(kept[i]) <= _UNREFERENCED:
                    return kept[i].view()
            block = np.empty(shape, dtype)
            if len(kept) < KEEP:
                kept.append(block)
                return block.view()
            return block

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays kept, held by a caller or not."""
        return sum(a.nbytes for a in self.held_arrays())

    def held_arrays(self) -> list[np.ndarray]:
        """The arrays kept, held by a caller or not (what the plan counts in its ``nbytes``)."""
        with self._lock:
            return [a for kept in self._kept.values() for a in kept]


def buffers_of(plan: PlanView) -> HostBuffers:
    """The :class:`HostBuffers` of ``plan`` (made on first use, kept for the plan's lifetime)."""
    return plan.prepared(PREPARED_KEY, HostBuffers)


#: The buffers every one-shot fold's plan shares (``bitfold.segment_sum``, ``bitfold.add_at``).
ONE_SHOT = HostBuffers(max_shapes=ONE_SHOT_SHAPES)


def share_one_shot(plan: P) -> P:
    """Let ``plan``, built for one fold, reuse the one-shot folds' shared buffers; return it."""
    plan.prepared(PREPARED_KEY, lambda: ONE_SHOT)
    return plan


def reused_empty(plan: PlanView, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)``, in memory ``plan`` kept from an earlier call when it is free."""
    return buffers_of(plan).empty(shape, dtype)


__all__ = [
    "KEEP",
    "MIN_BYTES",
    "ONE_SHOT",
    "ONE_SHOT_SHAPES",
    "PREPARED_KEY",
    "BuffersKey",
    "HostBuffers",
    "buffers_of",
    "reused_empty",
    "share_one_shot",
]
