# The set-up-and-go commands of README.md:
#   make run    one-shot set-up, then the main job (GraphSAGE through hmgstore; GPU if present)
#   make test   one-shot set-up, then the test suite (GPU tests skip themselves without a GPU)
#   make bench  one-shot set-up, then python -m hmgstore.bench gather
# Set-up builds .venv with torch ($(TORCH)), then `pip install -e .[$(EXTRAS)]`, adding the CuPy extra that
# matches torch's CUDA when torch sees a GPU. It runs again when pyproject.toml, TORCH or EXTRAS change.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= test
# PyG's own CPU sampler (torch-sparse, torch-scatter) is optional: only a few tests compare with it. Where
# prebuilt wheels are at hand (dev and CI machines) set-up installs them; elsewhere `make pyg-sampler`
# builds them from source (about 17 minutes on 2 cores, measured 2026-11-22).
WHEELS ?= $(wildcard $(realpath ../shared/wheels/ci-cp311))
PY := $(VENV)/bin/python
comma := ,
STAMP := $(VENV)/.ready-$(subst =,-,$(TORCH))-$(subst $(comma),-,$(EXTRAS))

.PHONY: setup run test bench pyg-sampler clean
setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "== set-up: $(VENV) with $(TORCH) and hmgstore[$(EXTRAS)] (a few minutes on a fresh machine)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
# numpy with torch: the CUDA probe below imports torch, which warns "Failed to initialize NumPy" without it.
	$(PY) -m pip install --progress-bar on "$(TORCH)" numpy setuptools wheel
	cuda=$$($(PY) -c "import torch; v = torch.version.cuda; print(',cuda' + v.split('.')[0] if v and torch.cuda.is_available() else '')"); \
	  $(PY) -m pip install --progress-bar on -e ".[$(EXTRAS)$$cuda]"
	$(if $(WHEELS),PIP_FIND_LINKS=$(WHEELS) $(PY) -m pip install --only-binary torch_scatter$(comma)torch_sparse torch_scatter torch_sparse || ,)echo "== PyG's own sampler (torch-sparse) not installed: the tests that compare with it skip (make pyg-sampler builds it)"
	rm -f $(VENV)/.ready-*
	touch $@

run: setup
	$(PY) examples/pyg_graphsage.py

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(PY) -m hmgstore.bench gather

# torch-sparse and torch-scatter from source: their build imports torch, hence no build isolation.
pyg-sampler: setup
	@echo "== building torch-scatter and torch-sparse from source (about 17 minutes on 2 cores)"
	$(PY) -m pip install -v --no-build-isolation torch_scatter torch_sparse 2>&1 | grep --line-buffered -E "Building|Created|Successfully|error|Error"

clean:
	rm -rf $(VENV) bench-out
