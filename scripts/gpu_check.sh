#!/usr/bin/env bash
# The GPU check (issue 18, item 6). On a machine with a CUDA GPU and this repo checked out:
# install anydraft with a CUDA build of torch, run the greedy exactness suite with the torch
# models on CUDA, `anydraft doctor` and the main-pair bench, and write everything to one folder:
#
#   scripts/gpu_check.sh [OUT_DIR]     (default: $OUT, else gpu-check-<date>-<time>)
#
#   OUT_DIR/summary.md      the machine, the commit, each step's exit status, doctor's report
#   OUT_DIR/gpu_check.log   every step's full output, in order
#   OUT_DIR/doctor.md, .json  doctor's measured cost curves (torch on CUDA, llama.cpp on the CPU)
#   OUT_DIR/bench/          the bench's results.json and summary.md
#
# Environment: PY (python3.11) makes the venv VENV (.venv-gpu, kept apart from the CPU venv of
# `make install`); PYTHON=/path/to/python instead uses that interpreter as it is and installs
# nothing (torch with CUDA, anydraft's dependencies and the catalog models already there).
# The install needs PyPI (torch 2.13.0 from PyPI is the CUDA build). Without a GPU it stops at
# once with exit status 1; nothing else in the repo runs or needs it. Exit status: 0 when every
# step passed, 1 otherwise (the later steps still run).
# shellcheck disable=SC2317  # the functions below run through `step`, which shellcheck cannot see
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${1:-${OUT:-gpu-check-$(date +%Y%m%d-%H%M%S)}}
MODELS=(smollm2-135m gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b)  # Makefile: ALL_MODELS
TARGET=qwen2.5-coder-1.5b
DRAFTER=smollm2-135m

fail() {
    echo "gpu_check: $*" >&2
    exit 1
}

if ! command -v nvidia-smi >/dev/null 2>&1; then
    fail "no NVIDIA GPU here (nvidia-smi not found): this check runs only on a machine with a CUDA GPU"
fi
if ! GPUS=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$GPUS"; then
    fail "no NVIDIA GPU here (nvidia-smi -L: ${GPUS:-nothing}): this check runs only on a machine with a CUDA GPU"
fi

mkdir -p "$OUT_DIR" || fail "cannot create $OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu_check.log
SUMMARY=$OUT_DIR/summary.md
: >"$LOG"
STEPS=()
FAILED=0

# step NAME COMMAND...: run it, its output appended to the log (and shown), its status recorded
step() {
    local name=$1 rc
    shift
    echo "== $name: $*" | tee -a "$LOG"
    "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    STEPS+=("| $name | $rc |")
    if [ "$rc" -ne 0 ]; then
        FAILED=1
        echo "== $name failed (exit status $rc)" | tee -a "$LOG"
    fi
    return "$rc"
}

if [ -n "${PYTHON:-}" ]; then
    py=$PYTHON
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout, installed or not
else
    VENV=${VENV:-.venv-gpu}
    py=$VENV/bin/python
    install() {
        [ -x "$py" ] || "${PY:-python3.11}" -m venv "$VENV" || return 1
        "$py" -m pip install --quiet --upgrade pip || return 1
        "$py" -m pip install --quiet torch==2.13.0 || return 1
        # as `make install`: every core for llama.cpp, without its AMX kernels (llama.cpp#20824)
        CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
            CMAKE_ARGS="-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8" \
            "$py" -m pip install --quiet --no-cache-dir -e '.[dev]'
    }
    step install install || fail "the install failed: see $LOG"
fi

cuda_torch() {
    "$py" - <<'EOF'
import sys

import torch

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device (a CPU build of torch, or no driver): the check needs one")
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i} {torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})")
EOF
}
step torch-cuda cuda_torch || fail "torch cannot use the GPU: see $LOG"
step models "$py" -m anydraft models install "${MODELS[@]}" || fail "the models did not install: see $LOG"

# the greedy exactness suite with the torch models on CUDA (llama.cpp drafters on the CPU), and
# device resolution where auto must mean cuda
step exactness env ANYDRAFT_TEST_DEVICE=cuda ANYDRAFT_REQUIRE_MODELS=1 \
    "$py" -m pytest -q --durations=10 tests/methods/test_greedy_real.py tests/models/test_device.py

doctor() {  # measures once (progress in the log), then the same curves from the cache as JSON
    "$py" -m anydraft doctor --target "$TARGET" --drafter "$DRAFTER" --device cuda \
        | tee "$OUT_DIR/doctor.md" || return 1
    "$py" -m anydraft doctor --target "$TARGET" --drafter "$DRAFTER" --device cuda --json \
        >"$OUT_DIR/doctor.json"
}
step doctor doctor

# the main pair as the CPU runs measured it (benchmarks/README.md): Spec-Bench coding where the
# file is beside the checkout, else the built-in code prompts; both drafter backends, and
# transformers' assisted generation on the same pair
if "$py" -c "import sys; from anydraft.bench.datasets import spec_bench_candidates as c
sys.exit(not any(p.is_file() for p in c()))" 2>/dev/null; then
    DATA=(--dataset spec-bench --categories coding --n 6)
else
    DATA=(--dataset builtin --categories code)
fi
step bench "$py" -m anydraft bench --target "$TARGET" --drafter "$DRAFTER" --device cuda \
    --drafter-backend torch,llamacpp --baseline hf --methods ar,auto "${DATA[@]}" \
    --max-new-tokens 96 --repeats 2 --no-plots --out "$OUT_DIR/bench"

{
    echo "# GPU check: $(date -Iseconds)"
    echo
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "- GPUs: $(tr '\n' ';' <<<"$GPUS")"
    echo "- python: $py"
    echo
    echo "| step | exit status |"
    echo "|---|---|"
    printf '%s\n' "${STEPS[@]}"
    echo
    echo "Full output: gpu_check.log. Bench: bench/summary.md, bench/results.json. Doctor:"
    echo "doctor.md (below), doctor.json."
    echo
    echo "## anydraft doctor --device cuda"
    echo
    cat "$OUT_DIR/doctor.md" 2>/dev/null
} >"$SUMMARY"
cat "$SUMMARY"
exit "$FAILED"
