#!/usr/bin/env bash
# Every GPU check of bitfold in one command, for a machine with an NVIDIA GPU:
#
#   scripts/gpu_check.sh OUTDIR        (or: make gpu-check OUT=OUTDIR)
#
# 1. install what the checks need into the venv (the cuda and test extras, or numba-cuda[cu12]
#    on a CUDA 12 driver, and, when missing, a CUDA build of torch and CuPy);
# 2. run the GPU tests on the real device (tests/cuda_cases.py with BITFOLD_CUDA_DEVICE=1, the
#    cc 9.0 compile checks, with BITFOLD_REQUIRE_CUDA=1 so nothing can skip silently);
# 3. run `bitfold probe --device cuda` (failure is recorded, not fatal);
# 4. run the GPU benchmark (scripts/gpu_check.py) on the seed's configuration;
# 5. run `bitfold bench --device cuda --quick` (tables, JSON and plots in OUT/bench-cuda).
#
# Everything lands in OUTDIR: environment.txt, gpu_check.log, gpu_tests.xml/.log,
# probe.json/.log, gpu_bench.json/.log and summary.json. Exit status: 0 when the tests and the
# benchmark's exact-vs-CPU check pass, 1 otherwise, 2 when there is no usable GPU.
# Budget: about 3 minutes on an H200 after the installs (each step has a time limit).
#
# Environment knobs:
#   PYTHON=...                  interpreter to use (default .venv/bin/python, created if missing)
#   GPU_CHECK_SKIP_INSTALL=1    use what is installed (offline machines)
#   TORCH_SPEC=torch==2.13.0    the torch to install when the present one has no CUDA
set -u -o pipefail

OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
START=$(date +%s)
LOG="$OUT/gpu_check.log"
: >"$LOG"
log() { echo "[gpu-check +$(($(date +%s) - START))s] $*" | tee -a "$LOG" >&2; }
declare -A RC SECS

step() { # step NAME LIMIT_SECONDS CMD...: run with a time limit, log to OUT/NAME.log
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$(date +%s)
    log "$name: $*"
    timeout -k 15 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    RC[$name]=$rc
    SECS[$name]=$(($(date +%s) - t0))
    [ "$rc" = 124 ] && log "$name: TIMED OUT after ${limit}s"
    log "$name: exit $rc in ${SECS[$name]}s (log: $OUT/$name.log)"
    tail -n 5 "$OUT/$name.log" | sed 's/^/    /' >&2
    return 0
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    log "no NVIDIA GPU here (nvidia-smi missing or failing): nothing to check"
    exit 2
fi
{
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
    nvidia-smi | head -n 4
    date -u +%Y-%m-%dT%H:%M:%SZ
    git rev-parse HEAD 2>/dev/null
    git status --short 2>/dev/null | head -n 20
} >"$OUT/environment.txt" 2>&1
CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
CUDA_MAJOR=${CUDA_MAJOR:-13}
[ "$CUDA_MAJOR" -ge 13 ] && CU=13 || CU=12
log "driver supports CUDA $CUDA_MAJOR: using numba-cuda[cu$CU]"

PY=${PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
    log "creating .venv"
    python3 -m venv .venv && PY=.venv/bin/python
fi

install() {
    "$PY" -m pip install --quiet --upgrade pip
    if [ "$CU" = 13 ]; then
        "$PY" -m pip install --quiet -e ".[cuda,test]" || return 1
    else  # the extras pin numba-cuda[cu13]; a CUDA 12 driver needs the cu12 build instead
        "$PY" -m pip install --quiet -e . pytest hypothesis "numba-cuda[cu12]>=0.30" || return 1
    fi
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        # a +cpu build satisfies "torch==X" for pip, so remove it first; other packages stay
        echo "torch without CUDA here: installing ${TORCH_SPEC:-torch==2.13.0}"
        "$PY" -m pip uninstall --quiet -y torch
        "$PY" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}" || echo "torch install failed"
    fi
    if ! "$PY" -c "import cupy" 2>/dev/null; then
        "$PY" -m pip install --quiet "cupy-cuda${CU}x" || echo "cupy-cuda${CU}x unavailable"
    fi
    "$PY" -m pip list 2>/dev/null | grep -i -E "^(numba|numpy|torch|cupy|cuda|nvidia)" || true
}
if [ "${GPU_CHECK_SKIP_INSTALL:-0}" = 1 ]; then
    log "install: skipped (GPU_CHECK_SKIP_INSTALL=1)"
    RC[install]=skipped
else
    step install 240 install
fi

export BITFOLD_CUDA_DEVICE=1 BITFOLD_REQUIRE_CUDA=1
unset NUMBA_ENABLE_CUDASIM
step gpu_tests 180 "$PY" -m pytest tests/cuda_cases.py tests/test_cuda_compile.py \
    tests/test_cuda_sim.py::test_import_bitfold_does_not_import_numba_cuda \
    -q -p no:cacheprovider -o addopts= -rs --junitxml="$OUT/gpu_tests.xml"
step probe 120 "$PY" -m bitfold probe --device cuda --json "$OUT/probe.json"
step gpu_bench 180 "$PY" scripts/gpu_check.py --out "$OUT/gpu_bench.json"
step bench_cuda 120 "$PY" -m bitfold bench --device cuda --quick --skip startup --out "$OUT/bench-cuda"

{
    printf '{\n  "outdir": "%s",\n  "seconds": %d,\n  "cuda_major": %s,\n  "steps": {' \
        "$OUT" "$(($(date +%s) - START))" "$CUDA_MAJOR"
    sep=""
    for name in install gpu_tests probe gpu_bench bench_cuda; do
        printf '%s\n    "%s": {"exit": "%s", "seconds": "%s"}' "$sep" "$name" \
            "${RC[$name]:-not run}" "${SECS[$name]:-0}"
        sep=","
    done
    printf '\n  }\n}\n'
} >"$OUT/summary.json"
log "summary: $(tr -d '\n' <"$OUT/summary.json")"

[ "${RC[probe]}" != 0 ] && log "probe failed (tolerated: the CUDA probe is optional here)"
if [ "${RC[gpu_tests]}" = 0 ] && [ "${RC[gpu_bench]}" = 0 ]; then
    log "GPU checks passed"
    exit 0
fi
log "GPU checks FAILED (gpu_tests exit ${RC[gpu_tests]}, gpu_bench exit ${RC[gpu_bench]})"
exit 1
