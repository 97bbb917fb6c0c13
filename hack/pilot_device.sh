#!/usr/bin/env bash
# The GPU pilot on the device (docs/evaluation.md, "GPU pilot"), run from the repository root.
#   hack/pilot_device.sh stash            (carry .pilot/1) keep the first part in .pilot-store, which stays between commands
#   hack/pilot_device.sh run OUT [ARGS]   (carry .pilot/2) join the wheel, check it, install the missing wheels with
#                                         --no-index into .pilot-store/site, run benchmarks/gpu_pilot.py --out OUT ARGS
set -euo pipefail
store=.pilot-store
case "${1:-}" in
stash)
  mkdir -p "$store" && cp .pilot/1/* "$store/" && ls -l "$store"
  ;;
run)
  out=$2; shift 2
  w=$store/wheels && mkdir -p "$w"
  cp .pilot/2/*.whl "$w/"
  name=$(basename "$(ls "$store"/*.part-00)" .part-00)
  cat "$store/$name.part-00" .pilot/2/"$name".part-01 > "$w/$name"
  (cd "$w" && sha256sum -c --quiet ../../.pilot/2/SHA256SUMS)
  python -m pip install --no-index --no-deps --quiet --upgrade --find-links "$w" --target "$store/site" -r .pilot/2/requirements.txt
  export PYTHONPATH=$PWD/$store/site:$PWD/training RLT_CACHE=$PWD/$store/cache
  python -u benchmarks/gpu_pilot.py --out "$out" "$@"
  ;;
*)
  echo "usage: $0 stash | run OUT [gpu_pilot.py args]" >&2; exit 64
  ;;
esac
