"""What a backend may read of a plan: the :class:`PlanView` protocol, and what a cache holds.

:class:`bitfold.Fold` builds a plan; the backends, :mod:`bitfold.dispatch` and
:mod:`bitfold.exact` sit below it and never import it, not even for their
annotations: they are written against this protocol, which imports nothing of
bitfold, and ``Fold`` has every member of it in its kind (``tests/test_plan_view.py``).

A backend reads, never sets, the plan's sizes (``K``, ``size``, ``shape``), its host arrays
(``index``, ``offsets``, ``counts``, ``order``, ``sorted_index``: each made on
first use and read-only), whether it was built for one fold (``once``,
``unchecked_index``), the torch tensors of a plan built on a device
(``device_tensors``), and keeps what it derives from the plan through
``prepared(key, build)``: one cache per thing, its key a frozen dataclass of the
module that owns the cache (a :class:`PlanKey` or :class:`DeviceKey` subclass, or
a dataclass of its own). Frozen dataclasses compare equal only to their own
class, so two caches cannot collide on equal fields, as tuples or NamedTuples
would. A backend writes nothing else on a plan.

A cached value tells the plan what it holds: a value with a ``held_arrays()``
method (:class:`HoldsArrays`) names its arrays itself; any other value is read
as an array, or a tuple, list, dict or dataclass of them. The plan counts each
array once in :attr:`bitfold.Fold.nbytes` (two caches may hold one tensor: the
flat index on a device is its own cache and a field of the device's tensors),
so no key is special to it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class PlanKey:
    """A key of :meth:`PlanView.prepared` for a thing a plan has one of: subclass it per cache.

    Every instance of one subclass is equal; instances of two subclasses never are.
    """


@dataclass(frozen=True)
class DeviceKey:
    """A key for a thing a plan has one of per device: subclass it per cache.

    Equal for one subclass and one ``device`` (a torch device's ``str``, a CUDA
    ordinal); instances of two subclasses never are.
    """

    device: Hashable


class HoldsArrays(Protocol):
    """A cached value that names the arrays it holds (read by :attr:`bitfold.Fold.nbytes`)."""

    def held_arrays(self) -> Iterable[Any]:
        """The arrays this value holds now, each with ``nbytes`` (or a torch tensor)."""
        ...


class PlanView(Protocol):
    """What a backend may read of a plan (:class:`bitfold.Fold` is one); see the module."""

    @property
    def K(self) -> int:
        """Number of buckets."""
        ...

    @property
    def size(self) -> int:
        """Number of positions N (elements of the index map)."""
        ...

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the index map."""
        ...

    @property
    def index(self) -> Any:
        """The flat index (NumPy, read-only, the narrowest integer type that holds K)."""
        ...

    @property
    def offsets(self) -> Any:
        """K + 1 offsets of the buckets' runs in :attr:`order` (NumPy, read-only)."""
        ...

    @property
    def counts(self) -> Any:
        """Values per bucket, int64, length K (NumPy, read-only)."""
        ...

    @property
    def order(self) -> Any:
        """Positions sorted by bucket, stable (NumPy, read-only)."""
        ...

    @property
    def sorted_index(self) -> Any:
        """The bucket of every position of :attr:`order` (NumPy, read-only)."""
        ...

    @property
    def once(self) -> bool:
        """True for a plan built for one fold."""
        ...

    @property
    def unchecked_index(self) -> Any:
        """A one-shot plan's flat index while its entries are unchecked, else None."""
        ...

    @property
    def device_tensors(self) -> Any:
        """The torch tensors of a plan built on a device
        (:class:`bitfold.backends.device_plan.PlanTensors`), else None."""
        ...

    def prepared(self, key: Any, build: Callable[[], T]) -> T:
        """What ``build()`` makes, made once under ``key`` and kept by the plan."""
        ...


class AccumulatorPlan(PlanView, Protocol):
    """What an accumulator reads of its plan besides a backend's view: whether two maps agree."""

    def same_map(self, other: Any) -> bool:
        """True when ``other`` folds the same positions into the same buckets."""
        ...


__all__ = ["AccumulatorPlan", "DeviceKey", "HoldsArrays", "PlanKey", "PlanView"]
