# Set-up and the main jobs. `make demo` and `make test` work on a fresh clone: they create
# .venv and install, pinned by constraints.txt, only what the job needs: the demo gets
# symgrad with its `demo` extra (no torch, no test tools); the tests get torch 2.13.0 (the
# CPU test oracle, installed first) and the `dev` extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: install demo test lint bench clean lab labext chromium wheel

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PY) -m pip install -q -c constraints.txt -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# The JupyterLab extension (labextension/) and the Inspector's ES module. `pip install -e .`
# builds them; this rebuilds them with jlpm when their sources change and links the build
# into the venv's share/jupyter/labextensions/symgrad.
LABEXT := symgrad/labextension/package.json
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/style/* labextension/scripts/*.mjs \
	symgrad/jupyter/graph.schema.json symgrad/symbolic/report.schema.json) \
	labextension/package.json labextension/yarn.lock
JLPM := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm

$(LABEXT): $(LABEXT_SRC) | $(STAMP)
	cd labextension && $(JLPM) install --silent && $(JLPM) build:prod
	$(VENV)/bin/jupyter-builder develop --overwrite .
	touch $(LABEXT)

labext: $(LABEXT)

# A wheel with the prebuilt labextension inside (users install it with no Node.js).
wheel: $(LABEXT)
	$(PY) -m pip wheel -q --no-deps -w dist .

# Headless browser for tests/browser (Debian's chromium; CI runs as root).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

lab: $(STAMP) $(LABEXT)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

demo: $(DEMO_STAMP)
	$(PY) -m symgrad.demo

# Every stage runs even when an earlier one failed (one failure must not hide another
# stage's results); the target fails at the end if any stage did, naming them.
test: $(STAMP) $(LABEXT) chromium
	@failed=""; \
	echo "== lint"; $(PY) -m ruff check . || failed="$$failed lint"; \
	echo "== tests"; $(PY) -m pytest -n 2 -q --symgrad-report=test-artifacts/symgrad-checks.json \
		|| failed="$$failed tests"; \
	echo "== CUDA kernels under numba's simulator (set before numba loads)"; \
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -n 2 -q -p no:cacheprovider tests/cuda \
		|| failed="$$failed cuda-simulator"; \
	if [ -n "$$failed" ]; then echo "make test: failed stages:$$failed"; exit 1; fi; \
	echo "make test: every stage passed"

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

clean:
	rm -rf $(VENV) demo-output test-artifacts .pytest_cache dist
