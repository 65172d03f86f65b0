# `make demo`: set up and start the gateway on the embedded demo backends.
# `make test`: set up and run the whole test suite.
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

.PHONY: demo test bench install
install: $(VENV)/.base

demo: $(VENV)/.base
	$(VENV)/bin/homelab-frontend demo --port $(PORT)

test: $(VENV)/.test
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q

bench: $(VENV)/.test
	$(PY) -m bench.run $(BENCH_ARGS)
