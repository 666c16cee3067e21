# Two commands on a fresh machine:  make demo  |  make test
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo test test-fast lint conformance docs clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/metadef demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -n 2 -q $(PYTEST_ARGS)

test-fast: install
	$(BIN)/pytest -n 2 -q -m "not slow" $(PYTEST_ARGS)

conformance: install
	$(BIN)/metadef conformance

docs: install
	$(BIN)/metadef docs ops -o docs/ops.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
