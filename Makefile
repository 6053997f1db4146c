# Two commands do all set-up on a fresh machine:
#   make fit    create the environment if missing, then run the tiny CPU demo (rlx fit params.yaml)
#   make test   create the environment if missing, then run the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install fit test bench gpu-check

install: $(STAMP)

# torch is pinned by constraints.txt to the CPU build; the package itself keeps a loose range.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --progress-bar off --upgrade pip
	$(BIN)/python -m pip install --quiet --progress-bar off -c constraints.txt -e '.[dev]'
	touch $(STAMP)

fit: $(STAMP)
	$(BIN)/rlx fit params.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

# Benchmarks (pytest-benchmark), not part of `make test`: they need the `bench` extra (TRL, the
# reference), write tests/benchmarks/results.json and render README's performance table from it.
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --progress-bar off -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m pytest tests/benchmarks --benchmark-only --benchmark-columns=min,median,mean,rounds
	$(BIN)/python tests/benchmarks/report.py

# On a CUDA machine with the gpu extra installed (pip install -e '.[gpu]'): LMDeploy vs transformers
# rollout tokens/s and a few bf16 DeepSpeed steps with LMDeploy rollouts. Skipped without a GPU.
gpu-check: $(STAMP)
	$(BIN)/python -m pytest tests/gpu -m gpu -s -p no:cacheprovider
