"""``bitfold.torch.compile``: ``torch.compile`` whose folds, forward and backward, are exact.

``bitfold.torch.compile(model, **kwargs)`` takes ``torch.compile``'s
arguments and returns what ``torch.compile`` returns (a compiled function,
or an ``OptimizedModule`` for a module), with one difference: inductor's
post-grad graphs, forward and backward, go through
:class:`bitfold.torch.graph_pass.ExactFoldPass`, which rewrites every fold
node (``index_put`` / ``_unsafe_index_put`` with ``accumulate``,
``scatter_add``, ``scatter_reduce`` sum/mean, ``index_add``, the embedding-bag
forward, the embedding and embedding-bag backwards, weighted histograms,
max-pooling gradients) into bitfold's exact custom ops. While the compiled
function runs, a function mode sends a weighted ``torch.bincount`` to an exact
op inside the graph (Dynamo would run it outside any graph) and translates the
sums of extension packages (``torch_scatter``, ``torch_sparse``, ``pyg_lib``)
into ATen folds the pass then rewrites. Everything else compiles as usual; the
graphs really compile (the custom ops are extern calls inside inductor's
generated code, no graph break).

What Dynamo runs outside its graphs is made exact too. Dynamo cannot trace
sparse tensors: a function that touches one (``torch.sparse.mm(A, x)``, an
uncoalesced COO tensor's ``to_dense``) is run by Python op by op, as is the
op at a graph break. The same function mode sends each such eager call
through :class:`bitfold.torch.exact_mode`'s rules (a sparse product as its
exact autograd function, every other fold by its ATen rule), but for the
functions whose forward on dense tensors folds nothing (indexing, views,
arithmetic, dense products: ``_GATHERS_AND_ELEMENTWISE``), and the
autograd nodes those calls create run their backward under the same rules
(all but those whose backward cannot fold: :data:`FOLD_FREE_BACKWARD`),
so their folds are exact forward and backward and appear in ``counts`` (once
each time they run) or in ``passed`` (refused with ``strict=True``), never
in neither.

The numeric contract:

* every fold in the compiled graphs gives exactly the bits of the eager exact
  fold of the same terms (:func:`bitfold.torch.exact_mode`): each element the
  correctly rounded sum of its old value and all its terms, one rounding;
* so a compiled step gives the same bits for any order of a fold's terms
  (edges, tokens), run after run;
* the other ops are inductor's, and inductor orders its own reductions (a
  ``sum``, a matrix product, fused kernels): a compiled step is **not**
  promised the eager step's bits, even for a model with no fold. Where
  inductor computes a fold's terms itself (a float16 table's gradient
  scaled by frequency, say, divided in float32), the terms are inductor's.

``mode=`` and ``options=`` are merged into one ``options`` dict (inductor's
``list_mode_options(mode)``, the user's options, and the pass), so the
user's inductor options are kept; a ``post_grad_custom_post_pass`` of the
user's (in ``options`` or in ``torch._inductor.config`` when ``compile`` is
called) runs before bitfold's. The returned object carries a
:class:`~bitfold.torch.graph_pass.CompileReport` as ``.bitfold``
(``counts``, ``passed``, also for graphs inductor loads from its caches, which
``cached`` counts); ``strict=True`` raises :class:`bitfold.FoldError` at compile
time for a fold that cannot be made exact.

Inside :func:`bitfold.torch.exact_mode` the compiled callable runs the
original model op by op, under the mode (Dynamo compiles nothing while an
exact mode is active and would remember that skip); a backward run
inside the mode through a graph compiled by this function outside it is
allowed, its folds being exact.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ..errors import FoldError
from ..validate import refuse_unknown_options
from . import extension_ops
from .aten_ops import EXACT_OPS
from .graph_pass import CompileReport, ExactFoldPass, record_left
from .handlers import Leave
from .mode import (
    COMPILED_NODE,
    EXACT_GRAPH,
    ExactMode,
    active_exact_mode,
    active_modes,
    autograd_nodes,
    dynamo_patches_held,
    install_kernels,
    sparse_tensors_seen,
)

_PASS_KEY = "post_grad_custom_post_pass"


def _options(
    mode: str | None, options: dict[str, Any] | None, dynamic: bool | None, report: CompileReport
) -> dict[str, Any]:
    """One options dict: the mode's, the user's, and the exact pass wrapping the user's pass."""
    from torch._inductor import config, list_mode_options

    merged = dict(list_mode_options(mode, dynamic)) if mode is not None else {}
    merged.update(options or {})
    inner = merged.get(_PASS_KEY, getattr(config, _PASS_KEY, None))
    merged[_PASS_KEY] = ExactFoldPass(report, inner)
    return merged


#: Autograd nodes whose backward runs no fold on dense tensors (no scatter-add, ``index_add``,
#: accumulating ``index_put``, embedding gradient, ...): their backward needs no exact mode, and
#: an eager stretch of a compiled call makes many of them (transformers' Mixtral with eager
#: experts: about a hundred a step). Every other node made by an eager call runs its backward
#: under the exact rules, and every node once the process has a sparse tensor (the backward of a
#: product with a sparse factor is a sparse product, a fold).
#: ``tests/test_fold_free_backward.py`` runs each one's backward under ``exact_mode()`` and fails
#: where it reaches a fold.
FOLD_FREE_BACKWARD = frozenset({
    "torch::autograd::AccumulateGrad", "AddBackward0", "AddmmBackward0", "AliasBackward0",
    "BmmBackward0", "CatBackward0", "CloneBackward0", "DivBackward0", "ExpBackward0",
    "ExpandBackward0", "GeluBackward0", "IndexAddBackward0", "LogSoftmaxBackward0",
    "MeanBackward1", "MmBackward0", "MulBackward0", "MulBackward1", "NativeLayerNormBackward0",
    "NegBackward0", "NllLossBackward0", "PermuteBackward0", "PowBackward0", "ReluBackward0",
    "ReshapeAliasBackward0", "RsqrtBackward0", "SafeSoftmaxBackward0",
    "ScaledDotProductFlashAttentionForCpuBackward0", "SelectBackward0", "SigmoidBackward0",
    "SiluBackward0", "SliceBackward0", "SoftmaxBackward0", "SplitBackward0", "SqueezeBackward1",
    "StackBackward0", "SubBackward0", "SumBackward1", "TBackward0", "TanhBackward0",
    "ToCopyBackward0", "TopkBackward0", "TransposeBackward0", "UnsafeViewBackward0",
    "UnsqueezeBackward0", "ViewBackward0",
})  # fmt: skip


def _mark(
    outputs: Any, since: int | None, report: CompileReport, watch: bool, eager: bool
) -> None:
    """Mark the compiled graphs' autograd nodes behind ``outputs`` as exact (for the mode's guard).

    Only nodes created by this call (sequence number ``>= since``) are marked.
    With ``watch`` (the forward compiled or loaded a graph), the first backward
    through each node is watched for a backward graph loaded from inductor's
    caches (compiled lazily, at the first backward), whose rewrites ``report``
    then counts. With ``eager`` (the call ran ops outside Dynamo's graphs),
    every other node it created runs its backward under the exact rules
    (:func:`_exact_backward`), but those whose backward never folds on
    dense tensors (:data:`FOLD_FREE_BACKWARD`) while the process has no
    sparse tensor.
    """
    keep = None if since is None else (lambda node: node._sequence_nr() >= since)
    fold_free = frozenset() if sparse_tensors_seen() else FOLD_FREE_BACKWARD
    for node in autograd_nodes(tree_leaves(outputs), keep):
        name = node.name()
        if name.startswith(COMPILED_NODE):
            node.metadata[EXACT_GRAPH] = True
            if watch:
                _watch_backward(node, report)
        elif eager and name not in fold_free:
            _exact_backward(node, report)


def _watch_backward(node: Any, report: CompileReport) -> None:
    marks: list[Any] = []

    def begin(*_: Any) -> None:
        marks.append(report.begin())

    def end(*_: Any) -> None:
        if marks:
            report.end(marks.pop())

    node.register_prehook(begin)
    node.register_hook(end)


class _ReportMode(ExactMode):
    """:class:`~bitfold.torch.mode.ExactMode` whose counts and refusals go to a compile report.

    Active around one eager call of a compiled function (activated: the call
    holds the kernels and Dynamo's patches) or entered around one eager
    autograd node's backward: what it makes exact is added to
    ``report.counts`` as it ends; what it leaves is recorded in
    ``report.passed``, or refused as
    ``bitfold.torch.compile(strict=True)`` refuses.
    """

    def __init__(self, report: CompileReport) -> None:
        # the fold kernels alone, as exact_mode() by default: an eager op that folds nothing
        # never enters Python; full (sparse products above autograd) once a sparse tensor exists
        super().__init__(strict=False, full=None)
        self.report = report

    def leave(self, func: str, kind: str, reason: str) -> None:
        record_left(self.report, func, f"{kind}: {reason}")

    def deactivate(self, *exc: Any) -> None:
        try:
            super().deactivate(*exc)
        finally:
            for kind, n in self.counts.items():
                self.report.record(f"exact:{kind}", n)
            for key, n in self.passed.items():  # left by a nested mode (an extension op)
                self.report.record(f"passed:{key}", n)
            self.counts.clear()
            self.passed.clear()


def _exact_backward(node: Any, report: CompileReport) -> None:
    """Run ``node``'s backward (an eager op's, in a compiled call) under the exact rules."""
    modes: list[_ReportMode] = []

    def begin(*_: Any) -> None:
        mode = _ReportMode(report)
        mode.__enter__()
        modes.append(mode)

    def end(*_: Any) -> None:
        if modes:
            modes.pop().__exit__(None, None, None)

    node.register_prehook(begin)
    node.register_hook(end)


def _drop_stale_modes() -> None:
    """Pop the modes of eager backward nodes whose backward raised (their end hook never ran)."""
    while any(isinstance(m, _ReportMode) for m in active_modes()):
        top = active_modes()[-1]
        if not isinstance(top, _ReportMode):
            return
        top.__exit__(None, None, None)


def _sequence_now() -> int | None:
    getter = getattr(torch._C._autograd, "_get_sequence_nr", None)
    return getter() if getter is not None and torch.is_grad_enabled() else None


def _fold_error_in(exc: BaseException) -> FoldError | None:
    """The FoldError (a ``strict=True`` refusal at compile time, an index out of range when a
    compiled fold runs) in ``exc`` or in the errors it wraps, or None."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, FoldError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return None


_BINCOUNTS = (torch.bincount, torch.Tensor.bincount)


def _bincount(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``torch.bincount(input, weights, minlength)`` through bitfold's exact op when weighted."""
    x = args[0] if args else kwargs.get("input", kwargs.get("self"))
    weights = args[1] if len(args) > 1 else kwargs.get("weights")
    minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        return torch.bincount(*args, **kwargs)
    return EXACT_OPS[torch.ops.aten.bincount.default](x, weights, int(minlength))


class _ExactCalls(TorchFunctionMode):
    """Active around every call of a function compiled by :func:`compile`, traced by Dynamo.

    Two kinds of fold never reach inductor's graphs as ATen fold nodes: a
    weighted ``torch.bincount`` (its output length depends on the ids, so
    Dynamo would run it outside any graph) and the ops of extension packages
    (``torch_scatter``, ``torch_sparse``, ``pyg_lib``), whose sums run inside the
    extension. This mode routes the first to bitfold's exact ``bincount`` op
    (an output of data-dependent length, inside the graph) and translates the
    second into ATen folds (:mod:`bitfold.torch.extension_ops`), which the
    graph pass then makes exact; an extension fold it cannot translate is
    recorded in the report's ``passed`` once per trace (refused with
    ``strict=True``). Everything else is called as it is.
    """

    def __init__(self, report: CompileReport) -> None:
        super().__init__()
        self.report = id(report)
        _REPORTS[self.report] = report
        self._report = report
        #: an op ran outside Dynamo's graphs (so its autograd nodes need the exact rules)
        self.eager = False
        #: where inductor writes the code it generates (whose calls are the graphs' own)
        self._generated = _generated_code_dir()
        #: the exact mode each eager call enters (one for the whole compiled call: its counts
        #: go to the report at each exit)
        self._mode = _ReportMode(report)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            return self._call(func, args, kwargs)
        caller = sys._getframe(1).f_code.co_filename
        if _plain_call(func, caller.startswith(self._generated), self.eager):
            return func(*args, **kwargs)
        return _eager_torch_function(self, func, args, kwargs, caller)

    def _eager(self, func: Any, args: Any, kwargs: dict[str, Any], caller: str) -> Any:
        """A call Dynamo runs itself, outside any graph (``caller``: the calling frame's file)."""
        sparse = _has_sparse(args, kwargs)
        if (sparse or _public_function(func)) and not caller.startswith(self._generated):
            if not self.eager:  # the first eager call of this compiled call
                install_kernels()  # only now: once installed, every fold op calls Python
                self.eager = True  # its autograd nodes get the exact rules (_mark)
            if func in _GATHERS_AND_ELEMENTWISE and not sparse:
                return func(*args, **kwargs)  # folds nothing in its forward
            mode = self._mode.activate()  # the call holds Dynamo's patches
            try:
                return func(*args, **kwargs)
            finally:
                mode.deactivate()
        return self._call(func, args, kwargs)

    def _call(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if func in _BINCOUNTS:
            return _bincount(args, kwargs)
        name, translation, reason = _extension(func)
        if translation is not None:
            result = extension_ops.TRANSLATIONS[translation](*args, **kwargs)
            if not isinstance(result, Leave):
                return result
            reason = result.reason
        if reason is not None:
            _left(self.report, name, reason)
        return func(*args, **kwargs)


#: :meth:`_ExactCalls._eager`, unseen by Dynamo. An eager stretch of a compiled function
#: (after a graph break) runs with Dynamo watching every new frame, and it compiled the mode's
#: own Python (its checks, entering the exact mode, the fold kernels) as frames of their own,
#: again wherever their guards failed.
_eager_torch_function = torch._dynamo.disable(_ExactCalls._eager, recursive=True)


def _generated_code_dir() -> tuple[str, ...]:
    """The folder of inductor's generated code (as given and resolved): its calls (``torch.mm``
    for a graph's products) run the compiled graphs, not eager code. Looked up once for each
    value of ``TORCHINDUCTOR_CACHE_DIR`` (inductor's own lookup makes the folder and resolves
    links: 13 us, at every compiled call)."""
    return _generated_code_dir_for(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))


@functools.lru_cache(maxsize=8)
def _generated_code_dir_for(setting: str | None) -> tuple[str, ...]:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    given = cache_dir()  # ``setting``, made absolute, or inductor's default folder
    return tuple({os.path.join(given, ""), os.path.join(os.path.realpath(given), "")})


def _has_sparse(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a tensor among the arguments (in containers too) is sparse: the tensors passed
    as they are read at once, without flattening (this runs for every eager torch call)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.layout != torch.strided:
                return True
        elif isinstance(a, list | tuple | dict) and any(
            isinstance(t, torch.Tensor) and t.layout != torch.strided for t in tree_leaves(a)
        ):
            return True
    return False


#: public functions whose forward on dense tensors reaches no fold op (metadata, views,
#: gathers, element-wise arithmetic, dense products): an eager stretch runs them without
#: activating the exact mode; their autograd nodes still get its rules (:func:`_mark`: a
#: gather's backward is a fold).
#: Measured on a Mixtral-style model with eager experts: 171 of the 179 calls a step that
#: entered the mode were these; ``index_add_`` made the other 8.
_GATHERS_AND_ELEMENTWISE = frozenset({
    torch.Tensor.__getitem__, torch.Tensor.__eq__, torch.Tensor.__bool__, torch.Tensor.size,
    torch.Tensor.stride, torch.Tensor.dim, torch.Tensor.detach, torch.Tensor.to,
    torch.Tensor.chunk, torch.Tensor.unbind, torch.Tensor.unsqueeze, torch.Tensor.view,
    torch.Tensor.reshape, torch.Tensor.mul, torch.Tensor.add, torch.where, torch.arange,
    torch.mm, torch.matmul, torch.nn.functional.linear, torch.nn.functional.embedding,
})  # fmt: skip


def _public_function(func: Any) -> bool:
    """Whether an eager call of ``func`` on dense tensors may fold: a public function (a call
    with a sparse tensor may fold, whatever it calls).

    Left out: attribute reads (``__get__``), torch's private helpers, which
    the compiled graphs' own wrappers call on every run (``_set_grad_enabled``),
    and ATen overloads (``torch.ops.aten.*``), which inductor's generated code
    calls for the kernels it does not generate: those nodes went through the
    graph pass already.
    """
    if isinstance(func, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return False
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__"):
        return False
    return not name.startswith("_") or name.startswith("__")


# Called from eager code (a frame Dynamo skipped, a graph break), the handler is a frame of its
# own, which Dynamo would compile too, guarding too little on ``func``: the compiled handler of
# ``tensor.shape``'s ``__get__`` then served ``tensor.device`` (transformers' Mixtral with eager
# experts). The handler runs as Python when it is a top-level frame; Dynamo still inlines it while
# it traces a compiled function.
torch._dynamo.eval_frame.skip_code(_ExactCalls.__torch_function__.__code__)

#: function -> (routed: a ``bincount`` or an extension op; public: :func:`_public_function`;
#: quiet: one of :data:`_GATHERS_AND_ELEMENTWISE`)
_CALL_KINDS: dict[Any, tuple[bool, bool, bool]] = {}


def _plain_call(func: Any, generated: bool, eager: bool) -> bool:
    """Whether a call of ``func`` runs as it is, before anything else is asked: one that
    :class:`_ExactCalls` neither routes (a ``bincount``, an extension op) nor runs in the exact
    mode, as its eager handler (:meth:`_ExactCalls._eager`) would decide, with nothing else
    for it to do. From inductor's generated code (``generated``), any call it does not
    route. From elsewhere, while the process has no sparse tensor: a private function
    (``Tensor._is_view``: about 65 calls a compiled step of a small transformer, from
    AOTAutograd's runtime wrappers), and, once the call went ``eager`` (its first public
    call did what the first does), a gather, view or element-wise call (about 150 a step of
    a Mixtral-style model with eager experts). Kinds kept per function."""
    try:
        routed, public, quiet = _CALL_KINDS[func]
    except KeyError:
        routed, public, quiet = _CALL_KINDS[func] = _call_kinds(func)
    except TypeError:  # an unhashable callable
        routed, public, quiet = _call_kinds(func)
    if routed:
        return False
    if generated:
        return True
    return (not public or (quiet and eager)) and not sparse_tensors_seen()


@torch._dynamo.disable(recursive=True)
def _call_kinds(func: Any) -> tuple[bool, bool, bool]:
    routed = func in _BINCOUNTS or extension_ops.qualified_name(func) is not None
    return routed, _public_function(func), func in _GATHERS_AND_ELEMENTWISE


# run as Python from the handler, never compiled by Dynamo (as the handler itself, above)
torch._dynamo.eval_frame.skip_code(_plain_call.__code__)
torch._dynamo.eval_frame.skip_code(sparse_tensors_seen.__code__)

#: the reports of the calls running now, by id (read by :func:`_left` while Dynamo traces)
_REPORTS: weakref.WeakValueDictionary[int, CompileReport] = weakref.WeakValueDictionary()


@torch._dynamo.assume_constant_result
def _extension(func: Any) -> tuple[str | None, str | None, str | None]:
    """(qualified name, translation, reason to pass it) of an extension op; all None for any
    other function. A constant while Dynamo traces."""
    name = extension_ops.qualified_name(func)
    if name is None:
        return None, None, None
    rule = extension_ops.rule_for(name)
    short = name.split("::")[-1]
    return name, short if rule.translate is not None else None, rule.reason


@torch._dynamo.assume_constant_result
def _left(report: int, name: str, reason: str) -> bool:
    """Record an extension fold left untranslated in the report (run once per trace)."""
    found = _REPORTS.get(report)
    if found is not None:
        record_left(found, name, f"{name}: {reason}")
    return True


def _guarded(
    compiled: Callable[..., Any], eager: Callable[..., Any], report: CompileReport
) -> Callable[..., Any]:
    """``compiled``, except that inside ``exact_mode()`` it runs ``eager`` under the mode."""

    @functools.wraps(eager)
    def call(*args: Any, **kwargs: Any) -> Any:
        if active_exact_mode() is not None:
            return eager(*args, **kwargs)
        _drop_stale_modes()
        since = _sequence_now()
        graphs = report.graphs + report.cached
        calls = _ExactCalls(report)
        try:
            with dynamo_patches_held(), calls, report.watch():
                out = compiled(*args, **kwargs)
        except Exception as exc:
            refusal = _fold_error_in(exc)
            if refusal is None:
                raise
            # bitfold's own error, alone: not inside inductor's wrappers, without the frames of
            # torch's machinery between the call and the check that refused it
            raise refusal.with_traceback(None) from None
        if torch.is_grad_enabled():
            _mark(out, since, report, report.graphs + report.cached != graphs, calls.eager)
        return out

    return call


def _check_options(kwargs: dict[str, Any]) -> None:
    """Refuse a keyword neither bitfold nor this torch's ``torch.compile`` takes, naming it."""
    own = inspect.signature(compile).parameters
    theirs = inspect.signature(torch.compile).parameters
    known = [p for p in (*own, *theirs) if p not in ("model", "kwargs")]
    refuse_unknown_options("bitfold.torch.compile()", kwargs, dict.fromkeys(known))


def compile(
    model: Callable[..., Any] | None = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | None = "inductor",
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    disable: bool = False,
    strict: bool = False,
    **kwargs: Any,
) -> Any:
    """``torch.compile(model, ...)`` whose folds, forward and backward, are exact.

    Same arguments as ``torch.compile`` (``kwargs`` passes on the ones of
    newer torch versions), plus ``strict``: raise :class:`bitfold.FoldError`
    when a fold cannot be made exact, instead of recording it in
    ``.bitfold.passed``. ``backend`` must be inductor (the pass is
    inductor's). Usable as a decorator, with or without arguments. See the
    module docstring for the numeric contract.

    >>> import torch, bitfold.torch as bt
    >>> idx = torch.tensor([0, 0, 0])
    >>> f = bt.compile(lambda x, v: x.index_add(0, idx, v), fullgraph=True)
    >>> f(torch.zeros(1), torch.tensor([1.0, 2.0**-24, 2.0**-24])).tolist()  # one rounding
    [1.0000001192092896]
    >>> f.bitfold.passed  # folds it could not make exact
    Counter()
    """
    _check_options(kwargs)
    if backend not in (None, "inductor"):
        raise FoldError(
            f"bitfold.torch.compile rewrites inductor's graphs: backend must be 'inductor'; "
            f"got {backend!r}"
        )
    if model is None:
        return functools.partial(
            compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
            options=options, disable=disable, strict=strict, **kwargs,
        )  # fmt: skip
    report = CompileReport(strict=bool(strict))
    compiled = torch.compile(
        model,
        fullgraph=fullgraph,
        dynamic=dynamic,
        backend="inductor",
        options=_options(mode, options, dynamic, report),
        disable=disable,
        **kwargs,
    )
    if isinstance(model, torch.nn.Module):
        compiled.forward = _guarded(compiled.forward, model.__call__, report)
        compiled.bitfold = report
        return compiled
    call = _guarded(compiled, model, report)
    call.bitfold = report  # type: ignore[attr-defined]
    return call


__all__ = ["compile"]
