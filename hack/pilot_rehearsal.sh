#!/usr/bin/env bash
# The CPU rehearsal of the device's two commands (docs/evaluation.md, "GPU pilot"), as the device runs them: a copy
# of the working tree (git ls-files -co --exclude-standard) with only the carried folders added, a fake $OUT per
# command, the interpreter of VENV (a fresh venv with only the box's packages; pydantic uninstalled). Command 2 runs
# in the same box folder, as on the warm machine, so it finds what command 1 stashed in .pilot-store.
#   VENV=/tmp/dev-venv hack/pilot_rehearsal.sh [BOX]      (from the repository root, after hack/pilot_bundle.sh)
set -euo pipefail
box=${1:-/tmp/pilot-box}
venv=${VENV:-/tmp/dev-venv}
rm -rf "$box" && mkdir -p "$box"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$box"
cp -r --parents .pilot/1 .pilot/check "$box"
echo "command 1 carries: $(du -sh --total "$box" | tail -1 | cut -f1) (tree and .pilot/1 .pilot/check)"
export PATH=$venv/bin:$PATH
if "$venv/bin/python3" -c "import pydantic" 2>/dev/null; then
  echo "$venv has pydantic: the box has none; uninstall it first" >&2
  exit 1
fi
out1=$(mktemp -d) out2=$(mktemp -d)
(cd "$box" && OUT=$out1 bash -c 'set -o pipefail; hack/pilot_device.sh check $OUT --rehearsal --budget 400 2>&1 | tee $OUT/check.log')
rm -rf "$box/.pilot" && cp -r --parents .pilot/2 "$box"
echo "command 2 carries: $(du -sh --total "$box"/* "$box"/.pilot "$box"/.[a-z]* --exclude .pilot-store 2>/dev/null | tail -1 | cut -f1)"
(cd "$box" && OUT=$out2 bash -c 'set -o pipefail; hack/pilot_device.sh run $OUT/pilot --rehearsal --wall 400 2>&1 | tee $OUT/pilot.log')
echo "command 1 brought back:" && find "$out1" -type f | xargs ls -l
echo "command 2 brought back:" && find "$out2" -type f | xargs ls -l
