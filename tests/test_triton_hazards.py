"""Hazards of the Triton path that the interpreter alone would not show.

Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``)
runs every kernel here, but it has one device, no sync to notice, and no test
can afford 2^31 elements in it. These tests reach the hazards by other means:

* the device guard: every launch of the folds' and the all-reduce words'
  kernels happens inside :func:`bitfold.backends.triton.launching` for its
  tensor's device (a recording guard and recording kernels, monkeypatched),
  and the guard makes ``cuda:1`` current for a ``cuda:1`` tensor (a fake
  ``torch.cuda.device``; ``xpu`` likewise);
* 64-bit offsets: every program id is widened to int64 before it is
  multiplied (the kernels' source; ``tests/test_triton_compile.py`` checks
  the sm_90 PTX);
* the hot chunk table is made with operations every supported torch has (no
  ``torch.nonzero_static``), reading its sizes back once, and a warm fold
  reads nothing back;
* tuning options past the limbs' carry bound are refused by name, and rows
  of size 0 fold to empty results of the right shape.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (make test installs it)", allow_module_level=True)

import bitfold  # noqa: E402
from bitfold import dense_device  # noqa: E402
from bitfold.backends import triton as triton_backend  # noqa: E402
from bitfold.dense import BLOCK, DenseSum  # noqa: E402
from bitfold.kernels import triton as fold_kernels  # noqa: E402
from bitfold.kernels import triton_words  # noqa: E402

interpreted = pytest.mark.skipif(
    not triton_backend.interpreting(), reason="TRITON_INTERPRET=1 is not set (conftest sets it)"
)
INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
#: Every kernel the folds launch (:mod:`bitfold.kernels.triton`).
FOLD_KERNELS = ["lanes_kernel", "hot_kernel", "round_rows_kernel", "ordered_kernel",
                "scatter_kernel"]  # fmt: skip


def _bits(t):
    return t.contiguous().view(INT[t.element_size()])


# -- 1. the device guard ---------------------------------------------------------------------------
class _Watch:
    """A recording guard and recording kernels: each launch notes the guards open around it."""

    def __init__(self, monkeypatch, module, names):
        self.open: list = []  # the devices of the guards entered and not yet left
        self.launches: list = []  # (kernel, its tensors' devices, the guards' devices)
        # the launches recorded are the folds' own, not the known-answer test's (its own tests)
        monkeypatch.setenv("BITFOLD_SELFTEST", "off")
        monkeypatch.setattr(triton_backend, "launching", self.guard)
        for name in names:
            monkeypatch.setattr(module, name, self._kernel(name, getattr(module, name)))

    @contextlib.contextmanager
    def guard(self, t, lib="torch"):
        self.open.append(t.device)
        try:
            yield
        finally:
            self.open.pop()

    def _kernel(self, name, real):
        watch = self

        class Recorded:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    tensors = {a.device for a in args if isinstance(a, torch.Tensor)}
                    watch.launches.append((name, tensors, list(watch.open)))
                    return real[grid](*args, **kwargs)

                return launch

        return Recorded()

    def check(self, expected):
        """Each launch ran inside exactly one guard, for the device of every tensor it takes."""
        assert [n for n, _, _ in self.launches] == expected
        for name, devices, guards in self.launches:
            assert len(guards) == 1, f"{name} launched inside {len(guards)} guards"
            assert devices == set(guards), f"{name}: guard for {guards}, tensors on {devices}"
        assert not self.open


@interpreted
def test_every_word_kernel_launch_is_guarded_by_its_tensors_device(monkeypatch):
    watch = _Watch(monkeypatch, triton_words, ["bounds_kernel", "words_kernel", "decode_kernel"])
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal(3 * BLOCK + 5).astype(np.float32))
    s = DenseSum((x.numel(),), "float32")
    bounds = dense_device.array_bounds(x, BLOCK, "triton")
    assert torch.equal(bounds, dense_device.array_bounds(x, BLOCK, "torch"))
    layout = dense_device.device_layout(bounds, x.numel(), 2, BLOCK, True, s.format.limbs)
    count, fast, _ = layout.totals()
    assert fast
    words = dense_device.array_words(x, layout, count, "triton")
    assert torch.equal(words, dense_device.array_words(x, layout, count, "torch"))
    got = dense_device.decode(words, layout, None, "float32", 1, "triton")
    assert torch.equal(_bits(got), _bits(dense_device.decode(words, layout, None, "float32")))
    watch.check(["bounds_kernel", "words_kernel", "decode_kernel"])


@interpreted
def test_every_fold_kernel_launch_is_guarded_by_its_tensors_device(monkeypatch):
    watch = _Watch(monkeypatch, fold_kernels, FOLD_KERNELS)
    rng = np.random.default_rng(2)
    index = rng.integers(0, 5, 60)
    index[:30] = 1  # a hot bucket
    v = torch.from_numpy(rng.standard_normal((60, 2)).astype(np.float32))
    plan = bitfold.Fold(index, 5)
    want = plan(v)
    assert torch.equal(_bits(plan(v, backend="triton", hot_min=8)), _bits(want))
    plan(v, "ordered", backend="triton")
    acc = plan.accumulator("float32", (2,), backend="triton").add(v, start=0)
    assert torch.equal(_bits(acc.result()), _bits(want))
    watch.check(["lanes_kernel", "hot_kernel", "round_rows_kernel", "ordered_kernel",
                 "scatter_kernel", "round_rows_kernel"])  # fmt: skip


class _FakeCuda:
    """``torch.cuda``'s current device and device guard, recorded (no GPU needed)."""

    def __init__(self, monkeypatch, current):
        self.current = current
        self.entered: list = []
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "device", self.device)

    @contextlib.contextmanager
    def device(self, where):
        before, self.current = self.current, torch.device(where).index
        self.entered.append(torch.device(where))
        try:
            yield
        finally:
            self.current = before


def test_the_guard_makes_a_tensors_cuda_device_current(monkeypatch):
    fake = _FakeCuda(monkeypatch, current=0)
    on1 = types.SimpleNamespace(device=torch.device("cuda", 1))
    with triton_backend.launching(on1):
        assert fake.current == 1  # what a launch here reads
    assert fake.entered == [torch.device("cuda", 1)] and fake.current == 0
    fake.current = 1  # already current: nothing to switch
    with triton_backend.launching(on1):
        assert fake.current == 1
    assert fake.entered == [torch.device("cuda", 1)]
    with triton_backend.launching(types.SimpleNamespace(device=torch.device("cpu"))):
        pass
    assert len(fake.entered) == 1


def test_the_guard_makes_a_tensors_xpu_device_current(monkeypatch):
    if not hasattr(torch, "xpu"):
        pytest.skip("this torch has no torch.xpu")
    entered = []

    @contextlib.contextmanager
    def device(where):
        entered.append(torch.device(where))
        yield

    monkeypatch.setattr(torch.xpu, "device", device)
    with triton_backend.launching(types.SimpleNamespace(device=torch.device("xpu", 1))):
        assert entered == [torch.device("xpu", 1)]


# -- 2. 64-bit offsets -----------------------------------------------------------------------------
def _program_ids(module):
    """Every ``tl.program_id(...)`` of a kernel module's source, with what follows it."""
    source = inspect.getsource(module)
    return re.findall(r"tl\.program_id\(\d\)[^\n]*", source)


@pytest.mark.parametrize("module", [fold_kernels, triton_words], ids=lambda m: m.__name__)
def test_every_program_id_is_widened_to_int64_before_it_is_multiplied(module):
    """``program_id * BLOCK`` in int32 wraps past 2^31 elements: each program id is int64 first,
    so every offset made from it (``b * BLOCK + j``, ``3 * c``, ``r * W``) is 64-bit."""
    found = _program_ids(module)
    assert found, f"{module.__name__}: no program ids found"
    wide = re.compile(r"tl\.program_id\(\d\)\.to\(tl\.int64\)")
    narrow = [line for line in found if not wide.match(line)]
    assert not narrow, f"{module.__name__}: program ids used in int32: {narrow}"


# -- 3. the hot chunk table with what every supported torch has ----------------------------------
class _Reads:
    """Counts the reads of tensors back to the host (``tolist``, ``item``, ``int``, ``bool``)."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("tolist", "item", "__int__", "__bool__", "__index__"):
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))

    def _counted(self, real):
        def read(t, *args):
            self.count += 1
            return real(t, *args)

        return read


@interpreted
def test_the_hot_chunk_table_needs_no_nonzero_static_and_reads_back_once(monkeypatch):
    monkeypatch.delattr(torch, "nonzero_static", raising=False)
    rng = np.random.default_rng(4)
    K = 40
    index = rng.integers(0, K, 900)
    index[:200], index[200:320], index[320:340] = 3, 17, 39  # hot, hot, cold at hot_min=64
    plan = bitfold.Fold(index, K)
    counts = np.bincount(index, minlength=K)
    reads = _Reads(monkeypatch)
    table = triton_backend.hot_chunk_table(plan, torch.device("cpu"), 64, 50)
    assert reads.count == 1  # the table's two sizes, read once together
    hot = np.flatnonzero(counts >= 64)
    assert table.count == len(hot) and table.buckets.tolist() == hot.tolist()
    offsets = np.concatenate([[0], np.cumsum(counts)])
    want = [(r, s, min(s + 50, offsets[k + 1])) for r, k in enumerate(hot)
            for s in range(offsets[k], offsets[k + 1], 50)]  # fmt: skip
    assert table.nchunks == len(want) and [tuple(c) for c in table.chunks.tolist()] == want
    v = torch.from_numpy(rng.standard_normal(900).astype(np.float32))
    want_bits = _bits(plan(v))
    assert torch.equal(_bits(plan(v, backend="triton", hot_min=64, chunk=50)), want_bits)
    reads.count = 0
    got = plan(v, backend="triton", hot_min=64, chunk=50)  # warm: nothing read back
    assert reads.count == 0
    assert torch.equal(_bits(got), want_bits)


def test_the_compaction_keeps_every_true_index_in_order():
    for mask in ([], [False] * 5, [True] * 5, [True, False, False, True, True, False, True]):
        m = torch.tensor(mask, dtype=torch.bool)
        got = triton_backend._first_true(m, int(m.sum()))
        assert got.tolist() == torch.nonzero(m).reshape(-1).tolist()


# -- 4. options and shapes ------------------------------------------------------------------------


@interpreted
@pytest.mark.parametrize("option", ["hot_min", "chunk"])
def test_tuning_past_the_carry_bound_is_refused_by_name_before_any_work(monkeypatch, option):
    """A lane sums fewer than ``hot_min`` values and a hot program ``chunk`` values in int64
    limbs without a carry: more than ``MAX_RUN`` could overflow them, silently."""
    bound = fold_kernels.MAX_RUN
    plan = bitfold.Fold(np.arange(10) % 3, 3)
    v = torch.ones(10)
    watch = _Watch(monkeypatch, fold_kernels, FOLD_KERNELS)
    for bad in (bound + 1, 1 << 40):
        with pytest.raises(bitfold.FoldError, match=rf"{option} must be at most 536,870,912"):
            plan(v, backend="triton", **{option: bad})
        with pytest.raises(bitfold.FoldError, match=option):
            plan.route(v, backend="triton", **{option: bad})
    assert watch.launches == []
    assert torch.equal(_bits(plan(v, backend="triton", **{option: bound})), _bits(plan(v)))


@interpreted
@pytest.mark.parametrize("trailing", [(0,), (2, 0), (0, 3)])
def test_rows_of_no_elements_fold_to_empty_results_without_a_launch(monkeypatch, trailing):
    plan = bitfold.Fold(np.arange(6) % 3, 3)
    v = torch.ones(6, *trailing)
    init = torch.zeros(3, *trailing)
    watch = _Watch(monkeypatch, fold_kernels, FOLD_KERNELS)
    for kwargs in ({}, {"chunk": 4, "hot_min": 2}, {"init": init}, {"out_dtype": torch.float16}):
        got = plan(v, backend="triton", **kwargs)
        want = plan(v, **{k: a for k, a in kwargs.items() if k not in ("chunk", "hot_min")})
        assert (got.shape, got.dtype) == (want.shape, want.dtype) == ((3, *trailing), want.dtype)
    got = plan(v, "ordered", backend="triton")
    assert got.shape == (3, *trailing)
    acc = plan.accumulator("float32", trailing, backend="triton").add(v, start=0)
    assert acc.result().shape == (3, *trailing)
    assert [n for n, _, _ in watch.launches] == []
    with pytest.raises(bitfold.FoldError, match="hot_min"):  # options still checked
        plan(v, backend="triton", hot_min=0)
