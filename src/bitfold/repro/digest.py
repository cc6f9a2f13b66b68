"""Canonical digests of arrays and named collections of arrays.

Encoding (version 1), fed to SHA-256:

* an array: ``b"bitfold-array-v1\\0"``, the dtype name (``float32``,
  ``bfloat16``, ...), ``\\0``, the shape as comma-separated decimals, ``\\0``,
  the byte count as a decimal, ``\\0``, then the elements' bytes in C order,
  little-endian;
* a mapping name -> array: ``b"bitfold-dict-v1\\0"``, the number of entries,
  then for each name in sorted order its UTF-8 bytes, ``\\0``, and the
  array's own 32-byte digest.

The same contents give the same digest from NumPy, PyTorch (any device),
CuPy or JAX arrays; values are never converted, so ``-0.0`` and ``+0.0``, or
two NaN payloads, give different digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..arrays import raw_bits
from ..errors import FoldTypeError
from ..validate import checked_options


def _encoded_array_hash(name: str, shape: tuple[int, ...], data: bytes | memoryview) -> bytes:
    h = hashlib.sha256(b"bitfold-array-v1\0")
    h.update(f"{name}\0{','.join(map(str, shape))}\0{len(data)}\0".encode())
    h.update(data)
    return h.digest()


def _array_hash(x: Any) -> bytes:
    return _encoded_array_hash(*raw_bits(x))


def _combined_hash(raw: Mapping[str, bytes]) -> bytes:
    h = hashlib.sha256(b"bitfold-dict-v1\0")
    h.update(f"{len(raw)}\0".encode())
    for name in sorted(raw):
        if not isinstance(name, str):
            raise FoldTypeError(f"digest needs string names in a mapping; got {name!r}")
        h.update(name.encode() + b"\0")
        h.update(raw[name])
    return h.digest()


def digest_of_bytes(dtype_name: str, shape: tuple[int, ...], data: bytes) -> str:
    """:func:`digest` of an array given as its dtype name, shape and little-endian C-order bytes.

    For arrays no library here can hold (bfloat16 read from a file into NumPy).
    """
    return "sha256:" + _encoded_array_hash(dtype_name, tuple(shape), data).hex()


def combine(digests: Mapping[str, str]) -> str:
    """:func:`digest` of a mapping, from the digests of its arrays (no array is re-read)."""
    return "sha256:" + _combined_hash(
        {name: bytes.fromhex(d.removeprefix("sha256:")) for name, d in digests.items()}
    ).hex()


@checked_options
def digest(x: Any) -> str:
    """``"sha256:<hex>"`` of an array or of a mapping name -> array (see the module docstring)."""
    if isinstance(x, Mapping):
        raw = _combined_hash({name: _array_hash(arr) for name, arr in x.items()})
    else:
        raw = _array_hash(x)
    return "sha256:" + raw.hex()


@checked_options
def bits_equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` have the same dtype, shape and bytes (NaN payloads included)."""
    return raw_bits(a) == raw_bits(b)
