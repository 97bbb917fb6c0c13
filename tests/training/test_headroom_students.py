"""benchmarks/headroom_students.py (issue 52, round five's step 0): the trace questions lie outside the teaching
comparison's rows, the gate's reading, and that nothing lives only on a machine: each finished unit's row is
committed before the next unit starts, and a new clone resumes from the committed rows alone."""

import json
import runpy
import subprocess

import pytest
from suite_helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "headroom_students.py"


@pytest.fixture(scope="module")
def hs():
    return runpy.run_path(str(SCRIPT), run_name="not_main")


def test_trace_questions_are_outside_the_comparisons_rows(hs):
    tc = hs["tc"]
    s = tc.Settings()
    rows = hs["trace_rows"](s)
    assert len(rows) == s.train_rows
    taken = {r["question"] for r in (*tc.training_rows(s), *tc.loss_rows(s), *tc.heldout_rows(s))}
    assert not taken & {r["question"] for r in rows}
    assert {r["question"] for r in rows} != {r["question"] for r in tc.training_rows(s)}


def rows_for(g_by_seed, n=20, raw_k=10):
    """Rows of both arms per seed: raw answers raw_k of n questions, friendly raw_k + round(g n)."""
    out = []
    for seed, g in g_by_seed.items():
        for arm, k in (("raw", raw_k), ("friendly", raw_k + round(g * n))):
            correct = [1] * k + [0] * (n - k)
            out.append({"arm": arm, "seed": seed, "pass1": k / n, "correct": correct, "seconds": 1.0})
    return out


def test_the_gate_reads_the_mean_over_the_three_seeds(hs):
    passed = hs["gate"](rows_for({1: 0.2, 2: 0.15, 3: 0.15}))
    assert passed["verdict"] == "PASS" and passed["mean_g"] == pytest.approx(0.5 / 3)
    assert passed["g_t95"][1] < passed["mean_g"] < passed["g_t95"][2]
    failed = hs["gate"](rows_for({1: 0.2, 2: 0.1, 3: 0.1}))
    assert failed["verdict"] == "FAIL" and failed["mean_g"] == pytest.approx(0.4 / 3)
    # the question-level interval: grades averaged over seeds per question, a t interval over the questions
    m, lo, hi = failed["g_questions95"]
    assert m == pytest.approx(failed["mean_g"]) and lo < m < hi
    # a unit missing: no verdict
    partial = hs["gate"](rows_for({1: 0.5, 2: 0.5, 3: 0.5})[:-1])
    assert partial["verdict"] == "not in (5 of 6 units)"


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def committed_rows(repo, name="units.jsonl"):
    return [json.loads(x) for x in git(repo, "show", f"HEAD:{name}").splitlines() if x.strip()]


class Machine:
    """A stand-in unit (no model: its row is made up), which checks, as it starts, that every unit finished before
    it is already committed in the clone it runs in."""

    def __init__(self, repo, stop_at=None):
        self.repo, self.stop_at, self.calls = repo, stop_at, []

    def __call__(self, arm, seed, need):
        before = self.calls_done()
        assert len(committed_rows(self.repo)) == before, "a finished unit's row was not committed before the next"
        self.calls.append((arm, seed))
        if (arm, seed) == self.stop_at:
            return None
        return {"arm": arm, "seed": seed, "pass1": 0.5, "correct": [1, 0], "seconds": 10.0}

    def calls_done(self):
        return len([x for x in (self.repo / "units.jsonl").read_text().splitlines() if x.strip()])


def test_a_new_clone_resumes_from_the_committed_rows_only(hs, tmp_path, monkeypatch):
    for k in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{k}_NAME", "t")
        monkeypatch.setenv(f"GIT_{k}_EMAIL", "t@example.com")
    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    first = {"arm": "raw", "seed": 1, "pass1": 0.4, "correct": [1, 0], "seconds": 10.0}
    (origin / "units.jsonl").write_text(json.dumps(first) + "\n")
    (origin / "notes.md").write_text("x\n")
    git(origin, "add", ".")
    git(origin, "commit", "-q", "-m", "the first unit")

    def commit(path, row):
        hs["commit_rows"](path, f"unit {row['arm']} seed {row['seed']}")

    def run(repo, machine):
        return hs["run_missing"](hs["plan"](), repo / "units.jsonl", machine, 1e12, commit, 10.0, lambda: 0.0, print)

    # machine A: picks up after the committed unit; stopped at seed 2's raw unit (a deadline)
    a = tmp_path / "a"
    git(tmp_path, "clone", "-q", str(origin), str(a))
    (a / "notes.md").write_text("edited, staged, not the runner's to commit\n")
    git(a, "add", "notes.md")
    machine_a = Machine(a, stop_at=("raw", 2))
    assert [(r["arm"], r["seed"]) for r in run(a, machine_a)] == [("friendly", 1)]
    assert machine_a.calls == [("friendly", 1), ("raw", 2)]
    assert [(r["arm"], r["seed"]) for r in committed_rows(a)] == [("raw", 1), ("friendly", 1)]
    assert git(a, "diff", "--cached", "--name-only").split() == ["notes.md"]  # left staged, not committed
    # a row only on machine A (appended, never committed) is lost with the machine: it must not count anywhere
    with (a / "units.jsonl").open("a") as f:
        f.write(json.dumps({"arm": "raw", "seed": 2, "pass1": 0.9, "correct": [1, 1], "seconds": 1.0}) + "\n")

    # machine B: a new clone of what A committed; it runs exactly the missing units, committing each
    b = tmp_path / "b"
    git(tmp_path, "clone", "-q", str(a), str(b))
    machine_b = Machine(b)
    run(b, machine_b)
    assert machine_b.calls == [("raw", 2), ("friendly", 2), ("raw", 3), ("friendly", 3)]
    assert [(r["arm"], r["seed"]) for r in committed_rows(b)] == hs["plan"]()
    assert len(git(b, "log", "--oneline").splitlines()) == 1 + 1 + 4  # one commit per unit
    assert git(b, "status", "--porcelain") == ""
    # and a further run there has nothing left to do
    again = Machine(b)
    assert run(b, again) == [] and again.calls == []


def test_a_unit_starts_as_a_piece_and_a_stopped_one_appends_nothing(hs, tmp_path):
    """Units longer than a session: one starts with `piece` seconds left even when a whole unit would not fit, none
    starts with less, and a unit stopped at the deadline writes no row (it continues, or restarts, next time)."""
    path, calls, logs = tmp_path / "units.jsonl", [], []

    def unit(arm, seed, need):  # every unit is stopped at the deadline: returns None
        calls.append((arm, seed, need))

    run = hs["run_missing"]
    assert run(hs["plan"](), path, unit, 1500.0, first=5000.0, clock=lambda: 0.0, log=logs.append, piece=1200.0) == []
    assert calls == [("raw", 1, 1500.0)] and not path.exists() and "not finished" in logs[-1]
    assert run(hs["plan"](), path, unit, 1000.0, first=5000.0, clock=lambda: 0.0, log=logs.append, piece=1200.0) == []
    assert len(calls) == 1 and "seed 1 raw not started: needs ~5000 s, 1000 s left" in logs[-1]


@pytest.mark.slow
def test_the_raw_arm_distils_the_questions_it_is_given(hs, tmp_path):
    """teaching_comparison.unit with `traces` (step 0's questions) on the tiny model: the student's distillation data
    are those rows' traces, not the comparison's training rows; a teacher arm refuses other traces."""
    tc = hs["tc"]
    s = tc.QUICK
    traces = hs["trace_rows"](s)
    row = tc.unit(s, tmp_path, "raw", 1, traces=traces)
    written = [
        json.loads(x) for x in (tmp_path / "teach-raw-seed1" / "distill" / "dataset.jsonl").read_text().split("\n") if x
    ]
    assert [w["question"] for w in written] == [r["question"] for r in traces]
    assert [w["reasoning_trace"] for w in written] == [r["reasoning_trace"] for r in traces]
    assert {w["question"] for w in written} != {r["question"] for r in tc.training_rows(s)}
    assert len(row["correct"]) == s.heldout and row["pass1"] == sum(row["correct"]) / s.heldout
    with pytest.raises(ValueError, match="teacher arm"):
        tc.unit(s, tmp_path, "rl", 1, traces=traces)
