# The two set-up-and-go commands of README.md:
#   make run    one-shot set-up, then the main job (GraphSAGE through hmgstore; GPU if present)
#   make test   one-shot set-up, then the test suite (GPU tests skip themselves without a GPU)
# Set-up builds .venv with torch ($(TORCH)), then `pip install -e .[$(EXTRAS)]`.
# On a GPU machine add CuPy matching torch's CUDA: make run EXTRAS=test,cuda12
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= test
# Prebuilt torch-sparse/-scatter wheels, where they exist (dev and CI machines), save a source build
# (14.5 min measured on this 2-core machine).
WHEELS ?= $(realpath ../shared/wheels/ci-cp311)
PY := $(VENV)/bin/python

.PHONY: setup run test bench clean
setup: $(VENV)/.ready-$(EXTRAS)

$(VENV)/.ready-$(EXTRAS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH) setuptools wheel
	# PyG's CPU sampler needs torch-sparse/-scatter; their source build imports torch, so no isolation.
	$(if $(WHEELS),PIP_FIND_LINKS=$(WHEELS)) $(PY) -m pip install -q --no-build-isolation torch_scatter torch_sparse
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

run: setup
	$(PY) examples/pyg_graphsage.py

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(PY) -m hmgstore.bench gather

clean:
	rm -rf $(VENV) bench-out
