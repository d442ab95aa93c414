# kafka-timers: `make help` lists the targets. CI runs `make test` (see .ci/run).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Written after a successful install: pip runs again only when its inputs change (the
# compiled modules' sources among them: the install builds them in place, setup.py).
STAMP := $(VENV)/.installed
LINT_PATHS := ktimers futures oscillator tools bench helm/kafka-timers/files

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

.PHONY: help venv install dist constraints proto lint test run broker topics clean distclean redis valgrind bench bench-full bench-capacity bench-engine failover bench-jobs
.PHONY: simulate
.PHONY: java compact replay report
.PHONY: helm-lint promtool
.PHONY: browser

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

venv: $(STAMP) ## create .venv and install the project with dev tools, by the hashes in constraints.txt

install: $(STAMP) ## same as venv

# pip first, by hash: the virtualenv's own pip (23.2.1 with Python 3.11) checks hashes only in
# requirements files, 26.1 and later in constraints files too (the Dockerfile installs an extra
# against constraints.txt; so can a developer). Then every pinned dependency, each file checked
# against its hashes; then the project itself, which has no file to hash: editable, without its
# dependencies (all there), and built by the hashed setuptools and Cython, not an isolated download.
$(STAMP): pyproject.toml constraints.txt requirements-pip.txt setup.py $(wildcard futures/worker/*.pyx ktimers/*.pxd)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements-pip.txt
	$(BIN)/python -m pip install --quiet --require-hashes -r constraints.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@# The client is pure Python: a module an older checkout compiled there would shadow its source.
	rm -f futures/client/*.so futures/client/*.c
	@touch $@

# The sdist and a wheel for this Python and platform, built by the setuptools and Cython make venv installed
# by hash (tools/dist.py: no isolated build downloading them again); the compiled modules in build/ are
# reused while their sources are unchanged. tests/test_wheel.py installs the wheel where no compiler is.
dist: $(STAMP) ## build the sdist and the wheel into dist/ (pip install dist/kafka_timers-*.whl)
	rm -rf dist
	$(BIN)/python -m tools.dist dist

# uv resolves for Python 3.11 on Linux, whoever runs it, and keeps every version already pinned unless
# pyproject.toml rules it out (ARGS='--upgrade-package NAME' moves one); it records the hashes of all
# the files PyPI has for a version, so any machine's pip finds the file it picks among them.
# constraints-lowest.txt is not kept from the last lock (--upgrade): a floor lowered in pyproject.toml
# is a floor there too, and what else comes is what an application installing the floors would get.
UV_LOCK = $(BIN)/uv pip compile --quiet --generate-hashes --python-version 3.11 --python-platform linux \
	--custom-compile-command 'make constraints' $(ARGS)
constraints: $(STAMP) ## re-lock constraints.txt, constraints-lowest.txt, requirements-pip.txt (ARGS='--upgrade-package X')
	$(UV_LOCK) --all-extras -o constraints.txt pyproject.toml
	$(UV_LOCK) --upgrade --resolution lowest-direct --extra guard --extra oscillator --extra registry \
		--extra embedded --extra test -o constraints-lowest.txt pyproject.toml
	$(UV_LOCK) -o requirements-pip.txt requirements-pip.in

proto: $(STAMP) ## regenerate ktimers/timers_pb2.py and .pyi from proto/timers.proto
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=ktimers --pyi_out=ktimers proto/timers.proto

lint: $(STAMP) ## ruff check, ruff format --check, mypy
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy $(LINT_PATHS)

test: $(STAMP) redis valgrind java browser promtool lint helm-lint ## lint, then every test (starts its own embedded broker)
	$(BIN)/pytest

run: $(STAMP) ## broker, topics, oscillator, worker and a demo; Ctrl-C stops (RUN_SECONDS=N: after N s)
	$(BIN)/python -m tools.devstack

redis: ## install Debian's redis-server (the benchmarks' Redis baseline) if it is missing
	@command -v redis-server >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server; }

valgrind: ## install Debian's valgrind (bench-engine counts instructions with it) if it is missing
	@command -v valgrind >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq valgrind; }

bench: $(STAMP) redis ## measure 3 times (~25 min): docs/bench/results.json, BENCHMARKS.md, *.png; any Kafka: KAFKA_BOOTSTRAP_SERVERS
	$(BIN)/python -m bench --profile quick --repeat 3

bench-full: $(STAMP) redis ## the large sizes: a 1 M-timer hot second, 10 M pending timers (long)
	$(BIN)/python -m bench --profile full

bench-capacity: $(STAMP) ## one worker from few to 10 M pending timers: RSS and hot-second rate, docs/BENCHMARKS.md (~15 min)
	$(BIN)/python -m bench.capacity $(ARGS)

bench-engine: $(STAMP) valgrind ## the engine alone, no broker: CPU instructions per timer accepted, fired and swept (~5 min)
	$(BIN)/python -m bench.engine --instructions $(ARGS)

SECONDS ?= 600
FAULTS ?= default
STEPS ?= 250
RUNS ?= 0
simulate: $(STAMP) ## the engine in a simulated world for SECONDS (600), from SEED: violations, shortest failing schedule (docs/simulation.md)
	$(BIN)/python -m tests.simulation --seconds $(SECONDS) --faults '$(FAULTS)' --steps $(STEPS) --runs $(RUNS) \
		$(if $(SEED),--seed $(SEED))

failover: $(STAMP) ## SIGKILL a worker: seconds until its partitions fire again (docs/FAILOVER.md, ~3 min)
	$(BIN)/python -m bench.failover $(ARGS)

RECORDS ?= 10000000
bench-jobs: $(STAMP) ## compaction speed of a 10 M-record log with 1, 2, 4 Spark tasks: docs/BENCHMARKS.md (RECORDS=N)
	$(BIN)/python -m bench.jobs --records $(RECORDS)

java: ## install Java 17 for PySpark (Debian's openjdk-17-jre-headless) if java is missing or older
	@v=$$( (java -version 2>&1 || true) | awk -F'"' '/version/ {split($$2, p, "."); print p[1]; exit}'); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq openjdk-17-jre-headless; fi

browser: ## install Debian's chromium (the admin page's browser test drives it) if it is missing
	@test -x /usr/bin/chromium || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; } || \
		echo "make browser: could not install chromium; tests/worker/admin/test_page.py will be skipped" >&2

compact: $(STAMP) java ## snapshot the pending timers of timer-request (ARGS='--out DIR --publish TOPIC ...')
	$(BIN)/timers-compact $(ARGS)

replay: $(STAMP) java ## re-publish timers (ARGS='--snapshot DIR'), or callbacks (ARGS='--from-log --to-topic T --due-from A --due-to B')
	$(BIN)/timers-replay $(ARGS)

report: $(STAMP) java ## due-time histogram and fire lateness as a table and a PNG (ARGS='--snapshot DIR')
	$(BIN)/timers-report $(ARGS)

helm-lint: $(STAMP) promtool ## the Helm chart and Dockerfile, offline: lint, render, Kubernetes schemas, alerts
	$(BIN)/pytest tests/helm -q -m "not integration"

promtool: ## install Debian's prometheus package for promtool (checks the chart's alert rules) if missing
	@command -v promtool >/dev/null || { \
		SUDO=$$(test "$$(id -u)" = 0 || echo sudo); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

broker: $(STAMP) ## only the embedded broker on 127.0.0.1:9092 (ARGS='--port 0' for any free port); Ctrl-C stops it
	$(BIN)/timers broker $(ARGS)

topics: $(STAMP) ## create the service's topics on KAFKA_BOOTSTRAP_SERVERS (then check the layout)
	@test -n "$${KAFKA_BOOTSTRAP_SERVERS:-}" || \
		{ echo "set KAFKA_BOOTSTRAP_SERVERS to the cluster, e.g. KAFKA_BOOTSTRAP_SERVERS=host:9092 make topics" >&2; exit 2; }
	$(BIN)/timers topics create

clean: ## remove run/ (logs, worker data), data dirs and caches; keeps .venv
	rm -rf run data timers-data .pytest_cache .mypy_cache .ruff_cache build dist
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean ## clean, and remove .venv, the egg-info and the compiled modules
	rm -rf $(VENV) *.egg-info futures/worker/*.c futures/worker/*.so
