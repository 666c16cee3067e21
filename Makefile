# Two commands on a fresh machine:  make demo  |  make test
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo test test-fast test-avx2 lint conformance docs clean

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
	@$(MAKE) --no-print-directory test-avx2

# On an AVX-512 host the generated code's AVX2 paths (256-bit tiles, the AVX2 int8 products)
# would go untested: run the code generator's and the x86 backend's tests again capped at AVX2.
test-avx2: install
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then \
	    echo "AVX-512 host: tests/codegen and tests/backends/x86 again under METADEF_MAX_ISA=avx2"; \
	    METADEF_MAX_ISA=avx2 OPENBLAS_CORETYPE=Haswell $(BIN)/pytest -n 2 -q tests/codegen tests/backends/x86; \
	else \
	    echo "no AVX-512 on this host: its AVX2 paths ran in the main pass"; \
	fi

test-fast: install
	$(BIN)/pytest -n 2 -q -m "not slow" $(PYTEST_ARGS)

conformance: install
	$(BIN)/metadef conformance

docs: install
	$(BIN)/metadef docs ops -o docs/ops.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
