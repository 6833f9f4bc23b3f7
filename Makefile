# Two entry points on a fresh machine: `make demo` and `make test`. Both are idempotent.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DEMO_MODELS := qwen2.5-coder-1.5b smollm2-135m
ALL_MODELS := smollm2-135m gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
LLAMA_BUILD := CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8"

.PHONY: demo test install install-demo browser lint clean-venv

$(BIN)/python:
	@command -v $(PY) >/dev/null || { echo "anydraft needs Python 3.11 ($(PY) not found): set PY=/path/to/python3.11"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	# torch first and pinned: the CPU wheel lies on local disk; unpinned, pip pulls a CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	# the dev extra includes llama-cpp-python, which pip compiles from source: use every core,
	# and leave out llama.cpp's AMX kernels, which crash on virtual machines (llama.cpp#20824);
	# no wheel cache: a build with them must not be reused
	$(LLAMA_BUILD) $(BIN)/pip install --quiet --no-cache-dir -e '.[dev]'
	# a venv from before that rule: rebuild llama.cpp without AMX
	@$(BIN)/python -c "import llama_cpp, sys; sys.exit(b'AMX_INT8 = 1' in llama_cpp.llama_print_system_info())" \
		|| $(LLAMA_BUILD) $(BIN)/pip install --quiet --no-cache-dir --no-deps --force-reinstall \
		llama-cpp-python==$$($(BIN)/python -c "import llama_cpp; print(llama_cpp.__version__)")

# the demo's GGUF models run on ik_llama.cpp's prebuilt wheel (or PyTorch): nothing to compile;
# where `make test` installed llama.cpp too, `auto` measures it as well
install-demo: $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[ik]'

demo: install-demo
	$(BIN)/anydraft models install $(DEMO_MODELS)
	$(BIN)/anydraft demo --target qwen2.5-coder-1.5b --drafter smollm2-135m

# the playground's test drives Debian's chromium through its chromium-driver (headless); where
# they cannot be installed (no root) that test is skipped, except in CI, where it fails
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
		echo "could not install chromium and chromium-driver: the playground's browser test will not run"

test: install browser
	$(BIN)/anydraft models install $(ALL_MODELS)
	$(BIN)/ruff check anydraft tests
	ANYDRAFT_REQUIRE_MODELS=1 $(BIN)/python -m pytest -q --durations=15

lint: install
	$(BIN)/ruff check anydraft tests

clean-venv:
	rm -rf $(VENV)
