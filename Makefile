# kafka-timers: `make help` lists the targets. CI runs `make test` (see .ci/run).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Written after a successful install: pip runs again only when its inputs change.
STAMP := $(VENV)/.installed
LINT_PATHS := ktimers futures oscillator tools

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

.PHONY: help venv install constraints proto lint test run topics clean distclean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

venv: $(STAMP) ## create .venv and install the project with dev tools, pinned by constraints.txt

install: $(STAMP) ## same as venv

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

constraints: ## re-pin constraints.txt from .venv (after changing dependencies in pyproject.toml)
	@test -x $(BIN)/python || { echo "no $(VENV): run make venv first" >&2; exit 2; }
	{ echo "# Exact versions of every dependency (transitive too), so a fresh machine gets the same set."; \
	  echo "# Regenerate after changing pyproject.toml: make constraints"; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -vi '^kafka-timers'; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt

proto: $(STAMP) ## regenerate ktimers/timers_pb2.py and .pyi from proto/timers.proto
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=ktimers --pyi_out=ktimers proto/timers.proto

lint: $(STAMP) ## ruff check, ruff format --check, mypy
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy $(LINT_PATHS)

test: $(STAMP) lint ## lint, then every test (starts its own embedded broker)
	$(BIN)/pytest

run: $(STAMP) ## broker, topics, oscillator, worker and a demo; Ctrl-C stops (RUN_SECONDS=N: after N s)
	$(BIN)/python tools/devstack.py

topics: $(STAMP) ## create the service's topics on KAFKA_BOOTSTRAP_SERVERS (then check the layout)
	@test -n "$${KAFKA_BOOTSTRAP_SERVERS:-}" || \
		{ echo "set KAFKA_BOOTSTRAP_SERVERS to the cluster, e.g. KAFKA_BOOTSTRAP_SERVERS=host:9092 make topics" >&2; exit 2; }
	$(BIN)/timers topics create

clean: ## remove run/ (logs, worker data), data dirs and caches; keeps .venv
	rm -rf run data timers-data .pytest_cache .mypy_cache .ruff_cache build
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean ## clean, and remove .venv and the egg-info
	rm -rf $(VENV) *.egg-info
