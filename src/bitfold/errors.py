"""One exception family for everything bitfold refuses.

Every error names the offending value and what would have been accepted.
``FoldError`` subclasses ``ValueError`` so that callers who already catch
``ValueError`` keep working; errors about the *type* of an argument are
``FoldTypeError``, which is also a ``TypeError``.
"""

from __future__ import annotations


class FoldError(ValueError):
    """Base class of every error bitfold raises on bad input."""


class FoldTypeError(FoldError, TypeError):
    """An argument has a type or dtype that bitfold does not accept."""


class IndexRangeError(FoldError, IndexError):
    """An index value is negative or not below ``K``.

    Also an ``IndexError``, so that code written for the library a drop-in
    replaces (torch raises ``IndexError`` for an id beyond an embedding table)
    still catches it.
    """


class ShapeError(FoldError):
    """Values do not match the plan's size, or a state array has the wrong shape."""


class UnknownStrategyError(FoldError, KeyError):
    """A strategy name is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownOptionError(FoldError, TypeError):
    """A keyword argument (an option) that the call does not take; the message lists those it does.

    Also a ``TypeError``, what Python raises for an unexpected keyword argument,
    so that code written for the function a drop-in replaces still catches it.
    """


class DeviceError(FoldError):
    """Values live on a device the plan cannot serve (or the device is unavailable)."""


class DistributedError(FoldError):
    """A collective failed: a rank died, hung past the timeout, or disagrees with the others."""


class SelfTestError(DeviceError):
    """A GPU kernel family failed its known-answer test on a device, and nothing may replace it.

    Raised where :class:`SelfTestWarning` would be warned when the test is strict
    (``BITFOLD_SELFTEST=strict``), and always when the failing backend was forced by
    name (``backend="triton"``): there is no other backend to move to.
    """


class BitfoldWarning(UserWarning):
    """Base class of the warnings bitfold gives (filter them by this class)."""


class SelfTestWarning(BitfoldWarning):
    """A GPU kernel family failed its known-answer test on a device; folds there moved on.

    Given once per backend and device in a process; the message names the device,
    its driver, the compiler and the failing case (:mod:`bitfold.backends.selftest`).
    """
