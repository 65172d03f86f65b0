# `make demo`: set up and start the gateway on the embedded demo backends.
# `make test`: set up and run the whole test suite (the outside dependencies too: `make deps`).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PORT   ?= 8080
PYTHON ?= python3

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.base
	$(PY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: demo test deps bench install
install: $(VENV)/.base

# Each .ci/deps/*.sh installs one outside dependency of the tests (llama.cpp's server and a model,
# Claude Code, Codex, redis-server, chromium, curl), cached outside the venv; a no-op in well under
# a second when it is already there, about 15 minutes the first time (most of it the llama.cpp build).
deps:
	@for dep in .ci/deps/*.sh; do echo "--- $$dep"; bash "$$dep" || exit 1; done

demo: $(VENV)/.base
	$(VENV)/bin/homelab-frontend demo --port $(PORT)

test: $(VENV)/.test deps
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q

bench: $(VENV)/.test
	$(PY) -m bench.run $(BENCH_ARGS)
