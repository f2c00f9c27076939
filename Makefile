# One-command entry points (see README). Everything runs from the project's own venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup test lint run demo bench monitoring docs e2e

setup:            ## create .venv and install cachemon with test extras
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'

test:             ## the whole test suite (needs `prometheus` + `promtool` on PATH for the Prometheus tests)
	$(BIN)/python -m pytest -q     # includes tests/test_static_checks.py: the `lint` target below

lint:             ## only the static checks: layer contract, type check, linter
	$(BIN)/lint-imports
	$(BIN)/python -m mypy src
	$(BIN)/ruff check src tests

run:              ## the sidecar next to a local `vllm serve` on :8000
	$(BIN)/cachemon run

demo:             ## no vLLM at hand: replay real vLLM captures through the exporter
	$(BIN)/cachemon demo

bench:            ## every benchmark, one table
	$(BIN)/python benchmarks/run.py

monitoring:       ## re-render alerts, rules, dashboards, deploy manifests and doc tables
	$(BIN)/cachemon monitoring
	$(BIN)/python -m cachemon.readme --write

e2e:              ## against a real vLLM CPU server (multi-GB install, not in CI)
	scripts/e2e-vllm
