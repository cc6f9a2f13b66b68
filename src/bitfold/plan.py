"""``Fold``: the plan built once from a static index map and called every step."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from . import dispatch
from .backends import device_plan
from .errors import FoldError, FoldTypeError
from .exact import ExactAccumulator
from .kernels import planning
from .validate import (
    check_has_data,
    check_K,
    check_K_fits,
    checked_options,
    index_range_error,
    read_index,
    type_label,
)

_INT32_MAX = np.iinfo(np.int32).max
T = TypeVar("T")


class Fold:
    """A fold plan: ``plan(values)[k]`` sums the values whose index is ``k``.

    ``Fold(index, K)`` validates the index map once (integers, any shape, read
    in C order, every entry in ``[0, K)``) and keeps what every later call
    needs: a compact copy of the index (in the narrowest integer type that
    holds K) and, for few buckets, the per-bucket ``offsets``, all in one
    parallel pass over the index (many buckets are counted when a route first
    needs them); the stable sorted ``order`` (a counting sort, O(N + K) time
    and memory) is built the first time a route needs it.
    The plan is immutable; build it once and call it every step. On the
    host it hands its large outputs' memory (1 MiB or more) out again once
    nothing holds the earlier result, no fresh pages every step
    (:mod:`bitfold.backends.host_buffers`; a result still held, or a view
    or tensor of it, is never touched).

    An index that is a torch tensor on a device (a CUDA tensor) never leaves
    it: the plan is checked, sorted and counted there by torch operations,
    with one flag read back (any entry out of range?), and keeps its arrays
    there as tensors (:attr:`device`, :attr:`device_tensors`,
    :mod:`bitfold.backends.device_plan`); its host arrays are made from one
    host copy only when something asks for them (a CPU fold, :attr:`fingerprint`).

    ``plan(values, strategy="exact")`` returns the K sums as an array of the
    same library (and device) as ``values``. The default ``exact`` strategy
    returns, for every bucket, the exact real sum rounded once to
    nearest-even (zeros, NaN and Inf as in :mod:`bitfold.exact`): the same
    bits for every order, thread count, split of the work, backend and
    device. ``ordered`` adds each bucket's values in increasing position;
    ``atomic`` is the usual scatter-add.

    >>> import numpy as np, bitfold
    >>> plan = bitfold.Fold(np.array([[0, 2], [2, 1]]), K=3)
    >>> plan(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)).tolist()
    [1.0, 4.0, 5.0]
    >>> plan.expand(np.array([10.0, 20.0, 30.0])).tolist()
    [[10.0, 30.0], [30.0, 20.0]]
    """

    @checked_options
    def __init__(self, index: Any, K: int) -> None:
        flat = self._begin(index, K)
        if flat is not None:
            self._check_index(flat)

    def _begin(self, index: Any, K: int) -> np.ndarray | None:
        """Read K and the index (dtype and shape checked): the flat index, entries unchecked.

        A torch tensor on a device (:func:`bitfold.backends.device_plan.builds_on_device`)
        is checked and planned there at once instead, its tensors kept on the plan: None.
        """
        t0 = time.perf_counter()
        self._K = check_K(K)
        check_K_fits(self._K)
        self._device_tensors: device_plan.PlanTensors | None = None
        self._unchecked: np.ndarray | None = None
        if device_plan.builds_on_device(index):
            self._shape, self._device_tensors = device_plan.build(index, self._K)
            self._size = int(self._device_tensors.index.numel())
        else:
            arr = read_index(index)
            self._shape = tuple(int(s) for s in arr.shape)
            self._unchecked = arr.reshape(-1)
            self._size = int(self._unchecked.size)
        self._positions = np.int32 if self._size <= _INT32_MAX else np.int64
        self._index: np.ndarray | None = None
        self._offsets: np.ndarray | None = None
        self._counts: np.ndarray | None = None
        self._order: np.ndarray | None = None
        self._sorted_index: np.ndarray | None = None
        self._fingerprint: str | None = None
        self._prepared: dict[Any, Any] = {}
        self._once = False
        if self._device_tensors is not None:
            device_plan.keep_built(self, self._device_tensors)
        self.build_seconds = time.perf_counter() - t0
        return self._unchecked

    def _check_index(self, flat: np.ndarray) -> np.ndarray:
        """Check every entry of ``flat``, keep its compact copy (and, for few buckets, the
        offsets), in one pass; the compact index."""
        t0 = time.perf_counter()
        n = flat.size
        # few buckets: counted in the checking pass (their counts stay in the caches); many:
        # counted when a route first needs the offsets (a one-shot float stream never does)
        eager = self._K <= planning.EAGER_COUNT_MAX_K
        chunks = planning.chunk_count(n, self._K if eager else 1)
        offsets = None
        with _bucket_memory(self._K, n):
            if eager:  # the K + 1 offsets, and one count a bucket per chunk when there are several
                offsets = np.zeros(self._K + 1, self._positions)
                shape = (chunks, self._K)
                counts = (offsets[1:].reshape(shape) if chunks == 1
                          else np.zeros(shape, self._positions))  # fmt: skip
            else:
                counts = np.zeros((chunks, 0), self._positions)
        compact = np.empty(n, planning.index_dtype(self._K))
        bad = planning.scan_index(flat, compact, counts, self._K)
        if bad >= 0:
            raise index_range_error(self._shape, bad, int(flat[bad]), self._K)
        if offsets is not None:
            planning.offsets_from_counts(counts, offsets)  # one chunk: counted in the offsets
        self._index = index = _frozen(compact)
        self._offsets = None if offsets is None else _frozen(offsets)
        self._unchecked = None
        self.build_seconds += time.perf_counter() - t0
        return index

    # -- what the plan holds ------------------------------------------------------
    @property
    def K(self) -> int:
        """Number of buckets (shared parameters)."""
        return self._K

    @property
    def size(self) -> int:
        """Number of positions N (elements of the index map)."""
        return self._size

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the index map; ``expand`` returns this shape."""
        return self._shape

    @property
    def index(self) -> np.ndarray:
        """The flat index, read-only, in the narrowest type that holds K.

        uint16 for K <= 65,536, int32 for K < 2^31, else int64. A one-shot plan
        (:func:`one_shot`) checks its entries and makes this copy on first use;
        a plan built on a device (:attr:`device`) copies its index to the host
        once, on first use (the other host arrays are then made from this one).
        """
        index, unchecked = self._index, self._unchecked
        if index is None:
            if unchecked is not None:
                index = self._check_index(unchecked)
            elif self._device_tensors is not None:
                t0 = time.perf_counter()
                self._index = index = _frozen(device_plan.host_index(self._device_tensors, self._K))
                self.build_seconds += time.perf_counter() - t0
        return index

    @property
    def device(self) -> str | None:
        """The torch device the plan was built on (``"cuda:0"``, ...), or None: built on the host.

        A plan of a torch tensor on a device other than the CPU is checked,
        sorted and counted there (:mod:`bitfold.backends.device_plan`): its
        index data stay there (:attr:`device_tensors`), and the host arrays
        (:attr:`index`, :attr:`offsets`, :attr:`order`, ...) are made from one
        host copy of the index only when something asks for them.
        """
        tensors = self._device_tensors
        return None if tensors is None else str(tensors.device)

    @property
    def device_tensors(self) -> device_plan.PlanTensors | None:
        """The torch tensors a plan built on a device was built as (on :attr:`device`), or None.

        The same object as ``device_plan.plan_tensors(plan, plan.device)``: the
        flat index (int64), the stable order, the sorted index, the counts and
        the offsets (see :class:`bitfold.backends.device_plan.PlanTensors`).
        """
        return self._device_tensors

    @property
    def once(self) -> bool:
        """True for a plan built for one fold (:func:`one_shot`, :func:`bitfold.segment_sum`).

        Routes then skip what only pays back over many folds (the partitioned
        stream's layout).
        """
        return self._once

    @property
    def unchecked_index(self) -> np.ndarray | None:
        """The caller's flat index while no entry of it is checked yet, else None.

        Only a one-shot plan (:func:`one_shot`) has one, until its first use of
        :attr:`index`: a route that reads the index in position order may read
        this array instead, checking each entry as it adds its value; one
        outside ``[0, K)`` makes it read :attr:`index`, which raises the plan's
        usual :class:`bitfold.IndexRangeError` (the first bad position).
        """
        return self._unchecked

    @property
    def counts(self) -> np.ndarray:
        """Values per bucket, int64, length K (read-only; made on first use from ``offsets``)."""
        if self._counts is None:
            self._counts = _frozen(np.diff(self.offsets).astype(np.int64))
        return self._counts

    @property
    def offsets(self) -> np.ndarray:
        """``offsets[k] .. offsets[k+1]`` is bucket k's range in ``order`` (K + 1 entries).

        int32 when the plan has fewer than 2^31 positions, else int64 (like ``order``).
        Made when the plan is built for up to :data:`planning.EAGER_COUNT_MAX_K`
        buckets, else on first use (one parallel counting pass).
        """
        if self._offsets is None:
            index = self.index  # a one-shot plan checks here (and counts few buckets)
            if self._offsets is None:
                with _bucket_memory(self._K, self.size):
                    offsets = planning.bucket_offsets(index, self._K, self._positions)
                self._offsets = _frozen(offsets)
        return self._offsets

    @property
    def order(self) -> np.ndarray:
        """Positions sorted by bucket, stable (increasing position within a bucket).

        Built on first use: the routes that fold in position order never need
        it, so a one-shot fold does not pay it. A parallel counting sort
        (O(N + K)) from the offsets; with more buckets than positions (past
        :data:`planning.EAGER_COUNT_MAX_K`), a radix sort (a few passes over
        the positions, no K-long array) that also gives :attr:`sorted_index`.
        The stable order is unique: both give the same array. Same dtype as
        ``offsets``.
        """
        order = self._order
        if order is None:
            order = np.empty(self.size, self._positions)
            index = self.index
            if self._offsets is None and planning.prefer_radix(self.size, self._K):
                sorted_index = np.empty(self.size, index.dtype)
                planning.radix_order(index, self._K, order, sorted_index)
                self._sorted_index = _frozen(sorted_index)
            else:
                planning.stable_order(index, self.offsets, order)
            self._order = order = _frozen(order)
        return order

    @property
    def sorted_index(self) -> np.ndarray:
        """The bucket of every position of :attr:`order` (``index[order]``), read-only.

        Non-decreasing, in the index's dtype; made on first use (with the
        order by a radix sort, else written in sequence from the offsets).
        """
        if self._sorted_index is None:
            order = self.order  # a radix sort leaves the sorted index too
            if self._sorted_index is None:
                sorted_index = np.empty(order.size, self.index.dtype)
                planning.sorted_buckets(self.offsets, sorted_index)
                self._sorted_index = _frozen(sorted_index)
        return self._sorted_index

    @property
    def nbytes(self) -> int:
        """Bytes the plan holds now, on the host and on devices: :attr:`host_nbytes` plus
        :attr:`device_nbytes`."""
        return self.host_nbytes + self.device_nbytes

    @property
    def host_nbytes(self) -> int:
        """Bytes the plan holds on the host now: index copy, and what it built so far.

        The offsets (at once for few buckets, else on first use), the order
        and the sorted index (built when a route first needs them), ``counts``
        once made, the host arrays backends and adapters derived from it and
        keep (int64 copies of the index for NumPy's and PyTorch's CPU
        scatters, the partitioned stream's layout, task tables, the portable
        path's constants on the CPU), and the large outputs and scratch arrays it
        keeps for reuse (:mod:`bitfold.backends.host_buffers`: at most two of
        a shape, of 1 MiB or more, whether a caller still holds them or not).
        A plan built on a device holds no host array until one is asked for.
        """
        held = [self._index, self._offsets, self._order, self._sorted_index, self._counts]
        held += [a for a in self._prepared_arrays() if _on_host(a)]
        return _distinct_nbytes(held)

    @property
    def device_nbytes(self) -> int:
        """Bytes the plan holds on devices (GPUs) now, each array counted once.

        The tensors of a plan built on a device (:attr:`device_tensors`), and
        what backends and adapters keep on the plan there: its index data as
        torch tensors (:func:`bitfold.backends.device_plan.plan_tensors`), the
        CUDA backend's uploaded arrays and scratch buffers, the portable path's
        constants, CuPy and JAX copies of the index. Memory a fold allocates
        and releases is not counted. (Tensors in CPU memory, as a plan built
        under :func:`bitfold.backends.device_plan.forced_device_build` has,
        count in :attr:`host_nbytes`.)
        """
        return _distinct_nbytes([a for a in self._prepared_arrays() if not _on_host(a)])

    def _prepared_arrays(self) -> list[Any]:
        """The arrays of everything :meth:`prepared` keeps, as each value names them."""
        return [a for value in list(self._prepared.values()) for a in _held_arrays(value)]

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of K and the flat index: equal for plans over the same map."""
        if self._fingerprint is None:
            h = hashlib.sha256(f"bitfold-plan K={self._K} n={self.size};".encode())
            h.update(self.index.astype("<i8", copy=False).tobytes())
            self._fingerprint = "sha256:" + h.hexdigest()
        return self._fingerprint

    def same_map(self, other: Fold) -> bool:
        """True when ``other`` folds the same positions into the same buckets."""
        if not isinstance(other, Fold):
            raise FoldTypeError(
                f"same_map compares two bitfold.Fold plans; got a {type_label(other)}"
            )
        if other is self:
            return True
        return (
            other.K == self.K and other.size == self.size and other.fingerprint == self.fingerprint
        )

    def same_index(self, index: Any) -> bool:
        """True when the host array ``index`` holds this plan's ids, entry for entry.

        ``index`` must have the plan's :attr:`shape` and an integer dtype (else
        False); it is read once, in parallel, without a copy when it is
        C-contiguous. A caller that meets an index again (a training loop's
        edge list) can reuse the plan, its order and its device copies after
        this check instead of building a new one: the check reads the index,
        building a plan also sorts it.
        """
        check_has_data(index, "index")
        arr = np.asarray(index)
        if arr.dtype.kind not in "iu" or arr.shape != self._shape:
            return False
        return planning.same_entries(read_index(arr).reshape(-1), self.index)

    def prepared(self, key: Any, build: Callable[[], T]) -> T:
        """What a backend or adapter derives once from this plan, built by ``build()`` on first use.

        Device copies of the index (per library and device), an int64 copy for
        NumPy's scatter, and the like: ``key`` names the thing (a frozen
        dataclass of the module that owns the cache, say
        ``device_plan.TensorsKey("cuda:0")``), ``build`` makes it, and the plan
        keeps it for its lifetime. This is the only way anything is cached on
        a plan; :attr:`nbytes` counts what the value holds
        (:mod:`bitfold.plan_view`), whatever its key.
        """
        value = self._prepared.get(key)
        if value is None:
            value = build()
            self._prepared[key] = value
        return value

    # -- folding ----------------------------------------------------------------
    def __call__(
        self,
        values: Any,
        strategy: str = "exact",
        *,
        out_dtype: Any = None,
        backend: Any = None,
        **options: Any,
    ) -> Any:
        """Fold ``values`` into K sums with ``strategy`` (see :func:`bitfold.dispatch.fold`).

        ``backend`` (``"host"``, ``"cuda"``, ``"portable"``) forces a backend; by
        default the values' family and device choose it. ``options`` are
        ``init=`` (an array of shape ``(K,) + trailing`` the values are added
        into) and the backend's tuning options (host ``exact``: ``route=``,
        ``kernel=``, ``carry_every=``), which never change an ``exact`` result;
        any other keyword is a :class:`bitfold.errors.UnknownOptionError` (a
        :class:`bitfold.FoldError`) listing the valid ones, raised before any work.
        """
        return dispatch.fold(
            self, values, strategy, out_dtype=out_dtype, backend=backend, **options
        )

    def route(self, values: Any, strategy: str = "exact", **options: Any) -> dispatch.Route:
        """Which backend and which of its routes would fold ``values``, and why (folds nothing).

        >>> import numpy as np, bitfold
        >>> bitfold.Fold(np.arange(6) % 3000, 3000).route(np.ones(6, np.float32))
        ... # doctest: +ELLIPSIS
        Route(backend='host', route='float-stream', reason='float32 scalars into 3,000 ...')
        """
        return dispatch.route(self, values, strategy, **options)

    def accumulator(
        self, dtype: Any = "float32", trailing: Any = (), **options: Any
    ) -> ExactAccumulator:
        """A mergeable exact accumulator of values of ``dtype`` and rows of shape ``trailing``.

        See :class:`bitfold.ExactAccumulator`; its state takes ``(L + 5) * 8``
        bytes per output element (120 for float32 values).
        """
        return ExactAccumulator(self, dtype, trailing, **options)

    @checked_options
    def expand(self, v: Any) -> Any:
        """``v[index]``: the forward of a folded layer (or of an embedding lookup).

        ``v`` has shape ``(K,)`` or ``(K,) + trailing``; the result has shape
        ``index.shape + trailing``, in the library and on the device of ``v``.
        """
        return dispatch.expand(self, v)

    def __repr__(self) -> str:
        return f"Fold(K={self._K}, shape={self._shape}, size={self.size})"


def one_shot(index: Any, K: int) -> Fold:
    """A plan for one fold (:func:`bitfold.segment_sum`) whose entries its fold checks.

    K, the index's dtype and its shape are checked at once, as by :class:`Fold`;
    the entries are checked on the plan's first use of :attr:`Fold.index`, or,
    on a route that reads the index in position order, by that route as it
    adds each value (:attr:`Fold.unchecked_index`): one pass over the index
    fewer, and an entry outside ``[0, K)`` is refused with the same
    :class:`bitfold.IndexRangeError`. The index must not change before the
    fold. Routes skip what pays back only over many folds (:attr:`Fold.once`).

    Up to :data:`planning.EAGER_COUNT_MAX_K` buckets the entries are checked at
    once, as by :class:`Fold`: that pass also counts the buckets, and the
    2-byte copy it makes is read about twice as fast as an int64 index by a
    stream into so few buckets (3.6 against 7.2 ms into 2,000 buckets, N =
    3,145,728, two threads).
    """
    plan = Fold.__new__(Fold)
    flat = plan._begin(index, K)
    plan._once = True
    if flat is not None and plan.K <= planning.EAGER_COUNT_MAX_K:
        plan._check_index(flat)
    return plan


@contextlib.contextmanager
def _bucket_memory(K: int, n: int) -> Iterator[None]:
    """Turn a MemoryError while making per-bucket arrays into a clear refusal naming K."""
    try:
        yield
    except MemoryError:
        raise FoldError(
            f"K = {K:,} buckets do not fit in memory: the plan keeps "
            f"{offsets_bytes(K, n)} bytes a bucket; use a smaller K"
        ) from None


def offsets_bytes(K: int, n: int) -> int:
    """Bytes a plan's offsets take per bucket (4 below 2^31 positions, else 8)."""
    return 4 if n <= _INT32_MAX else 8


def _held_arrays(value: Any) -> list[Any]:
    """The arrays ``value`` is or holds (in a tuple, list, dict or dataclass), each with ``nbytes``.

    A value with a ``held_arrays()`` method (:class:`bitfold.plan_view.HoldsArrays`,
    as the host's reused buffers) names them itself. NumPy arrays, PyTorch
    tensors, JAX arrays, CuPy arrays and numba device arrays (any library's
    only where it is already imported; any object with
    ``__cuda_array_interface__`` and ``nbytes``).
    """
    if isinstance(value, np.ndarray):
        return [value]
    if callable(getattr(type(value), "held_arrays", None)):
        return list(value.held_arrays())
    if isinstance(value, (tuple, list)):
        return [a for item in value for a in _held_arrays(item)]
    if isinstance(value, dict):
        return [a for item in value.values() for a in _held_arrays(item)]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return [value]
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.Array):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [a for f in dataclasses.fields(value) for a in _held_arrays(getattr(value, f.name))]
    if hasattr(type(value), "__cuda_array_interface__") and hasattr(value, "nbytes"):
        return [value]  # CuPy, numba device arrays
    return []


def _on_host(a: Any) -> bool:
    """True for an array in host memory (NumPy, and CPU tensors and CPU JAX arrays)."""
    if isinstance(a, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return a.device.type == "cpu"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(a, jax.Array):
        return all(d.platform == "cpu" for d in a.devices())
    return False


def _distinct_nbytes(arrays: list[Any]) -> int:
    """The bytes of ``arrays``, each counted once (None skipped).

    A torch tensor counts its storage, once for all the tensors that view it
    (a plan's offsets and the starts sliced from them are one allocation).
    """
    torch = sys.modules.get("torch")
    seen: set[Any] = set()
    total = 0
    for a in arrays:
        if a is None:
            continue
        if torch is not None and isinstance(a, torch.Tensor):
            storage = a.untyped_storage()
            key: Any = ("storage", str(a.device), storage.data_ptr())
            size = storage.nbytes()
        else:
            key, size = id(a), a.nbytes
        if key not in seen:
            seen.add(key)
            total += int(size)
    return total


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


__all__ = ["Fold", "one_shot"]
