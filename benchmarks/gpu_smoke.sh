#!/usr/bin/env bash
# GPU smoke: reward scoring (targets: >= 40 % of bf16 peak, >= 10x the one-at-a-time reference) and one GRPO step
# per phase at Qwen2 0.5B / 1.5B shapes with random weights. Run from the repository root on a CUDA machine where
# torch, transformers, accelerate and peft are installed; TRL and DeepSpeed come as wheels in $WHEELS (no network).
#   WHEELS=/path/to/wheels benchmarks/gpu_smoke.sh [--models 0.5b,1.5b] [--n 64]
# NOT RUN YET: no GPU has been available to this project (see the closing notes of issue 11).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! "$PY" -c "import trl, deepspeed" 2>/dev/null; then
  test -n "${WHEELS:-}" || { echo "trl/deepspeed missing: set WHEELS to a folder with their wheels" >&2; exit 2; }
  "$PY" -m pip install --no-index --find-links "$WHEELS" trl==1.16.0 deepspeed==0.19.8 datasets pydantic
fi
export PYTHONPATH="$PWD/training:$PWD/operator${PYTHONPATH:+:$PYTHONPATH}" TRL_EXPERIMENTAL_SILENCE=1
"$PY" benchmarks/gpu_smoke.py "$@" | tee "gpu_smoke-$(date +%Y%m%d-%H%M%S).json"
