# unimq: two commands for a newcomer.
#   make run        - create .venv, install unimq (server dependencies only) into it, run
#                     `unimq up` (data in ./unimq-data)
#   make test       - create .venv, install unimq with its test extras, install the Debian
#                     packages the tests need (when root), run the whole test suite
# The stories (each installs only what it needs):
#   make demo       - against a running unimq: simulated MQTT devices, a CloudEvents source
#                     and an AMQP shop (`unimq demo`)
#   make spark-demo - the Spark job that analyses what the demo sent (installs PySpark, Java)
#   make bench      - install the benchmark peers (RabbitMQ, Mosquitto; as root) and run every
#                     benchmark section (results recorded in bench/RESULTS.md)

SHELL        := /bin/bash
PYTHON       ?= python3
VENV         ?= .venv
BIN          := $(VENV)/bin
# One stamp per set of extras: each is reinstalled only when pyproject.toml, setup.py or the
# compiled encoder's source changed (the install is editable, so Python code changes need no
# reinstall; the C extension core_broker/_recordc.c is built by the install).
STAMP        := $(VENV)/.installed-server
STAMP_TEST   := $(VENV)/.installed-test
STAMP_DEMO   := $(VENV)/.installed-demo
STAMP_SPARK  := $(VENV)/.installed-spark
BUILD_INPUTS := pyproject.toml setup.py core_broker/_recordc.c
DEMO_ARGS    ?= --seconds 30
SPARK_ARGS   ?= --endpoint http://127.0.0.1:8080 --topics factory,events,orders --available-now
DATA_DIR     ?= ./unimq-data
UNIMQ_ARGS   ?=
PYTEST_ARGS  ?=
# Test processes (pytest-xdist); a test file stays on one of them (--dist loadfile: module fixtures
# such as a started cluster serve the whole file; one Spark session serves a process). 0 runs it in
# the make process. 2 on a 2-core machine: with 3 the suite's fault and rate tests saw failures
# at high load (its cores were busy ~64% of the time with 2, so 3 would be faster on a quiet one).
PYTEST_WORKERS ?= 2
# Debian packages the test suite needs (real protocol peers such as mosquitto; chromium and
# its WebDriver for the console's browser tests, tests/test_console_browser.py).
# Installed with apt-get when running as root and missing; skipped when empty.
APT_PACKAGES ?= mosquitto mosquitto-clients curl chromium chromium-driver
# Spark (spark_ingest, tests/test_spark_*.py) needs a Java 17+ runtime; installed only when
# no `java` is on PATH (any existing JDK/JRE 17 or 21 is used as is).
JAVA_PACKAGE ?= openjdk-17-jre-headless

.PHONY: run test demo spark-demo bench install apt-deps cc-deps java-deps clean-venv

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

# The store's optional compiled encoder (setup.py) needs a C compiler and Python's headers at
# install time; as root on Debian they are installed when missing. Without them the install
# still succeeds (the extension is optional) and the store uses its pure-Python encoder.
cc-deps: | $(BIN)/python
	@inc=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])'); \
	missing=""; \
	command -v cc >/dev/null || missing="gcc libc6-dev"; \
	[ -f "$$inc/Python.h" ] || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make: apt-get install $$missing (for the store's compiled encoder)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing \
	      || echo "make: could not install$$missing; the store will use its pure-Python encoder" >&2; \
	  else \
	    echo "make: no C compiler or Python headers ($$missing): the store will use its pure-Python encoder" >&2; \
	  fi; \
	fi

# pip runs without --quiet so a first install shows what it is doing (it takes about a minute
# for the server, several for the test and Spark extras: PySpark alone is ~500 MB).
$(STAMP): $(BUILD_INPUTS) | $(BIN)/python cc-deps
	@echo "make: installing unimq and its server dependencies into $(VENV) (first time only)"
	$(BIN)/python -m pip install --progress-bar on -e .
	@touch $@

$(STAMP_DEMO): $(BUILD_INPUTS) | $(BIN)/python cc-deps
	@echo "make: installing the demo's client libraries into $(VENV) (first time only)"
	$(BIN)/python -m pip install --progress-bar on -e '.[demo]'
	@touch $@ $(STAMP)

$(STAMP_SPARK): $(BUILD_INPUTS) | $(BIN)/python cc-deps
	@echo "make: installing PySpark and the Spark extra into $(VENV) (first time only, ~700 MB)"
	$(BIN)/python -m pip install --progress-bar on -e '.[spark]'
	@touch $@ $(STAMP) $(STAMP_DEMO)

$(STAMP_TEST): $(BUILD_INPUTS) | $(BIN)/python cc-deps
	@echo "make: installing unimq with its test extras into $(VENV) (first time only, ~1.1 GB)"
	$(BIN)/python -m pip install --progress-bar on -e '.[test]'
	@touch $@ $(STAMP) $(STAMP_DEMO) $(STAMP_SPARK)

install: $(STAMP)

apt-deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	[ -z "$(NEED_JAVA)" ] || command -v java >/dev/null || missing="$$missing $(JAVA_PACKAGE)"; \
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

test: $(STAMP_TEST)
	@$(MAKE) --no-print-directory apt-deps NEED_JAVA=1
	$(BIN)/python -m pytest -q --durations=25 -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Against a running unimq (`make run` in another terminal).
demo: $(STAMP_DEMO)
	$(BIN)/unimq demo $(DEMO_ARGS)

java-deps:
	@$(MAKE) --no-print-directory apt-deps APT_PACKAGES= NEED_JAVA=1

spark-demo: $(STAMP_SPARK) java-deps
	$(BIN)/python -m spark_ingest.jobs.stats $(SPARK_ARGS)

# The peers the benchmarks compare with: Mosquitto and RabbitMQ (amqtt comes with the test extra).
BENCH_APT_PACKAGES ?= mosquitto rabbitmq-server
BENCH_ARGS ?=

bench: $(STAMP_TEST)
	@$(MAKE) --no-print-directory apt-deps NEED_JAVA=1 APT_PACKAGES="$(APT_PACKAGES) $(BENCH_APT_PACKAGES)"
	$(BIN)/python -m bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
