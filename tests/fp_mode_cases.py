"""Exact folds of subnormal-heavy data through every entry point, for the FTZ/DAZ tests.

:func:`inputs` makes the data (from bit patterns, so that no float
instruction touches a subnormal while it is made); :func:`results` folds it
through every entry point and returns each result's bit patterns;
:func:`expected` gives the Fraction oracle's bits for the same names. Run as a
script (``python tests/fp_mode_cases.py N``), it turns FTZ and DAZ on *before*
anything starts a thread, so Numba's worker threads and XLA's run with them
too, and prints the results as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import exact_fold_oracle

#: Bucket counts that take the host's different exact routes by themselves.
KS = (6, 3000, 300_000)


def _f32(bits: Any) -> np.ndarray:
    return np.asarray(bits, np.uint64).astype(np.uint32).view(np.float32)


def _f64(bits: Any) -> np.ndarray:
    return np.asarray(bits, np.uint64).view(np.float64)


def inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Index and values: hand-made subnormal buckets 0..5, then ``n`` random values over 6..K.

    The random values are subnormals and small normals of both signs, so that
    sums cross the subnormal boundary both ways. Positions are shuffled.
    """
    rng = np.random.default_rng(seed)
    sub = 0x0020AAC8  # 3e-39, a float32 subnormal (its bits: no float instruction may read it)
    hand = [
        (0, [sub] * 5000),  # 5,000 x 3e-39: about 1.5e-35, a normal number
        (1, [1] * 7 + [0x80000001] * 3),  # 7 tiny - 3 tiny = 4 * 2^-149
        (2, rng.integers(1, 1 << 23, 500) | (rng.integers(0, 2, 500) << 31)),  # subnormals
        (3, [0x00C00000, 0x80800000]),  # 1.5 * 2^-126 - 2^-126 = 2^-127, a subnormal sum
        (4, [0x80000001, 0x80000001, 0x80000000]),  # -2 * 2^-149 (and a -0.0)
        (5, [0x3F800000, 1]),  # 1 + 2^-149 rounds to 1
    ]
    idx = [np.full(len(b), k) for k, b in hand]
    bits = [np.asarray(b, np.uint64) for _, b in hand]
    exps = rng.integers(0, 12, n)  # biased exponents 0 (subnormal) .. 11
    rand = (exps << 23) | rng.integers(0, 1 << 23, n) | (rng.integers(0, 2, n) << 31)
    idx.append(rng.integers(6, 1 << 40, n))  # reduced mod K by the caller
    bits.append(rand.astype(np.uint64))
    index = np.concatenate(idx).astype(np.int64)
    value_bits = np.concatenate(bits)
    perm = rng.permutation(index.size)
    # float64 values: subnormal float64s and normals whose sums are subnormal
    b64 = rng.integers(1, 1 << 52, index.size, dtype=np.int64).astype(np.uint64)
    normal = rng.random(index.size) < 0.5
    b64[normal] = (np.uint64(1) << np.uint64(52)) | (b64[normal] & np.uint64((1 << 20) - 1))
    b64 |= rng.integers(0, 2, index.size).astype(np.uint64) << np.uint64(63)
    return {
        "index": index[perm],
        "f32": _f32(value_bits[perm]),
        "f64": _f64(b64),
        "f16": (value_bits[perm] & 0x83FF).astype(np.uint16).view(np.float16),
        "bf16": (value_bits[perm] >> 16).astype(np.uint16),
    }


def _index(data: dict[str, np.ndarray], K: int) -> np.ndarray:
    i = data["index"]
    return np.where(i < 6, i, 6 + i % max(1, K - 6)) if K > 6 else np.minimum(i, K - 1)


def _bits(a: Any) -> list[int]:
    arr = np.asarray(a)
    if arr.dtype.itemsize == 2:
        return arr.view(np.uint16).reshape(-1).tolist()
    return arr.view(np.uint32 if arr.dtype.itemsize == 4 else np.uint64).reshape(-1).tolist()


def results(data: dict[str, np.ndarray], *, distributed: bool = False) -> dict[str, list[int]]:
    """Every entry point's exact result for ``data``, as bit patterns (see :func:`expected`)."""
    import bitfold
    from bitfold import dispatch

    out: dict[str, list[int]] = {}
    v32, v64 = data["f32"], data["f64"]
    for K in KS:
        idx = _index(data, K)
        plan = bitfold.Fold(idx, K)
        out[f"numpy K={K}"] = _bits(plan(v32))
        routes = ["limbs", "partitioned-stream", "float-stream", "sorted-stream", "buckets"]
        for route in routes:
            out[f"numpy K={K} route={route}"] = _bits(dispatch.fold(plan, v32, route=route))
        out[f"numpy K={K} route=limbs kernel=limbs"] = _bits(
            dispatch.fold(plan, v32, route="limbs", kernel="limbs")
        )
        out[f"numpy K={K} float64-out"] = _bits(plan(v32, out_dtype="float64"))
        out[f"numpy K={K} rows"] = _bits(plan(np.stack([v32, _negated(v32[::-1])], 1)))
        out[f"numpy K={K} init"] = _bits(dispatch.fold(plan, v32, init=_init(K)))
        for route in ("auto", "limbs", "sorted-stream", "buckets"):
            out[f"numpy K={K} f64 route={route}"] = _bits(dispatch.fold(plan, v64, route=route))
        out[f"numpy K={K} f16"] = _bits(plan(data["f16"]))
        out[f"numpy K={K} bf16"] = _bits(_bf16_fold(plan, data["bf16"]))
        half = v32.size // 2
        acc = plan.accumulator().add(v32[:half], start=0)
        acc.merge(plan.accumulator().add(v32[half:], start=half))
        out[f"accumulator K={K}"] = _bits(acc.result())
    out.update(_dense(data, distributed))
    out.update(_torch(data))
    out.update(_jax(data))
    return out


def _negated(v: np.ndarray) -> np.ndarray:
    """``-v`` by its sign bit (no float instruction)."""
    return (v.view(np.uint32) ^ np.uint32(1 << 31)).view(np.float32)


def _init(K: int) -> np.ndarray:
    return _f32(np.arange(K, dtype=np.uint64) % 7 + (np.arange(K, dtype=np.uint64) % 2 << 31))


def _bf16_fold(plan: Any, bits16: np.ndarray) -> Any:
    import torch

    return plan(torch.from_numpy(bits16.view(np.int16)).view(torch.bfloat16)).numpy()


def _dense_arrays(data: dict[str, np.ndarray]) -> list[np.ndarray]:
    v = data["f32"]
    m = v.size // 4
    return [v[j * m : (j + 1) * m] for j in range(4)]


def _dense(data: dict[str, np.ndarray], distributed: bool) -> dict[str, list[int]]:
    from bitfold.dense import DenseSum

    arrays = _dense_arrays(data)
    s = DenseSum(arrays[0].shape)
    for a in arrays:
        s.add(a)
    out = {"DenseSum": _bits(s.result())}
    if distributed:
        import tempfile

        import torch.distributed as dist

        from bitfold.distributed import exact_all_reduce

        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
            try:
                out["exact_all_reduce"] = _bits(exact_all_reduce(s)[0])
            finally:
                dist.destroy_process_group()
    return out


def _torch(data: dict[str, np.ndarray]) -> dict[str, list[int]]:
    import torch

    import bitfold.torch as bt

    K = KS[1]
    idx = torch.from_numpy(_index(data, K))
    vals = torch.from_numpy(data["f32"].copy())
    out = {"torch index_add": _bits(bt.index_add(torch.zeros(K), 0, idx, vals).numpy())}
    with bt.exact_mode():
        folded = torch.zeros(K).index_add_(0, idx, vals)
    out["torch exact_mode index_add_"] = _bits(folded.numpy())
    return out


def _jax(data: dict[str, np.ndarray]) -> dict[str, list[int]]:
    import jax

    import bitfold.jax as bj

    K = KS[1]
    fold = jax.jit(bj.segment_sum, static_argnums=2)
    return {"jax segment_sum jit": _bits(fold(data["f32"], _index(data, K), K))}


def expected(data: dict[str, np.ndarray], names: list[str]) -> dict[str, list[int]]:
    """The Fraction oracle's bits for each result name of :func:`results`."""
    v32, v64 = data["f32"], data["f64"]
    oracle: dict[str, list[int]] = {}
    cache: dict[Any, list[int]] = {}

    def fold(K: int, values: np.ndarray, out: str = "float32", what: str = "f32") -> list[int]:
        if (K, what, out) not in cache:
            cache[K, what, out] = _bits(exact_fold_oracle(_index(data, K), values, K, out))
        return cache[K, what, out]

    wide32 = data["bf16"].astype(np.uint32) << 16
    for name in names:
        K = int(name.split("K=")[1].split()[0]) if "K=" in name else KS[1]
        if name.startswith("numpy") or name.startswith("accumulator"):
            if name.endswith("float64-out"):
                oracle[name] = fold(K, v32, "float64")
            elif name.endswith(" rows"):
                a = np.array(fold(K, v32)).reshape(-1, 1)
                neg = exact_fold_oracle(_index(data, K), _negated(v32[::-1]), K)
                oracle[name] = np.concatenate([a, _u(neg).reshape(-1, 1)], 1).ravel().tolist()
            elif name.endswith(" init"):
                idx = np.concatenate([_index(data, K), np.arange(K)])
                vals = np.concatenate([v32, _init(K)])
                oracle[name] = _bits(exact_fold_oracle(idx, vals, K))
            elif " f64 " in name:
                oracle[name] = fold(K, v64, "float64", "f64")
            elif name.endswith(" f16"):
                oracle[name] = fold(K, data["f16"].astype(np.float32), what="f16")  # exact
            elif name.endswith(" bf16"):
                oracle[name] = fold(K, wide32.view(np.float32), what="bf16")
            else:
                oracle[name] = fold(K, v32)
        elif name in ("DenseSum", "exact_all_reduce"):
            arrays = _dense_arrays(data)
            m = arrays[0].size
            idx = np.tile(np.arange(m), len(arrays))
            oracle[name] = _bits(exact_fold_oracle(idx, np.concatenate(arrays), m))
        else:  # torch and jax: a scalar fold of float32 values into KS[1] buckets
            oracle[name] = fold(K, v32)
    return oracle


def _u(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)


if __name__ == "__main__":
    from fpmode import flush_denormals_on, flushes

    flush_denormals_on()  # before any thread starts: worker threads inherit it
    import torch

    torch.set_flush_denormal(True)
    assert flushes(), "the float unit does not flush subnormals after setting FTZ/DAZ"
    payload = results(inputs(int(sys.argv[1])), distributed=True)
    payload["flushes at the end"] = [int(flushes())]
    print(json.dumps(payload))
