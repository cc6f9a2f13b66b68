"""Canonical digests: the documented encoding, and the same digest from every library."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import bitfold


def _by_the_spec(name: str, shape: tuple[int, ...], data: bytes) -> bytes:
    h = hashlib.sha256(b"bitfold-array-v1\0")
    h.update(f"{name}\0{','.join(map(str, shape))}\0{len(data)}\0".encode())
    h.update(data)
    return h.digest()


def test_array_digest_follows_the_documented_encoding():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = "sha256:" + _by_the_spec("float32", (2, 3), a.astype("<f4").tobytes()).hex()
    assert bitfold.digest(a) == want


def test_mapping_digest_sorts_names():
    a, b = np.zeros(2, np.float32), np.ones(3, np.float64)
    h = hashlib.sha256(b"bitfold-dict-v1\0")
    h.update(b"2\0")
    for name, arr in (("alpha", b), ("beta", a)):
        h.update(name.encode() + b"\0")
        h.update(_by_the_spec(arr.dtype.name, arr.shape, arr.tobytes()))
    assert bitfold.digest({"beta": a, "alpha": b}) == "sha256:" + h.hexdigest()
    assert bitfold.digest({"beta": a, "alpha": b}) == bitfold.digest({"alpha": b, "beta": a})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (np.zeros(3, np.float32), np.zeros(3, np.float64)),  # dtype
        (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)),  # shape
        (np.array([0.0], np.float32), np.array([-0.0], np.float32)),  # signed zero
        (np.array([1, 2], np.int32), np.array([2, 1], np.int32)),  # order
    ],
)
def test_different_contents_give_different_digests(a, b):
    assert bitfold.digest(a) != bitfold.digest(b)
    assert not bitfold.bits_equal(a, b)


def test_byte_order_and_layout_do_not_matter():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert bitfold.digest(a.astype(">f4")) == bitfold.digest(a)
    assert bitfold.digest(np.asfortranarray(a)) == bitfold.digest(a)
    assert bitfold.bits_equal(a.T.copy().T, a)


def test_nan_payloads_are_compared_bitwise():
    a = np.array([0x7FC00000], np.uint32).view(np.float32)
    b = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert bitfold.bits_equal(a, a.copy()) and not bitfold.bits_equal(a, b)


def test_the_bytes_hashed_are_the_array_itself_not_a_copy():
    from bitfold.arrays import raw_bits

    a = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    name, shape, data = raw_bits(a)
    assert (name, shape, data.nbytes, data.readonly) == ("float32", (256, 256), a.nbytes, True)
    assert np.shares_memory(np.frombuffer(data, np.uint8), a)  # a (10^6, 64) copy costs 0.2 s
    assert bytes(data) == a.tobytes()


def test_torch_and_numpy_give_the_same_digest():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    a = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    t = torch.from_numpy(a.copy()).t().contiguous().t()  # a non-trivial layout
    assert bitfold.digest(t) == bitfold.digest(a)
    assert bitfold.digest({"w": t}) == bitfold.digest({"w": a})
    bf = torch.tensor([1.0, -2.5], dtype=torch.bfloat16)
    want = "sha256:" + _by_the_spec("bfloat16", (2,), bf.view(torch.int16).numpy().tobytes()).hex()
    assert bitfold.digest(bf) == want


def test_non_string_names_are_refused():
    with pytest.raises(bitfold.FoldTypeError, match="string names"):
        bitfold.digest({1: np.zeros(1)})


def test_object_arrays_are_refused():
    with pytest.raises(bitfold.FoldTypeError, match="object"):
        bitfold.digest(np.array([1, "a"], dtype=object))


@pytest.mark.parametrize("thing", [[1, 2, 3], 1.0, "abc"])
def test_non_arrays_are_refused(thing):
    with pytest.raises(bitfold.FoldTypeError, match="digests are of arrays"):
        bitfold.digest(thing)
