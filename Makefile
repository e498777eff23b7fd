# The two commands of the README. Each sets everything up first (a virtual
# environment in .venv with kvtop and its test tools), then does its job.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast lint bench

$(BIN)/.installed: pyproject.toml
	@echo "setting up $(VENV): a virtual environment with kvtop and its test tools (pip, quiet; a minute or so the first time) ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@
	@echo "$(VENV) is ready ($$($(BIN)/kvtop --version))"

run: $(BIN)/.installed  ## set up, then open kvtop on an embedded local cluster
	$(BIN)/kvtop

test: $(BIN)/.installed lint  ## set up, then lint, type-check and run the whole test suite
	$(BIN)/python -m pytest -n auto --dist loadfile

test-fast: $(BIN)/.installed  ## the tests that start no process and are not slow (under a minute on 2 cores)
	$(BIN)/python -m pytest -n 2 --no-processes -m 'not slow'

lint: $(BIN)/.installed
	$(BIN)/ruff check kvtop transport tests scripts
	$(BIN)/ruff format --check kvtop transport tests scripts
	$(BIN)/mypy

bench: $(BIN)/.installed  ## the data-plane benchmark (not part of the tests)
	$(BIN)/kvtop bench transfer
