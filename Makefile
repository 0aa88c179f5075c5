# Two commands on a fresh machine:
#   make demo   installs everything, starts the collector + dashboard on SQLite and feeds it a real torchrun job
#               (PORT=8123 for another port; FRESH=1 to delete the previous demo's database first)
#   make test   installs everything and runs the whole test suite (SQLite and the local PostgreSQL)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: install system-deps demo lint test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

# Debian packages the browser and Prometheus tests drive (root, apt). Skipped when already present.
system-deps:
	@bash scripts/system-deps.sh

demo: install
	$(PY) scripts/demo.py --port $(PORT) $(if $(FRESH),--fresh)

# Static checks, configured in pyproject.toml: ruff (lint) and mypy (types) over the whole tree. The import
# boundaries are a test (tests/test_import_boundaries.py), run by pytest with the rest.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The venv's bin first on PATH: tests start `goodput`, `torchrun` and `alembic` the way a user would.
test: install system-deps lint
	@bash scripts/ensure-postgres.sh
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q

test-fast: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -m "not torchrun"

bench: install
	@bash scripts/ensure-postgres.sh
	$(PY) -m benchmarks.ingest
	$(PY) -m benchmarks.ledger
	$(PY) -m benchmarks.client_overhead

clean:
	rm -rf $(VENV) .demo *.egg-info
