#!/usr/bin/env bash
# Every GPU check of bitfold in one command, for a machine with an NVIDIA GPU, in at most 7 minutes:
#
#   scripts/gpu_check.sh [--install] [--smoke] [OUTDIR]     (or: make gpu-check OUT=OUTDIR)
#
# It uses the python3 already on the machine (PYTHON=... to choose another) with PYTHONPATH=src,
# and installs nothing unless --install is given (where a package registry is reachable):
#
# 1. environment: nvidia-smi, git commit, and which libraries import (torch with CUDA, numba-cuda,
#    CuPy, JAX with a GPU, triton, torch_geometric; bitfold's registered backends)
#    -> OUT/imports.json;
# 2. the bits first, each in its own process and time limit: the backend table on the Triton
#    kernels with CUDA tensors -> OUT/triton_tests.*; every dtype and init, a torch and a CuPy
#    stream, hot buckets in a CUDA graph, cuda:1, the self-test's verdict and the one-word
#    share (scripts/gpu_bits.py) -> OUT/gpu_bits.json; the GPU kernel cases on the device
#    (tests/cuda_cases.py, BITFOLD_CUDA_DEVICE=1) -> OUT/gpu_tests.*;
# 3. the GPU benchmark, scripts/gpu_check.py (it makes the goals' figures), with the time left
#    but the reserve of the steps after it: at the seed
#    configuration, K = 10^6, rows uniform and Zipf, K = 1 at N = 10^8, the Triton path
#    (backend="triton": wall, host and device time), the one-shot fold (plan built in the call
#    from a new CUDA index) and the numba kernels (backend="cuda") against torch's atomic
#    index_add_, each exact result checked against the CPU's bits, ordered bits run to run; the
#    compiled GCN step (bitfold.torch.compile vs torch.compile, default and reduce-overhead
#    modes); then cupyx.scatter_add, deterministic index_add_, jax segment_sum, CUDA-graph
#    replay and diagnostics, as its budget allows; judged in its "assessment"
#    -> OUT/gpu_bench.json;
# 4. bitfold probe with its defaults on the GPU and on the CPU: the GPU's exact and ordered folds
#    bit-identical run to run, the exact digest the CPU's (scripts/gpu_probe.py) -> OUT/probe_*;
# 5. the exact all-reduce and reduce-scatter: one-process NCCL group, two processes on the
#    GPU over gloo, the GradientSum step against DDP's (scripts/gpu_allreduce.py)
#    -> OUT/allreduce.json, and the data-parallel model on paper -> OUT/dp_model.json
#
# Each step has a time budget and its output in OUT/<step>.log; OUT/summary.json (written on any
# exit) records each step's exit status and seconds. Exit status: 0 when the benchmark's bit checks,
# the device tests and the probe pass, 1 otherwise, 2 when there is no usable GPU.
#
# --smoke: no GPU needed; the benchmark on tiny sizes under the numba-cuda simulator and, where
#          the triton backend is registered, Triton's interpreter (TRITON_INTERPRET=1, torch CPU
#          tensors); checks this script and gpu_check.py; times mean nothing.
# --install: first pip-install the cuda and test extras (and CuPy) into PYTHON's environment; the
#            7-minute budget then starts after the install.
set -u -o pipefail

INSTALL=0
SMOKE=0
OUT=""
for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        --smoke) SMOKE=1 ;;
        -h | --help) sed -n '2,41p' "$0"; exit 0 ;;
        -*) echo "unknown option $arg (see --help)" >&2; exit 64 ;;
        *) OUT=$arg ;;
    esac
done
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu-$(date +%Y-%m-%d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
TOTAL=${GPU_CHECK_BUDGET:-400}  # seconds for every step after the install (7 minutes with margin)
START=$(date +%s)
LOG="$OUT/gpu_check.log"
: >"$LOG"
log() { echo "[gpu-check +$(($(date +%s) - START))s] $*" | tee -a "$LOG" >&2; }
declare -A RC SECS
STEPS=()

summary() {
    {
        printf '{\n  "outdir": "%s",\n  "python": "%s",\n  "smoke": %s,\n  "seconds": %d,\n  "steps": {' \
            "$OUT" "$PY" "$([ $SMOKE = 1 ] && echo true || echo false)" "$(($(date +%s) - START))"
        local sep="" name
        for name in "${STEPS[@]}"; do
            printf '%s\n    "%s": {"exit": "%s", "seconds": %s}' "$sep" "$name" "${RC[$name]:-not run}" \
                "${SECS[$name]:-0}"
            sep=","
        done
        printf '\n  }\n}\n'
    } >"$OUT/summary.json"
}
trap summary EXIT

left() { echo $((TOTAL - ($(date +%s) - START))); }

step() { # step NAME LIMIT_SECONDS CMD...: an external command with a time limit, logged to OUT/NAME.log
    local name=$1 limit=$2 t0 rc
    shift 2
    STEPS+=("$name")
    if [ "$(left)" -lt "$limit" ]; then limit=$(left); fi
    if [ "$limit" -lt 10 ]; then
        RC[$name]=skipped
        log "$name: skipped (the ${TOTAL}s budget is spent)"
        return 0
    fi
    t0=$(date +%s)
    log "$name (limit ${limit}s): $*"
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    RC[$name]=$rc
    SECS[$name]=$(($(date +%s) - t0))
    [ "$rc" = 124 ] && log "$name: TIMED OUT after ${limit}s"
    log "$name: exit $rc in ${SECS[$name]}s (log: $OUT/$name.log)"
    tail -n 5 "$OUT/$name.log" | sed 's/^/    /' >&2
    return 0
}

if [ $SMOKE = 1 ]; then
    export NUMBA_ENABLE_CUDASIM=1 TRITON_INTERPRET=1
    log "smoke mode: the numba-cuda simulator and Triton's interpreter, tiny sizes, no GPU needed"
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    log "no NVIDIA GPU here (nvidia-smi missing or failing): nothing to check (--smoke runs without one)"
    STEPS+=(gpu)
    RC[gpu]="no GPU"
    exit 2
fi
{
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv 2>&1
    date -u +%Y-%m-%dT%H:%M:%SZ
    git rev-parse HEAD 2>/dev/null
    git status --short 2>/dev/null | head -n 20
    "$PY" --version 2>&1
} >"$OUT/environment.txt" 2>&1

if [ $INSTALL = 1 ]; then
    CUDA_MAJOR=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
    if [ "${CUDA_MAJOR:-13}" -ge 13 ]; then EXTRA=".[cuda,test]"; CUPY=cupy-cuda13x
    else EXTRA=". pytest hypothesis numba-cuda[cu12]>=0.30"; CUPY=cupy-cuda12x; fi
    # one external command (a shell function would not run under `timeout`)
    step install 300 "$PY" -m pip install --quiet -e $EXTRA "$CUPY"
    START=$(date +%s)  # the budget of the checks starts after the install
fi

step imports 60 "$PY" - "$OUT/imports.json" <<'EOF'
"""Which of the libraries the check uses import here, with versions and the GPU they see."""
import importlib, json, sys, traceback

found = {}
def probe(name, fn):
    try:
        found[name] = {"ok": True, **fn()}
    except Exception as err:
        found[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    print(name, found[name], flush=True)

def torch():
    import torch
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}
def numba_cuda():
    from numba import cuda
    import numba_cuda
    return {"version": getattr(numba_cuda, "__version__", "?"), "available": cuda.is_available()}
def cupy():
    import cupy
    return {"version": cupy.__version__, "devices": cupy.cuda.runtime.getDeviceCount()}
def jax():
    import jax
    return {"version": jax.__version__, "devices": [str(d) for d in jax.devices()]}
def version_of(name):
    return lambda: {"version": importlib.import_module(name).__version__}
def bitfold():
    import bitfold
    from bitfold.backends.registry import backend_names
    return {"version": bitfold.__version__, "file": bitfold.__file__,
            "backends": list(backend_names())}

for name, fn in [("bitfold", bitfold), ("numba_cuda", numba_cuda), ("torch", torch),
                 ("cupy", cupy), ("jax", jax), ("triton", version_of("triton")),
                 ("torch_geometric", version_of("torch_geometric"))]:
    probe(name, fn)
json.dump({"python": sys.version, "libraries": found}, open(sys.argv[1], "w"), indent=2)
sys.exit(0 if found["bitfold"]["ok"] and found["numba_cuda"]["ok"] else 1)
EOF

if [ $SMOKE = 1 ]; then
    # the Triton interpreter and the simulator are slow: the benchmark stops at its budget
    step gpu_bench 300 "$PY" scripts/gpu_check.py --smoke --budget 240 --out "$OUT/gpu_bench.json"
    step probe 60 "$PY" scripts/gpu_probe.py --smoke "$OUT"
    step allreduce 60 "$PY" scripts/gpu_allreduce.py "$OUT/allreduce.json" --smoke --budget 45
    step gpu_bits 120 "$PY" scripts/gpu_bits.py "$OUT/gpu_bits.json" --smoke
    [ "${RC[gpu_bench]}" = 0 ] && [ "${RC[imports]}" = 0 ] && [ "${RC[probe]}" = 0 ] &&
        [ "${RC[allreduce]}" = 0 ] && [ "${RC[gpu_bits]}" = 0 ] &&
        { log "smoke passed"; exit 0; }
    log "smoke FAILED"
    exit 1
fi

export BITFOLD_CUDA_DEVICE=1 BITFOLD_REQUIRE_CUDA=1
unset NUMBA_ENABLE_CUDASIM TRITON_INTERPRET
# The bits first, each step in its own process with a limit of its own, so that no step can
# starve another (a sticky CUDA error stays in the process that met it): the backend table on
# the Triton kernels with CUDA tensors (the oracle's and the host's bits), then the numba
# kernels' device cases, on 8 workers where pytest-xdist is installed (each compiles the
# kernels its tests launch: compiling dominates). Then the benchmark with what is left but
# the reserve of the probe, the all-reduce and the model; its own budget stops it in time to
# write its JSON before the step's limit (25 s later).
PARALLEL=()
"$PY" -c "import xdist" >/dev/null 2>&1 && PARALLEL=(-n 8)
step triton_tests 70 "$PY" -m pytest \
    "tests/test_backend_table.py::test_the_backend_agrees_with_the_oracle_and_the_host" \
    -k triton ${PARALLEL[@]+"${PARALLEL[@]}"} -v -p no:cacheprovider -o addopts= -rs \
    --durations=10 --junitxml="$OUT/triton_tests.xml"
# every dtype with and without init, a torch stream, a CuPy stream, hot buckets in a CUDA graph,
# cuda:1 where there are two devices, the self-test's verdict, the one-word share
step gpu_bits 45 "$PY" scripts/gpu_bits.py "$OUT/gpu_bits.json"
step gpu_tests 80 "$PY" -m pytest tests/cuda_cases.py \
    "tests/test_cuda_compile.py::test_cuda_backend_loads_when_required" ${PARALLEL[@]+"${PARALLEL[@]}"} \
    -v -p no:cacheprovider -o addopts= -rs --durations=15 --junitxml="$OUT/gpu_tests.xml"
RESERVE=${GPU_CHECK_RESERVE:-100}  # the probe (~20 s on an H200), the all-reduce (~40 s), the model
BENCH_BUDGET=$(($(left) - 25 - RESERVE))
[ "$BENCH_BUDGET" -gt 220 ] && BENCH_BUDGET=220
# at least 60 s asked of the benchmark; the step's own limit (the time left) still stops it, and
# it writes its JSON when stopped
[ "$BENCH_BUDGET" -lt 60 ] && BENCH_BUDGET=60
step gpu_bench $((BENCH_BUDGET + 25)) "$PY" scripts/gpu_check.py --budget "$BENCH_BUDGET" \
    --out "$OUT/gpu_bench.json"
# bitfold probe with its defaults (on the GPU) against the same probe on the CPU: same exact digest
step probe 60 "$PY" scripts/gpu_probe.py --gpu-timeout 40 --cpu-timeout 15 "$OUT"
# the exact all-reduce and reduce-scatter: a one-process NCCL group, two processes on the GPU over gloo (the CPU's
# bits), the GradientSum step against DDP's
step allreduce 50 "$PY" scripts/gpu_allreduce.py "$OUT/allreduce.json" --budget 40
# the step on 8 and 64 GPUs predicted from those figures (on paper; judged, not a failure)
step dp_model 10 "$PY" benchmarks/dp_model.py "$OUT/allreduce.json" --json "$OUT/dp_model.json"

if [ "${RC[gpu_tests]}" = 0 ] && [ "${RC[gpu_bench]}" = 0 ] && [ "${RC[probe]}" = 0 ] \
    && [ "${RC[triton_tests]}" = 0 ] && [ "${RC[allreduce]}" = 0 ] && [ "${RC[gpu_bits]}" = 0 ]; then
    log "GPU checks passed"
    exit 0
fi
log "GPU checks FAILED (gpu_bench exit ${RC[gpu_bench]}, allreduce exit ${RC[allreduce]}, triton_tests exit ${RC[triton_tests]}, gpu_bits exit ${RC[gpu_bits]}, gpu_tests exit ${RC[gpu_tests]}, probe exit ${RC[probe]})"
exit 1
