#!/usr/bin/env bash
# The GPU check (issues 18 and 39): runs on a CUDA machine as it is, with no registry and no
# catalog models, in at most 5 minutes, and writes at most 8 files:
#
#   scripts/gpu_check.sh [OUT_DIR]                 (default: $OUT, else gpu-check-<date>-<time>)
#   scripts/gpu_check.sh --cpu-dry-run OUT_DIR     the same on this CPU with tiny shapes
#
#   OUT_DIR/summary.md     every section's result (anydraft/doctor/device_check.py lists them)
#   OUT_DIR/results.json   the same, as data
#   OUT_DIR/gpu_check.log  everything printed, in order
#   OUT_DIR/exhaustive.log the exhaustive toy enumeration (tests/methods/test_exhaustive.py)
#
# Only synthetic models run (models/synthetic/: random weights of real shapes, built on the
# GPU). What they need beside the repository travels in ignored folders:
#   .carry/tokenizers.tar.xz  `anydraft models export-tokenizers .carry/tokenizers.tar.xz`
#                             (here, where the catalog is installed; ~5 MiB), unpacked into a
#                             scratch $ANYDRAFT_CACHE there
#   .whl/*.whl                packages the machine lacks, installed with pip --no-index
# PYTHON (default python3) is the interpreter, used as it is. Exit status: 0 when every
# section passed, 1 otherwise.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
DRY=()
if [ "${1:-}" = "--cpu-dry-run" ]; then
    [ -n "${2:-}" ] || { echo "gpu_check: --cpu-dry-run needs the folder to write to" >&2; exit 2; }
    DRY=(--cpu-dry-run)
    shift
fi
OUT_DIR=${1:-${OUT:-gpu-check-$(date +%Y%m%d-%H%M%S)}}
py=${PYTHON:-python3}
# the whole check, and the sections' share of it (the rest: the exhaustive tests, the start);
# a CPU dry run gets more: it runs inside `make test` on 2 cores beside other work, where the
# exhaustive tests alone took 35-45 s (the GPU machine has 16 cores)
if [ ${#DRY[@]} -gt 0 ]; then LIMIT_DEFAULT=400 BUDGET_DEFAULT=300 EXHAUSTIVE=150
else LIMIT_DEFAULT=250 BUDGET_DEFAULT=200 EXHAUSTIVE=40; fi
LIMIT=${GPU_CHECK_SECONDS:-$LIMIT_DEFAULT}
BUDGET=${GPU_CHECK_BUDGET:-$BUDGET_DEFAULT}

mkdir -p "$OUT_DIR" || { echo "gpu_check: cannot create $OUT_DIR" >&2; exit 1; }
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu_check.log
exec > >(tee "$LOG") 2>&1
echo "gpu_check: $(date -Iseconds), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

if [ ${#DRY[@]} -eq 0 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L): use --cpu-dry-run OUT on a CPU"
    exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout, installed or not
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    site=$(mktemp -d)
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
        || { echo "gpu_check: the wheels in .whl/ did not install"; exit 1; }
    export PYTHONPATH=$PYTHONPATH:$site
fi
if [ -f .carry/tokenizers.tar.xz ]; then
    ANYDRAFT_CACHE=$(mktemp -d)
    export ANYDRAFT_CACHE
    tar -xJf .carry/tokenizers.tar.xz -C "$ANYDRAFT_CACHE" || { echo "gpu_check: bad tokenizer archive"; exit 1; }
fi

status=0
timeout "$LIMIT" "$py" -m anydraft.doctor.device_check --out "$OUT_DIR" --budget "$BUDGET" "${DRY[@]}" \
    || status=1
# the toy enumeration of every method's exactness (its own tensors; seconds)
timeout "$EXHAUSTIVE" "$py" -m pytest -q -p no:cacheprovider tests/methods/test_exhaustive.py \
    >"$OUT_DIR/exhaustive.log" 2>&1 || status=1
echo "== exhaustive enumeration: $(tail -n 1 "$OUT_DIR/exhaustive.log")"
cat "$OUT_DIR/summary.md" 2>/dev/null
exit "$status"
