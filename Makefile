# specdec developer commands. `make demo` and `make test` work on a fresh machine: they create
# .venv and install the core, every plugin (editable) and the test tools first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PLUGINS := $(wildcard plugins/*)
FIXTURES := $(wildcard tests/fixtures/specdec-plugin-*)
STAMP := $(VENV)/.specdec-installed
DEMO_PROMPT ?= def fibonacci(n):

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(wildcard plugins/*/pyproject.toml) $(wildcard tests/fixtures/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[test]" $(foreach p,$(PLUGINS),-e $(p))
	# Third-party fixture plugins, installed for real (not editable) as a user would.
	$(PIP) install -q -c constraints.txt --no-deps $(FIXTURES)
	touch $(STAMP)

demo: install
	$(BIN)/specdec methods
	$(BIN)/specdec generate --max-tokens 64 --no-progress "$(DEMO_PROMPT)"
	$(BIN)/specdec generate --method ngram -k 4 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
