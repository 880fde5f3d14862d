# agentpark: `make serve` runs the daemon, `make test` runs the checks.
# Both create or update the virtualenv in .venv first (needs Python >= 3.11 and make).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.agentpark-installed
SERVE_ARGS ?=
PYTEST_ARGS ?=

# The tpu_sync real-library tests: TPU Sync's wheel (tpu-sync-jax) needs Python >= 3.12, so
# they run in a second virtualenv, .venv-tpu, made only when a Python >= 3.12 that runs is
# found (pyenv's shim for python3.12 exists but fails unless 3.12 is selected, hence the
# check that it runs). Override with make PYTHON312=/path/to/python3.12.
PYTHON312 ?= $(shell for p in "$$(command -v python3.12)" $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12); do \
	[ -n "$$p" ] && "$$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$$p"; break; }; done)
VENV_TPU  ?= .venv-tpu
STAMP_TPU := $(VENV_TPU)/.agentpark-installed
TPU_TESTS := tests/dma/tpu_real
TPU_ENV   := JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1

.PHONY: serve test test-tpu lint format bench bench-tpu clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else f"agentpark needs Python >= 3.11, {sys.executable} is {v.major}.{v.minor}: run make PYTHON=python3.12 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@

serve: $(STAMP)
	$(BIN)/agentpark serve $(SERVE_ARGS)

$(STAMP_TPU): pyproject.toml
	@[ -n "$(PYTHON312)" ] || { echo "no Python >= 3.12 found: cannot make $(VENV_TPU)"; exit 1; }
	$(PYTHON312) -m venv $(VENV_TPU)
	$(VENV_TPU)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_TPU)/bin/python -m pip install --quiet -e '.[tpu,test]'
	@touch $@

test: $(STAMP)
	$(BIN)/ruff check agentpark migrations tests
	$(BIN)/ruff format --check agentpark migrations tests
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-tpu

# Run after the main suite by `make test`; never passes silently: without Python 3.12 it
# says the tests did not run.
test-tpu:
ifeq ($(PYTHON312),)
	@echo "tpu_sync real-library tests NOT RUN: no python3.12 on this machine"
else
	@$(MAKE) --no-print-directory $(STAMP_TPU)
	$(TPU_ENV) $(VENV_TPU)/bin/python -m pytest $(TPU_TESTS) $(PYTEST_ARGS)
endif

lint: $(STAMP)
	$(BIN)/ruff check agentpark migrations tests
	$(BIN)/ruff format --check agentpark migrations tests
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix agentpark migrations tests
	$(BIN)/ruff format agentpark migrations tests

bench: $(STAMP)
	$(BIN)/agentpark bench transfer

bench-tpu: $(STAMP_TPU)
	$(TPU_ENV) $(VENV_TPU)/bin/agentpark bench transfer --backend tpu_sync

clean:
	rm -rf $(VENV) $(VENV_TPU) .pytest_cache .ruff_cache .mypy_cache *.egg-info
