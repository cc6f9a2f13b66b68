"""The portable backend's accumulator states: int64 tables beside the values.

A state is ``(K,) + trailing + (L + 5,)`` int64 in the host's layout
(:attr:`bitfold.ExactAccumulator.state`), on the values' library and device;
on the host for a library without int64 (JAX in its default 32-bit mode),
whose digit tables are converted as they arrive. States merge with host
states by integer addition.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...arrays import ArrayFamily, from_numpy, place_of, to_numpy
from ...errors import FoldTypeError
from ...formats import LimbFormat
from ...plan_view import PlanView
from ...validate import Values
from .. import host_state
from .checks import check_family, check_options
from .digits import Words, carried_table, round_table, table_of, table_rows, words_for


def new_state(K: int, fmt: LimbFormat, trailing: tuple[int, ...] = (), like: Any = None) -> Any:
    """A zero state ``(K,) + trailing + (L + 5,)`` int64 beside ``like``, on its device.

    A host NumPy state without ``like``, or when ``like``'s library has no
    int64 (JAX in its default 32-bit mode: its 16-bit digits are converted to
    the host layout as they arrive, :func:`add_to_state`).
    """
    if like is None:
        return host_state.new_state(K, fmt, trailing)
    ops = check_family(like)
    if not ops.has_int64(like):
        return host_state.new_state(K, fmt, trailing)
    return ops.zeros(like, (K, *trailing, fmt.width), "int64")


def _need_int64(ops: ArrayFamily, like: Any) -> None:
    if not ops.has_int64(like):
        raise FoldTypeError(
            "an accumulator state on the device is int64: enable jax_enable_x64, or add the "
            "values to a host accumulator (plan.accumulator().add(values))"
        )


def _table(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat) -> tuple[Any, Words]:
    """The table of ``values`` at plan positions ``spec.start ..``: (flat table, its words)."""
    ops = check_family(values)
    D, n = spec.row_size, spec.positions
    if spec.start == 0 and n == plan.size:
        host_index, counts = plan.index, plan.counts
    else:
        host_index = plan.index[spec.start : spec.start + n]
        counts = np.bincount(host_index, minlength=plan.K).astype(np.int64)
    bound = int(counts.max(initial=0))
    words = words_for(fmt, ops.has_int64(values), bound)
    index = ops.constant(values, host_index.astype(words.word))
    rows = table_rows(ops, index, D, values, words.word)
    counts_rows = ops.constant(values, np.repeat(counts, D).astype(words.word))
    groups = [(rows, values.reshape(-1), spec.dtype)]
    return table_of(ops, values, fmt, words, plan.K * D, groups, counts_rows, bound), words


def exact_state(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat) -> Any:
    """The accumulator state of ``values`` on their device: ``(K,) + trailing + (L + 5,)`` int64.

    Bit for bit a host state of the same values (carried or not, it has the
    same value): it merges with host states by integer addition.
    """
    ops = check_family(values)
    _need_int64(ops, values)
    table, _ = _table(plan, values, spec, fmt)
    return table.reshape((plan.K, *spec.trailing, fmt.width))


def to_host_state(table: np.ndarray, words: Words, fmt: LimbFormat) -> np.ndarray:
    """A table of ``w``-bit digits (host copy, rows of ``words.columns``) in the host layout."""
    t = np.asarray(table, np.int64).reshape(-1, words.columns)
    if words.digit_bits == 32:
        return t
    per = 32 // words.digit_bits
    state = np.zeros((t.shape[0], fmt.width), np.int64)
    for i in range(words.digits):  # digits are carried: each below 2^w but the top one
        state[:, i // per] += t[:, i] << (words.digit_bits * (i % per))
    state[:, fmt.limbs :] = t[:, words.digits :]
    return state


def add_to_state(
    state: Any, plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, **options: Any
) -> Any:
    """Add ``values`` (plan positions ``spec.start ..``) into ``state``, exactly; the new state.

    The sums are made on the values' device. A state of the same place
    (library and device) adds their table there; a state elsewhere (the host,
    another device) gets the table copied to it once, in the host layout
    (:func:`to_host_state`: exact, the digits are integers).
    """
    check_options(options)
    ops = check_family(values)
    table, words = _table(plan, values, spec, fmt)
    shape = tuple(int(s) for s in state.shape)
    if words.digit_bits == 32 and place_of(state) == place_of(values):
        return merge_states(state, table.reshape(shape), fmt)
    if words.digit_bits != 32:  # digits below 2^w before regrouping
        table = carried_table(ops, table, words, plan.K * spec.row_size)
    host_table = to_host_state(to_numpy(table), words, fmt).reshape(shape)
    return merge_states(state, from_numpy(host_table, like=state), fmt)


def merge_states(into: Any, other: Any, fmt: LimbFormat) -> Any:
    """``into + other``, carried: two states of one plan, format and place (library, device).

    Integer addition, exact in any order. The sum is carried (every limb but
    the top one below 2^32) so that any number of adds and merges stays clear
    of int64 overflow, as the host's merge normalises. Host states merge as
    the host's.
    """
    if isinstance(into, np.ndarray):
        return host_state.merge_states(into, other, fmt)
    total = into + other
    shape = tuple(int(s) for s in total.shape)
    rows = math.prod(shape[:-1])
    carried = carried_table(check_family(total), total.reshape(-1), words_for(fmt, True, 1), rows)
    return carried.reshape(shape)


def round_state(state: Any, fmt: LimbFormat, out_name: str) -> Any:
    """Round every element of a state ``(K,) + trailing + (L + 5,)`` once to ``out_name``.

    The result is an array of the state's library and device (a host state
    rounds as the host's, the same bits).
    """
    if isinstance(state, np.ndarray):
        return host_state.round_state(state, fmt, out_name)
    ops = check_family(state)
    words = words_for(fmt, True, 1)
    shape = tuple(int(s) for s in state.shape[:-1])
    flat = state.reshape(-1, fmt.width)
    return round_table(ops, flat, words, fmt, out_name).reshape(shape)
