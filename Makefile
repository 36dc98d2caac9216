# make demo  - set up .venv, record a demo training run, write its report.html and trace.json
# make test  - set up .venv and run lint, types and the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml setup.py otelprof/integrations/_torch_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch, pinned: never let a dependency pull a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	# Lightning and transformers + accelerate add ~220 MB; torch stays pinned in the same command.
	$(PY) -m pip install --quiet -e ".[torch,dev,gpu,lightning,hf,storage,fast]" "torch==2.13.0"
	$(PY) -c "import torch, sys; sys.exit('a CUDA build of torch was installed' if torch.version.cuda else 0)"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/otelprof demo

lint: $(STAMP)
	$(VENV)/bin/ruff check otelprof tests benchmarks
	$(VENV)/bin/mypy

test: $(STAMP) lint
	# two workers for most of the suite; the load-sensitive end-to-end suites (marked serial) alone after it
	TESTS_NO_SKIP=$${TESTS_NO_SKIP:-1} $(VENV)/bin/pytest -q -n 2 -m "not serial"
	TESTS_NO_SKIP=$${TESTS_NO_SKIP:-1} $(VENV)/bin/pytest -q -m serial

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) otelprof-runs .pytest_cache .mypy_cache .ruff_cache
