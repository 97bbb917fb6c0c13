"""How fast the door answers: `rlt validate` of the tiny example and of the 7B paper recipe, whole process, against
two yardsticks timed in the same run, in turn (A B C A B C ...), so a machine whose speed drifts moves all alike:

  startup:  `python -c "import rlt.cli"` (the interpreter and rlt's command line, nothing checked): the floor;
  heavy:    the same validate after importing what the door imported before issue 54 (torch, transformers, TRL,
            DeepSpeed; DS_ACCELERATOR=cpu) — the import cost the lazy door no longer pays.

  old:      with --old REF, `rlt validate` of rlt as it was at commit REF (extracted with git archive), of the same
            example as it was at REF (a field added since would be unknown to it).

One warm-up run of each file first (it fills rlt's tokenizer cache for a built-in model and Python's bytecode).
Prints the median wall seconds of each and the median CPU seconds (user + system of the process, from
getrusage(RUSAGE_CHILDREN)), and each file's median ratio (pair by pair) to the heavy run and to the old commit. The
CPU time is about the wall time on an idle core (on a busy machine the wall time also counts waiting for a core).
Targets (issue 54): tiny <= 1.5 s, paper-7b <= 3 s on an idle core.

    nice -n 10 .venv/bin/python benchmarks/validate_speed.py [--runs 7] [--old dae8c77]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    "tiny": ROOT / "manifests" / "examples" / "rltrun-tiny.yaml",
    "paper-7b": ROOT / "manifests" / "examples" / "rltrun-paper-7b.yaml",
}
HEAVY = "import torch, transformers, trl, deepspeed; "  # what `rlt validate` imported for every file before


def _cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str], pythonpath: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv`. On a busy machine the wall time includes waiting for a
    core; the CPU time (user + system of the child) is about what the wall time is on an idle core."""
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cpu, start = _cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=ROOT)
    took, used = time.perf_counter() - start, _cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return took, used


def commands(path: Path, old_root: Path | None) -> dict[str, list[str]]:
    validate = f"from rlt.cli import main; raise SystemExit(main(['validate', {str(path)!r}]))"
    out = {
        "validate": [sys.executable, "-m", "rlt.cli", "validate", str(path)],
        "startup": [sys.executable, "-c", "import rlt.cli"],
        "heavy": [sys.executable, "-c", HEAVY + validate],
    }
    if old_root is not None:  # the example as it was then: a field added since is unknown to the old rlt
        out["old"] = [sys.executable, "-m", "rlt.cli", "validate", str(old_root / path.relative_to(ROOT))]
    return out


def extract(ref: str, into: Path) -> str:
    """rlt's packages and examples as they were at `ref`: a PYTHONPATH for the packages."""
    archive = subprocess.run(
        ["git", "archive", ref, "training", "operator", "manifests/examples"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return f"{into / 'training'}:{into / 'operator'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--old", help="a git commit of this repository: also time its `rlt validate`")
    parser.add_argument("--files", default=",".join(FILES), help=f"which of {', '.join(FILES)}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlt-old-") as tmp:
        old_path = extract(args.old, Path(tmp)) if args.old else None
        keys = ["validate", "startup", "heavy", *(["old"] if old_path else [])]
        head = f"{'file':<10}{'':<6}" + "".join(f"{k:>10}" for k in keys)
        print(head + f"{'validate/heavy':>16}" + (f"{'validate/old':>14}" if old_path else "") + "  (medians, s)")
        for name, path in ((n, FILES[n]) for n in args.files.split(",")):
            cmds = commands(path, Path(tmp) if old_path else None)
            for key in ("validate", "old") if old_path else ("validate",):  # warm-up: bytecode, tokenizer cache
                _timed(cmds[key], old_path if key == "old" else None)
            wall: dict[str, list[float]] = {k: [] for k in cmds}
            cpu: dict[str, list[float]] = {k: [] for k in cmds}
            for _ in range(args.runs):
                for key, argv in cmds.items():
                    took, used = _timed(argv, old_path if key == "old" else None)
                    wall[key].append(took)
                    cpu[key].append(used)
            for label, times in (("wall", wall), ("cpu", cpu)):
                line = f"{name:<10}{label:<6}" + "".join(f"{statistics.median(times[k]):>10.2f}" for k in keys)
                line += f"{_ratio(times['validate'], times['heavy']):>16.2f}"
                line += f"{_ratio(times['validate'], times['old']):>14.2f}" if old_path else ""
                print(line, flush=True)


def _ratio(a: list[float], b: list[float]) -> float:
    """The median of the pairwise ratios (runs taken in turn)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


if __name__ == "__main__":
    main()
