# Set-up and the main jobs. `make demo` and `make test` work on a fresh clone: they create
# .venv, install torch 2.13.0 (the CPU test oracle) first, then symgrad with its extras,
# pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean lab labext chromium

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,fast,cuda,jupyter,lab]'
	touch $(STAMP)

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

# Headless browser for tests/browser (Debian's chromium; CI runs as root).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

lab: $(STAMP) $(LABEXT)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

demo: $(STAMP)
	$(PY) -m symgrad.demo

test: $(STAMP) $(LABEXT) chromium
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 -q --symgrad-report=test-artifacts/symgrad-checks.json
	# the CUDA kernels under numba's simulator (the variable must be set before numba loads)
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -n 2 -q -p no:cacheprovider tests/cuda

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

clean:
	rm -rf $(VENV) demo-output test-artifacts .pytest_cache
