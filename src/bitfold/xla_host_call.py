"""A host function called from a jitted JAX computation on the CPU, without copying its input.

``jax.pure_callback`` hands its function a copy of every argument, made
when the call runs; for a gradient of tens of megabytes that copy costs
several times the fold it feeds. This module registers one XLA FFI target,
``bitfold_host_call``, whose handler XLA calls with its buffers where they
lie: the registered Python function reads a NumPy view of the input and its
result is written into the output buffer (one copy of the output, none of
the input).

The handler is a ``ctypes`` callback (it takes the GIL as any Python
callback does) reading the FFI's C structures (``xla/ffi/api/c_api.h``: the
call frame, its argument and result buffers): no compiler is needed. XLA
asks a handler for its FFI version first; it answers with the runtime's
own. An exception in the function becomes an XLA error naming it, so the
jitted call raises instead of returning an unwritten buffer.

Numeric contract: the output is the function's result, bit for bit.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
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


_Call = tuple[Callable[[np.ndarray], Any], tuple[int, ...], np.dtype, tuple[int, ...], np.dtype]
_CALLS: dict[int, _Call] = {}
_KEYS: dict[tuple[Any, ...], int] = {}
_NEXT = itertools.count(1)
_LOCK = threading.Lock()
_REGISTERED: list[Any] = []  # the ctypes callback, kept alive while XLA may call it


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

    Call frame words: 1 extension, 2 API, 4 stage, 9 argument buffers, 14
    result buffers; a buffer's word 3 is its data. Arguments: the input, then
    one int32, the key of the registered call.
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
        args, rets = _words(w[9], 2), _words(w[14], 1)
        key = ctypes.c_int32.from_address(_words(args[1], 4)[3]).value
        fn, in_shape, in_dtype, out_shape, out_dtype = _CALLS[key]
        result = fn(_view(_words(args[0], 4)[3], in_shape, in_dtype, False))
        _view(_words(rets[0], 4)[3], out_shape, out_dtype, True)[...] = result
        return None
    except BaseException as exc:  # never a silent, unwritten output: XLA raises it
        return _error(w[2], f"bitfold host call: {type(exc).__name__}: {exc}")


def available() -> bool:
    """Whether this JAX has the FFI (``jax.ffi``) the host call needs."""
    import jax

    return hasattr(getattr(jax, "ffi", None), "ffi_call")


def _register_target() -> None:
    with _LOCK:
        if _REGISTERED:
            return
        import jax

        handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(_handle)
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")
        _REGISTERED.append(handler)


def host_call(fn: Callable[[np.ndarray], Any], x: Any, out: Any, identity: tuple[Any, ...]
              ) -> Any:  # fmt: skip
    """``fn(x)`` on the host inside a jitted computation: a JAX array like ``out``
    (a ``jax.ShapeDtypeStruct``).

    ``fn`` gets a read-only NumPy view of ``x``'s buffer and returns an array
    of ``out``'s shape (cast to its dtype). ``identity`` names what ``fn``
    computes (calls of equal identities share one registration, kept for the
    life of the process with ``fn``). Under ``vmap``, one call a batch element.
    """
    import jax
    import jax.numpy as jnp

    _register_target()
    in_shape, in_dtype = tuple(x.shape), np.dtype(x.dtype)
    out_shape, out_dtype = tuple(out.shape), np.dtype(out.dtype)
    name = (*identity, in_shape, in_dtype.str, out_shape, out_dtype.str)
    with _LOCK:
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = next(_NEXT)
            _CALLS[key] = (fn, in_shape, in_dtype, out_shape, out_dtype)
    call = jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")
    return call(x, jnp.asarray(np.array([key], np.int32)))
