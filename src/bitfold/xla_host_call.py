"""A host function called from a jitted JAX computation on the CPU, without copying its inputs.

``jax.pure_callback`` hands its function a copy of every argument, made
when the call runs; for a gradient of tens of megabytes that copy costs
several times the fold it feeds. This module registers one XLA FFI target,
``bitfold_host_call``, whose handler XLA calls with its buffers where they
lie: the registered Python function reads NumPy views of the inputs and its
result is written into the output buffer (one copy of the output, none of
the inputs), or, registered with ``into=True``, it writes the output buffer
itself (no copy at all).

The handler is a ``ctypes`` callback (it takes the GIL as any Python
callback does) reading the FFI's C structures (``xla/ffi/api/c_api.h``: the
call frame, its argument and result buffers): no compiler is needed. XLA
asks a handler for its FFI version first; it answers with the runtime's
own. An exception in the function becomes an XLA error naming it, so the
jitted call raises instead of returning an unwritten buffer.

Lifetimes: a call is registered under a key (an int32 constant in the
computation) by a primitive of this module, ``bitfold_host_call``, which
holds the registration (the function and what it closes over: a plan) in
its parameters. Lowering it hands the registration to the runtime
executable as a host callback, which XLA keeps while the executable lives
and while any run of it is in flight (JAX's Python keep-alive list would
not: a jitted function dropped right after its call would lose it). The
registry holds it only weakly: it lives while a traced computation or a
compiled executable that calls it lives, and is freed with the last of
them (a jitted function deleted, ``jax.clear_caches()``). Outside ``jit``
the primitive calls the function directly, with no compilation and nothing
registered for longer than the call. (JAX writes no executable with host
callbacks to its persistent compilation cache.)

Numeric contract: the output is the function's result, bit for bit.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

#: The FFI target's name (one for every function: calls name theirs by a key).
TARGET = "bitfold_host_call"
_I64 = ctypes.c_int64
#: XLA_FFI_ExecutionStage_EXECUTE and XLA_FFI_Extension_Metadata.
_EXECUTE, _METADATA = 3, 1
#: XLA_FFI_Error_Code_INTERNAL.
_INTERNAL = 13


class _ErrorArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]  # fmt: skip


class Call:
    """One registered host function: ``fn`` of the inputs' views, and the shapes it is called
    with. Held by the ``bitfold_host_call`` equations that call it and by the executables
    compiled from them; the registry holds it weakly (module docstring)."""

    __slots__ = ("__weakref__", "fn", "identity", "ins", "into", "key", "out")

    def __init__(self, key: int, fn: Callable[..., Any], identity: tuple[Any, ...],
                 ins: tuple[tuple[tuple[int, ...], np.dtype], ...],
                 out: tuple[tuple[int, ...], np.dtype], into: bool) -> None:  # fmt: skip
        self.key, self.fn, self.identity, self.ins, self.out = key, fn, identity, ins, out
        self.into = into

    def __call__(self, *views: np.ndarray) -> np.ndarray:
        """The function's result for these inputs, as an array of the output's shape and dtype."""
        shape, dtype = self.out
        if self.into:
            out = np.empty(shape, dtype)
            self.fn(*views, out)
            return out
        return np.asarray(self.fn(*views), dtype).reshape(shape)

    def write(self, views: list[np.ndarray], out: np.ndarray) -> None:
        """The function's result for these inputs, written into ``out``."""
        if self.into:
            self.fn(*views, out)
        else:
            out[...] = self(*views)

    def __repr__(self) -> str:
        return f"bitfold_host_call(key={self.key}, {self.identity[0]!r})"


#: key -> registered call, while something that calls it lives (weak: module docstring).
_CALLS: weakref.WeakValueDictionary[int, Call] = weakref.WeakValueDictionary()
#: what a call computes, and its shapes -> its registration, so that equal calls share one.
_NAMES: weakref.WeakValueDictionary[tuple[Any, ...], Call] = weakref.WeakValueDictionary()
_NEXT = itertools.count(1)
_LOCK = threading.Lock()
_REGISTERED: list[Any] = []  # the ctypes callback (kept alive while XLA may call it), the primitive


def _words(address: int, n: int) -> Any:
    return (_I64 * n).from_address(address)


def _view(address: int, shape: tuple[int, ...], dtype: np.dtype, writable: bool) -> np.ndarray:
    """The buffer at ``address`` as a NumPy array (no copy)."""
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size == 0:
        return np.empty(shape, dtype)
    view = np.frombuffer((ctypes.c_char * size).from_address(address), dtype).reshape(shape)
    view.flags.writeable = writable
    return view


def _error(api: int, message: str) -> int:
    """An ``XLA_FFI_Error*`` made by the runtime's ``XLA_FFI_Error_Create`` (the API's seventh
    word: after its size, extension, version and internal API)."""
    create = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(_words(api, 7)[6])
    args = _ErrorArgs(ctypes.sizeof(_ErrorArgs) - 4, None, message.encode(), _INTERNAL)
    return int(create(ctypes.addressof(args)) or 0)


def _handle(frame: int) -> int | None:
    """The FFI handler: ``XLA_FFI_Error* (XLA_FFI_CallFrame*)``, ``None`` for success.

    Call frame words: 1 extension, 2 API, 4 stage, 7 argument count, 9
    argument buffers, 14 result buffers; a buffer's word 3 is its data.
    Arguments: the inputs, then one int32, the key of the registered call.
    """
    w = _words(frame, 15)
    try:
        if w[1]:
            ext = _words(w[1], 4)
            if ext[1] & 0xFFFFFFFF == _METADATA:  # the version asked: the runtime's own
                metadata, api = _words(ext[3], 5), _words(w[2], 5)
                metadata[1], metadata[2], metadata[3], metadata[4] = 24, 0, api[4], 0
                return None
        if w[4] & 0xFFFFFFFF != _EXECUTE:
            return None
        args, rets = _words(w[9], w[7]), _words(w[14], 1)
        key = ctypes.c_int32.from_address(_words(args[w[7] - 1], 4)[3]).value
        call = _CALLS.get(key)
        if call is None:
            raise LookupError(
                f"no host function is registered under key {key}: the computation outlived "
                "the executable it was compiled into (a serialized or exported computation "
                "cannot call bitfold's host functions)"
            )
        views = [_view(_words(args[i], 4)[3], shape, dtype, False)
                 for i, (shape, dtype) in enumerate(call.ins)]  # fmt: skip
        call.write(views, _view(_words(rets[0], 4)[3], *call.out, True))
        return None
    except BaseException as exc:  # never a silent, unwritten output: XLA raises it
        return _error(w[2], f"bitfold host call: {type(exc).__name__}: {exc}")


def available() -> bool:
    """Whether this JAX has the FFI (``jax.ffi``) the host call needs."""
    import jax

    return hasattr(getattr(jax, "ffi", None), "ffi_call")


def _primitive() -> Any:
    """The ``bitfold_host_call`` primitive (made, and the FFI target registered, on first use)."""
    with _LOCK:
        if not _REGISTERED:
            import jax

            handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(_handle)
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")
            _REGISTERED.extend([handler, _define_primitive()])
        return _REGISTERED[1]


def _define_primitive() -> Any:
    """``bitfold_host_call(*inputs, call=Call)``: abstract value, direct call outside ``jit``,
    the FFI custom call (the registration kept alive by the executable), ``vmap`` one
    element at a time."""
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax.interpreters import batching, mlir

    prim = Primitive(TARGET)

    def abstract(*avals: Any, call: Call) -> Any:
        shape, dtype = call.out
        return jax.core.ShapedArray(shape, dtype)

    def impl(*xs: Any, call: Call) -> Any:  # outside jit: no compilation, nothing kept
        return jnp.asarray(call(*(np.asarray(x) for x in xs)))

    def lowering(ctx: Any, *operands: Any, call: Call) -> Any:
        ctx.module_context.add_host_callback(call)  # the runtime executable holds it
        key = mlir.ir_constant(np.array([call.key], np.int32))
        ctx = ctx.replace(avals_in=[*ctx.avals_in, jax.core.ShapedArray((1,), np.int32)])
        return jax.ffi.ffi_lowering(TARGET)(ctx, *operands, key)

    def batch(args: Any, dims: Any, *, call: Call) -> Any:
        batched = [d is not None for d in dims]
        moved = [jnp.moveaxis(x, d, 0) for x, d in zip(args, dims, strict=True) if d is not None]

        def one(xs: Any) -> Any:
            it = iter(xs)
            return prim.bind(*(next(it) if b else x for x, b in zip(args, batched, strict=True)),
                             call=call)  # fmt: skip

        return jax.lax.map(one, moved), 0

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract)
    mlir.register_lowering(prim, lowering, platform="cpu")
    batching.primitive_batchers[prim] = batch
    return prim


def host_call(fn: Callable[..., Any], x: Any, out: Any, identity: tuple[Any, ...], *,
              into: bool = False) -> Any:  # fmt: skip
    """``fn(*x)`` on the host inside a jitted computation: a JAX array like ``out``
    (a ``jax.ShapeDtypeStruct``).

    ``x`` is a JAX array or a tuple of them; ``fn`` gets a read-only NumPy view
    of each one's buffer and returns an array of ``out``'s shape (cast to its
    dtype); with ``into=True`` it gets a writable view of the output buffer
    too, after the inputs, and must write every element of it (its return
    value is ignored). ``identity`` names what ``fn`` computes: calls of equal
    identities and shapes share one registration, which lives while a
    computation that calls it lives (module docstring); an object in
    ``identity`` (a plan) is kept with it. Under ``vmap``, one call a batch
    element.
    """
    prim = _primitive()
    xs = tuple(x) if isinstance(x, tuple | list) else (x,)
    ins = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in xs)
    spec = (tuple(out.shape), np.dtype(out.dtype))
    name = (*identity, tuple((s, d.str) for s, d in ins), spec[0], spec[1].str, into)
    with _LOCK:
        call = _NAMES.get(name)
        if call is None:
            call = Call(next(_NEXT), fn, tuple(identity), ins, spec, into)
            _NAMES[name] = _CALLS[call.key] = call
    return prim.bind(*xs, call=call)


def registered() -> int:
    """How many host calls are registered now (each one held by something that calls it)."""
    return len(_CALLS)
