# Two commands do all set-up on a fresh machine:
#   make fit    create the environment if missing, then run the tiny CPU demo (rlx fit params.yaml)
#   make test   create the environment if missing, then run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install fit test bench gpu-check gpu-bundle gpu-bundle-ray lmdeploy-contract

install: $(STAMP)

# torch is pinned by constraints.txt to the CPU build; the package itself keeps a loose range.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --progress-bar off --upgrade pip
	$(BIN)/python -m pip install --quiet --progress-bar off -c constraints.txt -e '.[dev]'
	touch $(STAMP)

fit: $(STAMP)
	$(BIN)/rlx fit params.yaml

# Two pytest-xdist workers: most tests wait on a child `rlx fit` whose start (imports, DVC) uses one core,
# so two files at a time fill the second core; each file runs whole on one worker (tests/conftest.py),
# the slowest files first.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --no-loadscope-reorder --durations=25

# Benchmarks (pytest-benchmark), not part of `make test`: they need the `bench` extra (TRL, the
# reference), write tests/benchmarks/results.json and render docs/performance.md's table from it.
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --progress-bar off -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m pytest tests/benchmarks --benchmark-only --benchmark-columns=min,median,mean,rounds
	$(BIN)/python tests/benchmarks/report.py

# The LMDeploy contract (no GPU, about a minute once the wheel is here): the pinned release installed
# without its dependencies into .venv-lmdeploy, its source compared with the stand-in the backend's CPU
# tests run against (tests/test_lmdeploy_contract.py), and those tests. Run it when the pin or the backend
# changes; `make test` runs the same tests and skips the comparison where .venv-lmdeploy is absent.
LMDEPLOY := $(shell grep -o 'lmdeploy==[0-9.]*' pyproject.toml)
LMDEPLOY_SRC := .venv-lmdeploy

$(LMDEPLOY_SRC)/.installed: pyproject.toml | $(STAMP)
	rm -rf $(LMDEPLOY_SRC)
	$(BIN)/python -m pip install --quiet --progress-bar off --no-deps --no-compile --target $(LMDEPLOY_SRC) $(LMDEPLOY)
	touch $@

lmdeploy-contract: $(STAMP) $(LMDEPLOY_SRC)/.installed
	RLX_LMDEPLOY_SOURCE=$(LMDEPLOY_SRC) RLX_LMDEPLOY_REQUIRED=1 $(BIN)/python -m pytest \
		tests/test_lmdeploy_contract.py tests/test_rollout_backends.py -k "lmdeploy or release or stand_in"

# The device bundle: cp312 manylinux wheels of what the lent GPU machine lacks (under 60 MiB), then
# the install test with Python 3.12 (PYTHON312; pyenv has one here).
PYTHON312 ?= $(shell ls -d $$(pyenv root 2>/dev/null || echo ~/.pyenv)/versions/3.12*/bin/python 2>/dev/null | tail -1)

gpu-bundle: $(STAMP)
	$(BIN)/python scripts/gpu_bundle.py build .gpu-bundle
	rm -rf .gpu-bundle-test .gpu-bundle-test-device
	$(PYTHON312) scripts/gpu_bundle.py check .gpu-bundle $(CURDIR)/.gpu-bundle-test

# Ray for the GPU check's one-worker group, carried in a device call of its own (scripts/gpu_bundle.py).
gpu-bundle-ray: $(STAMP)
	$(BIN)/python scripts/gpu_bundle.py build-ray .gpu-bundle-ray
	rm -rf .gpu-bundle-ray-test .gpu-bundle-ray-test-device
	$(PYTHON312) scripts/gpu_bundle.py check-ray .gpu-bundle-ray $(CURDIR)/.gpu-bundle-ray-test

# On the GPU machine: scripts/gpu_check.sh (rlx's rollout against LMDeploy's own batch inference, weight
# sync after a bf16 update, the engine-settings and training-MFU sweeps, 3 `rlx fit` steps with LMDeploy and
# bf16 ZeRO-2 and their time by part), under 9 minutes, its JSON in $$RLX_GPU_REPORT (default
# tests/gpu/gpu_check_<date>.json). Where LMDeploy is not installed, it installs .gpu-bundle/ first (make
# gpu-bundle here, then carry the folder).
gpu-check:
	scripts/gpu_check.sh
