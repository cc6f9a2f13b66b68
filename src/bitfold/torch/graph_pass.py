"""Inductor's custom post-grad pass that rewrites a graph's fold nodes into exact ops.

By the time inductor runs its post-grad passes, AOT autograd has split a
compiled function into a forward and a backward graph, both functional, and
decomposed its folds into a few ATen nodes (``index_put`` /
``_unsafe_index_put`` with ``accumulate=True``, ``scatter_add``,
``scatter_reduce.two``, ``_unsafe_masked_index_put_accumulate`` for the
embedding backward, ``_embedding_bag_backward``, and, for bfloat16,
``index_add``). :class:`ExactFoldPass` finds every node whose overload is in
the fold rules' ``compiled`` column (:data:`bitfold.torch.rules.COMPILED`),
asks the rule's verdict on the node's fake tensors, and

* replaces it with the rule's custom op (:mod:`bitfold.torch.aten_ops`),
  whose result is the exact fold: every element the correctly rounded sum of
  its old value and all its terms, the same bits as the eager exact fold and
  for any order of the terms;
* or leaves it to inductor: silently when nothing is lost (integer sums,
  maxima, a write), recorded in the :class:`CompileReport` (``passed``) when
  the fold stays inexact (complex, ``"prod"``), or refused with
  :class:`bitfold.FoldError` under ``strict=True``.

Inductor computes a float16 or bfloat16 embedding backward in float32 and
rounds the table to the narrow dtype afterwards: two roundings. When a
rewritten fold starts from zeros and its only user is that rounding, the
pass folds the float32 terms straight into the narrow dtype (one rounding),
which gives the eager exact fold's bits.

The pass runs after the user's own post-grad pass, if one was configured
(``inner``), and its :meth:`~ExactFoldPass.uuid` covers both, so the FX
graph cache keeps graphs rewritten by bitfold apart from plain ones.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from .._version import __version__
from ..errors import FoldError
from . import aten_ops, handlers, rules
from .aten_ops import EXACT_OPS, call_args
from .handlers import Leave, bind
from .rules import COMPILED, rule_for

aten = torch.ops.aten
_NARROW = (torch.float16, torch.bfloat16)
#: the overloads that add their terms into ``self`` (a sum, no division): they may round narrow
_SUMS_INTO_SELF = frozenset(
    op for op in COMPILED if op.__name__.split(".")[0] in (
        "index_put", "_unsafe_index_put", "_unsafe_masked_index_put_accumulate", "scatter_add",
        "index_add",
    )
)  # fmt: skip


#: the prefix of the keys bitfold adds to inductor's counters (``torch._dynamo.utils.counters``)
COUNTER_PREFIX = "bitfold:"


def _inductor_counters() -> Counter[str]:
    from torch._dynamo.utils import counters

    return counters["inductor"]


@dataclass
class CompileReport:
    """What the pass did to the graphs it rewrote (forward and backward graphs alike).

    ``counts``: fold nodes made exact, by kind (as ``exact_mode().counts``);
    ``passed``: fold nodes left to inductor that are not exact, keyed
    ``"kind: reason"`` (as ``exact_mode().passed``); ``graphs``: graphs the
    pass ran on in this process; ``cached``: graphs inductor loaded from its
    caches instead (FX graph or AOT autograd cache), rewritten when they were
    first compiled, whose rewrites are counted in ``counts`` and ``passed`` too.

    Each rewrite also adds one to a ``"bitfold:..."`` key of inductor's
    counters, which inductor stores with the compiled graph and adds again when
    it loads the graph from a cache: :meth:`watch` reads those back.
    """

    strict: bool = False
    counts: Counter[str] = field(default_factory=Counter)
    passed: Counter[str] = field(default_factory=Counter)
    graphs: int = 0
    cached: int = 0
    _direct: Counter[str] = field(default_factory=Counter, repr=False)

    def record(self, key: str, n: int = 1) -> None:
        """``n`` rewrites (``"exact:<kind>"``, ``"passed:<kind>: <reason>"`` or ``"graph"``)."""
        self._apply(key, n)
        self._direct[key] += n
        _inductor_counters()[COUNTER_PREFIX + key] += n

    def _apply(self, key: str, n: int) -> None:
        what, _, rest = key.partition(":")
        if what == "exact":
            self.counts[rest] += n
        elif what == "passed":
            self.passed[rest] += n

    def begin(self) -> tuple[Counter[str], Counter[str]]:
        """Start watching for graphs loaded from inductor's caches (see :meth:`end`)."""
        return self._snapshot(), Counter(self._direct)

    def end(self, mark: tuple[Counter[str], Counter[str]]) -> None:
        """Count the rewrites of the graphs inductor loaded from its caches since ``mark``."""
        before, direct = mark
        replayed = self._snapshot() - before - (self._direct - direct)
        for key, n in replayed.items():
            if key == "graph":
                self.cached += n
            else:
                self._apply(key, n)

    @contextmanager
    def watch(self) -> Iterator[None]:
        """:meth:`begin` ... :meth:`end` around a block."""
        mark = self.begin()
        try:
            yield
        finally:
            self.end(mark)

    @staticmethod
    def _snapshot() -> Counter[str]:
        found = _inductor_counters()
        return Counter({k[len(COUNTER_PREFIX) :]: v for k, v in found.items()
                        if k.startswith(COUNTER_PREFIX)})  # fmt: skip


#: bitfold's exact op -> the kind of fold it stands for
_EXACT_KINDS = {op: COMPILED[overload].kind for overload, op in EXACT_OPS.items()}


def _val(x: Any) -> Any:
    """A graph argument as the pass sees it: a node's fake tensor, lists element by element."""
    if isinstance(x, torch.fx.Node):
        return x.meta.get("val")
    if isinstance(x, list | tuple):
        return type(x)(_val(y) for y in x)
    return x


def _narrowing(node: torch.fx.Node, self_arg: Any) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(the rounding to float16/bfloat16, the zeros node) when the fold can round straight to it."""
    users = list(node.users)
    val = node.meta.get("val")
    if len(users) != 1 or not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
        return None
    (user,) = users
    if user.target is not torch.ops.prims.convert_element_type.default or user.args[1] not in (
        _NARROW
    ):
        return None
    zeros = self_arg
    if (
        not isinstance(zeros, torch.fx.Node)
        or zeros.target is not aten.full.default
        or zeros.args[1] != 0
        or len(zeros.users) != 1
    ):
        return None
    return user, zeros


def _fake_call(op: Any, args: tuple[Any, ...]) -> Any:
    """The fake tensor ``op`` gives for ``args`` (graph nodes read as their fake tensors)."""
    vals = _val(args)
    mode = torch._guards.detect_fake_mode(vals)
    if mode is None:
        return None
    with mode:
        return op(*vals)


def rewrite(graph: torch.fx.Graph, report: CompileReport) -> None:
    """Replace every fold node of ``graph`` that can be made exact (module docstring)."""
    report.graphs += 1
    report.record("graph")
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in _EXACT_KINDS:  # put in the graph by bitfold.torch.compile's call mode
            report.record(f"exact:{_EXACT_KINDS[node.target]}")
            continue
        rule = COMPILED.get(node.target)
        if rule is None:
            known = rule_for(node.target)
            if known is not None and known.verdict is not None:
                reason = _unrewritten(known, node)
                if reason is not None:
                    _leave(report, known.kind, str(node.target), reason)
            continue
        assert rule.verdict is not None
        verdict = rule.verdict({k: _val(v) for k, v in bind(node.target, node.args,
                                                           node.kwargs).items()})  # fmt: skip
        if isinstance(verdict, Leave):
            if verdict.reason is not None:
                _leave(report, rule.kind, str(node.target), verdict.reason)
            continue
        _replace(graph, node, EXACT_OPS[node.target], call_args(node.target, node.args,
                                                                 node.kwargs))  # fmt: skip
        report.record(f"exact:{rule.kind}")


def _unrewritten(rule: rules.Rule, node: torch.fx.Node) -> str | None:
    """Why a fold overload the pass does not rewrite stays inexact; None when it is no fold.

    The rule's verdict on the node's fake tensors decides: a plain write
    (``aten.scatter.src``, which ``topk``'s backward makes) is untouched, not passed.
    """
    assert rule.verdict is not None
    try:
        bound = bind(node.target, node.args, node.kwargs)
    except (TypeError, RuntimeError):
        return "an overload bitfold does not rewrite"
    verdict = rule.verdict({k: _val(v) for k, v in bound.items()})
    if isinstance(verdict, Leave):
        return verdict.reason
    return "an overload bitfold does not rewrite"


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, op: Any, args: tuple[Any, ...]) -> None:
    narrowing = _narrowing(node, args[0]) if node.target in _SUMS_INTO_SELF else None
    old = node
    if narrowing is not None:
        old, zeros = narrowing
        with graph.inserting_before(zeros):
            narrow = graph.call_function(
                zeros.target, zeros.args, {**zeros.kwargs, "dtype": old.args[1]}
            )
        narrow.meta.update(zeros.meta)
        narrow.meta["val"] = _fake_call(
            lambda *a: zeros.target(*a, **{**_val(zeros.kwargs), "dtype": old.args[1]}),
            zeros.args,
        )
        args = (narrow, *args[1:])
    with graph.inserting_before(node):
        new = graph.call_function(op, args)
    new.meta.update(node.meta)
    new.meta["val"] = _fake_call(op, args)
    old.replace_all_uses_with(new)
    graph.erase_node(old)
    if old is not node:
        graph.erase_node(node)
        graph.erase_node(narrowing[1])  # type: ignore[index]


def _leave(report: CompileReport, kind: str, func: str, reason: str) -> None:
    record_left(report, func, f"{kind}: {reason}")


def record_left(report: CompileReport, func: str, key: str) -> None:
    """A fold left inexact: ``passed[key]`` (``"kind: reason"``), or refused with ``strict``."""
    if report.strict:
        reason = key.split(": ", 1)[-1]
        raise FoldError(
            f"bitfold.torch.compile(strict=True): {func} cannot be made exact ({reason})"
        )
    report.record(f"passed:{key}")


#: the files whose code decides a rewrite: their hash keys the FX graph cache
_FILES = (rules.__file__, handlers.__file__, aten_ops.__file__, __file__)


class ExactFoldPass(CustomGraphPass):
    """The pass given to inductor as ``post_grad_custom_post_pass`` (module docstring).

    ``inner``: the post-grad pass the user had configured, run first (a
    ``CustomGraphPass`` or any callable taking the graph).
    """

    def __init__(self, report: CompileReport, inner: Any = None) -> None:
        self.report = report
        self.inner = inner

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.inner is not None:
            self.inner(graph)
        rewrite(graph, self.report)

    def uuid(self) -> Any:
        """A key for the FX graph cache: bitfold's version, the pass's code, strict, the inner pass.

        None (inductor then bypasses its cache) when the inner pass has no uuid.
        """
        inner = ""
        if self.inner is not None:
            uuid = getattr(self.inner, "uuid", None)
            inner = uuid() if callable(uuid) else None
            if inner is None:
                return None
        key = hashlib.sha256(get_hash_for_files(tuple(sorted(_FILES))))
        key.update(f"{__version__}|strict={self.report.strict}|{inner!r}".encode())
        return f"bitfold-exact-folds-{key.hexdigest()}"


__all__ = ["CompileReport", "ExactFoldPass", "record_left", "rewrite"]
