"""``bitfold bench``: the cost of determinism, measured against every peer, with plots.

Runs the selected sweeps (:mod:`bitfold.cli.bench.cases`) over the selected
contenders (:mod:`bitfold.cli.bench.contenders`) and writes into ``--out``:

* ``results.json``: machine, settings, command line, cases and one row per
  (case, contender) (fields in :mod:`bitfold.cli.bench.measure`), peak memory
  (:mod:`bitfold.cli.bench.worker`), Numba cold and warm start-up
  (:mod:`bitfold.cli.bench.startup`), whole training steps under
  ``exact_mode`` against plain PyTorch (:mod:`bitfold.cli.bench.steps`), the same
  steps compiled by ``bitfold.torch.compile`` against ``torch.compile``
  (:mod:`bitfold.cli.bench.compiled_steps`) and the seed configuration under one
  extra busy process (the ``load`` sweep, :mod:`bitfold.cli.bench.load`);
* ``summary.md`` generated from it (:mod:`bitfold.cli.bench.report`);
* PNG plots (:mod:`bitfold.cli.bench.plots`);

and prints a table on stdout. Everything that can be refused (names,
device, output folder, missing matplotlib) is checked before any work
starts; a contender that fails or runs out of memory is recorded as such
and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import sys
import time
from typing import Any

from ...errors import DeviceError, FoldError
from ..torch_env import passive_openmp_before_torch

HELP = "measure the cost of determinism: bitfold against every peer, with JSON, table and plots"

SCHEMA = "bitfold-bench/1"
PHASES = ("memory", "threads", "startup", "steps", "compiled", "plots")
#: Import name -> distributions that may provide it (first installed one wins): the libraries
#: a contender or an output of the benchmark may use, listed in ``machine.libraries``.
LIBRARIES = {
    "numpy": ("numpy",),
    "numba": ("numba",),
    "torch": ("torch",),
    "torch_scatter": ("torch-scatter", "torch_scatter"),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "numpy_groupies": ("numpy-groupies", "numpy_groupies"),
    "cupy": ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"),
    "matplotlib": ("matplotlib",),
    "tqdm": ("tqdm",),
}
#: What the table and summary of ``--from-json`` read from a saved ``results.json``.
RESULT_KEYS = ("date", "command", "settings", "machine", "sweeps", "cases", "results")
#: The seed configuration is the headline number: it gets this many times the repeats and time.
SEED_EXTRA = 3


def _names(text: list[str] | None) -> list[str] | None:
    """Comma- or space-separated names from one or more ``--flag`` values."""
    if text is None:
        return None
    return [n.strip() for part in text for n in part.split(",") if n.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``bitfold bench``'s options to ``parser``."""
    from ..devices import offered_devices
    from .cases import ALL_SWEEPS
    from .contenders import CONTENDERS, GROUPS

    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sweeps and fewer repeats (about 2 minutes on 2 cores)",
    )
    parser.add_argument(
        "--device", default="cpu", metavar="{" + ",".join(offered_devices()) + "}",
        help="where the folds run: the CPU (the default) or a device a backend folds torch "
        "tensors on",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output folder (default: benchmarks/results/<date>-<device>-<n>core)",
    )
    parser.add_argument(
        "--sweeps",
        nargs="+",
        metavar="NAME",
        default=None,
        help=f"sweeps to run (default: all): {', '.join(ALL_SWEEPS)}",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        metavar="NAME",
        default=None,
        help=f"contenders or groups (default: all): {', '.join(CONTENDERS)}; "
        f"groups {', '.join(GROUPS)}. The atomic baseline always runs.",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="N",
        help="timed repeats after the first call (default: 11, --quick: 5)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        metavar="S",
        help="multiply every N by S, 0 < S <= 1 (smoke tests; recorded)",
    )
    parser.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        metavar="GIB",
        help="largest padded buffer fixed-scatter may allocate "
        "(default: 2 GiB or a quarter of the RAM if less)",
    )
    parser.add_argument(
        "--skip",
        nargs="+",
        metavar="PHASE",
        default=None,
        help=f"phases to leave out: {', '.join(PHASES)}",
    )
    parser.add_argument("--from-json", metavar="RESULTS", default=None,
                        help="measure nothing: rewrite the table, summary.md and plots of a "
                        "saved results.json (into --out, default its folder)")  # fmt: skip


# -- checks before any work ------------------------------------------------------------------
def check_device(device: str) -> None:
    """Refuse a device that is unknown or not available here. The devices are the probe's
    (:func:`bitfold.cli.devices.offered_devices`: the CPU and every device type a registered
    backend folds torch tensors on); one other than the CPU needs torch to see it, and CUDA
    needs torch or CuPy to see a GPU."""
    from ..devices import offered_devices, why_not_usable

    if device == "cpu":
        return
    allowed = offered_devices()
    if device not in allowed:
        raise DeviceError(f"unknown device {device!r}; choose {', '.join(allowed)}")
    if device != "cuda":
        why = why_not_usable(device)
        if why:
            raise DeviceError(f"--device {device}: {why}; use --device cpu")
        return
    why = []
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return
        why.append("torch.cuda.is_available() is False")
    else:
        why.append("torch is not installed")
    if importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return
            why.append("cupy sees no device")
        except Exception as err:
            why.append(f"cupy sees no device ({type(err).__name__})")
    else:
        why.append("cupy is not installed")
    raise DeviceError(
        f"--device cuda: no CUDA GPU is available here ({'; '.join(why)}); use --device cpu"
    )


def check_out_dir(path: str) -> str:
    """Create ``path`` if needed and prove it is writable, or refuse it."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".bitfold-bench-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as err:
        raise FoldError(
            f"cannot write the benchmark results to --out {path!r}: {err.strerror or err}; "
            "pass a writable folder"
        ) from None
    return path


def _default_out(device: str, cores: int) -> str:
    day = _dt.date.today().isoformat()
    tag = f"cpu-{cores}core" if device == "cpu" else device
    return os.path.join("benchmarks", "results", f"{day}-{tag}")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Validate every option (raising FoldError) and return the run's settings."""
    from ...repro.fingerprint import physical_memory, usable_cores
    from .cases import ALL_SWEEPS, check_sweeps
    from .contenders import baseline_for, resolve

    if args.repeats is not None and args.repeats < 1:
        raise FoldError(f"--repeats must be at least 1; got {args.repeats}")
    if not 0 < args.scale <= 1:
        raise FoldError(f"--scale must satisfy 0 < S <= 1; got {args.scale}")
    if args.memory_limit is not None and not 0 < args.memory_limit < float("inf"):
        raise FoldError(
            f"--memory-limit must be a positive finite number of GiB; got {args.memory_limit}"
        )
    skip = _names(args.skip) or []
    for phase in skip:
        if phase not in PHASES:
            raise FoldError(f"unknown phase {phase!r} for --skip; choose from: {', '.join(PHASES)}")
    sweeps = check_sweeps(_names(args.sweeps) or list(ALL_SWEEPS))
    check_device(args.device)
    contenders = resolve(_names(args.contenders) or ["all"], args.device)
    if "plots" not in skip and importlib.util.find_spec("matplotlib") is None:
        raise FoldError(
            "the plots need matplotlib, which is not installed: pip install 'bitfold[plot]', "
            "or pass --skip plots"
        )
    ram = physical_memory() or 8 << 30
    limit = int(args.memory_limit * 2**30) if args.memory_limit else min(2 << 30, ram // 4)
    out = check_out_dir(args.out or _default_out(args.device, usable_cores() or 1))
    return {
        "quick": bool(args.quick),
        "device": args.device,
        "repeats": args.repeats or (5 if args.quick else 11),
        "budget_s": 1.0 if args.quick else 4.0,
        "min_repeats": 3 if args.quick else 5,
        "scale": args.scale,
        "sweeps": sweeps,
        "contenders": contenders,
        "baseline": baseline_for(args.device),
        "memory_limit_bytes": limit,
        "skip": skip,
        "out": out,
    }


def _command_line(args: argparse.Namespace) -> str:
    parts = ["bitfold", "bench"]
    if args.quick:
        parts.append("--quick")
    if args.device != "cpu":
        parts += ["--device", args.device]
    for flag in ("sweeps", "contenders", "skip"):
        names = _names(getattr(args, flag))
        if names:
            parts += [f"--{flag}", ",".join(names)]
    if args.repeats is not None:
        parts += ["--repeats", str(args.repeats)]
    if args.scale != 1.0:
        parts += ["--scale", f"{args.scale:g}"]
    if args.memory_limit is not None:
        parts += ["--memory-limit", f"{args.memory_limit:g}"]
    if args.out:
        parts += ["--out", args.out]
    return " ".join(parts)


# -- the run ---------------------------------------------------------------------------------
def _time_cases(cfg: dict[str, Any], cases: list[Any], progress: Any) -> list[dict]:
    """Time every contender on every case in this process."""
    import numpy as np

    from ...plan import Fold
    from .contenders import CONTENDERS, Inputs
    from .measure import failure, measure_case, reference

    Fold(np.arange(64, dtype=np.int64) % 7, 7)  # load the plan kernels: setup_s is build only
    rows: list[dict] = []
    base = cfg["baseline"]
    for case in cases:
        inp = Inputs.from_spec(case.spec, cfg["device"], cfg["memory_limit_bytes"])
        try:
            ref = reference(inp)
        except Exception as err:  # the yardstick is optional; say why it is missing
            ref = None
            print(f"bitfold bench: no exact reference for {case.id}: {failure(err)[1]}",
                  file=sys.stderr)  # fmt: skip
        label = case.describe()

        def step(r: dict[str, Any], label: str = label) -> None:
            progress.note(f"{r['contender']} {label}")
            progress.tick()

        more = SEED_EXTRA if "seed" in case.sweeps else 1  # the headline: tighter statistics
        case_rows = measure_case(
            cfg["contenders"],
            inp,
            repeats=cfg["repeats"] * more,
            budget_s=cfg["budget_s"] * more,
            min_repeats=cfg.get("min_repeats", 3),
            ref=ref,
            on_row=step,
        )
        for r in case_rows:
            c = CONTENDERS[r["contender"]]
            r.update(case=case.id, guarantee=c.guarantee, description=c.description)
        b = next((r for r in case_rows if r["contender"] == base and r["status"] == "ok"), None)
        for r in case_rows:
            if r["status"] == "ok" and r.get("median_s"):
                r["bandwidth_gb_s"] = case.min_bytes / r["median_s"] / 1e9
                r["ratio_to_baseline"] = r["median_s"] / b["median_s"] if b else None
        rows.extend(case_rows)
        del inp, ref
    return rows


def _worker_phase(
    mode: str, cfg: dict[str, Any], cases: list[Any], rows: list[dict], progress: Any
) -> None:
    """Peak memory (``memory``) or digests under another thread count (``threads``) per row."""
    from ...repro.fingerprint import numba_threads
    from .worker import run_jobs

    specs = {c.id: c.spec for c in cases}
    todo = [r for r in rows if r["status"] == "ok"]
    progress.tick(len(rows) - len(todo))  # nothing to measure for the others
    jobs = [{"case": specs[r["case"]], "contender": r["contender"]} for r in todo]
    env, threads = None, None
    if mode == "threads":
        main = numba_threads()
        threads = 1 if main > 1 else 2
        env = {k: str(threads) for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                                         "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}  # fmt: skip

    def done(i: int, result: dict[str, Any]) -> None:
        progress.note(f"{mode}: {jobs[i]['contender']}")
        progress.tick()

    results = run_jobs(
        "memory" if mode == "memory" else "digest",
        jobs,
        device=cfg["device"],
        memory_limit=cfg["memory_limit_bytes"],
        env=env,
        threads=threads,
        on_done=done,
    )
    for i, r in enumerate(todo):
        got = results.get(i, {"status": "failed", "reason": "no result from the worker"})
        if mode == "memory":
            r["memory_status"] = got["status"]
            r["memory_reason"] = got.get("reason")
            for key in ("peak_bytes", "peak_traced_bytes", "peak_rss_bytes",
                        "setup_traced_bytes", "bytes_per_element", "memory_method",
                        "device_peak_bytes"):  # fmt: skip
                r[key] = got.get(key)
        else:
            r["threads_compared"] = [numba_threads(), threads]
            r["threads_digest"] = got.get("digest")
            r["identical_threads"] = got["digest"] == r["digest"] if got["status"] == "ok" else None
            if got["status"] != "ok":
                r["threads_reason"] = got.get("reason")


def write_outputs(res: dict[str, Any], out: str, *, plots: bool) -> list[str]:
    """Write summary.md and the plots of ``res`` into ``out``; print the table; return files."""
    from .report import summary_markdown, text_table

    written = []
    if plots:
        from .plots import write_plots

        written = write_plots(res, out)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary_markdown(res, written))
    print(text_table(res))
    return ["summary.md", *written]


def machine() -> dict[str, Any]:
    """The ``machine`` block of ``results.json``: the environment fingerprint
    (:func:`bitfold.repro.fingerprint.fingerprint`) plus what a benchmark reader needs: the
    installed version of every library a contender may use (imported or not), Numba's cache
    folder (start-up times depend on it) and the load average (other work competing for the
    cores)."""
    from ...repro.fingerprint import fingerprint, installed_versions, load_average

    return {
        **fingerprint(),
        "libraries": installed_versions(LIBRARIES),
        "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
        "load_average": load_average(),
    }


def _case_record(c: Any) -> dict[str, Any]:
    return {"id": c.id, **c.spec, "d": c.d, "kind": c.kind, "sweeps": list(c.sweeps),
            "min_bytes": c.min_bytes, "input_bytes": c.n * (8 + c.width * c.value_itemsize),
            "output_bytes": c.output_bytes}  # fmt: skip


def run(cfg: dict[str, Any], command: str) -> dict[str, Any]:
    """Measure everything ``cfg`` asks for and return the results dict."""
    from ...repro.fingerprint import load_average
    from ..progress import progress_bar
    from .cases import build_cases, describe_sweep
    from .compiled_steps import measure_compiled_steps
    from .load import measure_load
    from .startup import measure_startup
    from .steps import measure_steps

    t_start = time.perf_counter()
    load_at_start = load_average()
    cases = build_cases(cfg["sweeps"], quick=cfg["quick"], scale=cfg["scale"])
    n_jobs = len(cases) * len(cfg["contenders"])
    total = n_jobs * (1 + sum(p not in cfg["skip"] for p in ("memory", "threads")))
    phases: dict[str, float] = {}
    startup = steps = compiled = load = None
    extra = (
        ("load" in cfg["sweeps"])
        + 2 * ("startup" not in cfg["skip"])
        + ("steps" not in cfg["skip"])
        + ("compiled" not in cfg["skip"])
    )
    with progress_bar(total + extra, "bitfold bench") as progress:
        t0 = time.perf_counter()
        rows = _time_cases(cfg, cases, progress)
        phases["timing"] = time.perf_counter() - t0
        if "load" in cfg["sweeps"]:
            progress.note("the seed configuration with one extra busy process")
            t0 = time.perf_counter()
            load = measure_load(
                device=cfg["device"], quick=cfg["quick"], scale=cfg["scale"],
                repeats=cfg["repeats"] * SEED_EXTRA, budget_s=cfg["budget_s"] * SEED_EXTRA,
                min_repeats=cfg.get("min_repeats", 3), memory_limit=cfg["memory_limit_bytes"],
            )  # fmt: skip
            progress.tick()
            phases["load"] = time.perf_counter() - t0
        for mode in ("memory", "threads"):
            if mode not in cfg["skip"]:
                t0 = time.perf_counter()
                _worker_phase(mode, cfg, cases, rows, progress)
                phases[mode] = time.perf_counter() - t0
        if "startup" not in cfg["skip"]:
            progress.note("Numba cold and warm start")
            t0 = time.perf_counter()
            startup = measure_startup()
            progress.tick(2)
            phases["startup"] = time.perf_counter() - t0
        step_phases = {
            "steps": ("training steps: exact_mode against plain PyTorch", measure_steps),
            "compiled": ("compiled training steps: bitfold.torch.compile against torch.compile",
                         measure_compiled_steps),
        }  # fmt: skip
        measured = {}
        for phase, (note, measure) in step_phases.items():
            if phase in cfg["skip"]:
                continue
            progress.note(note)
            t0 = time.perf_counter()
            measured[phase] = measure(repeats=7 if cfg["quick"] else 15, scale=cfg["scale"])
            progress.tick(1)
            phases[phase] = time.perf_counter() - t0
        steps, compiled = measured.get("steps", steps), measured.get("compiled", compiled)
    res: dict[str, Any] = {
        "schema": SCHEMA,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "settings": {k: v for k, v in cfg.items() if k != "out"},
        "machine": {**machine(), "load_average_at_start": load_at_start},
        "sweeps": {name: describe_sweep(name, cases) for name in cfg["sweeps"]},
        "cases": [_case_record(c) for c in cases],
        "results": rows,
        "startup": startup,
        "steps": steps,
        "compiled_steps": compiled,
        "load": load,
    }
    res["phase_seconds"] = phases
    res["duration_s"] = time.perf_counter() - t_start
    return res


def _read_results(path: str) -> dict[str, Any]:
    """A saved ``results.json`` of this command, or a FoldError naming the file and the fault."""
    try:
        with open(path) as f:
            res = json.load(f)
    except OSError as err:
        raise FoldError(f"cannot read --from-json {path!r}: {err.strerror or err}") from None
    except ValueError as err:
        raise FoldError(f"--from-json {path!r} is not JSON ({err}); give a results.json that "
                        "bitfold bench wrote") from None  # fmt: skip
    if not isinstance(res, dict) or res.get("schema") != SCHEMA:
        raise FoldError(f"--from-json {path!r} is not a bitfold bench results file ({SCHEMA})")
    missing = [k for k in RESULT_KEYS if k not in res]
    if missing:
        raise FoldError(
            f"--from-json {path!r}: a damaged or incomplete bitfold bench results file (no "
            f"{', '.join(map(repr, missing))}); give a results.json that bitfold bench wrote"
        )
    return res


def _from_json(args: argparse.Namespace) -> int:
    path = args.from_json
    res = _read_results(path)
    skip = _names(args.skip) or []
    if "plots" not in skip and importlib.util.find_spec("matplotlib") is None:
        raise FoldError("the plots need matplotlib: pip install 'bitfold[plot]', or --skip plots")
    out = check_out_dir(args.out or os.path.dirname(os.path.abspath(path)))
    parts = ["bitfold", "bench", "--from-json", path]
    if args.out:
        parts += ["--out", args.out]
    res["rewritten_by"] = " ".join(parts)  # the summary says its figures were not measured here
    try:
        write_outputs(res, out, plots="plots" not in skip)
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise FoldError(
            f"--from-json {path!r}: a damaged bitfold bench results file (its entry {err} is "
            "missing or malformed); rewrite from a results.json that bitfold bench wrote"
        ) from None
    return 0


def main(args: argparse.Namespace) -> int:
    """Run ``bitfold bench`` (see the module docstring); 0 on success.

    Unless the user chose otherwise, ``OMP_WAIT_POLICY=PASSIVE`` is set before
    PyTorch loads (as ``bitfold probe`` does): the idle workers of torch's own
    OpenMP runtime would otherwise spin and take the cores from the Numba
    kernels timed next. It changes timings only, and is recorded.
    """
    if args.from_json:
        return _from_json(args)
    passive_openmp_before_torch()
    cfg = _settings(args)
    cfg["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY")
    res = run(cfg, _command_line(args))
    out = cfg["out"]
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=float)
        f.write("\n")
    files = write_outputs(res, out, plots="plots" not in cfg["skip"])
    print(f"\nwrote {', '.join(['results.json', *files])} to {out} "
          f"in {res['duration_s']:.0f} s", file=sys.stderr)  # fmt: skip
    return 0
