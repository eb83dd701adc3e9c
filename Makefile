# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.lpx-installed
# checkov, kubernetes-validate and hadolint (lpx deploy's offline checks) in a venv of their own:
# checkov pins packaging<24, which LPX's environment cannot take. Tests find them in .venv-lint/bin.
LINT_VENV  := .venv-lint
LINT_STAMP := $(LINT_VENV)/.lpx-installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: setup lint-tools demo test test-fast lint clean

setup: $(STAMP)

lint-tools: $(LINT_STAMP)

$(LINT_STAMP): constraints/lint.txt
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip --disable-pip-version-check install --quiet -r constraints/lint.txt
	@touch $(LINT_STAMP)

# Exact, tested versions from constraints/cpu.txt; the bundled tritonserver comes with the [triton] extra.
$(STAMP): pyproject.toml constraints/cpu.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "LPX needs Python >= 3.10 (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -c constraints/cpu.txt -e ".[triton,dev]"
	@touch $(STAMP)

demo: setup
	$(BIN)/lpx run

test: setup lint-tools
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not triton and not slow"

lint: setup
	$(BIN)/ruff check pipeline model_repo tests scripts
	$(BIN)/ruff format --check pipeline model_repo tests scripts

clean:
	rm -rf $(VENV) $(LINT_VENV) .pytest_cache
