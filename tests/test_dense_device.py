"""The exact all-reduce's words made on the tensor's device: the host's words, bit for bit.

:mod:`bitfold.dense_device` makes the bounds, the layout, the words and the
rounding with its Triton kernels (here in Triton's CPU interpreter) or with
PyTorch's own operations (run here on CPU tensors, the same operations a
CUDA tensor takes). Each is checked against the host's Numba kernels
(:mod:`bitfold.dense`), and the rounded sums against the Fraction oracle;
gloo groups with the device words forced give the host's bits, ranks of one
group mixing both.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import pytest
from oracle import round_fraction

from bitfold.cli.launch import leave

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
dense_device = pytest.importorskip("bitfold.dense_device", reason="needs torch")

from ranks import start_ranks  # noqa: E402

from bitfold.dense import (  # noqa: E402
    BLOCK,
    WIDE_MAX_RANKS,
    DenseSum,
    array_bounds,
    array_words,
    wire_layout,
)
from bitfold.kernels import dense as kernels  # noqa: E402

INT = {2: np.int16, 4: np.int32, 8: np.int64}


def _arrays(seed: int) -> dict[str, np.ndarray]:
    """Arrays whose blocks take every fast class, zero signs, subnormals and a ragged end."""
    rng = np.random.default_rng(seed)
    n = 64 * 9 + 37
    normal = rng.standard_normal(n).astype(np.float32)  # thirds blocks
    spread = (rng.standard_normal(n) * 2.0 ** rng.integers(-12, 12, n)).astype(np.float32)
    signs = spread.copy()
    signs[64:128] = -0.0  # a block of -0.0: its zero signs travel
    signs[200] = -0.0
    tiny = (rng.integers(-9, 9, n) * 2.0**-149).astype(np.float32)  # subnormals
    halves = rng.standard_normal(n).astype(np.float16).astype(np.float32)  # half blocks
    doubles = np.round(rng.standard_normal(n) * 2.0**40) * 2.0 ** rng.integers(-50, -44, n)
    zeros = np.zeros(n, np.float32)
    return {"normal": normal, "spread": spread, "signs": signs, "tiny": tiny, "halves": halves,
            "doubles": doubles, "zeros": zeros}  # fmt: skip


ARRAYS = list(_arrays(0))


def _layouts(x: np.ndarray, ranks: int):
    s = DenseSum((x.size,), "float64" if x.dtype == np.float64 else "float32")
    bounds = dense_device.array_bounds(torch.from_numpy(x), BLOCK)
    host = wire_layout(bounds.numpy(), x.size, ranks, s.format.limbs)
    device = dense_device.device_layout(bounds, x.size, ranks, BLOCK, ranks <= WIDE_MAX_RANKS,
                                        s.format.limbs)  # fmt: skip
    return s, host, device


def test_a_nan_or_an_infinity_marks_its_block_as_a_dense_sum_does(engine):
    x = _arrays(2)["spread"]
    x[70], x[300] = np.nan, -np.inf
    want = DenseSum(x.size).add(x).bounds()
    got = dense_device.array_bounds(torch.from_numpy(x), BLOCK, engine).numpy()
    assert np.array_equal(got[:, 1], want[:, 1]) and got[1, 1] == kernels.SPECIAL_HI
    assert np.array_equal(got[:, 0], want[:, 0])


ENGINES = ["torch", "triton"]


@pytest.fixture(params=ENGINES)
def engine(request):
    """PyTorch's operations, or the Triton kernels (in Triton's interpreter without a GPU)."""
    if request.param == "triton":
        pytest.importorskip("triton", reason="triton is not installed")
    return request.param


@pytest.mark.parametrize("name", ARRAYS)
def test_bounds_are_the_hosts(name, engine):
    x = _arrays(1)[name]
    got = dense_device.array_bounds(torch.from_numpy(x), BLOCK, engine).numpy()
    assert np.array_equal(got, array_bounds(x))


@pytest.mark.parametrize("ranks", [1, 2, 4, 8, 40, WIDE_MAX_RANKS + 1])
@pytest.mark.parametrize("name", ARRAYS)
def test_layout_and_words_are_the_hosts(name, ranks, engine):
    x = _arrays(3)[name]
    _, host, device = _layouts(x, ranks)
    for field in ("classes", "lo", "offsets", "signs"):
        assert np.array_equal(getattr(device, field).numpy(), getattr(host, field)), field
    assert device.split == host.split
    count, fast, any_sign = device.totals()
    assert (count, any_sign) == (host.words, bool(host.signs.any()))
    if fast:
        words = dense_device.array_words(torch.from_numpy(x), device, count, engine).numpy()
        assert np.array_equal(words, array_words(x, host))


def test_the_classes_under_test_are_all_there():
    """The arrays above cover half, thirds and narrow blocks, and signs that travel."""
    seen = set()
    for x in _arrays(3).values():
        _, host, _ = _layouts(x, 2)
        seen |= set(host.classes.tolist())
        assert host.words > 0
    assert {kernels.HALF, kernels.THIRDS, kernels.NARROW} <= seen
    assert _layouts(_arrays(3)["signs"], 2)[1].signs.any()


def _oracle(terms: list[np.ndarray], out: str, mean_over: int) -> np.ndarray:
    """Each element's exact sum over the ranks, divided by ``mean_over``, rounded once."""
    got = []
    for column in zip(*[t.tolist() for t in terms], strict=True):
        total = sum((Fraction(v) for v in column), Fraction(0)) / mean_over
        value = round_fraction(total, out)
        if total == 0 and all(math.copysign(1.0, v) < 0 for v in column):
            value = -0.0
        got.append(value)
    dtype = {"bfloat16": np.float32}.get(out, out)
    return np.array(got, dtype)


def _bits(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy().view(INT[t.element_size()])


@pytest.mark.parametrize("mean_over", [1, 3, 4, 7])
@pytest.mark.parametrize("name", ARRAYS)
def test_reduced_words_round_to_the_oracles_bits(name, mean_over, engine):
    """Three ranks' words summed (as the all-reduce does) and rounded on the device: the
    oracle's bits, the host decode's, in every output dtype."""
    ranks = 3
    terms = [_arrays(10 + r)[name] for r in range(ranks)]
    bounds = np.maximum.reduce([array_bounds(t) for t in terms])
    s = DenseSum((terms[0].size,), "float64" if terms[0].dtype == np.float64 else "float32")
    host = wire_layout(bounds, s.size, ranks, s.format.limbs)
    device = dense_device.device_layout(torch.from_numpy(bounds), s.size, ranks, BLOCK, True,
                                        s.format.limbs)  # fmt: skip
    count, fast, any_sign = device.totals()
    assert fast
    words = sum(dense_device.array_words(torch.from_numpy(t), device, count, engine)
                for t in terms)  # fmt: skip
    flags = None
    if any_sign:
        flags = torch.from_numpy(np.minimum.reduce(
            [(t.view(INT[t.itemsize]) == np.iinfo(INT[t.itemsize]).min) for t in terms]
        ).astype(np.int32))  # fmt: skip
    outs = ["float64", "float32"] if terms[0].dtype == np.float64 else [
        "float32", "float16", "bfloat16", "float64"]  # fmt: skip
    for out in outs:
        got = dense_device.decode(words, device, flags, out, mean_over, engine)
        host_flags = flags.numpy() if flags is not None else np.zeros(0, np.int32)
        want = s.decode(words.numpy(), host, host_flags, out, mean_over=mean_over)
        oracle = _oracle(terms, out, mean_over)
        assert np.array_equal(_bits(got), want.view(INT[want.itemsize])), out
        assert np.array_equal(_bits(got), oracle.view(INT[oracle.itemsize])), out


def test_rounding_reaches_infinity_and_the_subnormals(engine):
    """Sums past float16's range round to infinity; tiny means to subnormals and to zero."""
    big = np.full(70, 60000.0, np.float32)
    tiny = np.full(70, 2.0**-149, np.float32)
    tiny[5] = -(2.0**-149)
    cases = (([big, big], "float16", 1), ([tiny, tiny], "float32", 5),
             ([tiny, tiny], "float32", 3), ([big, -big], "float32", 1))  # fmt: skip
    for terms, out, mean in cases:
        bounds = np.maximum.reduce([array_bounds(t) for t in terms])
        device = dense_device.device_layout(torch.from_numpy(bounds), 70, 2, BLOCK, True, 10)
        count, _, _ = device.totals()
        words = sum(dense_device.array_words(torch.from_numpy(t), device, count, engine)
                    for t in terms)  # fmt: skip
        got = dense_device.decode(words, device, None, out, mean, engine)
        want = _oracle(terms, out, mean)
        assert np.array_equal(_bits(got), want.view(INT[want.itemsize]))
    assert np.isinf(_oracle([big, big], "float16", 1)).all()


# -- gloo groups with the device words forced ----------------------------------------------------


def _terms(rank: int) -> np.ndarray:
    """Per rank 613 float32 over every fast class, a block of -0.0 on every rank."""
    x = _arrays(40 + rank)["spread"].copy()
    x[:300] = _arrays(40 + rank)["normal"][:300]
    x[300:400] = _arrays(40 + rank)["halves"][:100]
    x[448:512] = -0.0
    return x


def _nan_terms(rank: int) -> np.ndarray:
    x = _terms(rank)
    if rank == 1:
        x[500] = np.nan  # a full block: every rank's words go through the host
    return x


def _rank(terms, rank: int, world: int, init: str, out: str) -> None:
    from bitfold.distributed import exact_all_reduce

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    x = torch.from_numpy(terms(rank))
    words = "device" if rank % 2 == 0 else "host"  # one wire: ranks may mix
    summed = exact_all_reduce(x, words="device")
    mixed = exact_all_reduce(x, words=words, mean_over=world)
    half = exact_all_reduce(x.to(torch.bfloat16), words="device", out_dtype="float32")
    if rank == 0:
        np.savez(out, summed=summed.numpy(), mixed=mixed.numpy(), half=half.numpy())
    dist.destroy_process_group()
    leave(0)


@pytest.mark.slow
@pytest.mark.parametrize(("world", "terms"), [(2, _terms), (4, _terms), (2, _nan_terms)],
                         ids=["2-fast", "4-fast", "2-nan"])  # fmt: skip
def test_gloo_groups_with_device_words_give_the_cpus_bits(tmp_path, world, terms):
    if not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    out = str(tmp_path / "result.npz")
    init = f"file://{tmp_path / 'rendezvous'}"
    start_ranks(functools.partial(_rank, terms), world, (world, init, out))
    got = np.load(out)
    parts = [terms(r) for r in range(world)]
    host = DenseSum(613)
    for p in parts:
        host.add(p)
    assert np.array_equal(got["summed"].view(np.uint32), host.result().view(np.uint32))
    want_mean = host.result(mean_over=world)
    assert np.array_equal(got["mixed"].view(np.uint32), want_mean.view(np.uint32))
    if terms is _terms:
        oracle = _oracle(parts, "float32", 1)
        assert np.array_equal(got["summed"].view(np.uint32), oracle.view(np.uint32))
        assert got["summed"].view(np.uint32)[450] == 0x80000000  # -0.0 on every rank
    halves = [torch.from_numpy(p).to(torch.bfloat16).float().numpy() for p in parts]
    want_half = DenseSum(613)
    for h in halves:
        want_half.add(h)
    assert np.array_equal(got["half"].view(np.uint32), want_half.result().view(np.uint32))


def test_words_is_checked_before_any_collective():
    from bitfold.distributed import exact_all_reduce
    from bitfold.errors import FoldError, FoldTypeError

    with pytest.raises(FoldError, match="words must be one of"):
        exact_all_reduce(torch.zeros(3), words="gpu")
    with pytest.raises(FoldTypeError, match=r"words='device'.*ndarray"):
        exact_all_reduce(np.zeros(3, np.float32), words="device")
    with pytest.raises(FoldError, match="DenseSum's words are made on the host"):
        exact_all_reduce(DenseSum(3), words="device")
