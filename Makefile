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
	$(PIP) install -q -c constraints.txt -e ".[test,bench]" $(foreach p,$(PLUGINS),-e $(p))
	# Third-party fixture plugins, installed for real (not editable) as a user would.
	$(PIP) install -q -c constraints.txt --no-deps $(FIXTURES)
	# arctic-inference, the suffix plugin's backend, is only an sdist with a C++ extension: build it
	# against this venv's torch (--no-build-isolation, so its build tools come first). Its cmake
	# finds cmake, python and nanobind through PATH, hence the venv's bin/ in front.
	$(PIP) install -q -c constraints.txt cmake ninja nanobind==2.9.2 protobuf==5.29.6 grpcio-tools
	PATH="$(abspath $(BIN)):$$PATH" $(PIP) install -q -c constraints.txt --no-build-isolation arctic-inference==0.3.0
	touch $(STAMP)

demo: install
	# The bundled 'tiny' code model (3.4M parameters, CPU), without and with speculative decoding.
	$(BIN)/specdec generate --threads 1 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"
	$(BIN)/specdec generate --threads 1 --method ngram -k 4 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"
	$(BIN)/specdec generate --threads 1 --method draft_model -k 3 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
