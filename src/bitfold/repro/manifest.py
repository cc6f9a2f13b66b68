"""Run manifests: record digests of named tensors per step, read them back, compare two runs.

A manifest is a JSON-lines file (plain JSON, never pickle). Every line is
one JSON object carrying ``"format": "bitfold-manifest"`` and
``"version": 1`` so that foreign JSON is recognised, and a ``"kind"``:

* ``"header"`` (the first line): ``created`` (UTC time, informative only),
  ``meta`` (what the caller passed to :func:`record`) and ``env``, the
  environment fingerprint of :func:`bitfold.repro.fingerprint.fingerprint`;
* ``"step"`` (one line per :meth:`Recorder.log` call): ``step`` (an int),
  ``tensors`` (a list of ``[name, digest]`` pairs in the order they were
  logged; ``digest`` is :func:`bitfold.digest` of the tensor, so it covers
  dtype, shape and every bit) and, when given, ``meta`` (small JSON values
  such as the loss; non-finite floats are written as the strings ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``);
* ``"end"`` (written by :meth:`Recorder.close`): ``records`` (how many step
  lines precede it), ``threads`` (the thread settings again, since libraries
  change them while a run goes on) and ``error`` when the ``with`` block
  ended with an exception. A manifest without it comes from a run that
  stopped early.

Each line is flushed when written, so a crashed run leaves a readable
manifest up to its last step.

:func:`compare` walks two manifests step record by step record and finds
the first tensor whose digests differ, in recorded order, so the earliest
cause shows first; ``bitfold diff`` (:mod:`bitfold.cli.diff`) prints it.

Importing this module imports nothing heavier than bitfold itself;
PyTorch, JAX and CuPy are only looked at when the caller has imported them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import library_of
from ..errors import FoldError, FoldTypeError
from ..validate import checked_options
from .digest import digest
from .fingerprint import fingerprint, thread_settings

#: The value of ``"format"`` in every manifest record.
FORMAT = "bitfold-manifest"
#: The manifest version this bitfold writes and reads.
VERSION = 1


# --------------------------------------------------------------------------- writing
def _jsonable(value: Any, where: str) -> Any:
    """``value`` as plain JSON (numbers, strings, bools, None, lists, string-keyed dicts)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise FoldTypeError(f"{where}: metadata keys must be strings; got {k!r}")
            out[k] = _jsonable(v, where)
        return out
    if isinstance(value, list | tuple):
        return [_jsonable(v, where) for v in value]
    item = getattr(value, "item", None)  # NumPy scalars, one-element arrays and tensors
    if callable(item):
        try:
            scalar = item()
        except (ValueError, RuntimeError, TypeError):
            scalar = value
        if scalar is not value:
            return _jsonable(scalar, where)
    raise FoldTypeError(
        f"{where}: metadata must be JSON values (numbers, strings, bools, None, lists, dicts) "
        f"or scalars; got a {type(value).__module__}.{type(value).__qualname__}"
    )


def _record(kind: str, **fields: Any) -> str:
    rec = {"format": FORMAT, "version": VERSION, "kind": kind, **fields}
    return json.dumps(rec, allow_nan=False, separators=(",", ":")) + "\n"


def model_tensors(model: Any, params: bool = True, grads: bool = True) -> dict[str, Any]:
    """The named tensors :meth:`Recorder.log_model` records for a PyTorch module.

    The one tensor order of every manifest that records a model, whichever
    tool writes it (``bitfold train --record`` uses it too): gradients first,
    as ``"grad/<name>"`` in parameter-registration order
    (``model.named_parameters()``, the forward order of a sequential model),
    skipping parameters without a gradient; then the parameters, as
    ``"param/<name>"`` in the same order. Gradients come first because a
    difference in a gradient is the cause of the difference in the
    parameters it updates, so ``bitfold diff`` names the cause.

    ``model`` must be a ``torch.nn.Module`` (anything with
    ``named_parameters()``); anything else raises :class:`FoldTypeError`.
    """
    named_parameters = getattr(model, "named_parameters", None)
    if not callable(named_parameters):
        raise FoldTypeError(
            f"log_model: model must be a torch.nn.Module (an object with named_parameters()); "
            f"got a {type(model).__module__}.{type(model).__qualname__}. To record a mapping "
            "name -> tensor (a state dict, NumPy or JAX arrays) use rec.log(step, tensors)"
        )
    named = list(named_parameters())
    out: dict[str, Any] = {}
    if grads:
        for name, p in named:
            if p.grad is not None:
                out[f"grad/{name}"] = p.grad
    if params:
        for name, p in named:
            out[f"param/{name}"] = p
    return out


def _flatten_output(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        out.append((prefix, value))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _flatten_output(f"{prefix}.{k}", v, out)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _flatten_output(f"{prefix}.{i}", v, out)


def _snapshot(value: Any) -> Any:
    """A private copy of ``value`` to digest later, or its digest now when no cheap copy exists."""
    lib = library_of(value)
    if lib == "torch":
        return value.detach().clone()
    if lib == "numpy":
        return np.array(value, copy=True)
    if lib == "jax":  # immutable
        return value
    return digest(value)


def _resolve(entries: list[tuple[str, Any]]) -> list[list[str]]:
    return [[n, v if isinstance(v, str) else digest(v)] for n, v in entries]


class Recorder:
    """Writes a run manifest; create it with :func:`record`.

    ``log(step, tensors)`` appends one line with the digest of each named
    tensor, in the order given; ``records`` counts the lines written. What is
    recorded is the tensors' contents at the ``log`` call: later in-place
    updates do not change it. With
    ``background=True`` the tensors are copied at the call (a ``memcpy``) and
    digested by one worker thread, in order; the manifest is the same, and an
    error in a worker is raised by the next ``log`` or by ``close``.
    """

    #: step records that may wait for the background worker before ``log`` blocks.
    MAX_IN_FLIGHT = 2

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
        *,
        background: bool = False,
    ):
        self.path = Path(path)
        self.meta = _jsonable(dict(meta or {}), f"record({str(self.path)!r}) meta")
        self.records = 0
        self.background = bool(background)
        self._pending: list[tuple[str, Any]] = []
        self._hooks: list[Any] = []
        self._inflight: deque[Future[None]] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._worker_error: str | None = None
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fh: Any = open(self.path, "w", encoding="utf-8")
        except OSError as err:
            raise FoldError(
                f"cannot write the manifest {str(self.path)!r}: {err.strerror}; "
                "give the path of a file to create"
            ) from None
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._write(_record("header", created=created, meta=self.meta, env=fingerprint()))

    # -- context manager -------------------------------------------------------------
    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            self.close()
        else:  # the block's exception wins over a background worker's
            self._close(f"{exc_type.__name__}: {exc}", raise_worker_error=False)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._fh is None

    def _check_open(self) -> None:
        if self._fh is None:
            raise FoldError(f"the manifest {str(self.path)!r} is closed; it takes no more records")

    def _write(self, line: str) -> None:
        self._check_open()
        self._fh.write(line)
        self._fh.flush()

    # -- logging ---------------------------------------------------------------------
    @checked_options
    def log(
        self,
        step: int,
        tensors: Mapping[str, Any] | None = None,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the digests of ``tensors`` (name -> array of any library) at ``step``.

        Outputs captured by :meth:`watch` since the previous call come first,
        then ``tensors`` in their order. ``meta`` holds small JSON values
        (loss, learning rate); it is shown by ``bitfold diff`` but not compared.
        """
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int):
            item = getattr(step, "item", None)
            if isinstance(step, bool) or not callable(item) or not isinstance(item(), int):
                raise FoldTypeError(f"log: step must be an int; got {step!r}")
            step = int(item())
        if tensors is not None and not isinstance(tensors, Mapping):
            raise FoldTypeError(
                f"log: tensors must be a mapping name -> array; got a {type(tensors).__name__}"
            )
        entries = list(self._pending)
        self._pending.clear()
        seen = {name for name, _ in entries}
        for name, value in (tensors or {}).items():
            if not isinstance(name, str):
                raise FoldTypeError(f"log: tensor names must be strings; got {name!r}")
            if name in seen:
                raise FoldError(f"log: tensor name {name!r} appears twice in step {step}")
            seen.add(name)
            entries.append((name, self._take(value)))
        meta_json = _jsonable(dict(meta), f"log(step={step}) meta") if meta else None
        if not self.background:
            self._emit(step, entries, meta_json)
        else:
            self._reap(block=False)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="bitfold-record")
            self._inflight.append(self._executor.submit(self._emit, step, entries, meta_json))
            self._reap(keep=self.MAX_IN_FLIGHT, block=True)

    def _take(self, value: Any) -> Any:
        return _snapshot(value) if self.background else digest(value)

    def _emit(self, step: int, entries: list[tuple[str, Any]], meta: Any) -> None:
        fields: dict[str, Any] = {"step": step, "tensors": _resolve(entries)}
        if meta:
            fields["meta"] = meta
        self._write(_record("step", **fields))
        self.records += 1

    def _reap(self, keep: int = 0, block: bool = True) -> None:
        """Collect background records (waiting while more than ``keep`` are in flight when
        ``block``, else only finished ones), raising the first worker error."""
        while len(self._inflight) > keep and (block or self._inflight[0].done()):
            fut = self._inflight.popleft()
            err = fut.exception()
            if err is not None:
                self._worker_error = self._worker_error or (
                    f"{type(err).__name__} in the background worker: {err}"
                )
                raise err

    @checked_options
    def log_model(
        self,
        step: int,
        model: Any,
        *,
        params: bool = True,
        grads: bool = True,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Log a PyTorch module's gradients and parameters (see :func:`model_tensors`)."""
        self.log(step, model_tensors(model, params=params, grads=grads), meta=meta)

    @checked_options
    def watch(self, module: Any, names: Iterable[str] | None = None) -> None:
        """Record the outputs of ``module``'s submodules into the next :meth:`log` call.

        ``names`` are submodule names as in ``module.named_modules()``; by
        default every leaf submodule. Each forward call records
        ``"out/<name>"`` (tuples, lists and dicts of tensors get ``.<i>`` or
        ``.<key>`` suffixes; a second call before ``log`` gets ``#2``). The
        hooks are removed by :meth:`close` or :meth:`unwatch`.
        """
        modules = dict(module.named_modules())
        if names is None:
            chosen = [n for n, m in modules.items() if not any(True for _ in m.children())]
        else:
            chosen = list(names)
            missing = [n for n in chosen if n not in modules]
            if missing:
                known = ", ".join(repr(n) for n in modules if n) or "none"
                raise FoldError(f"watch: no submodule named {missing}; the module has: {known}")
        for name in chosen:
            label = f"out/{name or type(modules[name]).__name__}"
            self._hooks.append(modules[name].register_forward_hook(self._make_hook(label)))

    def _make_hook(self, label: str) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            found: list[tuple[str, Any]] = []
            _flatten_output(label, output, found)
            taken = {n for n, _ in self._pending}
            for name, value in found:
                final, n = name, 1
                while final in taken:
                    n += 1
                    final = f"{name}#{n}"
                taken.add(final)
                self._pending.append((final, self._take(value)))

        return hook

    def unwatch(self) -> None:
        """Remove the hooks installed by :meth:`watch`."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def close(self) -> None:
        """Write the closing record and close the file (idempotent).

        In background mode this waits for the worker, and raises its error if
        it failed (the closing record names that error too).
        """
        self._close(None, raise_worker_error=True)

    def _close(self, error: str | None, raise_worker_error: bool) -> None:
        if self._fh is None:
            return
        self.unwatch()
        failure: BaseException | None = None
        try:
            self._reap(block=True)
        except BaseException as err:  # written down, then raised
            failure = err
            self._reap_all_quietly()
        error = error or self._worker_error
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        fields: dict[str, Any] = {"records": self.records, "threads": thread_settings()}
        if error is not None:
            fields["error"] = error
        try:
            self._write(_record("end", **fields))
        finally:
            self._fh.close()
            self._fh = None
        if failure is not None and raise_worker_error:
            raise failure

    def _reap_all_quietly(self) -> None:
        while self._inflight:
            fut = self._inflight.popleft()
            fut.exception()  # waits; errors after the first are dropped


@checked_options
def record(
    path: str | os.PathLike[str],
    meta: Mapping[str, Any] | None = None,
    *,
    background: bool = False,
) -> Recorder:
    """Start a run manifest at ``path`` (overwritten) with ``meta`` in its header.

    Use it as a context manager or call ``.close()``::

        with bitfold.record("run.jsonl", {"seed": 0}) as rec:
            for step in range(steps):
                ...                                  # forward, backward
                rec.log_model(step, model, meta={"loss": loss.item()})
                optimizer.step()

    ``rec.log(step, {"name": array, ...})`` records any arrays (NumPy,
    PyTorch, CuPy, JAX); ``rec.watch(model)`` adds module outputs.
    ``background=True`` moves the hashing to a worker thread (tensors are
    copied at the ``log`` call); it pays when a core is free, and the file
    written is the same.
    """
    return Recorder(path, meta, background=background)


# --------------------------------------------------------------------------- reading
@dataclass
class Step:
    """One step record of a manifest."""

    step: int
    tensors: list[tuple[str, str]]
    meta: dict[str, Any]
    line: int


@dataclass
class Manifest:
    """A manifest read back by :func:`read_manifest`."""

    path: str
    header: dict[str, Any]
    steps: list[Step] = field(default_factory=list)
    end: dict[str, Any] | None = None

    @property
    def env(self) -> dict[str, Any]:
        """The environment fingerprint of the header."""
        return self.header.get("env", {})


_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and check a manifest; a bad file raises :class:`FoldError` naming the file and line."""
    p = str(path)
    try:
        fh = open(path, "rb")
    except OSError as err:
        raise FoldError(f"{p}: cannot read the manifest: {err.strerror or err}") from err
    manifest: Manifest | None = None
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{p}, line {lineno}"
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                cut = "" if raw.endswith(b"\n") else " (the line has no end: the file is truncated)"
                raise FoldError(
                    f"{where}: not valid JSON{cut}: {err}; a bitfold manifest has one JSON "
                    "object per line"
                ) from err
            if not isinstance(obj, dict) or obj.get("format") != FORMAT:
                raise FoldError(
                    f"{where}: not a bitfold manifest record (no \"format\": \"{FORMAT}\"); "
                    "the file is foreign JSON"
                )
            version = obj.get("version")
            if version != VERSION:
                raise FoldError(
                    f"{where}: manifest version {version!r}; this bitfold reads version {VERSION}"
                )
            kind = obj.get("kind")
            if manifest is None:
                if kind != "header":
                    raise FoldError(f"{where}: the first record must be the header; got {kind!r}")
                if not isinstance(obj.get("env"), dict):
                    raise FoldError(f"{where}: the header has no \"env\" object")
                manifest = Manifest(path=p, header=obj)
                continue
            if manifest.end is not None:
                raise FoldError(f"{where}: a {kind!r} record after the closing \"end\" record")
            if kind == "step":
                manifest.steps.append(_parse_step(obj, where, lineno))
            elif kind == "end":
                manifest.end = obj
            else:
                raise FoldError(
                    f"{where}: unknown record kind {kind!r}; expected \"step\" or \"end\""
                )
    if manifest is None:
        raise FoldError(f"{p}: empty file; not a bitfold manifest")
    return manifest


def _parse_step(obj: dict[str, Any], where: str, lineno: int) -> Step:
    step = obj.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise FoldError(f"{where}: \"step\" must be an integer; got {step!r}")
    tensors = obj.get("tensors")
    if not isinstance(tensors, list):
        raise FoldError(f"{where}: \"tensors\" must be a list of [name, digest] pairs")
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item in tensors:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], str)
            or not _DIGEST_RE.fullmatch(item[1])
        ):
            raise FoldError(f"{where}: bad tensor entry {item!r}; expected [name, 'sha256:<hex>']")
        if item[0] in seen:
            raise FoldError(f"{where}: tensor {item[0]!r} appears twice")
        seen.add(item[0])
        pairs.append((item[0], item[1]))
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise FoldError(f"{where}: \"meta\" must be an object")
    return Step(step=step, tensors=pairs, meta=meta, line=lineno)


# --------------------------------------------------------------------------- comparing
def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict[str, Any]]:
    fa, fb = _flatten(a), _flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [{"key": k, "a": fa.get(k), "b": fb.get(k)} for k in keys if fa.get(k) != fb.get(k)]


def _env_with_end(m: Manifest) -> dict[str, Any]:
    env = dict(m.env)
    if m.end is not None and isinstance(m.end.get("threads"), dict):
        env["threads_at_end"] = m.end["threads"]
    return env


def compare(a: Manifest, b: Manifest) -> dict[str, Any]:
    """Compare two manifests record by record; the result is what ``bitfold diff --json`` prints.

    ``status`` is ``"identical"``, ``"digests differ"`` (``first_difference``
    names the step and tensor), ``"different tensors"`` (``only_in_a`` /
    ``only_in_b``), ``"different steps"`` or ``"different lengths"``.
    ``matched_steps`` / ``matched_tensors`` count what matched before the
    first difference (``matched_tensors`` includes the differing step's
    earlier tensors).
    """
    report: dict[str, Any] = {
        "a": a.path,
        "b": b.path,
        "status": "identical",
        "identical": True,
        "message": "",
        "first_difference": None,
        "only_in_a": [],
        "only_in_b": [],
        "matched_steps": 0,
        "matched_tensors": 0,
        "steps_a": len(a.steps),
        "steps_b": len(b.steps),
        "complete_a": a.end is not None,
        "complete_b": b.end is not None,
        "error_a": (a.end or {}).get("error"),
        "error_b": (b.end or {}).get("error"),
        "env_differences": _differences(_env_with_end(a), _env_with_end(b)),
        "meta_differences": _differences(a.header.get("meta", {}), b.header.get("meta", {})),
    }

    def differ(status: str, message: str) -> dict[str, Any]:
        report.update(status=status, identical=False, message=message)
        return report

    for i, (sa, sb) in enumerate(zip(a.steps, b.steps, strict=False)):
        if sa.step != sb.step:
            return differ(
                "different steps",
                f"record {i + 1} is step {sa.step} in A (line {sa.line}) but step {sb.step} "
                f"in B (line {sb.line}); the manifests record different steps",
            )
        names_a = [n for n, _ in sa.tensors]
        names_b = [n for n, _ in sb.tensors]
        if set(names_a) != set(names_b):
            only_a = [n for n in names_a if n not in set(names_b)]
            only_b = [n for n in names_b if n not in set(names_a)]
            report.update(only_in_a=only_a, only_in_b=only_b)
            return differ(
                "different tensors",
                f"the manifests record different tensors at step {sa.step}: only in A: "
                f"{', '.join(only_a) or 'none'}; only in B: {', '.join(only_b) or 'none'}",
            )
        digests_b = dict(sb.tensors)
        for pos, (name, da) in enumerate(sa.tensors):
            db = digests_b[name]
            if da != db:
                report["first_difference"] = {
                    "step": sa.step,
                    "record": i + 1,
                    "tensor": name,
                    "position": pos + 1,
                    "tensors_in_step": len(sa.tensors),
                    "a": da,
                    "b": db,
                    "line_a": sa.line,
                    "line_b": sb.line,
                    "meta_a": sa.meta,
                    "meta_b": sb.meta,
                }
                return differ(
                    "digests differ", f"first difference at step {sa.step}, tensor {name!r}"
                )
            report["matched_tensors"] += 1
        report["matched_steps"] += 1
    if len(a.steps) != len(b.steps):
        longer, shorter = ("A", "B") if len(a.steps) > len(b.steps) else ("B", "A")
        n = min(len(a.steps), len(b.steps))
        return differ(
            "different lengths",
            f"{shorter} has {n} step records and {longer} has "
            f"{max(len(a.steps), len(b.steps))}; the {n} common ones are identical",
        )
    report["message"] = (
        f"identical: {report['matched_steps']} steps, {report['matched_tensors']} tensor digests"
    )
    return report


__all__ = [
    "FORMAT",
    "VERSION",
    "Manifest",
    "Recorder",
    "Step",
    "compare",
    "model_tensors",
    "read_manifest",
    "record",
]
