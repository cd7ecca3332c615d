# Two commands on a fresh machine (see README.md):
#   make setup   creates .venv, installs everything, runs the main job (the default verification run)
#   make test    runs the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch where no NVIDIA GPU is present: a bare `torch` requirement would pull a
# multi-GB CUDA build. 2.13.0 is the CPU wheel this kind of machine has on disk.
TORCH_CPU ?= torch==2.13.0

.PHONY: setup install main test lint clean

setup: install main

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

# The main job: the default verification run (baseline vs overlap vs overlap+wgrad on 2 CPU gloo ranks,
# judged by the skill's success criteria; report in verify-out/main/).
main:
	$(BIN)/moe-overlap verify --out verify-out/main --force

test:
	$(BIN)/python -m pytest -q

lint:
	$(BIN)/ruff check moe_overlap tests tools benchmarks

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
