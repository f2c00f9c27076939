# One-command entry points (see README). Everything runs from the project's own venv, which
# `make demo`, `make test` and the others create on first use (and refresh when pyproject.toml changes).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Container image: the base is an official slim Python image; its Python must match $(PYTHON)'s
# minor version (the wheels are built on the host). IMAGE is the name compose and the manifests use.
BASE   ?= docker.io/library/python:3.11-slim
IMAGE  ?= ghcr.io/cachemon/cachemon:$(VERSION)
DEBIAN_BASE ?= localhost/cachemon-base:bookworm
# Another CPU architecture (arm64, amd64): qemu-user-static + binfmt-support, see scripts/image.
ARCH   ?=
# required: the build fails unless the image's isolation index is the compiled one (cachemon-native)
NATIVE ?= optional

.PHONY: setup test test-fast test-deps lint run demo demo-stack screenshots bench soak soak-short bench-compare golden monitoring e2e image image-debian

$(STAMP): pyproject.toml native/cachemon_native.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@# the compiled isolation index (optional: native/README.md); it needs a C compiler and the Python headers
	$(BIN)/python -m pip install --quiet --no-build-isolation ./native || echo "setup: cachemon-native was not \
	built (it needs a C compiler and the Python headers; Debian: apt-get install gcc python3-dev): the isolation \
	index runs in pure Python, at more CPU (native/README.md)" >&2
	touch $@

setup: $(STAMP)   ## create .venv and install cachemon with test extras

test: $(STAMP) test-deps   ## the whole suite, Prometheus / Alertmanager / image tests included
	$(BIN)/python -m pytest -q     # includes tests/test_static_checks.py: the `lint` target below

test-fast: $(STAMP)   ## the suite without the tests marked slow (processes, Prometheus, builds): minutes less
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)    ## only the static checks: layer contract, type check, linter
	$(BIN)/lint-imports
	$(BIN)/python -m mypy src
	$(BIN)/ruff check src tests scripts benchmarks

test-deps:        ## as root: apt-get install what the integration tests run (else they skip, saying why)
	scripts/test-deps

run: $(STAMP)     ## the sidecar next to a local `vllm serve` on :8000
	$(BIN)/cachemon run

demo: $(STAMP)    ## no vLLM at hand: replay real vLLM captures through the exporter
	$(BIN)/cachemon demo

demo-stack: $(STAMP)   ## the demo + a real Prometheus (shipped rules) + Alertmanager (examples/alertmanager.yml)
	$(BIN)/python scripts/demo_stack.py

screenshots: $(STAMP)   ## redraw docs/images/ (the README's pictures) from a real Prometheus on the demo (~3 min)
	CACHEMON_UPDATE_IMAGES=1 $(BIN)/python -m pytest -q tests/test_demo_stack.py -k overview_is_drawn

bench: $(STAMP)   ## every benchmark, one table
	$(BIN)/python benchmarks/run.py

soak: $(STAMP)    ## the full 10-minute soak (issue 26): polls, idle connections, bad passwords, KV events
	$(BIN)/python benchmarks/bench_soak.py --full

soak-short: $(STAMP)    ## the same soak, 1 minute loaded after 30 s of polls only (a quick check)
	$(BIN)/python benchmarks/bench_soak.py --minutes 1 --baseline-minutes 0.5

.PHONY: bench-compare golden
bench-compare: $(STAMP)   ## BASE=<ref>: the hot-path benchmarks of this tree vs BASE, interleaved; fails on a >10% regression
	@case "$(origin BASE)" in command*|environment*) ;; *) echo "usage: make bench-compare BASE=<git ref>"; exit 2;; esac
	$(BIN)/python benchmarks/compare.py $(BASE)

golden: $(STAMP)  ## re-record tests/golden/whole-page.prom (the whole /metrics over the captures); review its diff
	$(BIN)/python tests/golden_page.py --write

monitoring: $(STAMP)   ## re-render alerts, rules, dashboards, deploy manifests and doc tables
	$(BIN)/cachemon monitoring
	$(BIN)/python scripts/readme.py --write

image: $(STAMP)   ## the container image with buildah (BASE=..., IMAGE=..., EXTRAS=auth,kv-events, ARCH=arm64, NATIVE=required)
	BASE=$(BASE) IMAGE=$(IMAGE) ARCH=$(ARCH) NATIVE=$(NATIVE) PYTHON=$(BIN)/python scripts/image build

image-debian: $(STAMP)   ## no registry at hand: the image on a Debian base made by mmdebstrap (ARCH=arm64 too)
	DEBIAN_BASE=$(DEBIAN_BASE)$(if $(ARCH),-$(ARCH)) ARCH=$(ARCH) scripts/image debian-base
	$(MAKE) image BASE=$(DEBIAN_BASE)$(if $(ARCH),-$(ARCH)) ARCH=$(ARCH) NATIVE=$(NATIVE)

e2e:              ## against a real vLLM CPU server (multi-GB install, not in CI)
	scripts/e2e-vllm
