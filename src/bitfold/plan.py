"""``Fold``: the plan built once from a static index map and called every step."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from .arrays import dtype_name, from_numpy, library_of, to_numpy
from .errors import FoldTypeError, IndexRangeError
from .kernels import cpu
from .validate import check_K

_INT32_MAX = np.iinfo(np.int32).max


def _read_index(index: Any) -> np.ndarray:
    """The index as a host NumPy integer array (copied from a device once), or a refusal."""
    arr = to_numpy(index) if hasattr(index, "dtype") else np.asarray(index)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        try:
            name = dtype_name(index) if hasattr(index, "dtype") else str(arr.dtype)
        except Exception:  # pragma: no cover - exotic objects
            name = str(arr.dtype)
        raise FoldTypeError(
            f"the index must be an array of integers (int8 .. int64, uint8 .. uint64); "
            f"got dtype {name}"
        )
    return arr


class Fold:
    """A fold plan: ``plan(values)[k]`` sums the values whose index is ``k``.

    ``Fold(index, K)`` validates the index map once (integers, any shape, read
    in C order, every entry in ``[0, K)``) and keeps what every later call
    needs: a compact copy of the index, per-bucket ``counts``, ``offsets``
    and the stable sorted ``order`` (a counting sort, O(N + K) time and
    memory). The plan is immutable; build it once and call it every step.

    ``plan(values, strategy="exact")`` returns the K sums as an array of the
    same library as ``values``. The default ``exact`` strategy returns, for
    every bucket, the exact real sum rounded once to nearest-even (see
    :mod:`bitfold.exactsum` for zeros, NaN and Inf): the same bits for every
    order, thread count and split of the work. ``ordered`` adds each bucket's
    values in increasing position; ``atomic`` is the usual scatter-add.

    >>> import numpy as np, bitfold
    >>> plan = bitfold.Fold(np.array([[0, 2], [2, 1]]), K=3)
    >>> plan(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)).tolist()
    [1.0, 4.0, 5.0]
    >>> plan.expand(np.array([10.0, 20.0, 30.0])).tolist()
    [[10.0, 30.0], [30.0, 20.0]]
    """

    def __init__(self, index: Any, K: int) -> None:
        t0 = time.perf_counter()
        self._K = check_K(K)
        arr = _read_index(index)
        self._shape = tuple(int(s) for s in arr.shape)
        flat = np.ravel(arr, order="C")
        if not flat.dtype.isnative:
            flat = flat.astype(flat.dtype.newbyteorder("="))
        if flat.dtype.kind == "u" and flat.dtype.itemsize == 8:
            big = np.flatnonzero(flat > np.uint64(np.iinfo(np.int64).max))
            if big.size:
                self._raise_range(int(big[0]), int(flat[big[0]]))
            flat = flat.astype(np.int64)
        counts, bad = cpu.count_and_check(flat, self._K)
        if bad >= 0:
            self._raise_range(int(bad), int(flat[bad]))
        compact = np.int32 if self._K <= _INT32_MAX else np.int64
        self._index = np.ascontiguousarray(flat, dtype=compact)
        self._index.flags.writeable = False
        self._counts = counts
        self._counts.flags.writeable = False
        self._offsets = np.zeros(self._K + 1, np.int64)
        np.cumsum(counts, out=self._offsets[1:])
        self._offsets.flags.writeable = False
        n = self._index.size
        self._order = np.empty(n, np.int32 if n <= _INT32_MAX else np.int64)
        cpu.counting_sort(self._index, self._offsets, self._order)
        self._order.flags.writeable = False
        self._fingerprint: str | None = None
        self._device_cache: dict[Any, Any] = {}
        self.build_seconds = time.perf_counter() - t0

    def _raise_range(self, position: int, value: int) -> None:
        where = np.unravel_index(position, self._shape) if self._shape else ()
        raise IndexRangeError(
            f"index{list(int(w) for w in where)} = {value} (flat position {position}) is out "
            f"of range: every index must satisfy 0 <= index < K = {self._K}"
        )

    # -- what the plan holds ------------------------------------------------------
    @property
    def K(self) -> int:
        """Number of buckets (shared parameters)."""
        return self._K

    @property
    def size(self) -> int:
        """Number of positions N (elements of the index map)."""
        return int(self._index.size)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the index map; ``expand`` returns this shape."""
        return self._shape

    @property
    def index(self) -> np.ndarray:
        """The flat index (read-only, int32 when K fits, else int64)."""
        return self._index

    @property
    def counts(self) -> np.ndarray:
        """Values per bucket, int64, length K (read-only)."""
        return self._counts

    @property
    def offsets(self) -> np.ndarray:
        """``offsets[k] .. offsets[k+1]`` is bucket k's range in ``order`` (int64, K + 1)."""
        return self._offsets

    @property
    def order(self) -> np.ndarray:
        """Positions sorted by bucket, stable (increasing position within a bucket)."""
        return self._order

    def index64(self) -> np.ndarray:
        """The flat index as int64 (made on first use and kept: for NumPy's own scatter)."""
        idx = self._device_cache.get("index64")
        if idx is None:
            idx = self._index.astype(np.int64)
            idx.flags.writeable = False
            self._device_cache["index64"] = idx
        return idx

    @property
    def nbytes(self) -> int:
        """Bytes the plan holds (index copy, counts, offsets, order)."""
        return int(
            self._index.nbytes + self._counts.nbytes + self._offsets.nbytes + self._order.nbytes
        )

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of K and the flat index: equal for plans over the same map."""
        if self._fingerprint is None:
            h = hashlib.sha256(f"bitfold-plan K={self._K} n={self.size};".encode())
            h.update(self._index.astype("<i8", copy=False).tobytes())
            self._fingerprint = "sha256:" + h.hexdigest()
        return self._fingerprint

    def same_map(self, other: Fold) -> bool:
        """True when ``other`` folds the same positions into the same buckets."""
        if other is self:
            return True
        return (
            other.K == self.K and other.size == self.size and other.fingerprint == self.fingerprint
        )

    # -- folding ----------------------------------------------------------------
    def __call__(self, values: Any, strategy: str = "exact", *, out_dtype: Any = None) -> Any:
        """Fold ``values`` (any shape, ``size == self.size``) into K sums with ``strategy``."""
        from .strategies import get_strategy

        return get_strategy(strategy).fold(self, values, out_dtype=out_dtype)

    def accumulator(self, dtype: Any = "float32", **options: Any) -> Any:
        """A mergeable exact accumulator for values of ``dtype`` (see ``ExactAccumulator``)."""
        from .exactsum import ExactAccumulator

        return ExactAccumulator(self, dtype, **options)

    def expand(self, v: Any) -> Any:
        """``v[index]`` in the index's shape: the forward of a folded layer.

        ``v`` must be one-dimensional with K entries; the result is an array of
        the same library as ``v``.
        """
        from .errors import ShapeError

        lib = library_of(v)
        shape = tuple(getattr(v, "shape", np.shape(v)))
        if len(shape) != 1 or shape[0] != self._K:
            raise ShapeError(f"expand needs a vector of K = {self._K} entries; got shape {shape}")
        if lib == "torch":
            import torch

            key = ("torch-index", str(v.device))
            idx = self._device_cache.get(key)
            if idx is None:
                idx = torch.from_numpy(self._index.astype(np.int64)).to(v.device)
                self._device_cache[key] = idx
            return v[idx].reshape(self._shape)
        host = np.ascontiguousarray(to_numpy(v))
        out = np.empty(self.size, host.dtype)
        if host.dtype.kind == "f" and host.dtype.itemsize >= 4:
            cpu.gather(host, self._index, out)
        else:
            np.take(host, self._index, out=out)
        return from_numpy(out.reshape(self._shape), like=v)

    def __repr__(self) -> str:
        return f"Fold(K={self._K}, shape={self._shape}, size={self.size})"
