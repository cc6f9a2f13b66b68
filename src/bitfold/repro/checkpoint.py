"""Published digests of checkpoints (the ``bitfold digest`` command is :mod:`bitfold.cli.digest`).

The digest of a checkpoint is :func:`bitfold.digest` of its name -> array
mapping (for a file holding a single array, ``.npy`` or a bare saved tensor,
the digest of that array). It covers names, dtypes, shapes and every bit, and
does not depend on the file format or on the device the tensors were saved
from: the same float32 weights saved as ``.npz``, safetensors or a PyTorch
state dict have one digest, and so do bfloat16 weights in safetensors and
PyTorch files.

Formats, recognised by their first bytes (not by the file name):

* NumPy ``.npy`` / ``.npz``, read with ``allow_pickle=False``;
* safetensors, parsed here with ``json`` and NumPy (8-byte little-endian
  header length, JSON header of dtype / shape / data_offsets); dtypes
  F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64 and BOOL;
* PyTorch files (zip or legacy), loaded with
  ``torch.load(path, weights_only=True, map_location="cpu")``; nested dicts,
  lists and tuples are flattened with ``.``-joined names, and entries that are
  not tensors (an epoch number, a config) are listed as ignored.

torch is imported only for a PyTorch file. Anything else, including a
pickle of arbitrary objects or a file whose ``weights_only`` load fails, is
refused with a :class:`bitfold.FoldError` naming the file and the reason;
nothing is ever unpickled beyond what ``weights_only`` allows.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, overload

import numpy as np

from ..arrays import dtype_name
from ..errors import FoldError
from .digest import combine, digest, digest_of_bytes

#: safetensors dtype -> (NumPy dtype of the stored bytes, bitfold dtype name).
SAFETENSORS_DTYPES: dict[str, tuple[str, str]] = {
    "BOOL": ("|b1", "bool"),
    "U8": ("|u1", "uint8"),
    "I8": ("|i1", "int8"),
    "U16": ("<u2", "uint16"),
    "I16": ("<i2", "int16"),
    "U32": ("<u4", "uint32"),
    "I32": ("<i4", "int32"),
    "U64": ("<u8", "uint64"),
    "I64": ("<i8", "int64"),
    "F16": ("<f2", "float16"),
    "BF16": ("<u2", "bfloat16"),
    "F32": ("<f4", "float32"),
    "F64": ("<f8", "float64"),
}

#: The first bytes of a legacy (non-zip) ``torch.save`` file: the pickled magic number.
_TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_NUMERIC_KINDS = "biufc"


@dataclass
class TensorDigest:
    """One tensor of a checkpoint: name, dtype name, shape and digest."""

    name: str
    dtype: str
    shape: list[int]
    digest: str


@dataclass
class CheckpointDigest:
    """What ``bitfold digest`` reports for one file."""

    path: str
    format: str
    digest: str
    tensors: list[TensorDigest] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    single: bool = False  # one array (``.npy`` or a bare tensor): digest is the array's

    def as_dict(self, per_tensor: bool = True) -> dict[str, Any]:
        """Plain JSON-ready dict; without ``per_tensor`` only the count of tensors."""
        d = asdict(self)
        if not per_tensor:
            d["tensors"] = len(self.tensors)
        return d


# --------------------------------------------------------------------------- digests
def _bfloat16_digest(bits: np.ndarray) -> str:
    """:func:`bitfold.digest` of a bfloat16 array given as its uint16 bit patterns."""
    data = np.ascontiguousarray(bits, dtype="<u2").tobytes()
    return digest_of_bytes("bfloat16", tuple(bits.shape), data)


def _entry(path: str, name: str, arr: Any, dtype: str | None = None) -> TensorDigest:
    shape = [int(s) for s in arr.shape]
    try:
        if dtype == "bfloat16":
            d = _bfloat16_digest(arr)
        else:
            d = digest(arr)
            dtype = dtype_name(arr)
    except FoldError:
        raise
    except (TypeError, ValueError, RuntimeError) as err:
        raise FoldError(
            f"{path}: cannot digest tensor {name!r} ({getattr(arr, 'dtype', '?')}): {err}"
        ) from err
    return TensorDigest(name=name, dtype=str(dtype), shape=shape, digest=d)


def _check_numeric(path: str, name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind not in _NUMERIC_KINDS:
        what = "Python objects" if arr.dtype.kind == "O" else f"dtype {arr.dtype}"
        raise FoldError(
            f"{path}: array {name!r} holds {what}; a checkpoint holds numeric arrays "
            "(bool, integer, float, complex)"
        )


# --------------------------------------------------------------------------- formats
def _read_npy(path: str) -> CheckpointDigest:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        if "allow_pickle" in str(err) or "Python objects" in str(err):
            raise FoldError(
                f"{path}: refused: the .npy file holds Python objects, and reading them would "
                "need unpickling"
            ) from err
        raise FoldError(f"{path}: damaged or truncated .npy file: {err}") from err
    except (OSError, EOFError) as err:
        raise FoldError(f"{path}: damaged or truncated .npy file: {err}") from err
    _check_numeric(path, "", arr)
    entry = _entry(path, "", arr)
    return CheckpointDigest(path, "npy", entry.digest, [entry], single=True)


def _read_npz(path: str, names: list[str]) -> CheckpointDigest:
    odd = [n for n in names if not n.endswith(".npy")]
    if odd:
        raise FoldError(
            f"{path}: a zip archive but not a NumPy .npz (members {odd[:5]} are not .npy "
            "arrays) nor a PyTorch checkpoint"
        )
    entries = []
    try:
        with np.load(path, allow_pickle=False) as z:
            for name in z.files:
                try:
                    arr = z[name]
                except ValueError as err:
                    if "allow_pickle" in str(err):
                        raise FoldError(
                            f"{path}: refused: array {name!r} holds Python objects, and reading "
                            "it would need unpickling"
                        ) from err
                    raise
                _check_numeric(path, name, arr)
                entries.append(_entry(path, name, arr))
    except FoldError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise FoldError(f"{path}: damaged or truncated .npz file: {err}") from err
    return CheckpointDigest(path, "npz", combine({e.name: e.digest for e in entries}), entries)


def _read_safetensors(path: str, size: int) -> CheckpointDigest:
    with open(path, "rb") as fh:
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise FoldError(
                f"{path}: truncated safetensors file: the header is {n} bytes but only "
                f"{size - 8} bytes follow its length"
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise FoldError(f"{path}: bad safetensors header (not valid JSON): {err}") from err
    if not isinstance(header, dict):
        raise FoldError(f"{path}: bad safetensors header: a JSON object was expected")
    data_len = size - 8 - n
    base = 8 + n
    buf = np.memmap(path, dtype=np.uint8, mode="r") if size > base else np.zeros(0, np.uint8)
    spans: list[tuple[int, int, str]] = []
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("dtype"), str)
            or not isinstance(info.get("shape"), list)
            or not all(isinstance(s, int) and s >= 0 for s in info["shape"])
            or not isinstance(info.get("data_offsets"), list)
            or len(info["data_offsets"]) != 2
            or not all(isinstance(o, int) for o in info["data_offsets"])
        ):
            raise FoldError(
                f"{path}: bad safetensors header entry for {name!r}: {info!r}; expected "
                "{'dtype': ..., 'shape': [...], 'data_offsets': [begin, end]}"
            )
        code = info["dtype"]
        if code not in SAFETENSORS_DTYPES:
            raise FoldError(
                f"{path}: tensor {name!r} has safetensors dtype {code!r}; bitfold digests "
                f"{', '.join(SAFETENSORS_DTYPES)}"
            )
        np_dtype, bf_name = SAFETENSORS_DTYPES[code]
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64))
        if begin < 0 or end - begin != count * np.dtype(np_dtype).itemsize:
            raise FoldError(
                f"{path}: tensor {name!r} ({code}, shape {list(shape)}) has data_offsets "
                f"[{begin}, {end}], which do not hold {count} elements"
            )
        if end > data_len:
            raise FoldError(
                f"{path}: truncated safetensors file: tensor {name!r} ends at byte {end} of the "
                f"data but only {data_len} bytes follow the header"
            )
        spans.append((begin, end, name))
        arr = buf[base + begin : base + end].view(np_dtype).reshape(shape)
        entries.append(_entry(path, name, arr, "bfloat16" if bf_name == "bfloat16" else None))
    spans.sort()
    for (_, e1, n1), (b2, _, n2) in itertools.pairwise(spans):
        if b2 < e1:
            raise FoldError(f"{path}: bad safetensors file: tensors {n1!r} and {n2!r} overlap")
    return CheckpointDigest(
        path, "safetensors", combine({e.name: e.digest for e in entries}), entries
    )


def _flatten_torch(torch: Any, obj: Any, prefix: str, out: list, ignored: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten_torch(torch, v, f"{prefix}.{k}" if prefix else str(k), out, ignored)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _flatten_torch(torch, v, f"{prefix}.{i}" if prefix else str(i), out, ignored)
    else:
        ignored.append(prefix or "(top level)")


def _reason(err: BaseException) -> str:
    """The first line of a loader's error, without PyTorch's advice about corrupted files."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    text = re.split(r"\.? (?:This is an internal miniz error|The file might be corrupted)", text)[0]
    return text.strip() or type(err).__name__


def _torch_load(torch: Any, path: str) -> Any:
    """``torch.load`` with ``weights_only=True`` on the CPU; every failure a :class:`FoldError`."""
    import pickle

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        m = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.? Please use|\n|$)", str(err))
        if m is None and "Weights only load failed" not in str(err):
            raise FoldError(f"{path}: damaged or truncated PyTorch file ({_reason(err)})") from err
        why = m.group(1).strip() if m else "weights only load failed"
        raise FoldError(
            f"{path}: refused: loading it with weights_only=True failed ({why}); it holds "
            "objects other than tensors and plain containers, and bitfold never unpickles them"
        ) from err
    except Exception as err:  # EOFError, RuntimeError, OSError ...: the bytes are not whole
        raise FoldError(f"{path}: damaged or truncated PyTorch file ({_reason(err)})") from err


def _import_torch(path: str) -> Any:
    try:
        import torch
    except ImportError as err:
        raise FoldError(
            f"{path}: a PyTorch checkpoint; reading it needs torch (pip install 'bitfold[torch]')"
        ) from err
    return torch


def _read_torch(path: str) -> CheckpointDigest:
    torch = _import_torch(path)
    obj = _torch_load(torch, path)
    found: list[tuple[str, Any]] = []
    ignored: list[str] = []
    _flatten_torch(torch, obj, "", found, ignored)
    if not found and ignored:
        raise FoldError(
            f"{path}: a PyTorch file that holds no tensors (only {', '.join(ignored[:5])}); "
            "not a checkpoint"
        )
    entries = []
    for name, t in found:
        if t.layout != torch.strided or t.is_quantized:
            raise FoldError(
                f"{path}: tensor {name!r} is {'quantized' if t.is_quantized else t.layout}; "
                "bitfold digests dense (strided) tensors only"
            )
        entries.append(_entry(path, name, t))
    if len(found) == 1 and found[0][0] == "":
        return CheckpointDigest(path, "torch", entries[0].digest, entries, ignored, single=True)
    return CheckpointDigest(
        path, "torch", combine({e.name: e.digest for e in entries}), entries, ignored
    )


#: What each format of :func:`file_format` is called in messages.
FORMAT_NAMES = {
    "npy": "a NumPy .npy file",
    "npz": "a NumPy .npz archive",
    "torch": "a PyTorch file",
    "safetensors": "a safetensors file",
}


def _head(path: str) -> tuple[bytes, int]:
    """The first 16 bytes and the size of ``path``; refuses directories, missing, unreadable
    and empty files."""
    if os.path.isdir(path):
        raise FoldError(f"{path}: is a directory; give checkpoint files")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as err:
        raise FoldError(f"{path}: cannot read: {err.strerror or err}") from err
    if not head:
        raise FoldError(f"{path}: empty file; not a checkpoint")
    return head, size


def _zip_members(path: str) -> list[str]:
    """The member names of a zip archive (a PyTorch file or an .npz); a cut one is refused."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        why = "" if isinstance(err, zipfile.BadZipFile) else f" ({err})"
        raise FoldError(
            f"{path}: damaged or truncated: it starts as a zip archive (a PyTorch or .npz file) "
            f"but the archive's directory, at its end, is missing or unreadable{why}"
        ) from err


def file_format(path: str | os.PathLike[str]) -> str:
    """The format of a checkpoint file, from its first bytes: a key of :data:`FORMAT_NAMES`.

    The one place that decides what a file is: directories, missing, unreadable,
    empty, damaged or truncated zip archives, pickles and unknown bytes are refused
    with a :class:`FoldError` naming the file. Reading the file past this may still
    find it damaged (each reader says so in the same words).
    """
    p = os.fspath(path)
    head, _ = _head(p)
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        names = _zip_members(p)
        return "torch" if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names) else "npz"
    if head.startswith(_TORCH_LEGACY_MAGIC):
        return "torch"
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        raise FoldError(
            f"{p}: refused: a Python pickle, not a checkpoint format; bitfold never unpickles "
            "arbitrary objects (save weights with numpy.savez, safetensors or torch.save of a "
            "state dict)"
        )
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    raise FoldError(
        f"{p}: not a checkpoint: not a NumPy .npy/.npz, safetensors or PyTorch file "
        f"(first bytes {head[:8]!r})"
    )


def load_torch_file(path: str | os.PathLike[str]) -> Any:
    """The contents of a PyTorch file, loaded with ``weights_only=True`` onto the CPU.

    Every way the file can be wrong (see :func:`file_format`; another checkpoint
    format; damaged or truncated bytes; objects ``weights_only`` refuses) is a
    :class:`FoldError` that names the file.
    """
    p = os.fspath(path)
    kind = file_format(p)
    if kind != "torch":
        raise FoldError(f"{p}: {FORMAT_NAMES[kind]}, not a PyTorch file")
    return _torch_load(_import_torch(p), p)


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointDigest:
    """Digest a checkpoint file, per tensor and as a whole (see the module docstring)."""
    p = os.fspath(path)
    kind = file_format(p)
    if kind == "npy":
        return _read_npy(p)
    if kind == "npz":
        return _read_npz(p, _zip_members(p))
    if kind == "torch":
        return _read_torch(p)
    return _read_safetensors(p, os.path.getsize(p))


@overload
def checkpoint_digest(path: str | os.PathLike[str], per_tensor: Literal[False] = ...) -> str: ...
@overload
def checkpoint_digest(
    path: str | os.PathLike[str], per_tensor: Literal[True]
) -> tuple[str, dict[str, str]]: ...
def checkpoint_digest(
    path: str | os.PathLike[str], per_tensor: bool = False
) -> str | tuple[str, dict[str, str]]:
    """The canonical digest of a checkpoint (``bitfold.digest`` of its name -> array mapping).

    With ``per_tensor=True``: ``(digest, {name: digest})`` in the file's order
    (a single-array file has the one name ``""``). Raises :class:`FoldError`
    for a file that is not a checkpoint or would need unsafe unpickling.
    """
    info = read_checkpoint(path)
    if per_tensor:
        return info.digest, {e.name: e.digest for e in info.tensors}
    return info.digest


__all__ = [
    "FORMAT_NAMES",
    "SAFETENSORS_DTYPES",
    "CheckpointDigest",
    "TensorDigest",
    "checkpoint_digest",
    "combine",
    "file_format",
    "load_torch_file",
    "read_checkpoint",
]
