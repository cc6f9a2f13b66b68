# The two commands of the quick start: `make probe` and `make test`.
# Both create .venv when it is missing and install what they need into it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Without an NVIDIA GPU, install the CPU build of torch first so that the
# `torch` extra does not pull a multi-GB CUDA build.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_CPU ?= torch==2.13.0

.PHONY: probe test lint bench readme-perf docs gpu-check mutants clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The probe measures PyTorch's folds too (the non-deterministic ones on a CPU).
$(VENV)/.installed-base: pyproject.toml | $(PY)
ifneq ($(HAS_GPU),yes)
	$(PIP) install --quiet "$(TORCH_CPU)"
endif
	$(PIP) install --quiet -e ".[progress,torch]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
ifneq ($(HAS_GPU),yes)
	$(PIP) install --quiet "$(TORCH_CPU)"
endif
	$(PIP) install --quiet -e ".[test]"
	touch $@ $(VENV)/.installed-base

probe: $(VENV)/.installed-base
	$(VENV)/bin/bitfold probe $(ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

# The test extras install these; the suite fails (not skips) if one cannot load.
REQUIRED_BACKENDS := torch,triton,jax,sklearn,safetensors,numba_cuda,torch_geometric,grimp,importlinter,hypothesis,matplotlib,numpy_groupies,tqdm,ml_dtypes,mkdocs,mkdocstrings,material,transformers

# On every core (pytest-xdist; one worker more than cores gave no time back: 761 and 797 s with
# 3 on 2 cores against 751 and 740 s with 2 in alternating fresh-clone runs), each test file in
# one worker in its order: a module's fixtures
# are built once, and a test that reads what an earlier one of its file wrote finds it (xdist's
# loadgroup cannot group under pytest 9: it renames the tests' ids, which pytest 9 ignores),
# the slowest files first (tests/conftest.py's SLOWEST_FIRST, kept in order by
# --no-loadscope-reorder), so that no worker is left alone with a long file at the end.
# Compiled kernels are cached in the checkout, shared by the workers (.cache/ and
# src/bitfold/**/__pycache__), so that a second run is warm.
XDIST ?= -n auto --dist loadfile --no-loadscope-reorder

test: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .
	BITFOLD_REQUIRE_BACKENDS=$(REQUIRED_BACKENDS) BITFOLD_REQUIRE_CUDA=1 \
		$(PY) -m pytest $(XDIST) --durations=10 $(ARGS)

# Plant known bugs one at a time, each in a copy of the source, and check that the tests meant
# to catch each fail (minutes; `make test` checks that every one still applies and runs two).
mutants: $(VENV)/.installed-test
	$(PY) scripts/mutants.py $(ARGS)

# The cost of determinism against every peer: table, JSON, plots and summary.md
# (ARGS=--quick for the two-minute version; see benchmarks/README.md).
bench: $(VENV)/.installed-test
	$(VENV)/bin/bitfold bench $(ARGS)

# Copy a run's generated summary, and its goals judged by benchmarks/bench_goals.py, into the
# performance page of the docs (docs/performance.md).
readme-perf: $(PY)
	$(PY) benchmarks/readme_performance.py $(or $(RESULTS),benchmarks/results/2026-12-04-full-cpu-2core) \
		--allreduce $(or $(ALLREDUCE),benchmarks/results/2026-12-04-allreduce-cpu-2core/run1.json)

# The documentation site, into site/ (mkdocs.yml; the test extras install MkDocs).
docs: $(VENV)/.installed-test
	$(VENV)/bin/mkdocs build --strict

# On a machine with an NVIDIA GPU, with the python3 already there (no venv, no install, works
# offline; ARGS=--install to pip-install first): the GPU benchmark and the GPU tests in at most
# 7 minutes, JSON in OUT (default benchmarks/results/gpu-DATE). ARGS=--smoke: no GPU needed.
gpu-check:
	scripts/gpu_check.sh $(ARGS) $(or $(OUT),benchmarks/results/gpu-$(shell date +%Y-%m-%d))

# Without a GPU: every Triton kernel variant built for sm_90 (and gfx942), its registers, spills,
# shared memory and inner loops' instructions a value read from the machine code, and the GPU
# check's configurations modelled on an H200 (minutes; README.md and report.json in
# benchmarks/results/DATE-kernel-report-sm90; ARGS=--no-amd skips gfx942).
.PHONY: kernel-report
kernel-report: $(VENV)/.installed-test
	$(PY) scripts/kernel_report.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .cache
