"""Turn the float unit's flush-to-zero (FTZ) and denormals-are-zero (DAZ) modes on, for tests.

FTZ writes a subnormal result of a float instruction as zero; DAZ reads a
subnormal operand as zero. ``torch.set_flush_denormal(True)`` sets both on
the calling thread, and XLA runs JAX's CPU work (host callbacks included) on
threads with both set. On x86-64 they are bits 15 and 6 of the SSE control
register MXCSR, which glibc's ``fegetenv``/``fesetenv`` read and write
(``fenv_t`` keeps MXCSR in its last four bytes). New threads inherit the
creating thread's floating-point environment, so a thread pool started while
the modes are on keeps them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import platform
import sys
from collections.abc import Iterator

FTZ = 0x8000
DAZ = 0x0040
_FENV_BYTES = 32
_MXCSR_AT = 28


def unsupported_reason() -> str | None:
    """Why the modes cannot be set on this machine, or None when they can."""
    if platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        return f"MXCSR FTZ/DAZ needs x86-64 Linux; this is {platform.machine()} {sys.platform}"
    if ctypes.util.find_library("m") is None:
        return "glibc's libm (fegetenv/fesetenv) was not found"
    return None


def _libm() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("m"))


def mxcsr() -> int:
    """The calling thread's MXCSR."""
    env = (ctypes.c_ubyte * _FENV_BYTES)()
    _libm().fegetenv(env)
    return int.from_bytes(bytes(env[_MXCSR_AT : _MXCSR_AT + 4]), "little")


def set_mxcsr(value: int) -> None:
    """Write the calling thread's MXCSR (through its floating-point environment)."""
    lib = _libm()
    env = (ctypes.c_ubyte * _FENV_BYTES)()
    lib.fegetenv(env)
    env[_MXCSR_AT : _MXCSR_AT + 4] = list(value.to_bytes(4, "little"))
    if lib.fesetenv(env) != 0:
        raise OSError("fesetenv refused the floating-point environment")


def flush_denormals_on() -> None:
    """FTZ and DAZ on for the calling thread (and every thread it starts from now on)."""
    set_mxcsr(mxcsr() | FTZ | DAZ)


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """FTZ and DAZ on for the calling thread (MXCSR, and torch's flag) within the block."""
    before = mxcsr()
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            torch.set_flush_denormal(True)
        flush_denormals_on()
        yield
    finally:
        if torch is not None:
            torch.set_flush_denormal(False)
        set_mxcsr(before)


def flushes() -> bool:
    """True when the float unit of the calling thread flushes a subnormal right now."""
    import numpy as np

    tiny = np.array([1], np.uint32).view(np.float32)
    return bool((tiny * np.float32(2.0))[0] == 0.0)
