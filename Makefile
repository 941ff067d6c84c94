# The set-up-and-go commands of README.md:
#   make run    one-shot set-up, then the main job (GraphSAGE through hmgstore; GPU if present)
#   make test   one-shot set-up, then the test suite on every core (GPU tests skip themselves without a GPU)
#   make test-slow  the end-to-end runs make test leaves out (benchmarks, examples, notebooks); CI runs both
#   make bench  one-shot set-up, then python -m hmgstore.bench gather
#   make lint   set-up plus the lint extra, then ruff (style, imports, bugs) and mypy (types, not strict)
#   make docs   set-up plus the docs extra, then the documentation site (docs/, API reference from the docstrings)
#               into site/, built by mkdocs in strict mode: a broken link, reference or docstring fails it
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

.PHONY: setup run test test-slow bench lint docs pyg-sampler clean
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

# One pytest-xdist worker per core, each test to the first idle worker (worksteal: a few tests take 5-10 s).
# make test leaves out the end-to-end runs marked slow (tests/conftest.py's SLOW); make test-slow runs them.
test: setup
	$(PY) -m pytest -q -n auto --dist worksteal -m "not slow" tests

test-slow: setup
	$(PY) -m pytest -q -n auto --dist worksteal -m slow tests

bench: setup
	$(PY) -m hmgstore.bench gather

# The lint extra (ruff, mypy, pre-commit) goes into the set-up venv once, again when pyproject.toml changes.
# Configuration: [tool.ruff] and [tool.mypy] in pyproject.toml; .pre-commit-config.yaml runs the same checks.
LINT_STAMP := $(VENV)/.lint-ready
LINT_PATHS := src plugins tests benchmarks examples docs/hooks
$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install --progress-bar on -e ".[lint]"
	touch $@

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy

# The docs extra (mkdocs, mkdocstrings) goes into the set-up venv once, again when pyproject.toml changes.
# NO_MKDOCS_2_WARNING: mkdocs-material's notice about MkDocs 2, printed on every build otherwise.
DOCS_STAMP := $(VENV)/.docs-ready
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --progress-bar on -e ".[docs]"
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site

# torch-sparse and torch-scatter from source: their build imports torch, hence no build isolation. pip's
# verbose output goes to a log (its compiler lines would fill the screen); every PROGRESS_EVERY seconds a line
# says how far the build is; pip's own exit status is make's (no pipe into grep to hide a failed build).
PROGRESS_EVERY ?= 30
PYG_SAMPLER_LOG ?= $(VENV)/pyg-sampler.log
pyg-sampler: setup
	@echo "== building torch-scatter and torch-sparse from source (about 17 minutes on 2 cores); full log: $(PYG_SAMPLER_LOG)"
	@log=$(PYG_SAMPLER_LOG); start=$$(date +%s); n=0; \
	$(PY) -m pip install -v --no-build-isolation torch_scatter torch_sparse >$$log 2>&1 & pid=$$!; \
	while kill -0 $$pid 2>/dev/null; do \
	  sleep 1; n=$$((n + 1)); \
	  if [ $$((n % $(PROGRESS_EVERY))) -eq 0 ]; then \
	    echo "   $$(( $$(date +%s) - start )) s: $$(grep -Ec -- ' -c [^ ]+[.](cpp|cu)( |$$)' $$log) source files compiled; $$(grep -E 'Building wheel|Created wheel|Successfully' $$log | tail -n 1)"; \
	  fi; \
	done; \
	wait $$pid; status=$$?; \
	grep -E "Created wheel|Successfully installed|ERROR|error:" $$log | tail -n 20; \
	if [ $$status -ne 0 ]; then echo "== pip failed (exit status $$status); the full log: $$log"; fi; \
	exit $$status

clean:
	rm -rf $(VENV) bench-out
