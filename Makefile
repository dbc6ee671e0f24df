# Set-up and the main jobs. `make demo` and `make test` work on a fresh clone: they create
# .venv, install torch 2.13.0 (the CPU test oracle) first, then symgrad with its extras,
# pinned by constraints.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,fast,cuda,jupyter]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m symgrad.demo

test: $(STAMP)
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
