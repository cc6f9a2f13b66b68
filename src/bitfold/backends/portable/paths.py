"""The choice between the exact paths: the shared unit, each element's unit, the digits.

Two one-word paths (int64 words: torch, CuPy, NumPy, JAX with
``jax_enable_x64``; values of at most 24 significant bits) come first: the
shared unit (:mod:`.shared_unit`), taken where a flag can be read without
waiting (eager CPU arrays), in JAX (``lax.cond``), and in a
``torch.compile`` graph on the CPU (:mod:`bitfold.backends.portable_torch`);
then each element's own unit (:mod:`.narrow`). Where an element's terms do
not fit one word, or meet NaN or infinity, a flag sends the whole fold to
the digit path (:mod:`.digits`): read where it lies for an eager CPU
tensor, ``lax.cond`` in JAX, both made and one selected elsewhere
(:mod:`.flags`; no host synchronisation in any case).
"""

from __future__ import annotations

import math
from typing import Any

from ...arrays import ArrayFamily, family_of
from ...formats import FLOATS, limb_format_for
from .checks import check_family, check_out, float_name, values_format
from .digits import Words, canonical_nan, round_table, table_of, table_rows, words_for
from .flags import choose, runs_one_path
from .narrow import narrow_applies, narrow_fold
from .shared_unit import shared_unit_fold, shared_unit_plan, shared_words
from .terms import Terms


def exact_sums(ops: ArrayFamily, values: Any, index: Any, counts: Any, init: Any, K: int, D: int,
               bound: int, out_name: str, *, words: Words | None = None,
               scaled: bool | None = None) -> Any:  # fmt: skip
    """The exact fold of ``values`` ((n,) or (n, ...) with ``D`` elements a row) by ``index``
    ((n,), the plan's words) into ``K`` buckets, rounded once: a flat ``(K·D,)`` array.

    ``counts`` ((K·D,), the plan's words) are every output element's terms,
    ``bound`` the most of one element (``init`` counted). Paths, each exact,
    the first that serves taken: the shared unit (:func:`shared_unit_plan`,
    where flags can be read or ``lax.cond`` branches), one word per element's
    unit (:func:`narrow_fold`), the digit tables (:func:`table_of`). Under
    ``torch.compile``, torch CPU tensors fold by the shared unit in the graph,
    and an operator (:mod:`bitfold.backends.portable_torch`) folds eagerly
    where it did not serve.

    ``words`` (default :func:`words_for` the values' library and ``bound``) hold
    the digit path's sums; ``scaled`` is :func:`narrow_fold`'s. ``index`` and
    ``counts`` are integers of ``words.word``.
    """
    dtype = float_name(values)
    init_dtype = None if init is None else float_name(init)
    fmt = values_format(dtype, init_dtype)
    if words is None:
        words = words_for(fmt, ops.has_int64(values), bound)

    def digits() -> Any:
        table = table_of(ops, values, fmt, words, K * D, groups(), counts, bound)
        return round_table(ops, table.reshape(K * D, words.columns), words, fmt, out_name)

    def groups() -> list[tuple[Any, Any, str]]:
        rows = [(table_rows(ops, index, D, values, words.word), values.reshape(-1), dtype)]
        if init is not None:
            rows.append((ops.arange(values, K * D, words.word), init.reshape(-1), init_dtype))
        return rows

    dtypes = [dtype] + ([] if init is None else [init_dtype])
    narrow = narrow_applies(dtypes, words.word == "int64")
    layout = shared_words(words.word, bound)
    if layout is None or max(FLOATS[d].precision for d in dtypes) > 24:
        return digits()  # float64 values, or more terms an element than int32 digits hold
    shape = (K,) if D == 1 else (K, D)
    narrow_groups = [(index, values.reshape((-1, *shape[1:])), dtype)]
    if init is not None:
        narrow_groups.append((ops.arange(values, K, words.word), init.reshape(shape), init_dtype))
    element_counts = counts.reshape(shape)
    terms = Terms(ops, values, fmt, shape, narrow_groups)

    def per_element() -> Any:
        if not narrow:
            return digits()
        out, bad = narrow_fold(terms, element_counts, out_name, scaled=scaled)
        return choose(ops, values, bad, digits, lambda: out.reshape(-1))

    compiled_cpu = ops.traced_for_host(values)
    if not (runs_one_path(ops, values) or compiled_cpu):  # both paths made: not worth it
        return per_element()
    unit, good = shared_unit_plan(terms, layout)
    if compiled_cpu:  # the shared unit in the graph; an eager fold where it does not serve
        from ..portable_torch import portable_exact_unless

        out, zero_sum = shared_unit_fold(terms, element_counts, unit, layout, out_name,
                                         signs=False)  # fmt: skip
        redo = ~good | zero_sum
        return portable_exact_unless(out.reshape(-1), redo, values, index, counts, init, K, D,
                                     bound, out_name)  # fmt: skip

    def shared() -> Any:
        out, _ = shared_unit_fold(terms, element_counts, unit, layout, out_name)
        return out.reshape(-1)

    return choose(ops, values, good, shared, per_element)


def eager_torch_sums(values: Any, *args: Any) -> Any:
    """:func:`exact_sums` of eager torch tensors (what a compiled CPU fold falls back to)."""
    return exact_sums(family_of(values), values, *args)


def segment_fold(
    data: Any, segment_ids: Any, num_segments: int, out_name: str, *, check: bool = True
) -> Any:
    """The exact fold of ``data`` ((n,) + trailing) by traced ``segment_ids`` ((n,)), no plan.

    For ids that live on the device only (JAX ids inside ``jit``): the counts
    come from an integer scatter of ones, the chunking from ``n``. An id
    outside ``[0, num_segments)`` cannot be refused without reading the ids on
    the host, so with ``check`` the whole result is the canonical NaN instead
    (never a silently wrong sum).
    """
    ops = check_family(data)
    check_out(ops, out_name)
    dtype = float_name(data)
    n = int(segment_ids.shape[0])
    trailing = tuple(int(s) for s in data.shape[1:])
    K, D = num_segments, math.prod(trailing)
    fmt = limb_format_for(dtype)
    words = words_for(fmt, ops.has_int64(data), n)
    ids = ops.astype(segment_ids, words.word)
    ones = ops.astype(ids - ids + 1, words.word)
    counts = ops.scatter_add(ops.zeros(data, (K,), words.word), ids, ones)
    if D != 1:
        counts = (counts.reshape(-1, 1) + ops.zeros(data, (1, D), words.word)).reshape(-1)
    out = exact_sums(ops, data, ids, counts, None, K, D, max(n, 1), out_name)
    if check and n:
        bad = ops.amax(ops.astype((ids < 0) | (ids >= K), words.word), 0)
        nan = canonical_nan(ops, out, out_name)
        out = ops.where(bad > 0, nan, out)
    return out.reshape((K, *trailing))
