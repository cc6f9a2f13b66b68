"""``exact_mode()``: every fold that reaches ATen, in the forward and the backward, made exact.

Inside ``with bitfold.torch.exact_mode() as mode:`` a ``TorchDispatchMode``
sees every ATen op that runs (the backward's too: autograd carries the mode
to its threads) and sends the ops that fold, on floating tensors of a
device some bitfold backend serves (:func:`bitfold.torch.devices.folds_on`),
to their exact handler (the table of :mod:`bitfold.torch.rules`,
which :func:`bitfold.torch.compile` reads too) instead of ATen. Every element they
produce is then the **correctly rounded sum of its old value (where the op
adds into one) and all its terms**, one rounding: the same bits for any order
of the contributions. Each term is computed as torch computes it (``alpha *
source[i]`` rounded to the dtype; a bag's gradient row divided by its size,
times its per-sample weight); a mean is that sum divided once by the count.
In-place (``index_add_``) and ``out=`` forms write their result where ATen
would. Every other op runs untouched.

Every op it makes exact is one row of :data:`bitfold.torch.rules.RULES` (a
rule's ``description`` says what is exact): that table is the one list, and
the documentation's coverage page (``docs/exact-mode-coverage.md``) is
generated from it. The ops of extension packages (``torch_scatter``,
``torch_sparse``, ``pyg_lib``) are seen above autograd by name and
translated into exact ATen folds (:mod:`.extension_ops`); called from
TorchScript or C++, they are seen at the dispatcher (a kernel of their own,
or, for composite ops whose C++ sums inside, a kernel bitfold registers at
the autograd keys while a mode is active).

Untouched: integer tensors and maxima/minima (exact in any order already),
writes (``index_put`` without accumulate, ``index_copy``, ``scatter``),
unweighted counts (``histc``), and reductions over fixed windows or dims that
no index drives (``sum``, dense products, convolutions, average pooling,
interpolation and padding backwards, ``col2im``): deterministic from run to run
on one machine, not folds through an index. Recorded in ``passed`` and refused
by ``strict=True``: "prod" reductions, grid sampling's input gradient (its
interpolated sums are torch's), complex dtypes, sparse gradients, sparse
@ sparse, BSR/BSC or hybrid sparse tensors, other devices, floating tensor
subclasses.

Integer index tensors of a subclass that wraps one plain tensor through
``__tensor_flatten__`` (torch_geometric's ``Index`` and ``EdgeIndex``) are
read as that tensor. An integer index out of range in ``index_put`` /
``put`` (``accumulate=True``) raises :class:`bitfold.IndexRangeError` naming
the id as given and the size, not torch's own error.

Two places where the exact result follows torch's documentation rather than
torch 2.13's CPU kernel: with ``scale_grad_by_freq`` the embedding-bag
gradient divides each term by the frequency of *its* id (torch's CUDA kernel
does; the CPU one divides some terms by another id's count,
pytorch/pytorch#190063), and with ``include_last_offset`` the ids after the
last offset belong to no bag: left out of the forward's sums and given no
gradient (torch 2.13's CPU kernel counts them in the last bag).

``mode.counts`` counts the ops made exact by kind (``"index_put"``,
``"embedding_dense_backward"``, an extension op's name, ...), so a test can
check that the mode saw a model's folds; ``mode.passed`` counts the folds left
to ATen that are not exact (kind and reason).

``torch.jit.trace`` inside the mode: its default ``check_trace`` reruns the
function and compares, which a dispatch mode can upset; trace outside the mode
(or pass ``check_trace=False``) and run the traced module inside it, where its
folds reach ATen and are made exact.

``torch.compile``: while a ``TorchDispatchMode`` is active, Dynamo compiles
nothing (PyTorch 2.13 skips every frame while a non-infra dispatch mode is
on the stack), so inside ``exact_mode()`` a compiled model runs op by op and
its folds are exact: slower, never inexact. Dynamo remembers the skip: a
function whose first call ran inside the mode stays uncompiled until
``torch._dynamo.reset()``. ``torch.compile(fullgraph=True)`` inside the mode
raises PyTorch's own error ("non-infra torch dispatch mode present"). A
graph compiled and run *outside* the mode keeps its own kernels (atomics
included), so a backward run inside the mode through such a graph raises
:class:`bitfold.FoldError`: run the forward and the backward inside the
mode. For compiled exact training, use the drop-ins
(:class:`bitfold.torch.Embedding`, :func:`bitfold.torch.index_add`, ...),
custom operators that ``torch.compile`` keeps whole.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import FoldError
from ..validate import checked_options
from . import extension_ops, sparse
from .folds import divide_by_counts
from .handlers import UNTOUCHED, Leave, bind, plain_index, written
from .rules import rule_for

# -- graphs compiled outside the mode ----------------------------------------------------------
#: the autograd node of a graph compiled by torch.compile (AOT autograd's CompiledFunction)
COMPILED_NODE = "CompiledFunctionBackward"
#: the key ``bitfold.torch.compile`` sets in the ``metadata`` of its graphs' autograd nodes:
#: their backward folds are exact, so the mode lets a backward through them
EXACT_GRAPH = "bitfold.exact_graph"
_BACKWARDS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


def _compiled_node_in(roots: Any) -> str | None:
    """The name of a graph's node, compiled by plain ``torch.compile``, reachable from ``roots``.

    None when there is none: graphs compiled by :func:`bitfold.torch.compile`
    (their nodes carry :data:`EXACT_GRAPH`) have exact backward folds.
    """
    if isinstance(roots, torch.Tensor):
        roots = (roots,)
    for node in autograd_nodes(roots):
        if node.name().startswith(COMPILED_NODE) and not node.metadata.get(EXACT_GRAPH):
            return str(node.name())
    return None


def autograd_nodes(tensors: Any, keep: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """Every autograd node reachable from ``tensors``, each once; a node for which ``keep``
    says False is skipped with everything behind it."""
    todo = [t.grad_fn for t in tensors if isinstance(t, torch.Tensor)]
    seen: set[int] = set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if keep is not None and not keep(node):
            continue
        yield node
        todo.extend(nxt for nxt, _ in node.next_functions)


# -- sparse products, seen above autograd ------------------------------------------------------
# The dispatch rules above make a sparse product's forward exact, and the dense operand's
# gradient (another sparse product); but ATen's backward into the sparse *values* of a COO
# matrix is a dense ``mm`` of two dense matrices, masked afterwards, which no rule can tell from
# any other ``mm``. So the public calls are caught above autograd and run as
# ``sparse.SparseAddmm``, whose backward is exact too.
@dataclass(frozen=True)
class _Product:
    """A call's operands: ``beta * C + alpha * (a @ b)``, ``reduce`` per row."""

    a: Any
    b: Any
    C: Any = None
    beta: Any = 1
    alpha: Any = 1
    reduce: Any = None


def _two(args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]) -> _Product | None:
    if kwargs.keys() - set(names) - {"reduce"} or len(args) > 3:
        return None  # out= and the like: the dispatch rules make the forward exact
    got = dict(zip(names, args, strict=False)) | kwargs
    if not all(n in got for n in names):
        return None
    a, b = (got[n] for n in names)
    return _Product(a, b, reduce=got.get("reduce", args[2] if len(args) > 2 else None))


def _mm_call(*args: Any, **kwargs: Any) -> _Product | None:
    return _two(args, kwargs, ("input", "mat2")) or _two(args, kwargs, ("self", "mat2"))


def _matmul_call(*args: Any, **kwargs: Any) -> _Product | None:
    return _two(args, kwargs, ("input", "other")) or _two(args, kwargs, ("self", "other"))


def _rmatmul_call(*args: Any, **kwargs: Any) -> _Product | None:
    got = _two(args, kwargs, ("self", "other"))
    return None if got is None else _Product(got.b, got.a)


def _sparse_mm_call(*args: Any, **kwargs: Any) -> _Product | None:
    return _two(args, kwargs, ("mat1", "mat2")) or _two(args, kwargs, ("sparse", "dense"))


def _addmm_call(*args: Any, **kwargs: Any) -> _Product | None:
    names = ("input", "mat1", "mat2", "beta", "alpha")
    if "self" in kwargs:
        kwargs = {"input": kwargs.pop("self"), **kwargs}
    if kwargs.keys() - set(names) or len(args) > 5:
        return None
    got = dict(zip(names, args, strict=False)) | kwargs
    if not all(n in got for n in names[:3]):
        return None
    return _Product(got["mat1"], got["mat2"], got["input"], got.get("beta", 1), got.get("alpha", 1))


_SPARSE_CALLS: dict[Any, Callable[..., _Product | None]] = {
    torch.mm: _mm_call,
    torch.Tensor.mm: _mm_call,
    torch.matmul: _matmul_call,
    torch.Tensor.matmul: _matmul_call,
    torch.Tensor.__matmul__: _matmul_call,
    torch.Tensor.__rmatmul__: _rmatmul_call,
    torch.sparse.mm: _sparse_mm_call,
    torch.addmm: _addmm_call,
    torch.Tensor.addmm: _addmm_call,
    torch.sparse.addmm: _addmm_call,
}


def _sparse_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The exact, differentiable result of a sparse product call; a :class:`Leave` otherwise."""
    try:
        binder = _SPARSE_CALLS.get(func)
    except TypeError:  # an unhashable callable
        return UNTOUCHED
    call = None if binder is None else binder(*args, **kwargs)
    if call is None:
        return UNTOUCHED
    a, b, vector = call.a, call.b, None
    if isinstance(b, torch.Tensor) and b.dim() == 1 and sparse.is_sparse(a) and call.C is None:
        b, vector = b.unsqueeze(1), 1  # matmul of a matrix and a vector
    elif isinstance(a, torch.Tensor) and a.dim() == 1 and sparse.is_sparse(b) and call.C is None:
        a, vector = a.unsqueeze(0), 0
    ops = sparse.operands(a, b, call.C)
    if ops is None:
        return UNTOUCHED
    if isinstance(ops, str):
        return Leave(ops)
    reduce = "sum" if call.reduce in (None, "sum") else call.reduce
    if reduce != "sum" and (reduce != "mean" or ops.right):
        return UNTOUCHED  # max, min: exact in any order
    beta, alpha = float(call.beta), float(call.alpha)
    out = sparse.differentiable_product(ops, call.C, beta, alpha)
    if reduce == "mean":
        out = divide_by_counts(out, sparse.row_counts(ops.A).clamp(min=1).view(-1, 1))
    return out if vector is None else out.squeeze(vector)


class _CompiledBackwardGuard(TorchFunctionMode):
    """Refuses a backward, inside the mode, through a graph that torch.compile compiled outside it.

    Dynamo compiles nothing while a dispatch mode is active, so everything
    compiled inside the mode runs op by op; but a forward compiled and run
    outside the mode leaves compiled backward kernels (atomics included) that
    no ATen op of the mode would see.

    It also runs the sparse products (``_SPARSE_CALLS``) as exact autograd
    functions, counted in ``mode``, and the ops of extension packages
    (:mod:`bitfold.torch.extension_ops`) through :meth:`ExactMode.extension`.
    """

    def __init__(self, mode: ExactMode) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _BACKWARDS and args:
            name = _compiled_node_in(args[0])
            if name is not None:
                raise FoldError(
                    f"exact_mode(): this backward runs through {name}, a graph torch.compile "
                    "compiled outside the mode, whose kernels the mode cannot see (its sums "
                    "would not be exact); run the forward inside exact_mode() too (torch.compile "
                    "then runs it op by op), or use bitfold.torch's drop-in functions and modules"
                )
        name = extension_ops.qualified_name(func)
        if name is not None:
            return self.mode.extension(name, func, args, kwargs)
        result = _sparse_call(func, args, kwargs)
        if isinstance(result, Leave):
            if result.reason is not None:
                self.mode.leave(str(func), "sparse_mm", result.reason)
            return func(*args, **kwargs)
        self.mode.counts["sparse_mm"] += 1
        return result


# -- extension ops called from TorchScript or C++ -------------------------------------------------
# An extension op registered as CompositeImplicitAutograd (torch_scatter's and torch_sparse's are)
# runs its own kernel at the autograd key, above the dispatch mode, and sums inside: called from
# Python the function-level guard sees it, but a ``torch.jit.script`` function calls the
# dispatcher directly. While a mode is active, such ops get a kernel of bitfold's at the autograd
# keys, registered directly there, which outranks the composite kernel: inside a mode it routes
# the call through :meth:`ExactMode.extension`; elsewhere (another thread, an op left to its
# package) it runs the op's own composite kernel. The kernels go when the last mode exits.
_AUTOGRAD_KEYS = ("AutogradCPU", "AutogradCUDA", "AutogradXPU", "AutogradMPS")
_registered: dict[str, Any] = {"count": 0, "libraries": []}
_registry_lock = threading.Lock()


def _composite_extension_ops() -> list[str]:
    """``"ns::name.overload"`` of every extension op whose kernel is CompositeImplicitAutograd."""
    found = []
    for full in torch._C._dispatch_get_all_op_names():
        if full.split("::")[0] in extension_ops.NAMESPACES and (
            torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd")
        ):
            found.append(full)
    return found


def _extension_kernel(op: Any, name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        mode = active_exact_mode()
        if mode is None or mode._extension_running():
            return op.decompose(*args, **kwargs)
        return mode.extension(name, op, args, kwargs)

    return kernel


def _register_extension_kernels() -> None:
    with _registry_lock:
        _registered["count"] += 1
        if _registered["count"] > 1:
            return
        for full in _composite_extension_ops():
            qualified, _, overload = full.partition(".")
            namespace, op_name = qualified.split("::")
            op = getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")
            library = torch.library.Library(namespace, "IMPL")
            for key in _AUTOGRAD_KEYS:
                library.impl(full.split("::")[1], _extension_kernel(op, qualified), key)
            _registered["libraries"].append(library)


def _unregister_extension_kernels() -> None:
    with _registry_lock:
        _registered["count"] -= 1
        if _registered["count"] > 0:
            return
        for library in _registered["libraries"]:
            library._destroy()
        _registered["libraries"] = []


class ExactMode(TorchDispatchMode):
    """The dispatch mode behind :func:`exact_mode` (see the module docstring).

    ``counts``: a ``Counter`` of the ops made exact, by kind. ``passed``: a
    ``Counter`` of the folds left to ATen that are not exact, keyed
    ``"kind: reason"``. ``strict=True`` raises :class:`bitfold.FoldError`
    for those instead.
    """

    def __init__(self, *, strict: bool = False, products: str = "rounded") -> None:
        super().__init__()
        if products not in sparse.PRODUCT_RULES:
            raise FoldError(
                f"exact_mode(products=...) takes one of {', '.join(sparse.PRODUCT_RULES)}; "
                f"got {products!r}"
            )
        self.strict = bool(strict)
        self.products = products
        self._products_tokens: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.passed: Counter[str] = Counter()
        self._guards: list[_CompiledBackwardGuard] = []
        self._extension = threading.local()  # .running: an extension op left to its package runs

    def __enter__(self) -> ExactMode:
        guard = _CompiledBackwardGuard(self)
        guard.__enter__()
        self._guards.append(guard)
        try:
            super().__enter__()
        except BaseException:
            self._guards.pop().__exit__(None, None, None)
            raise
        _register_extension_kernels()
        self._products_tokens.append(sparse.PRODUCTS.set(self.products))
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            sparse.PRODUCTS.reset(self._products_tokens.pop())
            _unregister_extension_kernels()
            self._guards.pop().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rule = rule_for(func)
        if rule is None:
            name = extension_ops.qualified_name(func)
            if name is not None and not self._extension_running():
                return self.extension(name, func, args, kwargs)
            return func(*args, **kwargs)
        kind = rule.kind
        bound = {k: plain_index(v) for k, v in bind(func, args, kwargs).items()}
        result = rule.handler(bound)
        if isinstance(result, Leave):
            if result.reason is not None:
                self.leave(str(func), kind, result.reason)
            return func(*args, **kwargs)
        self.counts[kind] += 1
        names = written(func)
        if not names:
            return result
        results = result if isinstance(result, tuple) else (result,)
        targets = tuple(bound[name] for name in names)
        for target, value in zip(targets, results, strict=True):
            if target.shape != value.shape:
                target.resize_(value.shape)
            target.copy_(value)
        return targets if isinstance(result, tuple) else targets[0]

    def _extension_running(self) -> bool:
        return bool(getattr(self._extension, "running", False))

    def extension(
        self, name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """An extension package's op (``name``): its exact translation, or the op itself.

        Above autograd (the function-level guard) the translation's ATen ops run
        under this mode and are made exact there; below it (an op that reached
        the dispatcher without passing the guard: from TorchScript, from C++) the
        translation runs under a nested mode that shares ``counts`` and
        ``passed``. An op left to its package runs with extension lookups off,
        so that the ops it calls are not counted twice.
        """
        if self._extension_running():
            return func(*args, **kwargs)
        nested = None
        if active_exact_mode() is not self:  # below autograd: this mode is off while we run
            nested = ExactMode(strict=self.strict, products=self.products)
            nested.counts, nested.passed = self.counts, self.passed
        with nested if nested is not None else contextlib.nullcontext():
            result = extension_ops.run(name, func, args, kwargs)
        if isinstance(result, Leave):
            if result.reason is not None:
                self.leave(name, name, result.reason)
            self._extension.running = True
            try:
                return func(*args, **kwargs)
            finally:
                self._extension.running = False
        self.counts[name] += 1
        return result

    def leave(self, func: str, kind: str, reason: str) -> None:
        """Record a fold left to torch (``passed``), or refuse it with ``strict=True``."""
        if self.strict:
            raise FoldError(f"exact_mode(strict=True): {func} cannot be made exact ({reason})")
        self.passed[f"{kind}: {reason}"] += 1

    def __repr__(self) -> str:
        return f"ExactMode(counts={dict(self.counts)}, passed={dict(self.passed)})"


@checked_options
def exact_mode(*, strict: bool = False, products: str = "rounded") -> ExactMode:
    """A context manager inside which every fold that reaches ATen is exact, forward and backward.

    ``with exact_mode() as mode:`` around a training step makes every
    ``scatter_add``, ``index_add``, ``index_put(accumulate=True)``,
    embedding and embedding-bag backward, ``scatter_reduce`` sum/mean (the
    module docstring's table) the correctly rounded sum, the same bits for any
    order of the contributions, and so are ``segment_reduce`` sum/mean and
    products with a sparse (COO, CSR, CSC) factor, forward and backward;
    every other op runs untouched.
    ``mode.counts`` says how many ops of each kind it made exact;
    ``mode.passed`` lists the folds it could not (complex, sparse, "prod");
    ``strict=True`` raises :class:`bitfold.FoldError` for those.

    ``products``: how a sum of products (a sparse matrix product) takes its
    terms. ``"rounded"`` (the default, the rule of every path): each product
    rounded to the dtype as torch computes it, the sum of those rounded once,
    so an ``edge_index`` fold, a ``torch_sparse`` product and a
    ``torch.sparse`` product of the same messages give the same bits.
    ``"exact"``: the exact dot product, each product exact, one rounding
    (more accurate, other bits).

    >>> import torch, bitfold.torch as bt
    >>> w = torch.zeros(3, requires_grad=True)
    >>> with bt.exact_mode() as mode:
    ...     w[torch.tensor([0, 2, 2])].sum().backward()
    >>> w.grad.tolist(), mode.counts["index_put"]
    ([1.0, 0.0, 2.0], 1)
    """
    return ExactMode(strict=strict, products=products)


def active_exact_mode() -> ExactMode | None:
    """The innermost :class:`ExactMode` on this thread's dispatch-mode stack, or None."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, ExactMode):
            return mode
    return None


__all__ = ["COMPILED_NODE", "EXACT_GRAPH", "ExactMode", "active_exact_mode", "exact_mode"]
