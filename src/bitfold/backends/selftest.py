"""Known answers before first use: the GPU kernel families check their bits on each device.

bitfold's promise is bits, and its GPU kernels meet devices, drivers and
compilers nobody here ran. So the first time a process folds values of one
dtype (into one output dtype) on one device with a GPU kernel family — the
Triton kernels, the numba-cuda kernels — that family first folds a small fixed
problem set on that device and compares the bits with the ones stored in the
package (``selftest_cases.json``, made once by the Fraction oracle:
``scripts/selftest_cases.py``). Two folds a pair: ``scalars`` (ties and
round-half-to-even at the output's precision, the oracle's boundary buckets of
the output format, subnormal sums crossing into the normal range, ``-0.0``,
NaN payloads, infinities, overflow, an empty bucket, a Zipf-shaped map whose
head is a hot bucket spanning the whole exponent range) and ``rows`` (three
columns, a hot bucket of rows), each with the tuning that cuts the hot bucket
in chunks (Triton) or segments (numba-cuda).

The contract:

* **When.** Once per process, backend, device and ``(value dtype, output
  dtype)`` pair, before the first fold that would use that backend there
  (:func:`admits`, asked by the dispatch for every fold, accumulator addition
  and route). The verdict is kept for the process (:func:`verdicts`,
  :func:`reset` for tests). Backends without a GPU kernel family (``host``,
  ``portable``) run nothing: they are the references.
* **Where.** On the values' own device: ``cuda:1`` is checked apart from
  ``cuda:0``; Triton's CPU interpreter (``TRITON_INTERPRET=1``, the tests) is
  the device ``cpu``. Not while the device cannot run it: inside a CUDA graph
  capture, or on tensors being traced (``torch.compile``'s fake tensors); the
  next fold outside runs it.
* **A mismatch or a kernel error** fails the backend on that device for the
  rest of the process (every dtype): one :class:`bitfold.errors.SelfTestWarning`
  names the device, its driver, the compiler (Triton's version, or numba's) and
  the failing case, and the fold moves to the next backend that passes its own
  test (Triton, then numba-cuda, then the portable path). A backend forced by
  name (``backend="triton"``) that fails raises
  :class:`bitfold.errors.SelfTestError` instead: there is nothing to move to.
* **BITFOLD_SELFTEST** (read at every fold): ``on`` (the default), ``strict``
  (a failure raises :class:`~bitfold.errors.SelfTestError` instead of warning and
  moving on), ``off`` (no test: every backend serves as registered).
* **Cost.** Per pair: two folds (Triton: six launches), two reads of their
  results back to the host and 0.1-0.4 ms of host work (reading the stored
  cases, comparing), after the compilation of the kernel variants the problem
  set uses (kept in Triton's cache across processes). In Triton's CPU
  interpreter, which runs every operation of every program in Python, a pair
  takes 0.6-0.9 s (float64 values, 67 limbs: about 3 s) on the 2-core test
  machine under load (``scripts/selftest_cost.py`` measures it on any device).

A backend takes part by giving its registry entry a :class:`KnownAnswers`:
how to place the problem's bits beside the values, which device they are on,
how to name it, when it cannot run the test now, and the tuning options of
each fold.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import to_numpy
from ..errors import FoldError, SelfTestError, SelfTestWarning
from ..formats import FLOATS, VALUE_DTYPES
from ..validate import check_values

if TYPE_CHECKING:
    from .registry import Backend

#: The environment variable that sets the test's mode, and its values.
ENV = "BITFOLD_SELFTEST"
MODES = ("on", "strict", "off")
#: The data file of the problem set, beside this module.
DATA = "selftest_cases.json"

PlanType = Callable[[Any, int], Any]


@dataclass(frozen=True)
class KnownAnswers:
    """What a GPU kernel family's registry entry gives the known-answer test.

    * ``family``: its name in messages (``"Triton"``, ``"numba-cuda"``);
    * ``device(values) -> str``: the device the values live on (``"cuda:0"``);
    * ``place(bits, dtype, values)``: the problem's values (host bit patterns
      of ``dtype``, an unsigned NumPy array) as an array the backend folds, on
      the device of ``values``;
    * ``about(values) -> dict``: ``device`` (its name), ``driver`` and
      ``compiler`` (versions), for the warning and the probe;
    * ``busy(values) -> bool``: True when the test cannot run now (a CUDA graph
      capture, values being traced); the fold goes ahead and the test runs at
      the next one;
    * ``options``: per fold of the problem set (``"scalars"``, ``"rows"``), the
      option sets its exact fold runs with (each one fold: tunings that send the
      hot bucket down the chunked path, or another kernel path);
    * ``dtypes``: the value dtypes the family folds with its kernels.
    """

    family: str
    device: Callable[[Any], str]
    place: Callable[[np.ndarray, str, Any], Any]
    about: Callable[[Any], dict[str, str]]
    options: Mapping[str, tuple[Mapping[str, Any], ...]]
    busy: Callable[[Any], bool] = lambda values: False
    dtypes: tuple[str, ...] = VALUE_DTYPES

    @classmethod
    def from_functions(cls, functions: Mapping[str, Any], **entry: Any) -> KnownAnswers:
        """Hooks that are the functions of ``functions`` (a backend module's ``globals()``)
        named ``device_of``, ``place``, ``about`` and ``busy`` (this one optional), as
        :meth:`bitfold.backends.registry.Backend.from_functions` takes a module's folds;
        ``entry`` holds the other fields."""
        hooks = {"device": "device_of", "place": "place", "about": "about", "busy": "busy"}
        found = {hook: functions[name] for hook, name in hooks.items() if name in functions}
        return cls(**found, **entry)


@dataclass
class Verdict:
    """What the known-answer test found for one backend on one device, in this process.

    ``passed`` is False from the first failing case on (``failure`` says which,
    and how); ``checked`` lists the ``"value dtype -> output dtype"`` pairs that
    passed; ``seconds`` the time spent running cases, compilation included on a
    first run; ``about`` names the device, driver and compiler.
    """

    backend: str
    family: str
    device: str
    about: dict[str, str]
    passed: bool = True
    checked: list[str] = field(default_factory=list)
    failure: str | None = None
    seconds: float = 0.0
    warned: bool = field(default=False, repr=False)  # the one warning of a failure was given
    pairs: set[tuple[str, str]] = field(default_factory=set, repr=False)  # checked, as tuples

    def as_dict(self) -> dict[str, Any]:
        """The verdict as JSON-ready data (the probe's report)."""
        return {"backend": self.backend, "family": self.family, "device": self.device,
                "about": dict(self.about), "passed": self.passed, "checked": list(self.checked),
                "failure": self.failure, "seconds": self.seconds}  # fmt: skip

    def line(self) -> str:
        """One line: which kernels, where, and the verdict."""
        where = f"the {self.family} kernels ({self.backend} backend) on {self.device}"
        if self.passed:
            pairs = ", ".join(self.checked) or "nothing yet"
            return f"{where}: passed ({pairs}; {self.seconds * 1e3:.1f} ms)"
        return f"{where}: FAILED, {self.failure}"


_LOCK = threading.RLock()
_VERDICTS: dict[tuple[str, str], Verdict] = {}
_PLANS: dict[tuple[Any, str, str], Any] = {}  # the cases' plans, made once


def mode() -> str:
    """The test's mode from ``BITFOLD_SELFTEST``: ``on`` (unset or empty), ``strict`` or ``off``;
    anything else is a :class:`bitfold.FoldError` naming the valid values."""
    raw = os.environ.get(ENV, "").strip().lower()
    value = {"": "on", "1": "on", "0": "off"}.get(raw, raw)
    if value not in MODES:
        raise FoldError(f"{ENV} must be one of {', '.join(MODES)}; got {raw!r}")
    return value


def verdicts() -> tuple[Verdict, ...]:
    """The verdicts of this process so far, in the order the tests first ran."""
    with _LOCK:
        return tuple(_VERDICTS.values())


def verdict(backend: str, device: str) -> Verdict | None:
    """The verdict for ``backend`` on ``device`` (``"cuda:0"``, ``"cpu"``), or None: not run."""
    with _LOCK:
        return _VERDICTS.get((backend, device))


def reset() -> None:
    """Forget every verdict (tests): the next fold on each device runs the test again."""
    with _LOCK:
        _VERDICTS.clear()


@contextlib.contextmanager
def fresh() -> Iterator[None]:
    """Run the block with no verdicts, then put back the ones kept before (tests: a test of
    the self-test leaves the rest of the process as it found it)."""
    with _LOCK:
        kept = dict(_VERDICTS)
        _VERDICTS.clear()
    try:
        yield
    finally:
        with _LOCK:
            _VERDICTS.clear()
            _VERDICTS.update(kept)


def cases(dtype: str, out_name: str) -> list[dict[str, Any]]:
    """The problem set's folds of ``dtype`` values into ``out_name`` (the stored data: name,
    K, shape, index, the values' bit patterns and the oracle's result bits)."""
    return _data()["cases"][dtype][out_name]


def _data() -> dict[str, Any]:
    global _CACHE
    if _CACHE is None:
        import importlib.resources  # only when a test runs: importing bitfold stays light

        text = importlib.resources.files(__package__).joinpath(DATA).read_text()
        _CACHE = json.loads(text)
    return _CACHE


_CACHE: dict[str, Any] | None = None


# -- the gate the dispatch asks --------------------------------------------------------------------
def admits(
    backend: Backend,
    values: Any,
    dtype: str,
    out_name: str,
    plan_type: PlanType,
    forced: bool = False,
) -> bool:
    """True when ``backend`` may fold ``values`` (``dtype`` into ``out_name``) on their device.

    Always True for a backend without :class:`KnownAnswers`, with the test
    ``off``, for a dtype its kernels do not take, or while the device cannot run
    the test (``busy``). Otherwise the test of that pair runs once (cached for
    the process) with plans made by ``plan_type(index, K)`` (the caller's plan
    class: plans sit above the backends). A backend that failed on the device
    is False, after one :class:`bitfold.errors.SelfTestWarning` at the failure;
    with ``strict``, or ``forced`` (the backend was named by the caller), it
    raises :class:`bitfold.errors.SelfTestError` instead.
    """
    hooks: KnownAnswers | None = getattr(backend, "known_answers", None)
    if hooks is None or dtype not in hooks.dtypes:
        return True
    device = hooks.device(values)
    found = _VERDICTS.get((backend.name, device))
    if found is not None and found.passed and (dtype, out_name) in found.pairs:
        return True  # the common case, every fold after the first: no more than this
    how = mode()
    if how == "off":
        return True
    if found is not None and not found.passed:
        return _refused(found, how, forced)
    if hooks.busy(values):
        return True
    with _LOCK:
        found = _VERDICTS.get((backend.name, device))
        if found is None:
            found = Verdict(backend.name, hooks.family, device, _about(hooks, values))
            _VERDICTS[(backend.name, device)] = found
        if found.passed and (dtype, out_name) not in found.pairs:
            _check(backend, hooks, found, values, dtype, out_name, plan_type)
        return found.passed or _refused(found, how, forced)


def check(
    backend: Backend, values: Any, pairs: list[tuple[str, str]], plan_type: PlanType
) -> Verdict:
    """Run the test of ``pairs`` (value dtype, output dtype) for ``backend`` on the device of
    ``values`` now, whatever is cached, and return a fresh verdict (kept by nothing;
    warns and raises nothing). The stored bits are the whole reference; ``values``
    only says where to run."""
    hooks: KnownAnswers | None = getattr(backend, "known_answers", None)
    if hooks is None:
        raise FoldError(f"the {backend.name} backend has no known-answer test (no GPU kernels)")
    found = Verdict(backend.name, hooks.family, hooks.device(values), _about(hooks, values))
    for dtype, out_name in pairs:
        if found.passed:
            _check(backend, hooks, found, values, dtype, out_name, plan_type)
    return found


def _about(hooks: KnownAnswers, values: Any) -> dict[str, str]:
    try:
        return {k: str(v) for k, v in hooks.about(values).items()}
    except Exception as err:  # naming the device must never stop a fold
        return {"device": f"unknown ({type(err).__name__}: {err})"}


def _check(
    backend: Backend, hooks: KnownAnswers, found: Verdict, values: Any, dtype: str,
    out_name: str, plan_type: PlanType,
) -> None:  # fmt: skip
    """Run one pair's folds; record it in ``found`` as checked, or its failure."""
    start = time.perf_counter()
    failure = _first_failure(backend, hooks, values, dtype, out_name, plan_type)
    found.seconds += time.perf_counter() - start
    if failure is None:
        found.checked.append(f"{dtype} -> {out_name}")
        found.pairs.add((dtype, out_name))
    else:
        found.passed, found.failure = False, failure


def _first_failure(
    backend: Backend, hooks: KnownAnswers, values: Any, dtype: str, out_name: str,
    plan_type: PlanType,
) -> str | None:  # fmt: skip
    """The first case whose bits differ from the stored ones, or whose fold raised, described;
    None when all match. (A missing or unreadable data file raises: the installation is
    broken, not the kernels.)"""
    fold = backend.fold("exact")
    unsigned = FLOATS[dtype].bits_dtype
    for case in cases(dtype, out_name):
        shape = tuple(case["shape"])
        plan = _plan(plan_type, dtype, out_name, case)
        bits = np.asarray(case["bits"], dtype=np.uint64).astype(unsigned).reshape(shape)
        spec = check_values(plan.shape, shape, dtype)
        want = np.asarray(case["expected"], dtype=np.uint64)
        for options in hooks.options.get(case["name"], ({},)):
            try:  # a kernel that raises (or values the device will not take) fails the case
                placed = hooks.place(bits, dtype, values)
                got = _result_bits(fold(plan, placed, spec, out_name, **options), out_name)
            except Exception as err:
                what = _case(case, dtype, out_name, options)
                return f"{what}: raised {type(err).__name__}: {err}"
            if got.shape != want.shape or not np.array_equal(got, want):
                return _mismatch(case, dtype, out_name, options, got, want)
    return None


def _case(case: dict[str, Any], dtype: str, out_name: str, options: Mapping[str, Any]) -> str:
    tuned = "".join(f", {k}={v!r}" for k, v in options.items())
    return f"case {case['name']!r} ({dtype} values -> {out_name}{tuned})"


def _plan(plan_type: PlanType, dtype: str, out_name: str, case: dict[str, Any]) -> Any:
    key = (plan_type, f"{dtype} -> {out_name}", case["name"])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = plan_type(np.asarray(case["index"], dtype=np.int64), case["K"])
    return plan


def _result_bits(result: Any, out_name: str) -> np.ndarray:
    """The result's bit patterns, flat, as uint64 (bfloat16: its 16 bits, whether the library
    returned bfloat16 or the float32 holding it)."""
    host = np.ascontiguousarray(to_numpy(result)).reshape(-1)
    if out_name == "bfloat16" and host.dtype == np.float32:
        return (host.view(np.uint32) >> np.uint32(16)).astype(np.uint64)
    return host.view(FLOATS[out_name].bits_dtype).astype(np.uint64)


def _mismatch(
    case: dict[str, Any], dtype: str, out_name: str, options: Mapping[str, Any],
    got: np.ndarray, want: np.ndarray,
) -> str:  # fmt: skip
    what = _case(case, dtype, out_name, options)
    if got.shape != want.shape:
        return f"{what}: {got.size} results where {want.size} were expected"
    bad = np.flatnonzero(got != want)
    cols = int(np.prod(case["shape"][1:], dtype=np.int64))
    first = int(bad[0])
    where = f"bucket {first // cols}" + (f", column {first % cols}" if cols > 1 else "")
    digits = FLOATS[out_name].width // 4
    gave, exact = (f"0x{int(b[first]):0{digits}x}" for b in (got, want))
    return f"{what}: {bad.size} of {want.size} results differ; {where} gave {gave}, not {exact}"


def _refused(found: Verdict, how: str, forced: bool) -> bool:
    """False (the fold moves on), after the one warning (the first refusal that does not
    raise gives it); or raise (strict, or forced)."""
    text = _message(found)
    if forced:
        raise SelfTestError(
            f"{text}. The {found.backend} backend was asked for by name, so nothing replaces it: "
            f"leave backend= out to fold on the next backend that passes its own test"
        )
    if how == "strict":
        raise SelfTestError(f"{text}. {ENV}=strict: nothing replaces it")
    with _LOCK:
        first, found.warned = not found.warned, True
    if first:
        warnings.warn(
            f"{text}. Folds there move to the next backend that passes its own test, for the "
            f"rest of this process ({ENV}=strict raises instead, {ENV}=off skips the test); "
            "please report it with this message",
            SelfTestWarning,
            stacklevel=_outside_bitfold(),
        )
    return False


def _outside_bitfold() -> int:
    """The ``stacklevel`` of the first caller outside the bitfold package (for ``_refused``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1  # _refused, which warns
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _message(found: Verdict) -> str:
    about = found.about
    named = "; ".join(f"{k} {about[k]}" for k in ("driver", "compiler") if k in about)
    device = about.get("device", found.device) + ("; " + named if named else "")
    return (f"bitfold's known-answer test failed for the {found.family} kernels on "
            f"{found.device} ({device}): {found.failure}")  # fmt: skip


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version (Linux: ``/proc/driver/nvidia/version``), or None."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    for word in text.split():
        if word[:1].isdigit() and "." in word:
            return word
    return text.splitlines()[0].strip() if text else None


__all__ = [
    "DATA",
    "ENV",
    "MODES",
    "KnownAnswers",
    "Verdict",
    "admits",
    "cases",
    "check",
    "fresh",
    "mode",
    "nvidia_driver",
    "reset",
    "verdict",
    "verdicts",
]
