# agentpark: `make serve` runs the daemon, `make test` runs the checks.
# Both create or update the virtualenv in .venv first (needs Python >= 3.11 and make).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.agentpark-installed
SERVE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: serve test lint format bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else f"agentpark needs Python >= 3.11, {sys.executable} is {v.major}.{v.minor}: run make PYTHON=python3.12 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@

serve: $(STAMP)
	$(BIN)/agentpark serve $(SERVE_ARGS)

test: $(STAMP)
	$(BIN)/ruff check agentpark migrations tests
	$(BIN)/ruff format --check agentpark migrations tests
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check agentpark migrations tests
	$(BIN)/ruff format --check agentpark migrations tests
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix agentpark migrations tests
	$(BIN)/ruff format agentpark migrations tests

bench: $(STAMP)
	$(BIN)/agentpark bench transfer

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
