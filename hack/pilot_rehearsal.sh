#!/usr/bin/env bash
# The CPU rehearsal of the device's two commands (docs/experiments.md, "GPU check and GPU pilot", "Teachers on a
# lent GPU"), as the device runs them: a copy of the working tree (git ls-files -co --exclude-standard) with only the
# carried folders added, a fake $OUT per command, the interpreter of VENV (a fresh venv with only the box's packages;
# pydantic uninstalled). Command 2 runs in the same box folder, as on the warm machine, so it finds what command 1
# stashed in .pilot-store.
#   VENV=/tmp/dev-venv hack/pilot_rehearsal.sh [BOX]           the check and the pilot
#   VENV=/tmp/dev-venv hack/pilot_rehearsal.sh BOX teachers    the stash and the teachers (--quick, 2 seeds), then
#                                                              here: the import and one student from its data
# (from the repository root, after hack/pilot_bundle.sh)
set -euo pipefail
box=${1:-/tmp/pilot-box}
what=${2:-pilot}
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
if [ "$what" = teachers ]; then
  first='hack/pilot_device.sh stash $OUT 2>&1 | tee $OUT/stash.log'
  second='hack/pilot_device.sh teachers $OUT --quick --units $OUT/none.jsonl --seeds 2-3 --parallel 2 --minutes 12 2>&1 | tee $OUT/teachers.log'
else
  first='hack/pilot_device.sh check $OUT --rehearsal --budget 400 2>&1 | tee $OUT/check.log'
  second='hack/pilot_device.sh run $OUT/pilot --rehearsal --wall 400 2>&1 | tee $OUT/pilot.log'
fi
(cd "$box" && OUT=$out1 bash -c "set -o pipefail; $first")
rm -rf "$box/.pilot" && cp -r --parents .pilot/2 "$box"
echo "command 2 carries: $(du -sh --total "$box"/* "$box"/.pilot "$box"/.[a-z]* --exclude .pilot-store 2>/dev/null | tail -1 | cut -f1)"
(cd "$box" && OUT=$out2 bash -c "set -o pipefail; $second")
echo "command 1 brought back:" && find "$out1" -type f | xargs ls -l
echo "command 2 brought back:" && find "$out2" -type f | xargs ls -l
if [ "$what" = teachers ]; then  # here: the rows into a units file, then a student of seed 2's rl teacher from them
  here=$(mktemp -d)
  py=${HERE_PY:-.venv/bin/python}
  "$py" benchmarks/gpu_teachers.py --import "$out2/teachers.tar.gz" --quick --units "$here/units.jsonl"
  "$py" benchmarks/teaching_comparison.py --quick --out "$here" --units "$here/units.jsonl" --unit rl.student1 --seed 2
  echo "a student of the imported rl teacher of seed 2: $(cat "$here/unit-rl.student1-seed2.json" | head -c 300)"
fi
