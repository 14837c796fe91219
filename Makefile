# Two entry points: `make demo` (set up + run the main job) and `make test` (set up + lint + run every test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch's version is pinned in constraints.txt (as for the Docker image and cluster.yaml's nodes); pip picks that
# version's wheel for the platform.  TORCH_INDEX: a wheel index for another build of the same version, e.g.
# `make TORCH_INDEX=https://download.pytorch.org/whl/cpu install` for the small CPU-only build on Linux.
CONSTRAINTS := constraints.txt
TORCH_INDEX ?=

# The platforms torch has wheels for at the pins in constraints.txt: Linux (x86_64, aarch64) and Apple silicon
# Macs. An Intel Mac (or a shell under Rosetta, which reports x86_64) is refused before anything is installed.
# UNAME_S / UNAME_M can be set to simulate another machine, e.g. `make -n UNAME_S=Darwin UNAME_M=x86_64 install`.
UNAME_S ?= $(shell uname -s)
UNAME_M ?= $(shell uname -m)
ifeq ($(UNAME_S),Darwin)
ifneq ($(UNAME_M),arm64)
UNSUPPORTED_PLATFORM := alchemetric-ray needs an Apple silicon Mac (arm64): torch publishes no macOS x86_64 wheels since 2.2
endif
endif

.PHONY: install demo lint test test-fast test-deps docs clean bench bench-full bench-gpu check-platform

$(BIN)/.installed: pyproject.toml $(CONSTRAINTS) | check-platform
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(CONSTRAINTS) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[dev]"
	touch $@

install: $(BIN)/.installed

# Before any install: an order-only prerequisite of .installed, and phony, so it runs (and `make -n` expands it)
# on every install, even when .venv is already up to date.
check-platform:
	$(if $(UNSUPPORTED_PLATFORM),$(error $(UNSUPPORTED_PLATFORM)))

# The main job on the packaged stocknet prices: features -> train -> the held-back test segment vs the baselines.
demo: install
	$(BIN)/python jobs/train.py --evaluate train.seeds=3

# The sweep-report test renders HTML in Debian's headless chromium; installed here when missing.
test-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "the report test needs Chromium or Chrome: sudo apt-get install -y chromium (Debian/Ubuntu) or brew install --cask chromium (macOS)" >&2; fi; }

# One pytest process with one local Ray: two workers (pytest-xdist) were tried (again 2026-12-05: 29 min 40 s
# against 31 min 15 s, docs/testing.md) and took about as long on
# 2 cores, since the tests' time is Ray's processes computing, not waiting.
PYTEST := $(BIN)/python -m pytest

# Lint first (ruff and mypy, pinned in the dev extras; rules in pyproject.toml): a finding fails the run before the
# tests start.
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install test-deps lint
	$(PYTEST) tests --durations=25

test-fast: install lint
	$(PYTEST) tests -m "not slow"

# The configuration reference, generated from the config's fields (alchemetric_ray/config/schema.py);
# tests/test_config_reference.py fails when the committed file is stale.
docs: install
	$(BIN)/python -m alchemetric_ray.config_reference --out docs/configuration.md
	$(BIN)/python -m alchemetric_ray.api_reference --out docs/python.md

# Benchmarks (bench/, results in bench/results/*.json).  `bench` is the quick set (under 15 minutes on a quiet 2-core
# machine); `bench-full` adds the 10M-row sizes and the 8-trial sweep.
# RAY_ADDRESS=local: ingest.py starts its own Ray, never one another process on this machine `ray start`-ed.
bench: install
	$(BIN)/python bench/loop_overhead.py --model mlp --tickers 300 --epochs 6
	$(BIN)/python bench/loop_overhead.py --model lstm --tickers 30 --days 800 --epochs 3
	$(BIN)/python bench/loop_overhead.py --model mlp --tickers 700 --epochs 3 --modes streamed
	$(BIN)/python bench/loop_overhead.py --model mlp --tickers 700 --epochs 3 --modes streamed --workers 2
	RAY_ADDRESS=local $(BIN)/python bench/ingest.py --rows 1000000
	$(BIN)/python bench/sweep_efficiency.py --trials 4 --epochs 2 --warmup
	$(BIN)/python bench/scaling.py --rows 100000,1000000
	$(BIN)/python bench/mixed_precision.py

bench-full: install bench
	$(BIN)/python bench/loop_overhead.py --model mlp --tickers 7000 --epochs 3 --modes streamed
	$(BIN)/python bench/loop_overhead.py --model mlp --tickers 7000 --epochs 3 --modes streamed --workers 2
	RAY_ADDRESS=local $(BIN)/python bench/ingest.py --rows 10000000
	$(BIN)/python bench/scaling.py --rows 1000000,10000000
	$(BIN)/python bench/sweep_efficiency.py --trials 8 --epochs 4 --warmup
	$(BIN)/python bench/features.py

# On a CUDA machine: precision branches, mixed precision, data path (bench/gpu.py needs only torch; with no
# .venv there, run `python3 bench/gpu.py` directly).
bench-gpu:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) bench/gpu.py

clean:
	rm -rf $(VENV) results models .pytest_cache
