"""The portable backend's entry: its folds, its route, and its registry entry.

``exact`` takes the paths of :mod:`.paths`; ``ordered`` adds each bucket's
values in increasing position, one rounding an addition, the host's order
and bits (a loop of ``max(counts)`` vector steps: slow for hot buckets, use
``exact``); ``atomic`` is the library's float scatter-add. The states are
:mod:`.states`'.
"""

from __future__ import annotations

from typing import Any

from ...arrays import ArrayFamily
from ...plan_view import PlanView
from ...validate import Values
from ..registry import FOLDS, Backend, InitRule
from . import states
from .checks import FAMILIES, check_family, check_options, check_out, float_name, values_format
from .digits import canonical_nan, table_rows, words_for
from .narrow import narrow_applies
from .paths import eager_torch_sums, exact_sums
from .plan_constants import counts_rows, max_count, plan_array, plan_index

NAME = "portable"


def fold_exact(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, init: Any = None, **options: Any
) -> Any:
    """Every bucket's exact sum, rounded once to ``out_name``, on the values' device.

    ``init`` ((K,) + trailing, same library and device, any float dtype) is one
    more term of every output element. Same bits as the host path.
    """
    check_options(options)
    ops = check_family(values)
    check_out(ops, out_name)
    K, D = plan.K, spec.row_size
    init_dtype = None if init is None else float_name(init)
    bound = max_count(plan) + (init is not None)
    word = words_for(values_format(spec.dtype, init_dtype), ops.has_int64(values), bound).word
    index = plan_index(plan, ops, values, word)
    counts = counts_rows(plan, ops, values, D, int(init is not None), word)
    if ops.compiles_for_host() and ops.reads_without_sync(values):
        from ..portable_torch import use_eager_fold

        use_eager_fold(eager_torch_sums)
    flat = exact_sums(ops, values, index, counts, init, K, D, bound, out_name)
    return flat.reshape((K, *spec.trailing))


def fold_ordered(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, init: Any = None, **options: Any
) -> Any:
    """``out[index[i]] += values[i]`` for i in increasing position, rounded in ``out_name``.

    The host's order and bits (``out`` starts as zeros, or ``init``), in
    ``max(counts)`` vector steps of K rows each; NaN results canonical.
    """
    check_options(options)
    ops = check_family(values)
    check_out(ops, out_name)
    K, D, N = plan.K, spec.row_size, spec.positions
    rows = ops.astype(values.reshape(N, D), out_name)
    acc = ops.zeros(values, (K, D), out_name)
    if init is not None:
        acc = ops.astype(init.reshape(K, D), out_name)
    word = "int64" if ops.has_int64(values) else "int32"
    order = plan_array(plan, ops, values, "order", word)
    starts = plan_array(plan, ops, values, "starts", word)
    counts = plan_array(plan, ops, values, "counts", word)
    steps = max_count(plan)

    def step(t: Any, acc: Any) -> Any:
        at = ops.take(order, ops.clip(starts + t, 0, max(N - 1, 0)))
        term = ops.take(rows, at)
        return acc + ops.where((counts > t).reshape(K, 1), term, -0.0)  # x + -0.0 == x

    if N:
        acc = ops.loop(steps, step, acc)
    return _canonical(ops, acc, out_name).reshape((K, *spec.trailing))


def _canonical(ops: ArrayFamily, out: Any, out_name: str) -> Any:
    """``out`` with every NaN replaced by the canonical NaN of ``out_name``."""
    return ops.where(out != out, canonical_nan(ops, out, out_name), out)


def fold_atomic(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, init: Any = None, **options: Any
) -> Any:
    """The library's float scatter-add into zeros (or ``init``) of ``out_name``: no order."""
    check_options(options)
    ops = check_family(values)
    check_out(ops, out_name)
    K, D = plan.K, spec.row_size
    word = "int64" if ops.has_int64(values) else "int32"
    rows = table_rows(ops, plan_index(plan, ops, values, word), D, values, word)
    out = ops.zeros(values, (K * D,), out_name)
    if init is not None:
        out = ops.astype(init.reshape(-1), out_name)
    out = ops.scatter_add(out, rows, ops.astype(values.reshape(-1), out_name))
    return out.reshape((K, *spec.trailing))


def expand(plan: PlanView, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), on ``v``'s device and library."""
    ops = check_family(v)
    word = "int64" if ops.has_int64(v) else "int32"
    return ops.take(v, plan_index(plan, ops, v, word)).reshape(plan.shape + tuple(trailing))


def explain_route(plan: PlanView, values: Any, spec: Values, **options: Any) -> tuple[str, str]:
    """``plan.route``'s answer: one route, integer words in the array library's operations."""
    ops = check_family(values)
    word = "int64" if ops.has_int64(values) else "int32 (16-bit digits)"
    return "words", (
        f"{spec.dtype} {'rows' if spec.trailing else 'scalars'} of the {ops.name} family on "
        f"{ops.device(values)!r}: "
        + (
            "one int64 word a value, of one unit for the whole fold where every term is a "
            "multiple of it, else of each bucket's own where its terms fit one, else "
            if narrow_applies([spec.dtype], ops.has_int64(values))
            else ""
        )
        + f"integer digits scatter-added in {word} words, carried and rounded once with the "
        "library's own operations"
    )


#: The registry's entry: any device the families' libraries run on; an accumulator's state
#: lives beside its values (on the host for a library without int64).
BACKEND = Backend.from_functions(
    globals(),
    new_state=states.new_state,
    add_to_state=states.add_to_state,
    merge_states=states.merge_states,
    round_state=states.round_state,
    name=NAME,
    families=FAMILIES,
    devices=("*",),
    options=dict.fromkeys((*FOLDS, "add_to_state"), ()),  # no tuning option anywhere
    init=InitRule(strategies=FOLDS, mixed_dtypes=True),  # every fold, into any float dtype
    explain=explain_route,
    priority=-100,  # asked last: the safety net on every device
)
