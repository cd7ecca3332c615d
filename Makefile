# Two commands on a fresh machine (see README.md):
#   make setup   creates .venv, installs everything, unpacks the megatron-core releases the rules are checked
#                against (oracle-releases), runs the main job (the default verification run)
#   make test    runs the test suite (the oracle tests require the unpacked releases)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch where no NVIDIA GPU is present: a bare `torch` requirement would pull a
# multi-GB CUDA build. 2.13.0 is the CPU wheel this kind of machine has on disk.
TORCH_CPU ?= torch==2.13.0

.PHONY: setup install oracle-releases main test lint clean slurm

setup: install oracle-releases main

install: $(BIN)/python
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing torch from the default index"; \
	  $(BIN)/pip install -q "torch>=2.6"; \
	else \
	  echo "no NVIDIA GPU: installing the CPU build of torch ($(TORCH_CPU))"; \
	  $(BIN)/pip install -q "$(TORCH_CPU)" || $(BIN)/pip install -q "$(TORCH_CPU)" --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(BIN)/pip install -q -e ".[dev]"

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# megatron-core 0.16.1 / 0.17.1 / 0.18.2 / 0.19.2 (+ triton, + the Megatron-Bridge 0.6.2 wheel), unpacked once
# into a cache outside the checkout (MOE_OVERLAP_MCORE_CACHE, default ~/.cache/moe-overlap/megatron-core) that
# CI keeps between runs; only what is missing is fetched. The differential oracle tests construct each release's
# TransformerConfig from there (tests/oracle/).
oracle-releases: $(BIN)/python
	$(BIN)/python -m tests.oracle.fetch

# The main job: the default verification run (baseline vs overlap vs overlap+wgrad on 2 CPU gloo ranks,
# judged by the skill's success criteria; report in verify-out/main/).
main:
	$(BIN)/moe-overlap verify --out verify-out/main --force

# A one-host Slurm (Debian's slurm-wlm + munge; root) for tests/slurm, which skip without one (CI requires it).
slurm:
	bash tests/slurm/setup_slurm.sh

test:
	MOE_OVERLAP_ORACLE_REQUIRED=1 $(BIN)/python -m pytest -q

lint:
	$(BIN)/ruff check moe_overlap tests tools benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
