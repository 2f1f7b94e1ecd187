# `make test` and `make run` set everything up on a fresh machine without a GPU:
#   .venv          torch (CPU build) and the test tools; mpgemm installed editable.
#   $(CUDA_VENV)   torch's CUDA build and a CUDA compiler of its version, used
#                  only by the CUDA build check (tests/kernels/conftest.py).
PYTHON ?= python3
VENV ?= .venv
CUDA_VENV ?= $(HOME)/.cache/mpgemm/cuda-venv-torch2.15.0-cu13.2
PY := $(VENV)/bin/python

TORCH_CPU := torch==2.13.0
TEST_TOOLS := tqdm transformers==5.23.0 pytest numpy ninja setuptools wheel expecttest matplotlib nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
TORCH_CUDA := torch==2.15.0 "nvidia-cuda-nvcc==13.2.*" "nvidia-cuda-crt==13.2.*" "nvidia-nvvm==13.2.*"

# The editable build's host units without debug info: Python's default
# flags add -g, which nearly doubles their compile (bench/NOTES.md, "The
# simulation's CUDA threads as fibers"). `make BUILD_CFLAGS=-g setup` keeps it.
BUILD_CFLAGS ?= -g0

SOURCES := setup.py pyproject.toml $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')

.PHONY: setup cuda-toolchain test run gpu-bundle clean

setup: $(VENV)/.built

# --no-compile: Python compiles the modules a run imports when it first
# imports them, not every module of every package at install (a fresh
# venv's install: 51 s, 30 s without).
$(VENV)/.deps: Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile $(TORCH_CPU) $(TEST_TOOLS)
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	CFLAGS="$$CFLAGS $(BUILD_CFLAGS)" $(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

cuda-toolchain: $(CUDA_VENV)/.deps

$(CUDA_VENV)/.deps:
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install -q $(TORCH_CUDA) ninja setuptools wheel numpy
	touch $@

# The kernel checks (tests/kernels: the CUDA builds and the simulation, most
# of the suite's CPU time) run beside the rest, which alone leaves about a
# core idle; niced, so that the rest's timed tests keep their pace. Their
# report follows the rest's. `pytest` alone runs both, one after the other.
test: setup cuda-toolchain
	@kernels_log=$$(mktemp); \
	MPGEMM_CUDA_PYTHON=$(CUDA_VENV)/bin/python nice -n 10 $(PY) -m pytest -o cache_dir=.pytest_cache/kernels \
		tests/kernels > $$kernels_log 2>&1 & kernels=$$!; \
	trap 'kill $$kernels 2>/dev/null; rm -f $$kernels_log' EXIT; \
	$(PY) -m pytest --ignore=tests/kernels; rest=$$?; \
	echo "tests/kernels:"; wait $$kernels; status=$$?; cat $$kernels_log; \
	[ $$rest -eq 0 ] && [ $$status -eq 0 ]

run: setup
	$(PY) -m mpgemm demo

# Before the tree is copied to a GPU machine, where no .git travels: the
# commit, for every result there to name (bench/README.md).
gpu-bundle:
	$(PYTHON) mpgemm/tools/provenance.py > COMMIT
	@echo "COMMIT: $$(cat COMMIT)"

clean:
	rm -rf $(VENV) build mpgemm/*.so
