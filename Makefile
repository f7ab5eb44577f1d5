# The two commands for a fresh machine are `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv lint typecheck unit test demo bench broker-start broker-stop broker-status clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "arrowagg needs Python 3.11+; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

# The whole suite, integration tests included: tests/conftest.py picks the broker
# (KAFKA_BOOTSTRAP_SERVERS, else testcontainers when Docker answers, else scripts/kafka-local).
test: lint typecheck
	$(PY) -m pytest

unit: venv
	$(PY) -m pytest -m 'not integration'

demo: venv
	$(PY) scripts/demo

# Installs the bench extra (once per pyproject.toml change) and Quix Streams in an
# interpreter of its own (.venv/quix), then runs the harness: bench/results/*.json and
# docs/benchmarks.md (with docs/benchmarks.png).
bench: venv
	@if [ ! $(VENV)/.bench-stamp -nt pyproject.toml ]; then \
		$(PY) -m pip install --quiet -e '.[dev,bench]' && touch $(VENV)/.bench-stamp; fi
	@if [ ! $(VENV)/quix/.stamp -nt bench/quix-requirements.txt ]; then \
		$(PYTHON) -m venv $(VENV)/quix && \
		$(VENV)/quix/bin/pip install --quiet -r bench/quix-requirements.txt && \
		touch $(VENV)/quix/.stamp; fi
	$(PY) -m bench

broker-start: venv
	$(PY) scripts/kafka-local start

broker-stop: venv
	$(PY) scripts/kafka-local stop

broker-status: venv
	$(PY) scripts/kafka-local status

clean: broker-stop
	rm -rf $(VENV) .kafka-local .mypy_cache .ruff_cache .pytest_cache .hypothesis
