#!/usr/bin/env python3
"""``make mutants``: plant known bugs one at a time and check that the tests meant to catch
each one fail (several minutes; tests/test_mutants.py runs a fast part of it in the suite).

Each mutation replaces one exact piece of source text in a copy of ``src/bitfold``
(in a temporary directory, first on ``PYTHONPATH``: the checkout is never edited)
and runs the tests that must kill it against that copy. A mutation of compiled code
(``kernels/``) runs with an empty Numba cache, so that every kernel that inlines the
mutated function is compiled again from the copy (Numba's cache of a kernel does not
notice a change in another file). A mutation whose tests still pass *survived*: a
missing test. A mutation whose text does not occur exactly once in its file is
*stale*: the code it guarded has changed, and the mutation must be brought up to
date. Prints a table, writes JSON (``--json PATH``) and exits 1 when any mutation
survived, went stale or could not run.

    python scripts/mutants.py [--only NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "bitfold"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to src/bitfold
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: the tests that must fail
    why: str


MUTATIONS = (
    Mutation(
        "mode: a process with a sparse tensor still starts its modes on the fold kernels",
        "torch/mode.py",
        '        if self.full or (self.full is None and _kernels["sparse_seen"]):\n',
        "        if self.full:\n",
        ("tests/test_torch_mode_kernels.py", "-k", "made_outside_the_mode"),
        "a CSR matrix from to_sparse_csr() times a vector reached no kernel: 0.0 for 1.0, "
        "nothing counted or passed",
    ),
    Mutation(
        "mode: the import does not look for sparse tensors made before it",
        "torch/mode.py",
        "    if _sparse_tensors_alive():\n        _sparse_seen()\n",
        "    pass\n",
        ("tests/test_torch_mode_kernels.py", "-k", "before_the_import"),
        "a sparse tensor made before importing bitfold.torch left its products unseen",
    ),
    Mutation(
        "rules: a sparse matrix times a vector left to torch",
        "torch/handlers.py",
        "    out = sparse_product(None, A, x.unsqueeze(1))\n",
        "    return UNTOUCHED\n    out = sparse_product(None, A, x.unsqueeze(1))\n",
        ("tests/test_torch_one_answer.py", "-k", "mv and exact_mode"),
        "torch.mv of a CSR matrix gave torch's sum in every mode, nothing counted or passed",
    ),
    Mutation(
        "mode: put returns ATen's inexact sum (still counted)",
        "torch/handlers.py",
        "    return folds.put(x, index, source)\n",
        "    return torch.ops.aten.put(x, index, source, True)\n",
        ("tests/test_torch_dropins.py", "-k", "correctly_rounded and put"),
        "issue 19: put of [1, 2^-24, 2^-24] gave 1.0 and every test passed",
    ),
    Mutation(
        "mode: scatter_reduce returns ATen's inexact sum (still counted)",
        "torch/handlers.py",
        '    return folds.scatter_reduce(x, dim, index, src, reduce, bool(a["include_self"]))\n',
        "    return torch.ops.aten.scatter_reduce(x, dim, index, src, reduce,"
        ' include_self=bool(a["include_self"]))\n',
        ("tests/test_torch_dropins.py", "-k", "correctly_rounded and scatter_reduce"),
        "issue 19: the mode's tests compared with torch within a tolerance",
    ),
    Mutation(
        "mode: index_add returns ATen's inexact sum (still counted)",
        "torch/handlers.py",
        "lambda *xdis: folds.index_add(*xdis, alpha))\n",
        "lambda x, d, i, s: torch.ops.aten.index_add(x, d, i, s, alpha=alpha))\n",
        ("tests/test_torch_dropins.py", "-k", "correctly_rounded and index_add"),
        "one of our own: the same hole for another op",
    ),
    Mutation(
        "dense wire: a wrong borrow in the two-word encoding of a negative sum",
        "kernels/dense.py",
        "            return (np.int64(1) << WIDE_LOW_BITS) - w0, -w1 - 1\n",
        "            return (np.int64(1) << WIDE_LOW_BITS) - w0, -w1\n",
        ("tests/test_dense.py",),
        "issue 19: caught only by a property test, in 6 of 10 runs",
    ),
    Mutation(
        "CPU limbs: no carry normalisation between chunks",
        "kernels/cpu.py",
        "_F64[0], _F64[1], _F64[2], True)\n        normalise_rows(acc)\n",
        "_F64[0], _F64[1], _F64[2], True)\n",
        ("tests/test_exact.py", "-k", "carried_in_time"),
        "issue 19: test_carries_are_normalised_before_a_limb_overflows could not fail",
    ),
    Mutation(
        "bucket route: a -0.0 chunk sum counted as a non-negative-zero term",
        "kernels/ieee.py",
        "    if not (x == 0.0 and math.copysign(1.0, x) < 0.0):\n        row[L + 1] += 1\n",
        "    row[L + 1] += 1\n",
        ("tests/test_rows.py", "-k", "negative_zeros"),
        "issue 19: 40 x -0.0 folded to +0.0 and only the dense tests noticed",
    ),
    Mutation(
        "rounding: the sticky bit ignored (ties decided without the bits below)",
        "kernels/ieee.py",
        "        if half == 1 and (sticky or (m & 1) == 1):\n",
        "        if half == 1 and (m & 1) == 1:\n",
        ("tests/test_exact.py",),
        "one of our own: the heart of round-to-nearest-even",
    ),
    Mutation(
        "flush-to-zero: subnormals read by the float unit (DAZ turns them into zeros)",
        "kernels/ieee.py",
        "    if (b >> frac_bits) & ((int64(1) << exp_bits) - 1) != 0:  # normal, infinite or NaN\n",
        "    if b == b:  # every value widened by the float unit, subnormals too\n",
        ("tests/test_fp_modes.py", "-k", "not worker"),
        "issue 19: 5,000 x 3e-39 folded to 0 under torch.set_flush_denormal(True)",
    ),
    Mutation(
        "flush-to-zero: a subnormal result cast by the float unit (FTZ turns it into zero)",
        "kernels/ieee.py",
        "    return x == x and (x == 0.0 or abs(x) >= tiny)\n",
        "    return x == x\n",
        ("tests/test_fp_modes.py", "-k", "not worker"),
        "one of our own: the output side of the same bug",
    ),
    Mutation(
        "checked_add: every float64 addition trusted as exact",
        "kernels/ieee.py",
        "    return np.nan if (not exact) | subnormal else s\n",
        "    return s\n",
        ("tests/test_rows.py", "-k", "oracle"),
        "one of our own: the float64 fast paths' only guard",
    ),
    Mutation(
        "checked_add_narrow: every addition of float32 sums trusted as exact",
        "kernels/ieee.py",
        "    return s if (s - a == b) & (s - b == a) else np.nan\n",
        "    return s\n",
        ("tests/test_host_routes.py", "-k", "float_stream"),
        "one of our own: the float streams' only guard",
    ),
    Mutation(
        "mode: the embedding-bag forward left to ATen's inexact sums",
        "torch/handlers.py",
        '    if int(a["mode"]) == 2:\n        return UNTOUCHED  # a bag\'s maximum is exact in any '
        "order\n",
        '    if int(a["mode"]) >= 0:\n        return UNTOUCHED  # a bag\'s maximum is exact in any '
        "order\n",
        ("tests/test_torch_forward_folds.py", "-k", "embedding_bag_forward_is_the_oracle"),
        "one of our own: the forward bag sums passed unseen, 595 of 1,024 outputs order-dependent",
    ),
    Mutation(
        "bag sums: ATen's inexact index_add inside the exact forward",
        "torch/folds.py",
        "        sums = fold_rows(bags, terms, num_bags)\n",
        "        sums = terms.new_zeros((num_bags, terms.shape[1])).index_add_(0, bags, terms)\n",
        ("tests/test_torch_forward_folds.py", "-k", "embedding_bag_forward or compiled_embedding"),
        "one of our own: the exact mode and the compiled graphs share this sum",
    ),
    Mutation(
        "small folds: x[i, j] += v's ids flattened without j",
        "kernels/planning.py",
        "                k = k * sizes[d] + j\n",
        "                k = k * sizes[d]\n",
        ("tests/test_torch_plan_cache.py", "-k", "negative_ids"),
        "a row of a two-index index_put sent to another bucket, with no error",
    ),
    Mutation(
        "means: divided by the count rounded to the dtype",
        "torch/folds.py",
        "    return (sums.to(torch.float64) / counts.to(torch.float64)).to(sums.dtype)\n",
        "    return sums / counts.to(sums.dtype)\n",
        ("tests/test_torch_forward_folds.py", "-k", "narrow_dtype_cannot or long_narrow"),
        "one of our own: bfloat16 holds 257 as 256",
    ),
    Mutation(
        "histograms: ATen's inexact bin sums",
        "torch/histograms.py",
        "    hist = fold_rows(flat, weight, math.prod(shape)).view(shape)\n",
        "    hist = weight.new_zeros(math.prod(shape)).index_add_(0, flat, weight).view(shape)\n",
        ("tests/test_torch_forward_folds.py", "-k", "histogram"),
        "one of our own: weighted histograms were folds nobody saw",
    ),
    Mutation(
        "max pooling: the gradients of overlapping windows summed by ATen",
        "torch/folds.py",
        "    return fold_positions(positions.reshape(-1), grad.reshape(-1), target)\n",
        "    return target.view(-1).index_add_(0, positions.reshape(-1), grad.reshape(-1))"
        ".view(target.shape)\n",
        ("tests/test_torch_forward_folds.py", "-k", "max_pool"),
        "one of our own: an index-driven backward the audit of ATen's ops found",
    ),
    Mutation(
        "compile: a weighted bincount run outside the graph",
        "torch/compiled.py",
        "        if func in _BINCOUNTS:\n            return _bincount(args, kwargs)\n",
        "",
        ("tests/test_torch_forward_folds.py", "-k", "bincount"),
        "one of our own: Dynamo ran it in eager code, in the order of its pairs",
    ),
    Mutation(
        "extension ops: sums left to the extension's own kernels",
        "torch/extension_ops.py",
        "    if op in TRANSLATIONS:\n        return ExtensionRule(TRANSLATIONS[op])\n",
        "",
        ("tests/test_torch_extension_ops.py", "-k", "oracle"),
        "one of our own: torch_scatter's and pyg_lib's sums ran unseen",
    ),
    Mutation(
        "compile: the rewrites of graphs loaded from inductor's caches not counted",
        "torch/graph_pass.py",
        "            else:\n                self._apply(key, n)\n",
        "",
        ("tests/test_torch_forward_folds.py", "-k", "compiled_from_the_cache"),
        "one of our own: a second compiled model reported Counter()",
    ),
    Mutation(
        "errors: an unknown option reaches Python's TypeError",
        "validate.py",
        "            if name not in names:\n                raise unknown_option_error(",
        "            if False:\n                raise unknown_option_error(",
        ("tests/test_validation.py", "-k", "unknown_option"),
        "one of our own: plan(values, route='turbo') was a raw TypeError",
    ),
    Mutation(
        "errors: a meta tensor reaches the fold",
        "arrays.py",
        "    if isinstance(kind, str) and kind in NO_DATA_DEVICES:\n",
        "    if False:\n",
        ("tests/test_validation.py", "-k", "meta_tensor"),
        "one of our own: a meta index made some folds return uninitialised memory",
    ),
    Mutation(
        "errors: a read-only add_at target found after the whole fold",
        "functions.py",
        '    if library == "numpy" and not a.flags.writeable:\n',
        "    if False:\n",
        ("tests/test_dropins.py", "-k", "read_only"),
        "one of our own: NumPy's error came after 4.7 s of folding",
    ),
    Mutation(
        "errors: a compiled fold's index error inside inductor's wrappers",
        "torch/compiled.py",
        "            raise refusal.with_traceback(None) from None\n",
        "            raise refusal from exc\n",
        ("tests/test_torch_compile.py", "-k", "one_bitfold_error"),
        "one of our own: 29 frames and the same error chained",
    ),
    Mutation(
        "CLI: a cut PyTorch file read past the check",
        "repro/checkpoint.py",
        "        names = _zip_members(p)\n",
        '        names = ["data.pkl"]\n',
        ("tests/test_checkpoint.py", "-k", "truncated_pytorch_file"),
        "one of our own: digest --model said '[Errno 22] Invalid argument'",
    ),
    Mutation(
        "CLI: an unknown flag answered with the top-level usage",
        "cli/__init__.py",
        '        getattr(args, "_parser", parser).error(',
        "        parser.error(",
        ("tests/test_cli_errors.py", "-k", "unknown_flag"),
        "one of our own: bitfold probe --bogus printed bitfold's usage",
    ),
    Mutation(
        "Triton rounding: ties go up instead of to even",
        "kernels/triton.py",
        "    up = (q > 0) & half & (below | ((m & 1) == 1))\n",
        "    up = (q > 0) & half\n",
        ("tests/test_backend_table.py", "-k", "triton and boundaries"),
        "the Triton kernels' own rounding: only boundary cases have ties",
    ),
    Mutation(
        "Triton: a -0.0 term counted as a non-negative zero (the one-word lanes)",
        "kernels/triton.py",
        "        signs | not_negzero,\n",
        "        signs | raw,\n",
        ("tests/test_triton_word_path.py", "-k", "specials"),
        "a bucket of -0.0 terms would sum to +0.0 on the GPU only",
    ),
    Mutation(
        "Triton decode: subnormal values read with a hidden bit, as if normal",
        "kernels/triton.py",
        "    m = tl.where(e == 0, frac, frac | (1 << FRAC_BITS))\n",
        "    m = frac | (1 << FRAC_BITS)\n",
        ("tests/test_selftest.py", "-k", "triton_kernels_pass_their_known_answers"),
        "the known-answer test must fail a wrong kernel before it folds: subnormal sums",
    ),
    Mutation(
        "Triton hot buckets: each chunk's last position left out",
        "backends/triton.py",
        "        end = torch.minimum(start + chunk, pt.offsets[buckets + 1][rank])\n",
        "        end = torch.minimum(start + chunk - 1, pt.offsets[buckets + 1][rank])\n",
        ("tests/test_triton_backend.py", "-k", "rows_with_hot"),
        "the split of hot buckets must cover every position once",
    ),
    Mutation(
        "small folds in place: a NaN in a row no id reaches kept with its payload",
        "kernels/buckets.py",
        "        if found:\n",
        "        if False:\n",
        ("tests/test_small_folds_oracle.py", "-k", "small_folds_are"),
        "an untouched NaN must become the canonical one, as on every other route",
    ),
    Mutation(
        "small folds with no old value: positions left in their compact order",
        "kernels/buckets.py",
        "                by_bucket[at + j] = order[j]\n",
        "                by_bucket[j] = order[j]\n",
        ("tests/test_small_folds_oracle.py", "-k", "small_folds_are"),
        "each bucket's rows must be the ones its ids name",
    ),
)


def mutated_copy(mutation: Mutation, original: str, into: Path) -> dict[str, str]:
    """Copy ``src/bitfold`` under ``into``, its file ``original`` (the text of
    ``mutation.path``) mutated; the environment in which Python imports the copy."""
    compiled = mutation.path.startswith("kernels/")
    copy = into / "src" / "bitfold"
    # compiled code: no cache copied (every kernel compiled from the copy); else the checkout's
    # caches, still valid (copied with their sources' times)
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__") if compiled else None)
    (copy / mutation.path).write_text(original.replace(mutation.old, mutation.new))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy.parent), env.get("PYTHONPATH")]))
    env.pop("NUMBA_CACHE_DIR", None)
    if compiled:
        env["NUMBA_CACHE_DIR"] = str(into / "numba-cache")
    return env


def run(mutation: Mutation, timeout: float) -> dict[str, object]:
    """Run one mutation's tests against a mutated copy of the source; the outcome as a dict:
    killed, survived, stale (its text not found once) or error (the tests could not run)."""
    original = (SRC / mutation.path).read_text()
    found = original.count(mutation.old)
    result: dict[str, object] = {"name": mutation.name, "why": mutation.why,
                                 "tests": " ".join(mutation.tests)}  # fmt: skip
    if found != 1:
        detail = (f"the text to mutate occurs {found} times in {mutation.path} (once expected): "
                  "the code changed, update the mutation")  # fmt: skip
        return {**result, "outcome": "stale", "detail": detail}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bitfold-mutant-") as tmp:
        env = mutated_copy(mutation, original, Path(tmp))
        which = subprocess.run([sys.executable, "-c", "import bitfold; print(bitfold.__file__)"],
                               cwd=ROOT, capture_output=True, text=True, env=env, check=False)
        imported = Path(which.stdout.strip() or ".").resolve()
        if not imported.is_relative_to(Path(tmp).resolve()):
            detail = f"the tests would not import the mutated copy: {which.stdout or which.stderr}"
            return {**result, "outcome": "error", "detail": detail.strip()}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               *mutation.tests]  # fmt: skip
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=timeout, env=env, check=False)  # fmt: skip
            last = (proc.stdout.strip().splitlines() or [""])[-1]
            outcome = {1: "killed", 0: "survived"}.get(proc.returncode, "error")
        except subprocess.TimeoutExpired:
            outcome, last = "error", f"the tests ran past {timeout:.0f} s"
    return {**result, "outcome": outcome, "detail": last,
            "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="run the mutations whose name contains these")
    parser.add_argument("--json", metavar="PATH", help="also write the outcomes as JSON")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a mutation's tests")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(w in m.name for w in args.only)]
    results = []
    for m in chosen:
        r = run(m, args.timeout)
        results.append(r)
        print(f"{r['outcome']:>8}  {m.name}  ({r.get('seconds', 0)} s: {r['detail']})", flush=True)
    bad = [r for r in results if r["outcome"] != "killed"]
    print(f"\n{len(results) - len(bad)} of {len(results)} mutations killed")
    for outcome, meaning in (("survived", "a missing test"),
                             ("stale", "its text is gone from the code: update the mutation"),
                             ("error", "its tests could not run")):  # fmt: skip
        names = [str(r["name"]) for r in bad if r["outcome"] == outcome]
        if names:
            print(f"FAILED, {outcome} ({meaning}): " + "; ".join(names))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
