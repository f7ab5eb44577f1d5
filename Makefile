# The two commands for a fresh machine are `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv lint typecheck unit test compose-test demo bench broker-start broker-stop broker-status clean

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

# The container stack built and run for real (tests/deploy/compose/, README "Containers"):
# scripts/docker-local finds a Docker engine or starts a private one (installing Debian's
# docker.io when root), gets compose v2 and the images, all cached under
# $${XDG_CACHE_HOME:-~/.cache}/arrowagg. A cold first run builds for minutes, hence the timeout.
compose-test: venv
	@# First on its own, so its progress shows (pytest would hold it); the tests' fixture
	@# then finds everything ready and stops the private engine at the end.
	$(PY) scripts/docker-local start >/dev/null || { $(PY) scripts/docker-local stop; exit 1; }
	$(PY) -m pytest --compose --timeout 1500 tests/deploy/compose

unit: venv
	$(PY) -m pytest -m 'not integration'

demo: venv
	$(PY) scripts/demo

# The end-to-end peers each get an interpreter of their own, (re)made when their
# requirements change: $(call peer_venv,NAME,PYTHON) makes .venv/NAME from
# bench/NAME-requirements.txt.
define peer_venv
	@if [ ! $(VENV)/$(1)/.stamp -nt bench/$(1)-requirements.txt ]; then \
		$(2) -m venv $(VENV)/$(1) && \
		$(VENV)/$(1)/bin/pip install --quiet -r bench/$(1)-requirements.txt && \
		touch $(VENV)/$(1)/.stamp; fi
endef

# Denormalized needs Python 3.12+: PYTHON312 when set, else PYTHON when new enough, else
# python3.1x on PATH, else one that pyenv has installed (its shims only answer for the
# active version, so its version directories are searched).
FIND_PY312 = for c in $(PYTHON312) $(PYTHON) python3.14 python3.13 python3.12 \
	$$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python3; do \
	"$$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
	&& { command -v "$$c"; break; }; done

# The JVM peers: Flink's Kafka SQL connector jar beside PyFlink, and the Kafka Streams
# project built into bench/kstreams/target; each (re)made when its pom or sources change.
# Without Maven or Java they are left out (the harness says why), not the whole bench.
KSTREAMS_BUILT := bench/kstreams/target/.built
$(KSTREAMS_BUILT): bench/kstreams/pom.xml $(shell find bench/kstreams/src -name '*.java')
	@mvn -B -q -f bench/kstreams/pom.xml package && touch $@ || \
		echo "make bench: could not build the Kafka Streams peer with Maven;" \
			"going on without it." >&2

FLINK_JARS := $(VENV)/flink/jars/.stamp
$(FLINK_JARS): bench/flink/pom.xml
	@mvn -B -q -f bench/flink/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
		-DoutputDirectory=$(CURDIR)/$(VENV)/flink/jars && touch $@ || \
		echo "make bench: could not fetch Flink's Kafka SQL connector with Maven;" \
			"going on without Flink." >&2

# Installs the bench extra (once per pyproject.toml change) and the end-to-end peers
# (Quix Streams, Bytewax, Denormalized, PyFlink) in interpreters of their own under .venv/
# and the JVM peers' parts, then runs the harness: bench/results/*.json and
# docs/benchmarks.md (with docs/benchmarks.png). A peer that could not be set up is
# reported as skipped, with the reason.
bench: venv $(FLINK_JARS) $(KSTREAMS_BUILT)
	@if [ ! $(VENV)/.bench-stamp -nt pyproject.toml ]; then \
		$(PY) -m pip install --quiet -e '.[dev,bench]' && touch $(VENV)/.bench-stamp; fi
	$(call peer_venv,quix,$(PYTHON))
	$(call peer_venv,bytewax,$(PYTHON))
	@if [ ! $(VENV)/denormalized/.stamp -nt bench/denormalized-requirements.txt ]; then \
		py=$$($(FIND_PY312)); \
		if [ -z "$$py" ]; then \
			echo "make bench: Denormalized needs Python 3.12 or later and none was found;" \
				"install one (your distribution's python3.12/python3.13, or pyenv install" \
				"3.12) or set PYTHON312=/path/to/python3.12. Going on without it." >&2; \
		else \
			$$py -m venv $(VENV)/denormalized && \
			$(VENV)/denormalized/bin/pip install --quiet \
				-r bench/denormalized-requirements.txt && \
			touch $(VENV)/denormalized/.stamp; fi; fi
	$(call peer_venv,flink,$(PYTHON))
	$(PY) -m bench

broker-start: venv
	$(PY) scripts/kafka-local start

broker-stop: venv
	$(PY) scripts/kafka-local stop

broker-status: venv
	$(PY) scripts/kafka-local status

clean: broker-stop
	rm -rf $(VENV) .kafka-local .mypy_cache .ruff_cache .pytest_cache .hypothesis
