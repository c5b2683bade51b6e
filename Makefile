# unimq: two commands for a newcomer.
#   make run   - create .venv, install unimq into it, run `unimq up` (data in ./unimq-data)
#   make test  - create .venv, install unimq with its test extras, install the Debian
#                packages the tests need (when root), run the whole test suite
#   make bench - install the benchmark peers (RabbitMQ, Mosquitto; as root) and run every
#                benchmark section (results recorded in bench/RESULTS.md)

SHELL        := /bin/bash
PYTHON       ?= python3
VENV         ?= .venv
BIN          := $(VENV)/bin
STAMP        := $(VENV)/.installed
DATA_DIR     ?= ./unimq-data
UNIMQ_ARGS   ?=
PYTEST_ARGS  ?=
# Debian packages the test suite needs (real protocol peers such as mosquitto).
# Installed with apt-get when running as root and missing; skipped when empty.
APT_PACKAGES ?= mosquitto mosquitto-clients curl
# Spark (spark_ingest, tests/test_spark_*.py) needs a Java 17+ runtime; installed only when
# no `java` is on PATH (any existing JDK/JRE 17 or 21 is used as is).
JAVA_PACKAGE ?= openjdk-17-jre-headless

.PHONY: run test bench install apt-deps clean-venv

# The virtualenv. On a bare Debian `python3 -m venv` fails until python3-venv is
# installed, so as root we install it and retry.
$(BIN)/python:
	@if ! $(PYTHON) -m venv $(VENV); then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: installing python3-venv"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip \
	      && $(PYTHON) -m venv --clear $(VENV); \
	  else \
	    echo "make: '$(PYTHON) -m venv' failed; install python3-venv" >&2; exit 1; \
	  fi; \
	fi

# Reinstall only when pyproject.toml changed (the install is editable, so code
# changes need no reinstall).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@

install: $(STAMP)

apt-deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	command -v java >/dev/null || missing="$$missing $(JAVA_PACKAGE)"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make: apt-get install$$missing"; \
	    mkdir -p /usr/share/man/man1; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "make: missing Debian packages:$$missing (not root: install them yourself; tests that need them will fail or skip)" >&2; \
	  fi; \
	fi

run: $(STAMP)
	$(BIN)/unimq up --data-dir $(DATA_DIR) $(UNIMQ_ARGS)

test: $(STAMP) apt-deps
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The peers the benchmarks compare with: Mosquitto and RabbitMQ (amqtt comes with the test extra).
BENCH_APT_PACKAGES ?= mosquitto rabbitmq-server
BENCH_ARGS ?=

bench: $(STAMP)
	@$(MAKE) --no-print-directory apt-deps APT_PACKAGES="$(APT_PACKAGES) $(BENCH_APT_PACKAGES)"
	$(BIN)/python -m bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
