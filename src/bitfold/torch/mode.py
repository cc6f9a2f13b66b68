"""``exact_mode()``: every fold that reaches ATen, in the forward and the backward, made exact.

Inside ``with bitfold.torch.exact_mode() as mode:`` the ops that fold (the
table of :mod:`bitfold.torch.rules`, which :func:`bitfold.torch.compile` reads
too) have Python kernels of bitfold's, and nothing else does: the fold ops, on
floating tensors of a device some bitfold backend serves
(:func:`bitfold.torch.devices.folds_on`), go to their exact handler instead of
ATen's kernel, and every other op runs as in plain PyTorch, without entering
Python. The kernels sit at the ``BackendSelect`` dispatch key, which every
thread dispatches through: below autograd (they see the ops of the forward and
of the backward), below autocast and below the ``Python`` key of dispatch
modes and tensor subclasses, and not skipped by ``torch.no_grad()`` or
``torch.inference_mode()``. A kernel serves the innermost mode of its thread
(autograd's threads see the mode of the thread that runs the backward); a fold
op of a thread with no mode runs ATen's kernel. Every element the made-exact ops
produce is then the **correctly rounded sum of its old value (where the op
adds into one) and all its terms**, one rounding: the same bits for any order
of the contributions. Each term is computed as torch computes it (``alpha *
source[i]`` rounded to the dtype; a bag's gradient row divided by its size,
times its per-sample weight); a mean is that sum divided once by the count.
In-place (``index_add_``) and ``out=`` forms write their result where ATen
would. Every other op runs untouched.

Products with a sparse factor need more: ATen's gradient of a COO matrix's
values is a dense product, masked afterwards, which no kernel can tell from
another dense product. So at the first sparse tensor a mode sees (made by
``torch.sparse_coo_tensor``, or reaching one of its kernels) it turns *full*
until it exits: a ``TorchDispatchMode`` (every op through Python, the mode's
former and slower way) with a function-level layer that runs the sparse
products above autograd as exact autograd functions. A product whose sparse
factor requires a gradient and which the mode met before it turned full (its
factor made outside the mode) keeps torch's gradient for that factor, recorded
in ``passed``. ``exact_mode(full=True)`` is full from the start;
``full=False`` never turns full (for code without sparse tensors: a product
with a sparse factor that reaches no kernel of the mode, such as a CSR
matrix times a vector, is then torch's). Once the process has made a sparse
tensor, every mode starts full, and dense ``mm``, ``addmm``, ``mv`` and
``addmv`` get kernels;
until then dense products never enter Python. To notice sparse tensors,
importing ``bitfold.torch`` installs kernels for torch's sparse constructors
and dense-to-sparse conversions (otherwise torch's own) and looks once among
the live tensors for a sparse one made before the import; a sparse tensor held
only by C++ (an extension's) and made before that import is not seen: use
``full=True`` there.

Every op it makes exact is one row of :data:`bitfold.torch.rules.RULES` (a
rule's ``description`` says what is exact): that table is the one list, and
the documentation's coverage page (``docs/exact-mode-coverage.md``) is
generated from it. The ops of extension packages (``torch_scatter``,
``torch_sparse``, ``pyg_lib``) are translated into exact ATen folds
(:mod:`.extension_ops`), seen at the dispatcher however they are called (from
Python, TorchScript or C++): by a kernel of bitfold's at ``BackendSelect`` for
an op with kernels of its own, at the autograd keys for a composite op whose
C++ sums inside (torch_scatter's, torch_sparse's); a full mode also sees them
above autograd by name. The kernels are installed when the first mode is
entered and stay (installing them takes about a millisecond); outside a mode,
a fold op then makes one Python call and runs ATen's kernel.

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

``torch.compile``: while a mode is active on a thread, Dynamo compiles nothing
there (the mode extends the check with which PyTorch 2.13 skips every frame
while a non-infra dispatch mode is on the stack), so inside ``exact_mode()`` a
compiled model runs op by op and its folds are exact: slower, never inexact.
Dynamo remembers the skip: a function whose first call ran inside the mode stays uncompiled until
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
import warnings
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
from .handlers import LANES, UNTOUCHED, Leave, bind, plain_index, written
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
    compiled_types = _COMPILED_TYPES
    for node in autograd_nodes(roots):
        kind = type(node)  # a compiled graph's nodes are autograd.Function nodes, typed per class
        compiled = compiled_types.get(kind)
        if compiled is None:
            compiled = compiled_types[kind] = node.name().startswith(COMPILED_NODE)
        if compiled and not node.metadata.get(EXACT_GRAPH):
            return str(node.name())
    return None


#: autograd node type -> whether its nodes are a compiled graph's (asked once a type: the name
#: of every node of every backward cost about 60 of the 100 us a GPT-2 step's walk took)
_COMPILED_TYPES: dict[type, bool] = {}


def autograd_nodes(tensors: Any, keep: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """Every autograd node reachable from ``tensors``, each once; a node for which ``keep``
    says False is skipped with everything behind it."""
    todo = [t.grad_fn for t in tensors if isinstance(t, torch.Tensor)]
    seen: set[Any] = set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if keep is not None and not keep(node):
            continue
        yield node
        todo += [nxt for nxt, _ in node.next_functions]


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
                raise FoldError(_COMPILED_REFUSAL.format(name=name))
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


# -- the fold kernels: Python only for the fold ops ----------------------------------------------
# While any mode has been entered, every overload of every rule's ops (and the extension ops whose
# kernels are not composite) has a Python kernel at the BackendSelect key. BackendSelect is in
# every thread's dispatch keys (inference mode included), below autograd, autocast and the Python
# key of dispatch modes and tensor subclasses, and falls through for every other op: the ops that
# are not folds never enter Python. A kernel looks up the innermost mode of its thread (a
# thread-local stack that torch carries to autograd's threads with the rest of its thread-local
# state); with none, or while a handler of its thread runs, it runs ATen's kernel below
# BackendSelect. The kernels stay installed once made (installing them takes about a millisecond;
# outside a mode each fold op then makes one Python call). Extension ops registered as
# CompositeImplicitAutograd (torch_scatter's, torch_sparse's: they sum inside, above the key) get
# a kernel at the autograd keys instead, which routes the call through ExactMode.extension.
_FAST_KEY = "BackendSelect"
_BELOW = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
_AUTOGRAD_KEYS = ("AutogradCPU", "AutogradCUDA", "AutogradXPU", "AutogradMPS")
_TLS_KEY = "bitfold.exact_modes"
#: the constructors of sparse tensors (overloads with a BackendSelect kernel of torch's): seeing
#: one, a mode turns full, and the products get their kernels
_SPARSE_FACTORIES = (
    ("_sparse_coo_tensor_with_dims_and_tensors", "default"),
    ("sparse_compressed_tensor", "comp_plain_value_size"),
    ("sparse_compressed_tensor", "comp_plain_value"),
)
#: the conversions of dense tensors to sparse layouts, which build their results in ATen
_SPARSE_CONVERSIONS = ("_to_sparse", "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr",
                       "_to_sparse_bsc")  # fmt: skip
#: dense products are not folds: mm and addmm get their kernels only once this process has made
#: a sparse tensor (seen by the constructors' kernels, installed on import, or by a fold kernel)
_PRODUCTS = ("mm", "addmm", "mv", "addmv")
_kernels: dict[str, Any] = {
    "libraries": [],
    "products": [],
    "sparse_seen": False,
    "extension": set(),
    "calls": 0,
}
_registry_lock = threading.Lock()
_local = threading.local()  # .inside: a handler (or ATen's kernel for a left fold) runs here


def active_modes() -> tuple[ExactMode, ...]:
    """The exact modes active on this thread (autograd's threads included), innermost last."""
    if torch._C._is_key_in_tls(_TLS_KEY):
        return tuple(torch._C._get_obj_in_tls(_TLS_KEY))
    return ()


def _set_modes(modes: tuple[ExactMode, ...]) -> None:
    torch._C._stash_obj_in_tls(_TLS_KEY, modes)


def _handling() -> ExactMode | None:
    """The mode that handles a fold op on this thread now, or None (ATen's kernel runs)."""
    if getattr(_local, "inside", False) or not torch._C._is_key_in_tls(_TLS_KEY):
        return None
    modes = torch._C._get_obj_in_tls(_TLS_KEY)
    return modes[-1] if modes else None


@contextlib.contextmanager
def _inside(inside: bool) -> Iterator[None]:
    """With ``inside``, ops run here go to ATen's kernels (a handler's own ops, a fold left to
    torch); without, they reach the modes' kernels (an extension op's translation)."""
    before = getattr(_local, "inside", False)
    _local.inside = inside
    try:
        yield
    finally:
        _local.inside = before


def _full_name(op: Any) -> str:
    overload = op._schema.overload_name
    return op._schema.name + (f".{overload}" if overload else "")


def _skip_with_callees() -> tuple[Callable[..., None], Any] | None:
    """Dynamo's mark for a code object that it skips with every frame called from it, as
    ``(set_code_exec_strategy, strategy)``, or None on a torch without it."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        return set_code_exec_strategy, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    except (ImportError, AttributeError, TypeError):  # a torch without it, or another form
        return None


_SKIP_WITH_CALLEES = _skip_with_callees()


def _skipped_by_dynamo(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` with its code marked for Dynamo to skip, with the frames it calls (the closures
    of one kernel maker share the code); on a torch without the mark, wrapped by
    ``torch._dynamo.disable(recursive=True)``, which runs on every call (about 1.5 us more a
    call on a 2-core VM)."""
    if _SKIP_WITH_CALLEES is None:
        return torch._dynamo.disable(kernel, recursive=True)
    mark, strategy = _SKIP_WITH_CALLEES
    mark(kernel.__code__, strategy)
    return kernel


def _register(library: Any, name: str, kernel: Callable[..., Any], key: str = _FAST_KEY, *,
              with_keyset: bool = True) -> None:  # fmt: skip
    """Register ``kernel`` for op ``name`` at ``key``, never traced by dynamo, nor anything it
    calls.

    The dispatcher calls these Python kernels from eager ops, and an eager op of a compiled
    function (after a graph break) runs with dynamo watching every new Python frame: each
    kernel would be compiled as a frame of its own, and compiled again at every call (its
    counter is guarded) until dynamo's recompile limit. The kernel's code is marked for Dynamo
    to skip, with every frame it calls (:func:`_skipped_by_dynamo`): no wrapper runs on the
    call.
    """
    library.impl(name, _skipped_by_dynamo(kernel), key, with_keyset=with_keyset)


def _register_on_import(library: Any, name: str, kernel: Callable[..., Any]) -> None:
    """:func:`_register` for the kernels installed when ``bitfold.torch`` is imported (the mark
    on the code imports nothing; where a torch has no such mark, torch's own lazy form of
    ``torch._dynamo.disable``, so that importing bitfold does not import Dynamo: about a
    second of start-up in every process)."""
    lazy = getattr(torch, "_disable_dynamo", None)
    if _SKIP_WITH_CALLEES is None and lazy is not None:
        kernel = lazy(kernel, recursive=True)
    else:
        kernel = _skipped_by_dynamo(kernel)
    library.impl(name, kernel, _FAST_KEY, with_keyset=True)


def _fold_kernel(op: Any) -> Callable[..., Any]:
    """The kernel of fold op ``op``: the innermost mode's fold, or ATen's kernel when no mode
    handles it here. An op that sums only with ``accumulate=True`` (``index_put``, ``put``)
    runs ATen's kernel at once without it (a write, as a model's masked assignments), as its
    rule would say after binding every argument."""
    flag = _accumulate_position(op)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        _kernels["calls"] += 1
        mode = _handling()
        if mode is None or (
            flag is not None
            and not (args[flag] if len(args) > flag else kwargs.get("accumulate", False))
        ):
            return op.redispatch(keyset & _BELOW, *args, **kwargs)
        return mode._fold(op, args, kwargs, lambda: op.redispatch(keyset & _BELOW, *args, **kwargs))

    return kernel


def _accumulate_position(op: Any) -> int | None:
    """The position of ``op``'s ``accumulate`` argument (``index_put``, ``put``), or None."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "accumulate" and not arg.kwarg_only:
            return i
    return None


def _never_folds(op: Any) -> bool:
    """An overload of a fold's packet that only writes (``scatter.src``, ``scatter_.value``: no
    ``reduce`` argument): no kernel is installed for it, so it never enters Python."""
    packet = op._schema.name.split("::")[1]
    return packet in ("scatter", "scatter_") and all(
        arg.name != "reduce" for arg in op._schema.arguments
    )


def _product_kernel(op: Any) -> Callable[..., Any]:
    """mm and addmm are folds only with a sparse factor: dense products return at once."""
    fold = _fold_kernel(op)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(sparse.is_sparse(a) for a in args[:3]):
            return op.redispatch(keyset & _BELOW, *args, **kwargs)
        return fold(keyset, *args, **kwargs)

    return kernel


def _sparse_factory_kernel(op: Any) -> Callable[..., Any]:
    """Torch's BackendSelect kernel of a sparse constructor (the backend of its layout and
    device, with its tensors'), after noting that a sparse tensor appeared."""

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        _sparse_seen()
        mode = _handling()
        if mode is not None:
            mode._saw_sparse()
        device = torch.device(kwargs.get("device") or "cpu")
        prefix = "Sparse" if kwargs.get("layout") in (None, torch.sparse_coo) else "SparseCsr"
        key = getattr(torch._C.DispatchKey, prefix + torch._C._dispatch_key_for_device(device.type))
        return op.redispatch(torch._C.DispatchKeySet(key) | (keyset & _BELOW), *args, **kwargs)

    return kernel


def _sparse_conversion_kernel(op: Any) -> Callable[..., Any]:
    """A dense-to-sparse conversion (``to_sparse_csr()`` ...), after noting that a sparse tensor
    appeared: ATen builds its result without passing a constructor's kernel."""

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        _sparse_seen()
        mode = _handling()
        if mode is not None:
            mode._saw_sparse()
        return op.redispatch(keyset & _BELOW, *args, **kwargs)

    return kernel


def _sparse_tensors_alive() -> bool:
    """Whether a sparse tensor made before ``bitfold.torch`` was imported is still alive
    (held by Python: the garbage collector's objects; read once, on import)."""
    import gc

    tensor = torch.Tensor
    return any(issubclass(type(o), tensor) and o.layout != torch.strided
               for o in gc.get_objects())  # fmt: skip


def _extension_fold_kernel(op: Any, name: str) -> Callable[..., Any]:
    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        _kernels["calls"] += 1
        mode = _handling()
        if mode is None or mode._extension_running():
            return op.redispatch(keyset & _BELOW, *args, **kwargs)
        return mode.extension(name, op, args, kwargs)

    return kernel


def _composite_extension_kernel(op: Any, name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        mode = _handling()
        if mode is None or mode._extension_running():
            return op.decompose(*args, **kwargs)
        return mode.extension(name, op, args, kwargs)

    return kernel


def _rule_overloads() -> Iterator[Any]:
    from .rules import RULES

    for rule in RULES:
        for packet in rule.ops:
            for name in packet.overloads():
                yield getattr(packet, name)


def _install_factory_kernels() -> None:
    """The sparse constructors' kernels (on import: a sparse tensor made any time is seen)."""
    library = torch.library.Library("aten", "IMPL")
    for packet, overload in _SPARSE_FACTORIES:
        op = getattr(getattr(torch.ops.aten, packet), overload)
        name = packet if overload == "default" else f"{packet}.{overload}"
        with warnings.catch_warnings():  # in place of torch's kernel, which it repeats
            warnings.simplefilter("ignore", UserWarning)
            _register_on_import(library, name, _sparse_factory_kernel(op))
    for packet in _SPARSE_CONVERSIONS:
        for overload in getattr(torch.ops.aten, packet).overloads():
            op = getattr(getattr(torch.ops.aten, packet), overload)
            name = packet if overload == "default" else f"{packet}.{overload}"
            _register_on_import(library, name, _sparse_conversion_kernel(op))
    _kernels["factories"] = library
    if _sparse_tensors_alive():
        _sparse_seen()


def sparse_tensors_seen() -> bool:
    """Whether this process has made or met a sparse tensor (then every mode starts full)."""
    return bool(_kernels["sparse_seen"])


def _sparse_seen() -> None:
    """A sparse tensor exists: the products get their kernels (once)."""
    if not _kernels["sparse_seen"]:
        _kernels["sparse_seen"] = True
        if _kernels["libraries"]:
            with _registry_lock:
                _install_product_kernels()


def _install_product_kernels() -> None:
    if _kernels["products"] or not _kernels["sparse_seen"]:
        return
    library = torch.library.Library("aten", "IMPL")
    for packet in _PRODUCTS:
        for name in getattr(torch.ops.aten, packet).overloads():
            op = getattr(getattr(torch.ops.aten, packet), name)
            full = _full_name(op)
            _register(library, full.split("::")[1], _product_kernel(op))
    _kernels["products"].append(library)


def install_kernels() -> None:
    """Install the fold kernels (once; they stay, and cost each fold op of the process a Python
    call from then on) and those of extension ops registered since."""
    with _registry_lock:
        if not _kernels["libraries"]:
            library = torch.library.Library("aten", "IMPL")
            for op in _rule_overloads():
                full = _full_name(op)
                packet = op._schema.name.split("::")[1]
                try:
                    taken = torch._C._dispatch_has_kernel_for_dispatch_key(full, _FAST_KEY)
                except RuntimeError:  # an overload torch keeps out of the dispatcher
                    continue
                if taken or packet in _PRODUCTS or _never_folds(op):
                    continue
                _register(library, full.split("::")[1], _fold_kernel(op))
            _kernels["libraries"].append(library)
        _install_product_kernels()
        _install_extension_kernels()


def _install_extension_kernels() -> None:
    """Kernels for the extension ops registered since the last look: their packages register
    them on import (a new module) or through ``torch.library`` (a new definition)."""
    import sys

    seen = (len(sys.modules), len(getattr(torch.library, "_defs", ())))
    if _kernels.get("ops_seen") == seen:
        return
    _kernels["ops_seen"] = seen
    for full in torch._C._dispatch_get_all_op_names():
        namespace = full.split("::")[0]
        if namespace not in extension_ops.NAMESPACES or full in _kernels["extension"]:
            continue
        qualified, _, overload = full.partition(".")
        op_name = qualified.split("::")[1]
        op = getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")
        library = torch.library.Library(namespace, "IMPL")
        if torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd"):
            for key in _AUTOGRAD_KEYS:
                _register(library, full.split("::")[1], _composite_extension_kernel(op, qualified),
                          key, with_keyset=False)
        else:
            _register(library, full.split("::")[1], _extension_fold_kernel(op, qualified))
        _kernels["libraries"].append(library)
        _kernels["extension"].add(full)


def _uninstall_kernels() -> None:
    """Remove every kernel (for a fair "plain" timing; the next mode installs them again)."""
    with _registry_lock:
        for library in _kernels["libraries"] + _kernels["products"]:
            library._destroy()
        _kernels["libraries"], _kernels["products"] = [], []
        _kernels["extension"] = set()
        _kernels.pop("ops_seen", None)


# -- while a mode is active: Dynamo compiles nothing, a compiled backward is refused --------------
_patched: dict[str, Any] = {"count": 0, "saved": []}
_compiled_graphs_made: list[bool] = [False]


def _graphs_may_exist() -> bool:
    """Whether torch.compile may have made a graph in this process (else no walk is needed)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return False
    if not _compiled_graphs_made[0]:
        _compiled_graphs_made[0] = bool(dynamo.counters["stats"]["unique_graphs"]) or bool(
            dynamo.counters["aot_autograd"]
        )
    return _compiled_graphs_made[0]


def _guarded_engine(run: Callable[..., Any]) -> Callable[..., Any]:
    def engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if active_modes() and _graphs_may_exist():
            name = _compiled_node_in(tuple(t_outputs))
            if name is not None:
                raise FoldError(_COMPILED_REFUSAL.format(name=name))
        return run(t_outputs, *args, **kwargs)

    return engine_run_backward


def _dynamo_skips(check: Callable[[], bool]) -> Callable[[], bool]:
    def any_torch_dispatch_mode_on_stack() -> bool:
        return bool(active_modes()) or check()

    return any_torch_dispatch_mode_on_stack


def _exact_mode_backend(gm: Any, example_inputs: Any) -> Any:
    """The backend Dynamo's callback names while a mode is active: no cached code has it."""
    return gm


def _dynamo_callback(choose: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def callback_from_stance(callback: Any) -> Any:
        chosen = choose(callback)
        if chosen in (None, False) or not active_modes():
            return chosen

        def in_mode(*args: Any, **kwargs: Any) -> Any:
            return chosen(*args, **kwargs)

        # Dynamo guards its cached code on the backend: code compiled outside the mode does not
        # run inside it (as under a dispatch mode); the frame goes to Dynamo, which skips it
        in_mode._torchdynamo_orig_backend = _exact_mode_backend  # type: ignore[attr-defined]
        return in_mode

    return callback_from_stance


def _patch() -> None:
    """While a mode is active: Dynamo skips the frames it would compile (as under a dispatch mode,
    with its message), and a backward through a graph compiled outside the mode is refused."""
    with _registry_lock:
        _patched["count"] += 1
        if _patched["count"] > 1:
            return
        import torch._dynamo.convert_frame as convert_frame
        import torch._dynamo.eval_frame as eval_frame

        saved = []
        for module, name, wrap in (
            (torch.autograd, "_engine_run_backward", _guarded_engine),
            (convert_frame, "any_torch_dispatch_mode_on_stack", _dynamo_skips),
            (eval_frame, "_callback_from_stance", _dynamo_callback),
        ):
            original = getattr(module, name, None)
            if original is not None:
                setattr(module, name, wrap(original))
                saved.append((module, name, original))
        _patched["saved"] = saved


def _unpatch() -> None:
    with _registry_lock:
        _patched["count"] -= 1
        if _patched["count"] > 0:
            return
        for module, name, original in _patched["saved"]:
            setattr(module, name, original)
        _patched["saved"] = []


@contextlib.contextmanager
def dynamo_patches_held() -> Iterator[None]:
    """Dynamo's patches (:func:`_patch`) held for the block, for a caller that activates a mode
    many times (:meth:`ExactMode.activate`: the eager stretches of a compiled call) instead of
    entering it. The patches change nothing while no mode is active."""
    _patch()
    try:
        yield
    finally:
        _unpatch()


_COMPILED_REFUSAL = (
    "exact_mode(): this backward runs through {name}, a graph torch.compile "
    "compiled outside the mode, whose kernels the mode cannot see (its sums "
    "would not be exact); run the forward inside exact_mode() too (torch.compile "
    "then runs it op by op), or use bitfold.torch's drop-in functions and modules"
)


class ExactMode(TorchDispatchMode):
    """The mode behind :func:`exact_mode` (see the module docstring).

    ``counts``: a ``Counter`` of the ops made exact, by kind. ``passed``: a
    ``Counter`` of the folds left to ATen that are not exact, keyed
    ``"kind: reason"``. ``strict=True`` raises :class:`bitfold.FoldError`
    for those instead. ``full``: whether the mode runs as a dispatch mode
    (every op through Python, sparse products above autograd) rather than
    through the fold kernels alone; ``full=None`` (the default) starts with
    the kernels and turns full when a sparse tensor is made or multiplied.
    """

    def __init__(
        self, *, strict: bool = False, products: str = "rounded", full: bool | None = None
    ) -> None:
        super().__init__()
        if products not in sparse.PRODUCT_RULES:
            raise FoldError(
                f"exact_mode(products=...) takes one of {', '.join(sparse.PRODUCT_RULES)}; "
                f"got {products!r}"
            )
        self.strict = bool(strict)
        self.products = products
        self.full = full
        self._products_tokens: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.passed: Counter[str] = Counter()
        self._entries: list[tuple[int, bool]] = []  # (thread, upgraded) of each __enter__
        self._guards: list[_CompiledBackwardGuard] = []
        self._extension = threading.local()  # .running: an extension op left to its package runs

    def __enter__(self) -> ExactMode:
        install_kernels()
        _patch()
        try:
            return self.activate()
        except BaseException:
            _unpatch()
            raise

    def activate(self) -> ExactMode:
        """Make the mode the one that handles folds on this thread: ``__enter__`` without
        installing the kernels or Dynamo's patches, for a caller that made sure of both
        (:func:`install_kernels`, :func:`dynamo_patches_held`); undone by :meth:`deactivate`."""
        self._products_tokens.append(sparse.PRODUCTS.set(self.products))
        _set_modes((*active_modes(), self))
        self._entries.append((threading.get_ident(), False))
        if self.full or (self.full is None and _kernels["sparse_seen"]):
            self._go_full()  # a sparse tensor exists: its products may reach no kernel of ours
        return self

    def _go_full(self, *, seen: bool = False) -> None:
        """From here to ``__exit__``: a dispatch mode, and sparse products above autograd.

        ``seen``: on seeing a sparse tensor, not in a backward (autograd restores its thread's
        modes when the backward ends) and only on the thread that entered the mode.
        """
        thread, full = self._entries[-1]
        if full or thread != threading.get_ident():
            return
        if seen and torch._C._current_graph_task_id() != -1:
            return
        guard = _CompiledBackwardGuard(self)
        guard.__enter__()
        self._guards.append(guard)
        try:
            super().__enter__()
        except BaseException:
            self._guards.pop().__exit__(None, None, None)
            raise
        self._entries[-1] = (thread, True)

    def _saw_sparse(self) -> None:
        if self.full is None:
            self._go_full(seen=True)

    def __exit__(self, *exc: Any) -> None:
        try:
            self.deactivate(*exc)
        finally:
            _unpatch()

    def deactivate(self, *exc: Any) -> None:
        """Undo the last :meth:`activate` (``__exit__`` without removing Dynamo's patches)."""
        exc = exc or (None, None, None)
        _, full = self._entries.pop()
        try:
            if full:
                from torch.overrides import _get_current_function_mode_stack
                from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

                guard = self._guards.pop()
                try:
                    if any(m is self for m in _get_current_dispatch_mode_stack()):
                        super().__exit__(*exc)
                finally:
                    if any(m is guard for m in _get_current_function_mode_stack()):
                        guard.__exit__(*exc)
        finally:
            modes = list(active_modes())
            for i in range(len(modes) - 1, -1, -1):
                if modes[i] is self:
                    del modes[i]
                    break
            _set_modes(tuple(modes))
            sparse.PRODUCTS.reset(self._products_tokens.pop())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        modes = active_modes()
        if modes and modes[-1] is not self:  # an inner mode (of the kernels) handles the op
            return func(*args, **kwargs)
        if rule_for(func) is None:
            name = extension_ops.qualified_name(func)
            if name is not None and not self._extension_running():
                return self.extension(name, func, args, kwargs)
            return func(*args, **kwargs)
        return self._fold(func, args, kwargs, lambda: func(*args, **kwargs))

    def _fold(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], aten: Callable[[], Any]
    ) -> Any:
        """A fold op: its rule's exact result, or ``aten()`` (ATen's own kernel)."""
        rule = rule_for(func)
        kind = rule.kind
        local = _local
        before = getattr(local, "inside", False)
        local.inside = True  # as _inside(True), without a generator: this runs for every fold
        try:
            lane = LANES.get(func)
            result = None if lane is None else lane(args, kwargs)
            if result is not None:  # a small CPU fold, by the direct way
                self.counts[kind] += 1
                if not written(func):
                    return result
                target = args[0]  # a lane's in-place ops write self (most of them in place)
                if result is not target:
                    target.copy_(result)
                return target
            bound = {k: plain_index(v) for k, v in bind(func, args, kwargs).items()}
            if kind in _SPARSE_KINDS and not self._entries[-1][1]:
                self._sparse_seen_below(func, kind, bound)
            result = rule.handler(bound)
            if isinstance(result, Leave):
                if result.reason is not None:
                    self.leave(str(func), kind, result.reason)
                return aten()
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
        finally:
            local.inside = before

    def _sparse_seen_below(self, func: Any, kind: str, bound: dict[str, Any]) -> None:
        """A sparse op reached the kernels: the mode turns full (when allowed) for what follows;
        a sparse factor whose gradient autograd already asked for ATen's way is recorded."""
        tensors = [v for v in bound.values() if isinstance(v, torch.Tensor)]
        if not any(sparse.is_sparse(t) for t in tensors):
            return
        _sparse_seen()
        if self.full is None:
            self._go_full(seen=True)
        if (
            kind == "sparse_mm"
            and torch.is_grad_enabled()
            and any(sparse.is_sparse(t) and t.requires_grad for t in tensors)
        ):
            self.leave(str(func), kind, "the gradient of a sparse factor made outside the mode, "
                       "in a product seen below autograd, is torch's")  # fmt: skip

    def _extension_running(self) -> bool:
        return bool(getattr(self._extension, "running", False))

    def extension(self, name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An extension package's op (``name``): its exact translation, or the op itself.

        The translation's ATen folds are made exact by this mode where they run
        (above autograd from the function-level guard, below it from a kernel).
        An op left to its package runs with extension lookups off, so that the
        ops it calls are not counted twice.
        """
        if self._extension_running():
            return func(*args, **kwargs)
        with _inside(False):
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


_SPARSE_KINDS = frozenset({"sparse_mm", "sparse_sampled_addmm", "coalesce", "sparse_sum"})


@checked_options
def exact_mode(
    *, strict: bool = False, products: str = "rounded", full: bool | None = None
) -> ExactMode:
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

    ``full``: how the mode sees the ops. Only the fold ops enter Python (their
    kernels; the other ops run as in plain PyTorch) until the mode meets a
    sparse tensor, where it turns full until it exits: every op through
    Python (a dispatch mode) and sparse products run above autograd, so that
    their sparse factor's gradient is exact too (``None``, the default).
    ``True``: full from the start (a sparse factor made outside the mode that
    requires a gradient); ``False``: never full (a sparse factor's gradient
    stays torch's, recorded in ``passed``). The bits of every fold made exact
    are the same either way.

    >>> import torch, bitfold.torch as bt
    >>> w = torch.zeros(3, requires_grad=True)
    >>> with bt.exact_mode() as mode:
    ...     w[torch.tensor([0, 2, 2])].sum().backward()
    >>> w.grad.tolist(), mode.counts["index_put"]
    ([1.0, 0.0, 2.0], 1)
    """
    return ExactMode(strict=strict, products=products, full=full)


def active_exact_mode() -> ExactMode | None:
    """The innermost :class:`ExactMode` active on this thread, or None."""
    modes = active_modes()
    return modes[-1] if modes else None


_install_factory_kernels()

__all__ = [
    "COMPILED_NODE",
    "EXACT_GRAPH",
    "ExactMode",
    "active_exact_mode",
    "active_modes",
    "exact_mode",
]
