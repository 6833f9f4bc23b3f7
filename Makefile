# Two entry points on a fresh machine: `make demo` and `make test`. Both are idempotent.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DEMO_MODELS := qwen2.5-coder-1.5b smollm2-135m
ALL_MODELS := smollm2-135m gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b

.PHONY: demo test install lint clean-venv

$(BIN)/python:
	@command -v $(PY) >/dev/null || { echo "anydraft needs Python 3.11 ($(PY) not found): set PY=/path/to/python3.11"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	# torch first and pinned: the CPU wheel lies on local disk; unpinned, pip pulls a CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	# the dev extra includes llama-cpp-python, which pip compiles from source: use every core
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/pip install --quiet -e '.[dev]'

demo: install
	$(BIN)/anydraft models install $(DEMO_MODELS)
	$(BIN)/anydraft demo --target qwen2.5-coder-1.5b --drafter smollm2-135m

test: install
	$(BIN)/anydraft models install $(ALL_MODELS)
	$(BIN)/ruff check anydraft tests
	ANYDRAFT_REQUIRE_MODELS=1 $(BIN)/python -m pytest -q --durations=15

lint: install
	$(BIN)/ruff check anydraft tests

clean-venv:
	rm -rf $(VENV)
