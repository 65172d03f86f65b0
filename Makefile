# `make demo`: set up and start the gateway on the embedded demo backends.
# `make test`: set up and run the whole test suite (the outside dependencies too: `make deps`).
# `make test-fast`: the unit and stub-backed tests only (no real server, CLI or browser).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 8080
PYTHON ?= python3
# pytest-xdist workers. The suite mostly waits (servers starting, streams at a token pace), so
# more workers than the 2 cores pay: tests/xdist_groups.py keeps each module (and each shared real
# server's tests) on one worker. PYTEST_ARGS adds to either run (`make test PYTEST_ARGS='-x'`).
JOBS   ?= 4
PARALLEL := -n $(JOBS) --dist loadgroup
# the fast set starts no real server, so two more workers cost little memory and fill the waits
FAST_JOBS ?= 6
# the assertion rewrites are cached in __pycache__ (gitignored) even where the environment asks
# Python not to write bytecode: re-rewriting every test module costs each worker ~10 s of CPU
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(PY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: demo test test-fast deps bench install config-reference typecheck
install: $(VENV)/.base

# Each .ci/deps/*.sh installs one outside dependency of the tests (llama.cpp's server and a model,
# Claude Code, Codex, redis-server, chromium, curl), cached outside the venv; a no-op in well under
# a second when it is already there, about 15 minutes the first time (most of it the llama.cpp build).
deps:
	@for dep in .ci/deps/*.sh; do echo "--- $$dep"; bash "$$dep" || exit 1; done

demo: $(VENV)/.base
	$(VENV)/bin/homelab-frontend demo --port $(PORT)

# --durations=15: the 15 slowest tests end every run, so the next slow test is seen when it arrives.
# Under coverage ([tool.coverage] in pyproject.toml: the workers and every gateway, stub and CLI
# process the tests start), then combined and held to the floor: every product module at 80% of
# its lines or a stated reason (tests/support/coverage_floor.py). `make test-fast` does not measure.
test: $(VENV)/.test deps
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	$(PY) -m coverage erase && PYTHONDONTWRITEBYTECODE= $(PY) -m coverage run -m pytest -q $(PARALLEL) --durations=15 $(PYTEST_ARGS)
	$(PY) -m coverage combine -q
	$(PY) tests/support/coverage_floor.py

# No `deps`: nothing outside the venv is needed. HLF_TEST_FAST makes a test that starts a real
# server, a CLI or a browser without the `real` mark fail (tests/fastset.py) and gives hypothesis
# fewer examples where a test sets none; the surface fuzzers, the soak and the scaled property
# tests do less of the same work (the full run: 1100 requests per surface, 1000 soak requests).
FAST_ENV := HLF_TEST_FAST=1 HLF_FUZZ_EXAMPLES=$${HLF_FUZZ_EXAMPLES:-150} HLF_SOAK_REQUESTS=$${HLF_SOAK_REQUESTS:-300} \
	HLF_HYPOTHESIS_SCALE=$${HLF_HYPOTHESIS_SCALE:-0.25}
test-fast: $(VENV)/.test
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	$(FAST_ENV) $(PYTEST) -q -n $(FAST_JOBS) --dist loadgroup -m 'not real' --durations=15 $(PYTEST_ARGS)

# mypy over src/ ([tool.mypy] in pyproject.toml: defaults everywhere, strict in admission/,
# request/ and lifecycle/); `test` and `test-fast` run it too, after the import layers
typecheck: $(VENV)/.test
	$(VENV)/bin/mypy

# docs/configuration.md's key tables, regenerated from the config schema (src/homelab_frontend/config.py)
config-reference: $(VENV)/.base
	$(VENV)/bin/homelab-frontend config-reference --write docs/configuration.md

bench: $(VENV)/.test
	$(PY) -m bench.run $(BENCH_ARGS)
