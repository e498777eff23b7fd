# The two commands of the README. Each sets everything up first (a virtual
# environment in .venv with kvtop and its test tools), then does its job.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast test-sglang lint bench

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

# The SGLang interop tier: its own environment with SGLang 0.5.23, the torch it pins (pip takes it from this
# machine's disk where it lies there), Mooncake's CPU build, and kvtop with its SGLang plugin's entry point.
SGLANG_VENV ?= .venv-sglang
SGLANG_BIN := $(SGLANG_VENV)/bin

$(SGLANG_BIN)/.installed: pyproject.toml tests/sglang/requirements.txt
	@echo "setting up $(SGLANG_VENV): SGLang 0.5.23, torch 2.14.1, Mooncake's CPU build, kvtop (pip, quiet; about 3.4 GB to download where torch is not on this disk, 6.2 GB installed, 3-5 minutes) ..."
	@ldconfig -p | grep -q libibverbs.so.1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq libibverbs1; } \
		|| { echo "test-sglang: Mooncake needs libibverbs.so.1 (Debian: apt-get install libibverbs1)" >&2; exit 1; }
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_BIN)/python -m pip install --quiet --upgrade pip
	$(SGLANG_BIN)/python -m pip install --quiet -r tests/sglang/requirements.txt
	$(SGLANG_BIN)/python -m pip install --quiet --no-deps sglang==0.5.23
	$(SGLANG_BIN)/python -m pip install --quiet -e '.[test]'
	$(SGLANG_BIN)/python -c "import sglang.srt.disaggregation.mooncake.conn, mooncake.engine, kvtop" 2>/dev/null \
		|| { echo "test-sglang: the environment in $(SGLANG_VENV) does not import SGLang's Mooncake PD code" >&2; exit 1; }
	touch $@

test-sglang: $(SGLANG_BIN)/.installed  ## set up SGLang 0.5.23's environment, then run kvtop against its own KV transfer code
	$(SGLANG_BIN)/python -m pytest -c tests/sglang/pytest.ini tests/sglang
