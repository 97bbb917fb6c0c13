"""Round five, step 0 (issue 52; pre-registered in docs/experiments.md, "Round five, step 0", committed before any
unit ran): the headroom the students see. The teaching comparison's raw and friendly arms (traces as distillation
data -> student -> evaluate) on 256 questions outside the comparison's rows, 3 student seeds each; the gate reads
the mean over the seeds of pass@1(friendly) − pass@1(raw) on the comparison's 200 held-out questions.

  nice -n 19 python benchmarks/headroom_students.py --out results/headroom-students --deadline 17:00 --commit
  python benchmarks/headroom_students.py --analyse                   # per seed, g, its intervals, the gate

Each finished unit's row (with the commit it ran on) is appended to benchmarks/headroom-students.jsonl and, with
--commit, committed at once; a re-run on any clone reads the committed file and runs only the missing units.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import teaching_comparison as tc
import teaching_protocol as protocol
from unit_runner import (
    append_row,
    commit_rows,
    deadline_ts,
    git,
    lower_priority,
    read_rows,
    run_missing_units,
    run_until,
    stop_on_sigterm,
    unit_estimate,
)

# ---- pre-registered (docs/experiments.md, "Round five, step 0"); never edited after a unit ran
ARMS = ("raw", "friendly")
SEEDS = (1, 2, 3)  # student seeds; each seed's pair before the next seed
TRACE_SEED = 7  # generator seed of the trace questions (no earlier calibration, test or split uses it)
GATE = 0.15  # mean over the seeds of pass@1(friendly) − pass@1(raw)
FIRST_ESTIMATE = 2400.0  # seconds a unit may take before one ran
# Scheduling, not statistics: on the shared cores a unit took longer than a session (the student stage at ~160 s a
# step), so every unit runs in pieces like the comparison's rl unit: it starts with PIECE seconds left, gets SIGTERM
# GRACE seconds before the deadline (the student stage saves its last step), and the next run on the same machine
# continues it; on a new machine it starts again. Only a finished unit's row is written, and committed at once.
PIECE, GRACE = 1200.0, 180.0
UNITS_FILE = Path(__file__).parent / "headroom-students.jsonl"
# the code a unit runs: a row records whether it was committed when the unit started
CODE_PATHS = ("training", "benchmarks/headroom_students.py", "benchmarks/teaching_comparison.py")


def trace_rows(s: tc.Settings) -> list[dict[str, Any]]:
    """The first `train_rows` rows of generator seed TRACE_SEED whose question is none of the comparison's training,
    loss or held-out questions."""
    from rlt.data import tasks

    taken = {r["question"] for r in (*tc.training_rows(s), *tc.loss_rows(s), *tc.heldout_rows(s))}
    fresh = [dict(r) for r in tasks.generate(s.task, 4 * s.train_rows, TRACE_SEED) if r["question"] not in taken]
    if len(fresh) < s.train_rows:
        raise ValueError(f"generator seed {TRACE_SEED} gave {len(fresh)} fresh questions, {s.train_rows} wanted")
    return fresh[: s.train_rows]


def plan(seeds: tuple[int, ...] = SEEDS) -> list[tuple[str, int]]:
    return [(arm, seed) for seed in seeds for arm in ARMS]


# ---- the record: rows committed to the repository as each unit ends


def code_state(repo: Path) -> dict[str, Any]:
    """The commit a unit runs on, and whether the code it runs differs from that commit."""
    return {"commit": git(repo, "rev-parse", "HEAD"), "dirty": bool(git(repo, "status", "--porcelain", *CODE_PATHS))}


def run_missing(
    units: list[tuple[str, int]],
    units_path: Path,
    run_unit: Callable[[str, int, float], dict | None],
    deadline: float,
    record: Callable[[Path, dict], None] = lambda path, row: None,
    first: float = FIRST_ESTIMATE,
    clock: Callable[[], float] = time.time,
    log: Callable[[str], None] = print,
    piece: float = PIECE,
) -> list[dict]:
    """Run the units not yet in `units_path`, in order. run_unit(arm, seed, estimate) returns the unit's row, or None
    when it was stopped at the deadline; each row is appended and `record`ed (committed) before the next unit starts.
    A unit starts when the longest of the last three units (`first` before any) says it ends by the deadline, or
    as a piece when at least `piece` seconds are left (a unit stopped at the deadline continues next time)."""

    def budget(arm: str, rows: list[dict], left: float) -> tuple[float, float | None]:
        need = unit_estimate([r["seconds"] for r in rows], first)
        return need, None if need > left and left < piece else min(need, left)

    def done_note(row: dict) -> str:
        return f"pass@1 {row['pass1']:.3f} in {row['seconds']:.0f} s"

    return run_missing_units(units, units_path, run_unit, deadline, budget, clock, log, record, done_note=done_note)


def unit_runner(out: Path, repo: Path, deadline: float) -> Callable[[str, int, float], dict | None]:
    """Each unit is this script's --unit in a process group of its own (SIGTERM GRACE s before the deadline, killed
    at it), its output in out/unit-<arm>-seed<seed>.log."""

    def run(arm: str, seed: int, need: float) -> dict | None:
        result = out / f"unit-{arm}-seed{seed}.json"
        result.unlink(missing_ok=True)  # only the committed file counts as done
        state = code_state(repo)
        cmd = [sys.executable, "-u", __file__, "--out", str(out), "--unit", arm, "--seed", str(seed)]
        logfile = out / f"unit-{arm}-seed{seed}.log"
        print(f"[unit] seed {seed} {arm}: started (estimate {need:.0f} s), output in {logfile}", flush=True)
        started = time.time()
        status = run_until(cmd, deadline, GRACE, logfile)
        if status is None:  # stopped: its seconds count when a later piece finishes it (tc.unit adds them)
            append_row(tc.pieces_file(out, arm, seed), {"seconds": round(time.time() - started, 1)})
            return None
        if status:
            raise SystemExit(f"unit {arm} seed {seed} failed (exit {status}); see {logfile}")
        return dict(json.loads(result.read_text())) | state

    return run


def unit(out: Path, arm: str, seed: int) -> dict[str, Any]:
    s = tc.Settings()
    row = tc.unit(s, out, arm, seed, traces=trace_rows(s))
    return row | {"trace_seed": TRACE_SEED, "step": "round5-step0"}


# ---- analysis


def gate(rows: list[dict]) -> dict[str, Any]:
    """Per seed g = friendly − raw; its mean, the paired t interval over seeds, the question-level interval, the
    spreads, and the gate's verdict once all SEEDS have both arms."""
    table: dict[int, dict[str, dict]] = {}
    for r in rows:
        table.setdefault(r["seed"], {})[r["arm"]] = r
    pairs = {s: t for s, t in sorted(table.items()) if all(a in t for a in ARMS)}
    out: dict[str, Any] = {"table": {s: {a: t[a]["pass1"] for a in t} for s, t in sorted(table.items())}}
    g = [t["friendly"]["pass1"] - t["raw"]["pass1"] for t in pairs.values()]
    out["g"] = g
    if g:
        out["mean_g"] = statistics.fmean(g)
    if len(g) >= 2:
        out["g_t95"] = list(protocol.one_sample_interval(g))
        out["sd_g"] = statistics.stdev(g)
        for a in ARMS:
            out[f"sd_{a}"] = statistics.stdev(t[a]["pass1"] for t in pairs.values())
    if pairs:  # per held-out question, the arms' grade difference averaged over the seeds
        n_q = len(next(iter(pairs.values()))["raw"]["correct"])
        q_diff = [
            statistics.fmean(t["friendly"]["correct"][i] - t["raw"]["correct"][i] for t in pairs.values())
            for i in range(n_q)
        ]
        out["g_questions95"] = list(protocol.one_sample_interval(q_diff))
    complete = all(s in pairs for s in SEEDS)
    if complete:
        out["verdict"] = "PASS" if statistics.fmean(g[: len(SEEDS)]) >= GATE else "FAIL"
    else:
        out["verdict"] = f"not in ({sum(len(t) for t in table.values())} of {len(plan())} units)"
    return out


def analyse(path: Path) -> dict[str, Any]:
    res = gate(read_rows(path))
    print("| seed | raw | friendly | g = friendly − raw |")
    print("|---|---|---|---|")
    for seed, t in res["table"].items():
        cells = [f"{t[a]:.3f}" if a in t else "—" for a in ARMS]
        g = f"{t['friendly'] - t['raw']:+.3f}" if all(a in t for a in ARMS) else "—"
        print(f"| {seed} | {' | '.join(cells)} | {g} |")
    if "mean_g" in res:
        print(f"mean g over {len(res['g'])} seeds: {res['mean_g']:+.3f} (gate: ≥ {GATE})")
    if "g_t95" in res:
        m, lo, hi = res["g_t95"]
        print(
            f"paired 95 % t interval over seeds: [{lo:+.3f}, {hi:+.3f}]; sd over seeds: g {res['sd_g']:.3f}, "
            + ", ".join(f"{a} {res[f'sd_{a}']:.3f}" for a in ARMS)
        )
    if "g_questions95" in res:
        m, lo, hi = res["g_questions95"]
        print(f"question-level 95 % interval (seeds fixed): {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    print(f"gate (pre-registered): {res['verdict']}")
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default="results/headroom-students", help="the units' run folders and logs")
    p.add_argument("--units", type=Path, default=UNITS_FILE, help="the finished units (committed)")
    p.add_argument("--deadline", help="HH:MM UTC: no unit runs past it")
    p.add_argument("--minutes", type=float, help="or: no unit runs past this many minutes from now")
    p.add_argument("--commit", action="store_true", help="commit the units file after each unit")
    p.add_argument("--nice", type=int, default=19)
    p.add_argument("--analyse", action="store_true")
    p.add_argument("--unit", choices=ARMS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.analyse:
        analyse(args.units)
        return
    if args.unit:
        if argv is None:  # the unit's own process: its runs report to no tracker
            from rlt.stages.tracking import hide_tracking_libraries

            hide_tracking_libraries()
        row = unit(out, args.unit, args.seed)
        (out / f"unit-{args.unit}-seed{args.seed}.json").write_text(json.dumps(row))
        return
    end = deadline_ts(args.deadline, args.minutes, dt.datetime.now(dt.UTC))
    lower_priority(args.nice)
    stop_on_sigterm()
    out.mkdir(parents=True, exist_ok=True)

    def record(path: Path, row: dict) -> None:
        if args.commit:
            commit_rows(path, f"round 5 step 0: unit {row['arm']} seed {row['seed']} (pass@1 {row['pass1']:.3f})")

    repo = Path(__file__).resolve().parent.parent
    run_missing(plan(), args.units, unit_runner(out, repo, end), end, record)
    analyse(args.units)


if __name__ == "__main__":
    main()
