# Two commands for a newcomer: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.remedy-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast lint typecheck bench clean

install: $(STAMP)

# torch is installed first, pinned, so no resolver pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,ray]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/remedy demo

test: lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

# ruff: lint rules and the formatter's check (pyproject.toml [tool.ruff]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy follows the package-dir mapping through a tree of symlinks (remedy/cases -> ../../cases, ...).
typecheck: $(STAMP)
	mkdir -p .typecheck/remedy
	for p in cases kb retrieval optimizer miners; do ln -sfn ../../$$p .typecheck/remedy/$$p; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml -p remedy

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: $(STAMP)
	$(BIN)/python bench/retrieval_speed.py
	$(BIN)/python bench/verify.py

clean:
	rm -rf $(VENV) .remedy .typecheck .mypy_cache
