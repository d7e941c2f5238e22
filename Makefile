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

.PHONY: install demo test test-gpu lint bench clean

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
	# The bundled 'tiny' code model (3.4M parameters, CPU), without and with speculative decoding (eagle3:
	# the bundled tiny-eagle3 head).
	$(BIN)/specdec generate --threads 1 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"
	$(BIN)/specdec generate --threads 1 --method ngram -k 4 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"
	$(BIN)/specdec generate --threads 1 --method draft_model -k 3 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"
	$(BIN)/specdec generate --threads 1 --method eagle3 -k 3 --max-tokens 64 --no-progress "$(DEMO_PROMPT)"

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# On a CUDA machine with its own torch (the H200 device): no venv; the repo's distributions go into that
# python without dependencies, then the whole suite runs, CUDA tests included, and its log is kept.
# arctic-inference's suffix tree, built for that python by benchmarks/build_suffix_backend.sh, is read
# from .device-pkgs/ when present (suffix's tests skip without it).
GPU_LOG ?= benchmarks/results/gpu-tests.log
test-gpu:
	$(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA device')"
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e . $(foreach p,$(PLUGINS),-e $(p))
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation $(FIXTURES)
	mkdir -p $(dir $(GPU_LOG))
	bash -c 'set -o pipefail; PYTHONPATH="$(CURDIR)/.device-pkgs$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m pytest -q \
	    -p no:cacheprovider -rs tests 2>&1 | grep -v "^DEBUG" | tee $(GPU_LOG)'

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
