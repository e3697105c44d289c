# shardflow developer commands. `make demo` and `make test` are all a new checkout needs:
# both create/refresh .venv first (scripts/setup.sh; a no-op in about a second when up to date).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV   ?= .venv
PYTHON := $(VENV)/bin/python
# -p no:cacheprovider: no .pytest_cache written into the checkout; --durations: the slow ones in CI logs
PYTEST_FLAGS ?= -q -p no:cacheprovider --durations=15
# narrow a run: make test TESTS=tests/storage PYTEST_FLAGS="-q -x"
TESTS ?=
# make test-fast: the pure-Python subset (markers registered in pyproject.toml, see tests/README.md)
FAST_MARKERS ?= not servers and not cluster and not slow and not gpu

.PHONY: help setup lint demo test test-fast bench manifests dist clean-venv

help:
	@echo "make setup   create/refresh .venv (pinned by constraints.txt)"
	@echo "make demo    setup, then run 'shardflow demo'"
	@echo "make lint    setup, then ruff and the import-linter layer contract"
	@echo "make test    setup, lint, then the whole test suite (real S3/GCS/Dask servers on 127.0.0.1); CI runs this"
	@echo "make test-fast  setup, lint, then the pure-Python tests: no servers, cluster, slow or gpu marks (~1-2 min)"
	@echo "make bench   setup, then run bench/run.py"
	@echo "make dist    build the wheel into dist/ (pip install -c constraints.txt 'dist/shardflow-*.whl[s3,dask]')"
	@echo "make manifests  regenerate k8s/ and argo/ examples from jobs/augment.py"

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/shardflow demo

# the wheel a team installs where there is no checkout (a login node, an image): setuptools from .venv,
# no network; `pip install -c constraints.txt 'dist/shardflow-<version>-py3-none-any.whl[s3,dask]'`
dist: setup
	rm -rf dist build
	$(PYTHON) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	rm -rf build
	@ls dist/*.whl

# ruff (pyflakes, pycodestyle, imports, bugbear) and the import-linter layer contract run first: fast,
# and a broken layer or an unused import fails the build like a failing test
lint: setup
	$(VENV)/bin/ruff check shardflow tests bench jobs
	$(VENV)/bin/lint-imports

test: lint
	$(PYTHON) -m pytest $(PYTEST_FLAGS) $(TESTS)

test-fast: lint
	$(PYTHON) -m pytest $(PYTEST_FLAGS) -m "$(FAST_MARKERS)" $(TESTS)

bench: setup
	$(PYTHON) bench/run.py

manifests: setup
	$(PYTHON) -m shardflow.cluster.manifests

clean-venv:
	rm -rf $(VENV)
