"""The backend registry: one :class:`Backend` entry a backend, checked whole when registered.

A backend is the place values live and the code that folds them there. Its
entry states, as data:

* ``name``;
* ``families`` and ``devices``: it serves values of one of these array
  families (:func:`bitfold.arrays.family_of`, e.g. ``"numpy"``, ``"torch"``)
  that live on one of these devices; selection looks at both together, so a
  backend never claims values it cannot fold (JAX arrays on a GPU are listed
  by no kernel backend, and go to ``portable``, which lists every device;
  values that no available backend serves get a clear
  :class:`bitfold.DeviceError`);
* ``folds``: one implementation a strategy (:data:`FOLDS`), each
  ``impl(plan, values, spec, out_name, **options)``, with ``init=`` among
  the options of the strategies its ``init`` rule names (only those are ever
  passed one);
* ``expand(plan, v, trailing)``;
* the accumulator's state operations (:class:`bitfold.ExactAccumulator`):
  ``new_state(K, fmt, trailing, like)``, a zero state for values like
  ``like``; ``add_to_state(state, plan, values, spec, fmt, **options)``,
  which adds values it serves exactly into one of its states;
  ``merge_states(into, other, fmt)``, two of its states of one place;
  ``round_state(state, fmt, out_name)``. Each returns the state (updated in
  place where the library allows, a new array where it does not). A state is
  always the int64 array ``(K,) + trailing + (L + 5,)`` of
  :mod:`bitfold.exact`, whatever library and device hold it, so a state
  copied to another place (``to_numpy``/``from_numpy``, exact for integers)
  is a state there. Backends whose state operations are the same functions
  share their states (:meth:`Backend.shares_states`; the host, CUDA and
  portable backends each keep their own: on the host, on the GPU, beside
  the tensors);
* ``options``: the tuning options each operation accepts (a strategy name or
  ``"add_to_state"`` -> option names). None of them changes a result;
* ``init``: the strategies that fold into an existing array, and whether that
  array may have another dtype than the values (see :class:`InitRule`);
* optionally ``explain(plan, values, spec, **options) -> (route, reason)``:
  which of its paths an ``exact`` fold would take, and why
  (``plan.route(values)``);
* optionally ``available() -> bool``: whether it can run here at all (the
  CUDA backend: whether numba-cuda loads); an unavailable backend serves
  nothing, and the next one is asked;
* optionally ``runs_on(device) -> bool``: whether it can run on one of its
  listed device types here and now (``"cpu"``, ``"cuda"``, ``"xpu"``, ...);
  a backend that lists a device it cannot run on at the moment (a GPU
  kernel library on ``"cpu"`` without its interpreter) does not serve it,
  and the next one is asked;
* optionally ``why_not(device) -> str``: why it cannot run on a device it
  lists (``available()`` or ``runs_on(device)`` False), and what would let
  it, for the refusal of a backend forced by name (the Triton kernels on
  ``"cpu"``: only under ``TRITON_INTERPRET=1``, for tests);
* optionally ``known_answers``: a GPU kernel family's known-answer test
  (:class:`bitfold.backends.selftest.KnownAnswers`), run on each device before
  the family first folds there; a family that fails it on a device does not
  serve that device for the rest of the process (the next one is asked);
* ``priority``: the order backends are asked in, highest first; backends of
  equal priority are asked in the order they were registered. The built-in
  entries leave room between them — ``host`` 300, ``triton`` 200, ``cuda``
  (the numba-cuda kernels) 100, ``portable`` -100 — so a new backend slots in by its number,
  not by where its ``register`` line sits (a GPU backend preferred to the
  numba-cuda kernels takes a number between 100 and 300).

A backend missing any piece is refused by :func:`register` with an error
naming it and the piece. :func:`backend_for` picks the backend of highest
priority that serves the values (a backend forced by name that does not
serve them is refused with a :class:`bitfold.DeviceError` saying why, before
anything is imported or run for them);
:func:`check_options` refuses an option the backend does not take for an
operation, listing the ones it does.

Beside the backends, the registry answers the other "which one runs this, here"
questions from tables: :func:`device_types` (the device types backends name,
what a tool offers) and :func:`collective_device_type` (which device type's
tensors a ``torch.distributed`` backend's collectives take: gloo the CPU's,
NCCL CUDA's; :func:`register_collective` adds a row).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DeviceError, FoldError, UnknownOptionError
from ..validate import checked_options

if TYPE_CHECKING:
    from .selftest import KnownAnswers

#: The strategies every backend implements (the strategy registry holds the same names).
FOLDS: tuple[str, ...] = ("exact", "ordered", "atomic")
#: The other operations every backend implements, besides one fold a strategy.
OPERATIONS: tuple[str, ...] = (
    "add_to_state", "expand", "new_state", "merge_states", "round_state",
)  # fmt: skip

Impl = Callable[..., Any]


@dataclass(frozen=True)
class InitRule:
    """Which folds take ``init=`` (an array the values are added into) on a backend.

    ``strategies``: the strategies that accept it; ``mixed_dtypes``: whether
    ``init`` may have another float dtype than the values (the sum is then
    exact in the wider one).
    """

    strategies: tuple[str, ...] = ("exact",)
    mixed_dtypes: bool = False


@dataclass(frozen=True)
class Backend:
    """One backend: what it serves, its implementation of every operation, its options.

    ``priority`` orders selection (higher is asked first; ties keep registration
    order). ``available()`` says whether the backend can run here at all,
    ``runs_on(device)`` whether it can run on one of its listed device types now;
    either one saying False makes :meth:`serves` False for the values concerned, and
    ``why_not(device)`` says why (and what would let it run) when it is forced by name.
    """

    name: str
    families: tuple[str, ...]
    devices: tuple[str, ...]
    folds: Mapping[str, Impl]
    add_to_state: Impl | None
    expand: Impl | None
    new_state: Impl | None
    merge_states: Impl | None
    round_state: Impl | None
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    init: InitRule = InitRule()
    explain: Impl | None = None
    available: Callable[[], bool] | None = None
    runs_on: Callable[[str], bool] | None = None
    why_not: Callable[[str], str] | None = None
    known_answers: KnownAnswers | None = None
    priority: int = 0

    @classmethod
    def from_functions(cls, functions: Mapping[str, Any], **entry: Any) -> Backend:
        """An entry whose pieces are the functions of ``functions`` (a backend module's
        ``globals()``) named ``fold_<strategy>`` and after :data:`OPERATIONS`; ``entry``
        holds the other fields (and may name a piece itself). A missing function is left
        ``None``, for :func:`register` to refuse by name."""
        folds = {s: functions[f"fold_{s}"] for s in FOLDS if f"fold_{s}" in functions}
        return cls(folds=folds, **{**{op: functions.get(op) for op in OPERATIONS}, **entry})

    def serves(self, family: str, device: str) -> bool:
        """True when this backend folds values of array ``family`` living on ``device``.

        ``devices`` may be ``("*",)``: any device the array library runs on. A
        backend whose ``available()`` says False (its kernels' library does not
        load) serves nothing; one whose ``runs_on(device)`` says False does not
        serve ``device`` (it lists the device but cannot run there now).
        """
        if not self.lists(family, device):
            return False
        return self.can_run(device)

    def lists(self, family: str, device: str) -> bool:
        """True when ``family`` on ``device`` is among what this entry declares it serves,
        whether or not it can run there now (:meth:`serves` asks both)."""
        return family in self.families and ("*" in self.devices or device in self.devices)

    def can_run(self, device: str) -> bool:
        """True unless ``available()`` or ``runs_on(device)`` says this backend cannot run
        on ``device`` here."""
        if self.available is not None and not self.available():
            return False
        return self.runs_on is None or bool(self.runs_on(device))

    def shares_states(self, other: Backend) -> bool:
        """True when ``other``'s accumulator states are this backend's: the same state
        operations (values of either backend add straight into a state of the other)."""
        ops = ("new_state", "merge_states", "round_state")
        return self is other or all(getattr(self, op) is getattr(other, op) for op in ops)

    def fold(self, strategy: str) -> Impl:
        """The implementation of ``strategy`` (every registered backend has one per strategy)."""
        return self.folds[strategy]

    def missing(self) -> list[str]:
        """The pieces this entry lacks (empty for a complete backend)."""
        gone = [f"the {s!r} fold" for s in FOLDS if not callable(self.folds.get(s))]
        gone += [op for op in OPERATIONS if not callable(getattr(self, op))]
        if not self.families or not self.devices:
            gone.append("the array families and devices it serves")
        gone += [
            f"options for unknown operation {op!r}"
            for op in self.options
            if op not in (*FOLDS, "add_to_state")
        ]
        return gone


class _Entries(dict[str, Backend]):
    """The registry's table: a dict that forgets the order it was asked in whenever it changes
    (by :func:`register`, :func:`unregister` or a test's ``monkeypatch.setitem``)."""

    order: tuple[Backend, ...] | None = None

    def __setitem__(self, name: str, backend: Backend) -> None:
        self.order = None
        super().__setitem__(name, backend)

    def __delitem__(self, name: str) -> None:
        self.order = None
        super().__delitem__(name)

    def pop(self, *args: Any) -> Any:
        self.order = None
        return super().pop(*args)

    def clear(self) -> None:
        self.order = None
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.order = None
        super().update(*args, **kwargs)

    def setdefault(self, name: str, backend: Backend) -> Backend:  # type: ignore[override]
        self.order = None
        return super().setdefault(name, backend)

    def popitem(self) -> tuple[str, Backend]:
        self.order = None
        return super().popitem()


_REGISTRY: _Entries = _Entries()


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the registry; refuse an incomplete one or a second of one name.

    It is asked by its ``priority`` (:func:`backends`), after the ones already
    registered with the same priority.
    """
    gone = backend.missing()
    if gone:
        raise FoldError(
            f"backend {backend.name!r} cannot be registered: it lacks {', '.join(gone)}"
        )
    if backend.name in _REGISTRY and _REGISTRY[backend.name] is not backend:
        raise FoldError(f"a backend named {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Remove the backend called ``name`` (for tests of the registry)."""
    _REGISTRY.pop(name, None)


@checked_options
def backend_names() -> tuple[str, ...]:
    """Names of the registered backends, in the order they are asked (:func:`backends`)."""
    return tuple(b.name for b in backends())


def get_backend(name: str) -> Backend:
    """The backend called ``name``; an unknown name lists the registered ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise FoldError(
            f"unknown backend {name!r}; registered: {', '.join(backend_names())}"
        ) from None


def backends() -> tuple[Backend, ...]:
    """The registered backends, in the order they are asked: highest ``priority`` first,
    equal priorities in the order they were registered."""
    order = _REGISTRY.order
    if order is None:  # asked before every small fold: sorted once a change
        order = _REGISTRY.order = tuple(sorted(_REGISTRY.values(), key=lambda b: -b.priority))
    return order  # sorted() is stable


def device_types(family: str | None = None) -> tuple[str, ...]:
    """The device types registered backends name for arrays of ``family`` (of every family
    when None), each once, in the order the backends are asked: what a tool may offer as a
    place to fold (the probe's ``--device``). ``"*"`` (any device: ``portable``) names no
    type and is left out; a listed type need not be usable here (:meth:`Backend.serves`
    says, for a family on a device)."""
    listed = (b.devices for b in backends() if family is None or family in b.families)
    return tuple(dict.fromkeys(d for devices in listed for d in devices if d != "*"))


#: The collective libraries of ``torch.distributed`` (a process group's backend) and the
#: device type whose tensors each one's collectives take: gloo the CPU's, NCCL CUDA's, XCCL
#: (Intel's GPUs) XPU's. A library not listed takes CPU tensors. A device type whose
#: collectives come from a library of its own adds a row (:func:`register_collective`, from
#: its backend's module), not a case in :mod:`bitfold.distributed`; a row naming a library
#: this torch does not know is never asked.
_COLLECTIVES: dict[str, str] = {"gloo": "cpu", "nccl": "cuda", "xccl": "xpu"}


def register_collective(library: str, device_type: str) -> None:
    """Say that the collectives of ``torch.distributed`` backend ``library`` take tensors of
    ``device_type`` (a row of the table :func:`collective_device_type` reads)."""
    _COLLECTIVES[library] = device_type


def unregister_collective(library: str) -> None:
    """Remove the row of ``library`` (for tests of the registry); it then takes CPU tensors."""
    _COLLECTIVES.pop(library, None)


def collective_device_type(library: str) -> str:
    """The device type whose tensors the collectives of ``torch.distributed`` backend
    ``library`` take (``"cuda"`` for ``"nccl"``); ``"cpu"`` for a library the table does not
    list (a mixed ``"cpu:gloo,cuda:nccl"`` group takes CPU tensors through gloo)."""
    return _COLLECTIVES.get(library, "cpu")


def collective_libraries() -> dict[str, str]:
    """The table :func:`collective_device_type` reads: library -> device type (a copy)."""
    return dict(_COLLECTIVES)


def backend_for(
    family: str,
    device: str,
    what: str = "values",
    name: str | None = None,
    admits: Callable[[Backend, bool], bool] | None = None,
) -> Backend:
    """The backend of highest priority serving arrays of ``family`` on ``device``, or a refusal.

    With ``name``, that backend (forced), refused with a :class:`bitfold.DeviceError`
    unless it serves them: one that does not list them says what it serves (before
    its ``available()`` is asked: no import, no work), one that lists them but cannot
    run here (``available()`` or ``runs_on(device)`` False) says so, and why when
    its entry has a ``why_not``.

    ``admits(backend, forced)``, when given, is asked of a backend that serves them
    before it is chosen (the dispatch's known-answer gate,
    :func:`bitfold.backends.selftest.admits`): a backend it says False of is passed
    over for the next one; for a forced backend it raises rather than say False.
    """
    if name is not None:
        chosen = get_backend(name)
        refused = (f"the {name} backend does not fold {what} that are {family} arrays on "
                   f"device {device!r}")  # fmt: skip
        if not chosen.lists(family, device):
            raise DeviceError(
                f"{refused}: it serves {', '.join(chosen.families)} arrays on "
                f"{', '.join(chosen.devices)}"
            )
        if not chosen.can_run(device):
            why = chosen.why_not(device) if chosen.why_not is not None else ""
            raise DeviceError(f"{refused}: it cannot run here" + (f"; {why}" if why else ""))
        if admits is not None:
            admits(chosen, True)
        return chosen
    failed = []
    for backend in backends():
        if backend.serves(family, device):
            if admits is None or admits(backend, False):
                return backend
            failed.append(backend.name)
    if failed:
        raise DeviceError(
            f"{what} are {family} arrays on device {device!r}, whose backends here "
            f"({', '.join(failed)}) all failed their known-answer test"
        )
    served = "; ".join(
        f"{b.name}: {', '.join(b.families)} arrays on {', '.join(b.devices)}"
        for b in backends()
    )
    raise DeviceError(
        f"{what} are {family} arrays on device {device!r}, which no backend folds; "
        f"the backends serve {served} — move them with .cpu() or to a CUDA device"
    )


def check_options(
    backend: Backend,
    operation: str,
    options: Mapping[str, Any],
    own: tuple[str, ...] = (),
    call: str = "",
) -> None:
    """Refuse an option ``backend`` does not take for ``operation``, listing the valid ones.

    The refusal is a :class:`bitfold.errors.UnknownOptionError` (a ``FoldError``
    and a ``TypeError``). ``own`` are the keywords the public ``call`` takes
    itself (``strategy=``, ``out_dtype=``, ...): the message lists them too.
    """
    valid = backend.options.get(operation, ())
    bad = sorted(set(options) - set(valid))
    if bad:
        allowed = ", ".join(f"{o}=" for o in valid) or "none"
        besides = f" (besides {call}'s own: {', '.join(f'{o}=' for o in own)})" if own else ""
        raise UnknownOptionError(
            f"the {backend.name} backend's {operation} takes no option "
            f"{', '.join(f'{o}=' for o in bad)}; valid options: {allowed}{besides}"
        )


def known_options(operation: str) -> tuple[str, ...]:
    """Every option some registered backend takes for ``operation`` (sorted)."""
    return tuple(sorted({o for b in backends() for o in b.options.get(operation, ())}))


__all__ = [
    "FOLDS",
    "OPERATIONS",
    "Backend",
    "InitRule",
    "backend_for",
    "backend_names",
    "backends",
    "check_options",
    "collective_device_type",
    "collective_libraries",
    "device_types",
    "get_backend",
    "known_options",
    "register",
    "register_collective",
    "unregister",
    "unregister_collective",
]
