# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit bench clean

setup: $(STAMP)

# Idempotent: re-runs only when pyproject.toml changes.  torch is installed first, pinned to the CPU
# build that lies on disk, so nothing later can resolve a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/leakprobe demo

lint: setup
	$(VENV)/bin/ruff check .

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	$(VENV)/bin/pytest

test: lint typecheck unit

bench: setup
	$(PY) bench/detect.py
	$(PY) bench/testbed.py

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
