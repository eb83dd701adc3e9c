# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lpx-installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: setup demo test test-fast lint clean

setup: $(STAMP)

# Exact, tested versions from constraints/cpu.txt; the bundled tritonserver comes with the [triton] extra.
$(STAMP): pyproject.toml constraints/cpu.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "LPX needs Python >= 3.10 (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -c constraints/cpu.txt -e ".[triton,dev]"
	@touch $(STAMP)

demo: setup
	$(BIN)/lpx run

test: setup
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not triton and not slow"

lint: setup
	$(BIN)/ruff check pipeline model_repo tests scripts
	$(BIN)/ruff format --check pipeline model_repo tests scripts

clean:
	rm -rf $(VENV) .pytest_cache
