"""Every GPU kernel variant bitfold launches, as the builds without a GPU need them.

The machine-code checks (``tests/test_cuda_compile.py``, ``tests/test_triton_compile.py``
through ``tests/triton_machine_code.py``) and ``make kernel-report``
(``scripts/kernel_report.py``, which loads this file by path) build each of these for
compute capability 9.0 (and AMD gfx942) and read what the hardware would execute. The lists
live beside the tests, not in the package: no user calls them. A kernel the backends launch
with a new signature or constexpr set belongs here, or it is never built before a GPU run.

* :func:`cuda_targets`: ``(name, python function, argument types)`` for
  ``numba.cuda.compile_ptx`` (:mod:`bitfold.kernels.cuda`);
* :func:`triton_targets` and :func:`triton_word_targets`: ``(name, kernel, signature,
  constexprs)`` for ``triton.compile(ASTSource(...), target=GPUTarget(...))``
  (:mod:`bitfold.kernels.triton`, :mod:`bitfold.kernels.triton_words`);
  :func:`triton_all` is both.

Each imports its kernel module when called, so that a missing numba-cuda or Triton costs
only the lists that need it.
"""

from __future__ import annotations

from typing import Any

#: The pointer type of a float format's bits in a Triton signature.
POINTER = {"float16": "*i16", "bfloat16": "*i16", "float32": "*i32", "float64": "*i64"}


def _typed(pointers: dict[str, str], scalars: tuple[str, ...], const: dict[str, Any]) -> tuple[
        dict[str, str], dict[str, Any]]:  # fmt: skip
    """A Triton signature: the pointers, the ``i32`` scalars and the constexprs, by name."""
    sig = {**pointers, **dict.fromkeys(scalars, "i32"), **dict.fromkeys(const, "constexpr")}
    return sig, const


def cuda_targets() -> list[tuple[str, Any, tuple[Any, ...]]]:
    """``(name, python function, argument types)`` of every kernel, for ``cuda.compile_ptx``.

    Every kernel :mod:`bitfold.kernels.cuda` launches appears here with the
    signatures it is launched with, so that ``tests/test_cuda_compile.py`` can
    compile each for sm_90 and read its PTX and machine code.
    """
    from numba import types

    from bitfold.formats import LIMBS, OUT_DTYPES
    from bitfold.kernels import cuda as kernels

    i32, i64 = types.int32, types.int64
    arr = types.Array
    targets: list[tuple[str, Any, tuple[Any, ...]]] = []
    bit_types = {"float32": types.uint32, "float16": types.uint16, "bfloat16": types.uint16,
                 "float64": types.int64}  # fmt: skip
    for source, bt in bit_types.items():
        sig = (arr(i32, 1, "C"), arr(bt, 1, "C"), i64, i64, arr(i64, 2, "C"))
        shared, global_ = kernels.exact_shared_kernel(source), kernels.exact_global_kernel(source)
        targets.append((f"exact_shared[{source}]", shared.py_func, sig))
        targets.append((f"exact_global[{source}]", global_.py_func, sig))
    ints = {"float16": types.int16, "float32": types.int32, "float64": types.int64}
    for fmt in LIMBS.values():
        for out_name, widen in [(n, False) for n in OUT_DTYPES] + [("bfloat16", True)]:
            bits_t = types.int32 if widen else ints.get(out_name, types.int16)
            targets.append(
                (
                    f"round[{fmt.name}->{out_name}{'>float32' if widen else ''}]",
                    kernels.round_kernel(fmt.limbs, fmt.unit_exp, out_name, widen).py_func,
                    (arr(i64, 2, "C"), arr(i64, 1, "C"), i64, i64, arr(bits_t, 1, "C")),
                )
            )
        targets.append(
            (
                f"settle[{fmt.name}]",
                kernels.settle_kernel(fmt.limbs).py_func,
                (arr(i64, 2, "C"), arr(i64, 1, "C"), i64),
            )
        )
    floats = {"float16": types.float16, "float32": types.float32, "float64": types.float64}
    for value_name, ft in floats.items():
        targets.append(
            (
                f"gather_rows[{value_name}]",
                kernels.gather_rows.py_func,
                (arr(i32, 1, "C"), arr(ft, 2, "C"), arr(ft, 2, "C")),
            )
        )
    pairs = [("float32", o) for o in floats] + [("float16", "float32"), ("float64", "float64")]
    for value_name, out_name in pairs:
        targets.append(
            (
                f"ordered[{value_name}->{out_name}]",
                kernels.ordered_kernel(out_name).py_func,
                (
                    arr(i32, 1, "C"),
                    arr(floats[value_name], 2, "C"),
                    arr(floats[out_name], 2, "C"),
                    arr(ints[out_name], 2, "C"),
                ),
            )
        )
    for value_name, out_name in [("float32", "float32"), ("float32", "float64"),
                                 ("float16", "float32"), ("float64", "float64")]:  # fmt: skip
        targets.append(
            (
                f"atomic[{value_name}->{out_name}]",
                kernels.atomic_kernel(out_name).py_func,
                (arr(i32, 1, "C"), arr(floats[value_name], 2, "C"), arr(floats[out_name], 2, "C")),
            )
        )
    bucket_cases = [("float32", o, False) for o in ("float32", "float16", "float64")]
    bucket_cases += [("float32", "bfloat16", True), ("float32", "bfloat16", False)]
    bucket_cases += [("float16", "float32", False)]
    bucket_cases += [("float64", o, False) for o in ("float64", "float32", "float16", "bfloat16")]
    bucket_cases += [("float64", "bfloat16", True)]
    bucket_cases += [("bfloat16", "bfloat16", False), ("bfloat16", "float32", False)]
    for source, out_name, widen in bucket_cases:
        bits_t = types.int32 if widen else ints.get(out_name, types.int16)
        value_t = bit_types[source] if source == "bfloat16" else floats[source]
        targets.append(
            (
                f"buckets[{source}->{out_name}{'>float32' if widen else ''}]",
                kernels.buckets_kernel(source, out_name, widen).py_func,
                (
                    arr(value_t, 2, "C"),
                    arr(bit_types[source], 2, "C"),
                    arr(i32, 1, "C"),
                    arr(i32, 1, "C"),
                    arr(bits_t, 2, "C"),
                    arr(value_t, 2, "C"),
                    arr(bit_types[source], 2, "C"),
                    i64,
                    i64,
                ),
            )
        )
    for source, bt in bit_types.items():
        value_t = bt if source == "bfloat16" else floats[source]
        targets.append(
            (
                f"hot_segments[{source}]",
                kernels.hot_segments_kernel(source).py_func,
                (arr(value_t, 2, "C"), arr(bt, 2, "C"), arr(i32, 1, "C"), arr(i32, 1, "C"),
                 arr(i64, 1, "C"), arr(i64, 1, "C"), arr(i32, 1, "C"), i64, i64,
                 arr(i64, 2, "C")),
            )
        )  # fmt: skip
    for source, out_name, widen in bucket_cases:
        bits_t = types.int32 if widen else ints.get(out_name, types.int16)
        targets.append(
            (
                f"hot_round[{source}->{out_name}{'>float32' if widen else ''}]",
                kernels.hot_round_kernel(source, out_name, widen).py_func,
                (arr(i64, 2, "C"), arr(i64, 1, "C"), arr(bits_t, 2, "C"),
                 arr(bit_types[source], 2, "C"), i64),
            )
        )  # fmt: skip
    targets.append(
        (
            "cast_f32_to_f16",
            kernels.cast_f32_to_f16.py_func,
            (arr(types.float32, 1, "C"), arr(types.float16, 1, "C")),
        )
    )
    targets.append(("zero_fill", kernels.zero_fill.py_func, (arr(i64, 1, "C"),)))
    targets.append(("add_fill", kernels.add_fill.py_func, (arr(i64, 1, "C"), arr(i64, 1, "C"))))
    return targets


def triton_targets() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    """``(name, kernel, signature, constexprs)`` of every fold kernel variant the triton backend
    launches (:mod:`bitfold.kernels.triton`).

    What ``triton.compile(ASTSource(kernel, signature, constexprs), target=...)``
    needs to build each one for a GPU without a GPU
    (``tests/test_triton_compile.py`` builds them all for sm_90 and reads the
    machine code).
    """
    from bitfold.formats import FLOATS, decoding, limb_format_for
    from bitfold.kernels import triton as kernels

    def decode(dtype: str) -> dict[str, Any]:
        exp_bits, frac_bits, shift = decoding(dtype)
        mask = {2: 0xFFFF, 4: 0xFFFFFFFF, 8: -1}[FLOATS[dtype].width // 8]
        return dict(BITS_MASK=mask, EXP_BITS=exp_bits, FRAC_BITS=frac_bits, SHIFT=shift,
                    WIDE=dtype == "float64")  # fmt: skip

    def target(out: str, unit: int) -> dict[str, Any]:
        t = FLOATS[out]
        return dict(UNIT=unit, PREC=t.precision, TEXP=t.exponent_bits, SUBEXP=t.subnormal_exp,
                    NAN_BITS=t.canonical_nan)  # fmt: skip

    out: list[tuple[str, Any, dict[str, str], dict[str, Any]]] = []
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        fmt = limb_format_for(dtype)
        limbs = dict(L=fmt.limbs, L_PAD=kernels.next_power_of_2(fmt.limbs))
        vp = POINTER[dtype]
        outs = ("float32", "float16", "bfloat16", "float64") if dtype != "float64" else (
            "float64", "float32", "float16", "bfloat16")  # fmt: skip
        for out_name in outs:
            op = POINTER[out_name]
            for has_init in (False, True):
                sig, const = _typed(
                    {"bits_ptr": vp, "order_ptr": "*i32", "offsets_ptr": "*i64", "init_ptr": vp,
                     "out_ptr": op}, ("K", "D", "hot_min"),
                    {**decode(dtype), "HAS_INIT": has_init, **limbs,
                     **target(out_name, fmt.unit_exp), "BLOCK_K": 128 if fmt.limbs < 16 else 32,
                     "BLOCK_D": 1, "WORD": True})  # fmt: skip
                out.append((f"lanes[{dtype}->{out_name}, init={has_init}]",
                            kernels.lanes_kernel, sig, const))  # fmt: skip
                sig, const = _typed(
                    {"state_ptr": "*i64", "out_ptr": op, "target_ptr": "*i64",
                     "terms_ptr": "*i32", "init_ptr": vp}, ("R", "D"),
                    {**decode(dtype), "HAS_TARGET": True, "HAS_TERMS": True,
                     "HAS_INIT": has_init, **limbs, "W": fmt.width,
                     **target(out_name, fmt.unit_exp), "BLOCK": 128 if fmt.limbs < 16 else 32})
                out.append((f"round_rows[{dtype}->{out_name}, init={has_init}]",
                            kernels.round_rows_kernel, sig, const))  # fmt: skip
        sig, const = _typed(
            {"bits_ptr": vp, "order_ptr": "*i32", "chunk_ptr": "*i64", "state_ptr": "*i64"},
            ("D",), {**decode(dtype), **limbs, "W": fmt.width, "BLOCK_N": 32, "BLOCK_D": 64})
        out.append((f"hot[{dtype}]", kernels.hot_kernel, sig, const))
        sig, const = _typed(
            {"bits_ptr": vp, "index_ptr": "*i64", "state_ptr": "*i64"}, ("N", "D"),
            {**decode(dtype), "L": fmt.limbs, "W": fmt.width, "BLOCK_N": 16, "BLOCK_D": 64})
        out.append((f"scatter[{dtype}]", kernels.scatter_kernel, sig, const))
    for values in ("float32", "float64"):
        for out_name in ("float16", "bfloat16", "float32", "float64"):
            t = FLOATS[out_name]
            sig, const = _typed(
                {"values_ptr": "*fp32" if values == "float32" else "*fp64", "order_ptr": "*i32",
                 "offsets_ptr": "*i64", "out_ptr": POINTER[out_name]}, ("K", "D"),
                {"NARROW": out_name in ("float16", "bfloat16"),
                 "WIDE_ACC": out_name == "float64",
                 "VAL_NARROW": values == "float64" and out_name != "float64",
                 "PREC": t.precision, "TEXP": t.exponent_bits, "SUBEXP": t.subnormal_exp,
                 "NAN_BITS": t.canonical_nan, "BLOCK_K": 128, "BLOCK_D": 1})  # fmt: skip
            out.append((f"ordered[{values}->{out_name}]", kernels.ordered_kernel, sig, const))
    return out


def triton_word_targets() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    """``(name, kernel, signature, constexprs)`` of every word kernel variant of the exact
    all-reduce (:mod:`bitfold.kernels.triton_words`), as :func:`triton_targets` lists the
    folds'; a decode's ``init=`` in its name says whether zero signs travel (``HAS_SIGNS``)."""
    from bitfold.formats import FLOATS
    from bitfold.kernels import triton_words as words
    from bitfold.kernels.dense import NO_HI, NO_LO, SPECIAL_HI

    out: list[tuple[str, Any, dict[str, str], dict[str, Any]]] = []
    for values in ("float32", "float64"):
        f = FLOATS[values]
        reading = {"EXP_BITS": f.exponent_bits, "FRAC_BITS": f.fraction_bits,
                   "BITS_MASK": -1 if values == "float64" else 0xFFFFFFFF}  # fmt: skip
        sig, const = _typed({"bits_ptr": POINTER[values], "out_ptr": "*i32"}, ("n", "blocks"),
                           {**reading, "NO_LO": NO_LO, "NO_HI": NO_HI, "SPECIAL_HI": SPECIAL_HI,
                            "BLOCK": 64, "BLOCKS": 16})  # fmt: skip
        out.append((f"bounds[{values}]", words.bounds_kernel, sig, const))
        sig, const = _typed({"bits_ptr": POINTER[values], "classes_ptr": "*i64", "lo_ptr": "*i64",
                            "offsets_ptr": "*i64", "words_ptr": "*i64"},
                           ("n", "blocks", "split"), {**reading, "BLOCK": 64, "BLOCKS": 16})
        out.append((f"words[{values}]", words.words_kernel, sig, const))
    for out_name in ("float16", "bfloat16", "float32", "float64"):
        t = FLOATS[out_name]
        for signs in (False, True):
            sig, const = _typed(
                {"words_ptr": "*i64", "classes_ptr": "*i64", "lo_ptr": "*i64",
                 "offsets_ptr": "*i64", "negzero_ptr": "*i32", "out_ptr": POINTER[out_name]},
                ("n", "blocks", "split", "mean"),
                {"HAS_SIGNS": signs, "PREC": t.precision, "TEXP": t.exponent_bits,
                 "SUBEXP": t.subnormal_exp, "BLOCK": 64, "BLOCKS": 16})  # fmt: skip
            out.append((f"decode[int64->{out_name}, init={signs}]", words.decode_kernel,
                        sig, const))  # fmt: skip
    return out


def triton_all() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    """Every Triton kernel variant: the folds' and the all-reduce's words'."""
    return triton_targets() + triton_word_targets()
