"""The teaching comparison's units and their scheduling (benchmarks/teaching_comparison.py runs them): the units'
names, the student seeds, the order within a teacher seed, and the runner over benchmarks/unit_runner.py's loop
(a deadline guard per kind of unit, resumable pieces, rows appended as units end, a student never before its
teacher)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import comparison_analysis as analysis
from unit_runner import append_row, heavy_lock, read_rows, run_missing_units, run_until, unit_estimate

SCRIPT = Path(__file__).parent / "teaching_comparison.py"  # each unit is its --unit in a process of its own

# ---- registered (docs/experiments.md, "Round five: the comparison's fixed design"); the rule's constants are in
# comparison_analysis (SEEDS_FIXED 15, STUDENTS 4, α and margin from comparison_power)
ARMS = ("rl", "sft-continued", "sft-convergence", "raw", "friendly")
TEACHER_ARMS = ("rl", "sft-continued", "sft-convergence")
PRIMARY_TEACHERS = ("rl", "sft-continued")  # the teacher units a teacher seed's primary students need, in run order
PRIMARY_STUDENTS = analysis.PRIMARY_ARMS  # rl's students, sft-continued's, raw's
SECONDARY = ("sft-convergence", "friendly")  # outside the rule: one student each, where time allows
STUDENT_SEED_BASE = 100  # student j of teacher seed s has seed 100·s + j
# First estimates (seconds on shared cores) of a unit of each kind before one ran: the teacher units the earlier
# protocol's runner estimated for the whole arm, a student unit as its raw arm.
FIRST_ESTIMATE = {"rl": 7200.0, "sft-continued": 1800.0, "sft-convergence": 3600.0, "student": 1200.0}
# rl's teacher unit and every student unit may be longer than what a session has left after its other work (step 0's
# student units took longer than a session on the shared cores): their stages checkpoint (rl every
# teaching_comparison.RL_SAVE steps; the student stage on SIGTERM) and a re-run continues from the last one (rlt's restarts change nothing:
# tests/training/test_restart_changes_nothing), so they may start with PIECE seconds left and are stopped at the
# deadline, to go on next time. GRACE seconds before the deadline a unit gets SIGTERM, on which the stage saves its
# last finished step (step 0's 180 s: a student step took up to ~160 s there). A unit starved of the cores (a CI
# run beside it at a higher priority) may save nothing in the grace: the runner says what each piece kept.
PIECE, GRACE = 1200.0, 180.0
COURTESY = 20.0  # seconds between units without the lock

# ---- the units: their names, seeds and order


def unit_name(arm: str, student: int | None = None) -> str:
    """A unit's name: "<arm>.teacher" (a teacher arm's teacher stages and distill) or "<arm>.student<j>"."""
    return f"{arm}.teacher" if student is None else f"{arm}.student{student}"


def parse_unit(name: str) -> tuple[str, int | None]:
    """(arm, student index or None for a teacher unit) of a unit's name; a bad name is refused, naming it."""
    arm, _, kind = name.rpartition(".")
    if arm in TEACHER_ARMS and kind == "teacher":
        return arm, None
    j = kind.removeprefix("student")
    if arm in ARMS and kind.startswith("student") and j.isdigit() and 1 <= int(j) < STUDENT_SEED_BASE:
        return arm, int(j)
    raise ValueError(
        f"unit {name!r}: expected <teacher arm>.teacher ({', '.join(TEACHER_ARMS)}) or <arm>.student<j> "
        f"(j 1 … {STUDENT_SEED_BASE - 1}; arms {', '.join(ARMS)})"
    )


def run_name(arm: str, seed: int, student: int | None = None) -> str:
    """The RLTRun of a unit: teach-<arm>-seed<s> (a teacher unit) or teach-<arm>-seed<s>-student<j>."""
    return f"teach-{arm}-seed{seed}" + ("" if student is None else f"-student{student}")


def student_seed(seed: int, student: int) -> int:
    """Student j of teacher seed s: seed 100·s + j, the same in every arm of s (the arms are paired by it)."""
    return STUDENT_SEED_BASE * seed + student


def plan(seeds: list[int], students: int = analysis.STUDENTS, secondary: bool = False) -> list[tuple[str, int]]:
    """The units in run order: per teacher seed the primary teachers, then the primary arms' students, then (with
    `secondary`) sft-convergence's teacher and one student and one friendly student; so that a deadline cuts what
    the rule needs last, and a teacher's students never come before it."""
    if not 1 <= students < STUDENT_SEED_BASE:
        raise ValueError(f"students {students}: 1 … {STUDENT_SEED_BASE - 1} per arm")
    units: list[tuple[str, int]] = []
    for seed in seeds:
        units += [(unit_name(a), seed) for a in PRIMARY_TEACHERS]
        units += [(unit_name(a, j), seed) for a in PRIMARY_STUDENTS for j in range(1, students + 1)]
        if secondary:
            units += [(unit_name("sft-convergence"), seed), *((unit_name(a, 1), seed) for a in SECONDARY)]
    return units


# ---- the runner: units in order, a deadline guard, rows appended as units end, resumable


def estimate_kind(name: str) -> str:
    """Units whose durations estimate each other: each teacher arm's teacher units; all student units."""
    arm, student = parse_unit(name)
    return arm if student is None else "student"


def resumable(name: str) -> bool:
    arm, student = parse_unit(name)
    return student is not None or arm == "rl"


def run_units(
    seeds: list[int],
    units_path: Path,
    run_unit: Callable[[str, int, float], dict | None],
    deadline: float,
    first: dict[str, float],
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = print,
    students: int = analysis.STUDENTS,
    secondary: bool = False,
    record: Callable[[Path, dict], None] = lambda path, row: None,
) -> list[dict]:
    """Run the missing units of `plan` in order. run_unit(name, seed, estimate) returns the unit's row, or None when
    it was stopped at the deadline. No unit starts that the longest of the last three units of its kind
    (`first[kind]` before any ran) says cannot end by the deadline, except that a resumable unit starts with PIECE
    seconds left (a piece of it: the next run continues it). record(units file, row) runs as each row is appended
    (--commit: commits it)."""

    def budget(name: str, rows: list[dict], left: float) -> tuple[float, float | None]:
        kind = estimate_kind(name)
        need = unit_estimate([r["seconds"] for r in rows if estimate_kind(r["unit"]) == kind], first[kind])
        piece = resumable(name) and left >= PIECE
        if need > left and not piece:
            return need, None
        return need, PIECE if piece and need > left else need

    def stopped_note(name: str) -> str:
        return " (a piece: the next run goes on from what it kept)" if resumable(name) else ""

    units = plan(seeds, students, secondary)
    key = lambda r: (r["unit"], r["seed"])  # noqa: E731
    return run_missing_units(
        units, units_path, run_unit, deadline, budget, clock, log, record, stopped_note=stopped_note, key=key
    )


def progress(rows: list[dict], seeds: list[int], students: int = analysis.STUDENTS) -> list[str]:
    """Where the comparison stands, from the rows' unit names, seeds and seconds only (never an arm value: whoever
    reads it stays blind): per teacher seed its units done, then the units left and the CPU hours they need at the
    median unit of each kind so far (FIRST_ESTIMATE for a kind none of which ran)."""
    units = plan(seeds, students)
    done = {(r["unit"], r["seed"]) for r in rows}
    lines, idle, complete = [], [], 0
    for seed in seeds:
        mine = [u for u in units if u[1] == seed]
        teachers = sum(1 for u in mine if u in done and parse_unit(u[0])[1] is None)
        taught = sum(1 for u in mine if u in done and parse_unit(u[0])[1] is not None)
        if not teachers and not taught:
            idle.append(seed)
            continue
        n_teachers, n_students = len(PRIMARY_TEACHERS), len(mine) - len(PRIMARY_TEACHERS)
        state = "complete" if teachers + taught == len(mine) else "in progress"
        complete += state == "complete"
        lines.append(
            f"teacher seed {seed}: {state}: {teachers} of {n_teachers} teachers, {taught} of {n_students} students"
        )
    if idle:
        lines.append(f"teacher seeds {spans(idle)}: not started")
    seconds: dict[str, list[float]] = {}
    for r in rows:
        seconds.setdefault(estimate_kind(r["unit"]), []).append(float(r["seconds"]))
    typical = {k: statistics.median(seconds[k]) if k in seconds else v for k, v in FIRST_ESTIMATE.items()}
    left = [u for u in units if u not in done]
    hours = sum(typical[estimate_kind(name)] for name, _ in left) / 3600
    each = ", ".join(f"{k} {typical[k] / 3600:.2f} h" for k in (*PRIMARY_TEACHERS, "student"))
    lines.append(
        f"complete seeds: {complete} of {len(seeds)}; left: {len(left)} units, about {hours:.0f} CPU hours at the "
        f"median unit of each kind so far ({each})"
    )
    return lines


def spans(seeds: list[int]) -> str:
    """1, 2, 3, 5 as "1-3, 5"."""
    runs: list[list[int]] = []
    for s in sorted(seeds):
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def teacher_row(units_path: Path, arm: str, seed: int, settings: str) -> dict[str, Any]:
    """The row of `arm`'s teacher unit of teacher seed `seed`, run with `settings`; refused, naming it, if none."""
    name = unit_name(arm)
    for r in read_rows(units_path):
        if r.get("unit") == name and r["seed"] == seed and r.get("settings") == settings:
            return r
    raise ValueError(
        f"teacher unit {name} of teacher seed {seed} ({settings}) has no row in {units_path}: run it first"
    )


def unit_runner(
    out: Path, quick: bool, lock: str | None, deadline: float, units_path: Path
) -> Callable[[str, int, float], dict | None]:
    """Each unit is this script's --unit in a process group of its own (SIGTERM GRACE seconds before the deadline,
    killed whole at it), its output in out/unit-<name>-seed<seed>.log; it leaves its row in
    out/unit-<name>-seed<seed>.json, which the runner appends."""
    wanted = "quick" if quick else "protocol"

    def run(name: str, seed: int, need: float) -> dict | None:
        arm, student = parse_unit(name)
        result = out / f"unit-{name}-seed{seed}.json"
        if result.exists():  # measured by an earlier, interrupted runner: not rerun
            row = dict(json.loads(result.read_text()))
            if row["settings"] != wanted:
                raise SystemExit(f"{result}: a {row['settings']} unit, this run is {wanted}: use another --out")
            return row
        if student is not None and arm in TEACHER_ARMS:
            teacher_row(units_path, arm, seed, wanted)  # refused before a process starts
        with heavy_lock(lock, deadline - need) as held:
            if not held or time.time() + need > deadline:
                return None
            cmd = [sys.executable, "-u", str(SCRIPT), "--out", str(out), "--units", str(units_path)]
            cmd += ["--unit", name, "--seed", str(seed)] + (["--quick"] if quick else [])
            started = time.time()
            logfile = out / f"unit-{name}-seed{seed}.log"
            print(f"[unit] seed {seed} {name}: started, output in {logfile}", flush=True)
            try:
                status = run_until(cmd, deadline, GRACE, logfile)
            except BaseException:  # the runner stopped (SIGTERM at a session's end, Ctrl-C), its unit with it
                append_row(pieces_file(out, name, seed), {"seconds": round(time.time() - started, 1)})
                raise
            if status is None:  # stopped: its seconds so far count when a later piece finishes it
                kept = kept_progress(out, name, seed)
                append_row(pieces_file(out, name, seed), {"seconds": round(time.time() - started, 1), "kept": kept})
                print(f"[deadline] seed {seed} {name}: the piece kept {kept_note(kept)}", flush=True)
                return None
        if lock:
            time.sleep(COURTESY)
        if status:
            raise SystemExit(f"unit {name} seed {seed} failed (exit {status}); see {logfile}")
        return dict(json.loads(result.read_text()))

    return run


def kept_progress(out: Path, name: str, seed: int) -> list[str]:
    """Where the unit's next piece goes on from, per unfinished stage of its run: the newest complete checkpoint
    ("rl/checkpoint-40"), or for a stage that resumes by row the rows written ("distill/240 rows"); a stage with
    neither starts over."""
    from rlt.contract.layout import RunLayout, newest_complete_checkpoint
    from rlt.contract.stage_registry import STAGE_ORDER, stage_info

    arm, student = parse_unit(name)
    layout = RunLayout.for_run(out, run_name(arm, seed, student))
    kept = []
    for stage in STAGE_ORDER:  # the run folder also holds plots/, tracking/, cache/: not stages
        if not layout.stage_dir(stage).is_dir() or layout.stage_done(stage).exists():
            continue
        if stage_info(stage).resumes_by_row:
            if rows := rows_written(layout, stage):
                kept.append(f"{stage}/{rows} rows")
        elif (newest := newest_complete_checkpoint(layout.checkpoints_dir(stage))) is not None:
            kept.append(f"{stage}/{newest.name}")
    return kept


def rows_written(layout: Any, stage: str) -> int:
    """The rows a by-row stage has on disk for the run's spec (its part files, which its restart reads)."""
    from rlt.spec.fingerprint import compared_fingerprint
    from rlt.spec.loading import read_runs
    from rlt.stages.distill_parts import parts_dir, read_done

    if not layout.run_file.is_file():
        return 0
    spec = read_runs(layout.run_file)[0].spec
    return len(read_done(parts_dir(layout.stage_dir(stage), compared_fingerprint(spec, stage))))


def kept_note(kept: list[str]) -> str:
    return ", ".join(kept) if kept else "nothing (no checkpoint or row saved in time): its unfinished stage starts over"


def pieces_file(out: Path, name: str, seed: int) -> Path:
    """The seconds of a unit's pieces stopped at a deadline (a resumable unit's earlier runs)."""
    return out / f"unit-{name}-seed{seed}.pieces.jsonl"
