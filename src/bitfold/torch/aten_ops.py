"""The custom ops that stand for ATen's folds in compiled graphs: ``bitfold::exact_<op>``.

For every functional ATen overload in the fold rules' ``compiled`` column
(:data:`bitfold.torch.rules.COMPILED`) there is one ``torch.library``
custom op with the same schema (``bitfold::exact_index_put``,
``bitfold::exact_scatter_reduce_two``, ...). Its implementation binds the
arguments and calls the rule's exact handler, the very function
:func:`bitfold.torch.exact_mode` calls, so a fold rewritten into it gives
the eager exact fold's bits: every element the correctly rounded sum of its
old value and all its terms, one rounding, the same bits for any order of
the terms. Where the handler leaves the call to ATen (an integer tensor, a
product), ATen's op runs. The output is a new contiguous tensor (never an
alias of an input), as the fake implementation says, so inductor can plan
its buffers; ``self``'s dtype, except the embedding backward's narrowing
(:mod:`bitfold.torch.graph_pass`), where float32 terms fold into a float16
or bfloat16 table with one rounding.

The ops have no autograd: they appear only in post-grad graphs, after
AOT autograd has split the forward from the backward. So they are plain
``torch.library`` definitions with a Python kernel for every device, not
``torch.library.custom_op`` ones, whose autograd layer in Python costs a call
more than the fold it wraps (an ``index_put`` of 130 rows into 256: 79 us a
call against 54 us through the dispatcher). Where the mode's lane for the
overload takes the call (:data:`bitfold.torch.handlers.LANES`, a small CPU
fold), it runs without binding the arguments, as in the mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from .handlers import LANES, Leave, bind
from .rules import COMPILED, Rule, op_name

#: ATen overload -> its bitfold custom op (the ``.default`` overload)
EXACT_OPS: dict[Any, Any] = {}
#: the definitions of the ``bitfold::exact_<op>`` ops and their kernels
_LIBRARY = torch.library.Library("bitfold", "FRAGMENT")
#: ops whose call takes the lane of another overload with the same schema
_SAME_LANE = {torch.ops.aten._unsafe_index_put.default: torch.ops.aten.index_put.default}


def _schema_of(overload: Any) -> str:
    """``(args) -> returns`` of an overload's schema, every argument positional.

    (A custom op takes no keyword-only tensors; :func:`call_args` orders a
    call's arguments for it.)
    """
    text = str(overload._schema)
    return text[text.index("(") :].replace("*, ", "")


def call_args(overload: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call of ``overload`` as the positional arguments of its custom op (defaults filled)."""
    bound = bind(overload, args, kwargs)
    return tuple(bound[a.name] for a in overload._schema.arguments)


def _aten_call(overload: Any, values: tuple[Any, ...]) -> Any:
    """Call ``overload`` with the custom op's positional ``values`` (keyword-only as keywords)."""
    pos, kw = [], {}
    for arg, value in zip(overload._schema.arguments, values, strict=True):
        if arg.kwarg_only:
            kw[arg.name] = value
        else:
            pos.append(value)
    return overload(*pos, **kw)


def _fresh(result: Any, inputs: tuple[Any, ...]) -> Any:
    """``result`` (a tensor or a tuple of them) as new contiguous tensors sharing no storage
    with an input."""
    if isinstance(result, tuple | list):
        outs: list[torch.Tensor] = []
        for r in result:  # none shares storage with an input or an earlier output
            outs.append(_fresh(r, (*inputs, *outs)))
        return tuple(outs)
    out = result.contiguous()
    for t in tree_leaves(inputs):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == (
            out.untyped_storage().data_ptr()
        ):
            return out.clone()
    return out


def _dynamic_fake(overload: Any, args: tuple[Any, ...]) -> torch.Tensor:
    """The fake result of ``bincount``, whose length depends on the ids' values."""
    weights = args[1]
    dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    size = torch.library.get_ctx().new_dynamic_size(min=int(args[2]) if args[2] else 0)
    return weights.new_empty((size,), dtype=dtype)


def _define(overload: Any, rule: Rule) -> Any:
    schema = overload._schema.arguments

    def full(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Every argument in schema order (the op may get some by keyword, or defaulted)."""
        got = dict(zip((a.name for a in schema), args, strict=False)) | kwargs
        return tuple(got[a.name] if a.name in got else a.default_value for a in schema)

    lane = LANES.get(_SAME_LANE.get(overload, overload))
    # the trailing keyword-only arguments at their defaults (``alpha=1``): a lane takes the
    # call only as the ATen op gets it without them
    trailing = [a for a in schema if a.kwarg_only]
    plain = len(schema) - len(trailing)

    def lane_call(args: tuple[Any, ...]) -> Any:
        if lane is None or len(args) > len(schema):
            return None
        for a, v in zip(trailing, args[plain:], strict=False):
            if isinstance(v, torch.Tensor) or v != a.default_value:
                return None
        return lane(args[:plain], {})

    def impl(*args: Any, **kwargs: Any) -> Any:
        result = None if kwargs else lane_call(args)
        if result is not None:  # a new contiguous tensor (a lane folds into a new array)
            return result
        values = full(args, kwargs)
        result = rule.handler({a.name: v for a, v in zip(schema, values, strict=True)})
        if isinstance(result, Leave):
            result = _aten_call(overload, values)
        return _fresh(result, values)

    def fake(*args: Any, **kwargs: Any) -> Any:
        args = full(args, kwargs)
        first = next(a for a in args if isinstance(a, torch.Tensor))

        def narrow(t: Any) -> Any:  # wider floating terms fold into self's dtype
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != first.dtype:
                return t.to(first.dtype)
            return t

        if torch.Tag.dynamic_output_shape in overload.tags:
            return _dynamic_fake(overload, args)
        shaped = _aten_call(overload, tree_map(narrow, args))
        return tree_map(lambda t: t.new_empty(t.shape), shaped)

    name = op_name(overload)
    _LIBRARY.define(f"{name}{_schema_of(overload)}")
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"bitfold::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.bitfold, name).default


for _overload, _rule in COMPILED.items():
    EXACT_OPS[_overload] = _define(_overload, _rule)

__all__ = ["EXACT_OPS", "call_args"]
