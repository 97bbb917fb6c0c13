"""benchmarks/teaching_comparison.py (issues 46, 52) and its modules: the data splits, each arm's RLTRun, the fixed
design's units (a teacher seed's order, the paired student seeds, a student never before its teacher), its rule
(two contrasts at 97.5 %, margin 0.10, 15 teacher seeds, the arm value the mean of its students), the runner's
deadline guard and resume (a stand-in unit on a fake clock), the convergence callback on a real tiny model, and
every arm run end to end on the tiny model (--quick)."""

import gzip
import hashlib
import json
import math
import runpy
import subprocess
import sys

import pytest
from suite_helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "teaching_comparison.py"


@pytest.fixture(scope="module")
def tc():
    return runpy.run_path(str(SCRIPT), run_name="not_main")


@pytest.fixture(scope="module")
def ca():
    return runpy.run_path(str(ROOT / "benchmarks" / "comparison_analysis.py"), run_name="not_main")


@pytest.fixture(scope="module")
def cc():
    return runpy.run_path(str(ROOT / "benchmarks" / "comparison_convergence.py"), run_name="not_main")


def test_splits_are_disjoint_and_sized(tc):
    s = tc["Settings"]()
    train, held, loss = tc["training_rows"](s), tc["heldout_rows"](s), tc["loss_rows"](s)
    assert (len(train), len(held), len(loss)) == (256, 200, 32)
    q = lambda rows: {r["question"] for r in rows}  # noqa: E731
    assert not q(train) & q(held) and not q(train) & q(loss) and not q(held) & q(loss)
    # held out: the first unseen rows of generator seed 99, in its order
    from rlt.data import tasks

    seed99 = [r["question"] for r in tasks.generate("sums-detour", 800, 99) if r["question"] not in q(train)]
    assert [r["question"] for r in held] == seed99[:200]
    # the friendly rewrite answers the same question with the same solution, in the `sums` worked shape
    friendly = tc["friendly_rows"](train[:5])
    assert [r["solution"] for r in friendly] == [r["solution"] for r in train[:5]]
    assert all(f["reasoning_trace"].startswith("Add the tens") for f in friendly)
    assert all(f["reasoning_trace"] != r["reasoning_trace"] for f, r in zip(friendly, train[:5], strict=True))


def same_parts(run):
    """What a student unit's run reads: the student stage, the evaluation, the dataset, the models."""
    stages = run.spec.stages
    return stages.student, stages.evaluate, run.spec.dataset, run.spec.student, run.spec.teacher


def test_each_arm_is_a_valid_run_and_the_arms_differ_only_in_the_teacher(tc, tmp_path):
    from rlt.checks.validation import run_problems
    from rlt.data.jsonl import write_jsonl
    from rlt.spec.loading import parse_run

    s = tc["Settings"]()
    held = tmp_path / "heldout.jsonl"
    write_jsonl(held, tc["heldout_rows"](s))
    runs = {a: parse_run(tc["run_spec"](s, a, 7, str(held))) for a in tc["ARMS"]}
    for arm, run in runs.items():
        assert run_problems(run) == [], arm
    sft = {a: r.spec.stages.sft for a, r in runs.items()}
    assert sft["rl"].max_steps == s.warmup_steps and runs["rl"].spec.stages.rl.steps == s.rl_steps
    assert sft["sft-continued"].max_steps == s.warmup_steps + s.rl_steps  # compute-matched
    assert sft["sft-convergence"].max_steps is None and sft["sft-convergence"].epochs == s.max_epochs
    assert [a for a, r in runs.items() if r.spec.stages.rl.enabled] == ["rl"]
    assert [a for a, r in runs.items() if r.spec.stages.distill.enabled] == list(tc["TEACHER_ARMS"])
    # what the student and its evaluation see is the same in every arm: only the explanations differ
    same = {a: (r.spec.seed, r.spec.stages.student, r.spec.stages.evaluate, r.spec.dataset) for a, r in runs.items()}
    assert all(v == same["rl"] for v in same.values())
    # a teacher unit's run: the teacher stages and distill only; a student unit's: student and evaluate only, the
    # same in every arm
    for arm in tc["TEACHER_ARMS"]:
        teacher = parse_run(tc["run_spec"](s, arm, 7, str(held), part="teacher"))
        assert run_problems(teacher) == [], arm
        enabled = teacher.spec.stages.enabled()
        assert "distill" in enabled and "student" not in enabled and "evaluate" not in enabled, enabled
        assert teacher.spec.stages.sft == sft[arm] and teacher.spec.stages.rl == runs[arm].spec.stages.rl
    students = {a: parse_run(tc["run_spec"](s, a, 701, str(held), part="student", name="x")) for a in tc["ARMS"]}
    for arm, run in students.items():
        assert run_problems(run) == [] and list(run.spec.stages.enabled()) == ["student", "evaluate"], arm
        assert (run.spec.seed, run.spec.stages.student) == (701, runs[arm].spec.stages.student)
    seen = {json.dumps([r.spec.seed, *(v.model_dump(mode="json") for v in same_parts(r))]) for r in students.values()}
    assert len(seen) == 1
    with pytest.raises(ValueError, match="arm 'sft'"):
        tc["run_spec"](s, "sft", 1, "x")
    with pytest.raises(ValueError, match="part 'both'"):
        tc["run_spec"](s, "rl", 1, "x", part="both")


def test_a_teacher_seeds_units_in_order_with_paired_student_seeds(tc, tmp_path, monkeypatch):
    """The order within a teacher seed (the teachers, then rl's, sft-continued's and raw's students, then the
    secondary arms), and the student seeds 100·s + j that each student unit's run really gets: the same four in
    every arm of teacher seed s."""
    plan, name = tc["run_units"].__globals__["plan"], tc["unit_name"]
    students = [name(a, j) for a in ("rl", "sft-continued", "raw") for j in (1, 2, 3, 4)]
    assert plan([3]) == [(u, 3) for u in ["rl.teacher", "sft-continued.teacher", *students]]
    secondary = ["sft-convergence.teacher", "sft-convergence.student1", "friendly.student1"]
    assert plan([3, 4], secondary=True) == [
        (u, seed) for seed in (3, 4) for u in ["rl.teacher", "sft-continued.teacher", *students, *secondary]
    ]
    assert plan([1], students=2)[2:] == [
        (u, 1)
        for u in [
            "rl.student1",
            "rl.student2",
            "sft-continued.student1",
            "sft-continued.student2",
            "raw.student1",
            "raw.student2",
        ]
    ]
    for unit, _ in plan([3], secondary=True):
        assert name(*tc["parse_unit"](unit)) == unit
    with pytest.raises(ValueError, match="unit 'raw.teacher'"):
        tc["parse_unit"]("raw.teacher")  # raw has no teacher
    with pytest.raises(ValueError, match="unit 'rl.student0'"):
        tc["parse_unit"]("rl.student0")
    # the seed each student unit's run is given, whatever its arm
    seen = {}

    def fake_run(s, out, spec, put_data, pieces):
        seen[spec["metadata"]["name"]] = spec["spec"]["seed"]
        return {}

    monkeypatch.setitem(tc["student_unit"].__globals__, "distil_and_evaluate", fake_run)
    s = tc["QUICK"]
    teachers = {arm: archived(tc, s, tmp_path, arm, 3, f"{arm}\n".encode()) for arm in ("rl", "sft-continued")}
    for arm in ("rl", "sft-continued", "raw"):
        for j in (1, 2, 3, 4):
            row = tc["student_unit"](s, tmp_path, arm, 3, j, teachers.get(arm))
            assert (row["kind"], row["unit"], row["seed"], row["student"], row["student_seed"]) == (
                "student",
                f"{arm}.student{j}",
                3,
                j,
                300 + j,
            )
    for j in (1, 2, 3, 4):
        assert {seen[f"teach-{a}-seed3-student{j}"] for a in ("rl", "sft-continued", "raw")} == {300 + j}
    assert len(seen) == 12


def archived(tc, s, out, arm, seed, data: bytes) -> dict:
    """A teacher unit's row fields and its dataset's archive, as teacher_unit leaves them."""
    archive = tc["records_dir"](s, out) / f"{arm}-seed{seed}.jsonl.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(gzip.compress(data))
    return {"dataset": archive.name, "dataset_sha256": hashlib.sha256(data).hexdigest()}


def test_a_student_on_a_new_clone_reads_its_teachers_committed_dataset_only(tc, tmp_path, monkeypatch):
    """The protocol's teacher datasets live beside the committed rows (RECORDS), not in the run folders: a student
    unit whose --out is empty (a new clone, another machine) distils exactly the teacher's explanations."""
    got = {}

    def fake_run(s, out, spec, put_data, pieces):
        path = out / "distill.jsonl"
        put_data(path)
        got["data"] = path.read_bytes()
        return {}

    monkeypatch.setitem(tc["student_unit"].__globals__, "distil_and_evaluate", fake_run)
    monkeypatch.setitem(tc["records_dir"].__globals__, "RECORDS", tmp_path / "repo" / "records")
    s, fresh = tc["Settings"](), tmp_path / "new-clone-out"
    explanations = b'{"question": "What is 1 + 2?", "reasoning_trace": "1 + 2 = 3."}\n'
    teacher = archived(tc, s, tmp_path / "elsewhere", "rl", 5, explanations)
    assert tc["records_dir"](s, fresh) == tmp_path / "repo" / "records"  # whatever the --out
    tc["student_unit"](s, fresh, "rl", 5, 2, teacher)
    assert got["data"] == explanations
    assert not (fresh / "teach-rl-seed5").exists()  # nothing read from a teacher run folder


def test_a_student_unit_refuses_to_run_before_its_teacher(tc, tmp_path, monkeypatch):
    s = tc["QUICK"]
    with pytest.raises(ValueError, match="its teacher unit rl.teacher of teacher seed 2 has no row yet"):
        tc["student_unit"](s, tmp_path, "rl", 2, 1, None)
    units = tmp_path / "units.jsonl"
    with pytest.raises(ValueError, match=r"teacher unit sft-continued.teacher of teacher seed 2 \(quick\) has no row"):
        tc["teacher_row"](units, "sft-continued", 2, "quick")
    # the runner refuses it before a process starts
    calls = []
    monkeypatch.setitem(tc["unit_runner"].__globals__, "run_until", lambda cmd, *a: calls.append(cmd) or 0)
    import time

    run = tc["unit_runner"](tmp_path, True, None, time.time() + 600, units)
    with pytest.raises(ValueError, match="teacher unit rl.teacher of teacher seed 2"):
        run("rl.student3", 2, 1.0)
    assert calls == []
    # a row whose dataset is missing, or not the one it recorded, is refused too
    row = {"unit": "rl.teacher", "seed": 2, "settings": "quick", "dataset": "rl-seed2.jsonl.gz"}
    row["dataset_sha256"] = hashlib.sha256(b"x\n").hexdigest()
    units.write_text(json.dumps(row) + "\n")
    assert tc["teacher_row"](units, "rl", 2, "quick") == row
    with pytest.raises(ValueError, match="the dataset of its teacher unit rl.teacher of teacher seed 2, is not in"):
        tc["student_unit"](s, tmp_path, "rl", 2, 1, row)
    archived(tc, s, tmp_path, "rl", 2, b"y\n")
    with pytest.raises(ValueError, match="is not the dataset its teacher unit rl.teacher"):
        tc["student_unit"](s, tmp_path, "rl", 2, 1, row)


def t_quantile(p, df):
    """The Student-t quantile by hand: Simpson's rule on the density, bisection on the distribution function."""

    def pdf(x):
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        return c * (1 + x * x / df) ** (-(df + 1) / 2)

    def cdf(x, n=4000):
        h = x / n
        return 0.5 + h / 3 * (pdf(0) + pdf(x) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n)))

    lo, hi = 0.0, 20.0
    for _ in range(50):
        lo, hi = ((lo + hi) / 2, hi) if cdf((lo + hi) / 2) < p else (lo, (lo + hi) / 2)
    return lo


def test_the_rule_reads_each_contrast_at_97_5_percent_with_margin_0_10(ca):
    decide, interval = ca["decide"], ca["interval"]
    assert (ca["SEEDS_FIXED"], ca["STUDENTS"], ca["MARGIN"], ca["ALPHA"]) == (15, 4, 0.10, 0.025)
    # one interval by hand: t at 1 − 0.025/2 with 14 degrees of freedom (a table gives 2.510; at 95 % it is 2.145)
    d = [0.02 * k for k in range(15)]  # mean 0.14, sd 0.0894
    q = t_quantile(1 - 0.025 / 2, 14)
    assert q == pytest.approx(2.5096, abs=1e-3)
    half = q * (sum((x - 0.14) ** 2 for x in d) / 14) ** 0.5 / 15**0.5
    m, lo, hi = interval(d)
    assert (m, lo, hi) == (
        pytest.approx(0.14),
        pytest.approx(0.14 - half, abs=1e-5),
        pytest.approx(0.14 + half, abs=1e-5),
    )
    # PASS at 97.5 %: its lower end above 0
    assert decide(d)["verdict"] == "PASS"
    # a contrast whose 95 % interval excludes 0 but whose 97.5 % interval does not: inconclusive, not PASS
    sd = 0.1
    a = sd * (15 / 14) ** 0.5  # ±a alternating (7 + 8): sd close to 0.1
    spread = [a if k % 2 else -a for k in range(15)]
    spread = [x - sum(spread) / 15 for x in spread]
    s = (sum(x * x for x in spread) / 14) ** 0.5
    between = (t_quantile(0.975, 14) + t_quantile(0.9875, 14)) / 2 * s / 15**0.5  # mean between the two half-widths
    res = decide([x + between for x in spread])
    assert res["d"][1] < 0 < res["d"][0] - t_quantile(0.975, 14) * s / 15**0.5 and res["verdict"] == "inconclusive"
    # FAIL: the upper end below 0.10 (and below it only: an upper end between 0.05, the old margin, and 0.10 fails)
    fail = [x + 0.05 - between for x in spread]
    res = decide(fail)
    assert 0.05 < res["d"][2] < 0.10 and res["verdict"] == "FAIL"
    assert decide([x + 0.06 for x in spread])["verdict"] == "inconclusive"  # at 95 % its lower end is above 0
    # before all 15 seeds are in, no verdict: the interval is a description
    res = decide(d[:14])
    assert res["verdict"] == "not in (14 of 15 seeds)" and res["d"][1] > 0
    assert (
        ca["rule"](0.01, 0.2) == "PASS"
        and ca["rule"](-0.1, 0.0999) == "FAIL"
        and ca["rule"](-0.1, 0.2) == "inconclusive"
    )


def student_row(arm, seed, j, pass1, settings="protocol"):
    return {
        "kind": "student",
        "unit": f"{arm}.student{j}",
        "arm": arm,
        "seed": seed,
        "student": j,
        "pass1": pass1,
        "seconds": 1.0,
        "settings": settings,
    }


def test_an_arm_is_the_mean_of_its_students_and_a_seed_counts_only_complete(ca, tmp_path, capsys):
    rows = [{"kind": "teacher", "unit": "rl.teacher", "arm": "rl", "seed": 1, "seconds": 5.0, "settings": "protocol"}]
    base = {"rl": 0.6, "sft-continued": 0.5, "raw": 0.3}
    for seed in (1, 2, 3, 16):
        for arm, p in base.items():
            for j in (1, 2, 3, 4):
                if (seed, arm, j) != (2, "raw", 4):  # seed 2: one raw student missing
                    rows.append(student_row(arm, seed, j, p + 0.01 * j + 0.1 * seed))
    rows.append(student_row("friendly", 1, 1, 0.99))
    rows.append(student_row("rl", 1, 1, 0.0, settings="quick"))  # another settings' row: not read
    res = ca["verdicts"](rows)
    assert res["values"][1]["rl"] == pytest.approx(0.6 + 0.025 + 0.1)  # the mean of its 4 students
    assert "friendly" not in res["values"][1]  # one student of 4: no value
    assert "raw" not in res["values"][2] and "rl" in res["values"][2]
    # seed 2 (a raw student missing) and seed 16 (outside 1 … 15) are in neither contrast
    assert [s for s, _ in res["contrasts"]["d_raw"]] == [s for s, _ in res["contrasts"]["d_sft"]] == [1, 3]
    assert [d for _, d in res["contrasts"]["d_raw"]] == [pytest.approx(0.3)] * 2
    assert [d for _, d in res["contrasts"]["d_sft"]] == [pytest.approx(0.1)] * 2
    assert res["decisions"]["d_raw"]["verdict"] == "not in (2 of 15 seeds)"
    assert ca["arm_values"](ca["student_table"](rows), students=1)[1]["friendly"] == 0.99
    with pytest.raises(ValueError, match="teacher seed 1 rl student 2: two rows"):
        ca["student_table"](rows + [student_row("rl", 1, 2, 0.5)])
    plot = tmp_path / "contrasts.png"
    ca["analyse"](rows, plot)
    out = capsys.readouterr().out
    assert (
        "| 2 | 0.825 | 0.725 | (3 of 4) | — |" in out and "d_raw = rl − raw: +0.300" in out and plot.stat().st_size > 0
    )


def test_the_analysis_says_no_seed_and_one_seed_in_words_not_nan(ca, capsys):
    """Before two complete teacher seeds there is no interval: the lines say so (they printed +nan [+nan, +nan])."""
    rows = [student_row(arm, 1, j, 0.5) for arm in ("rl", "sft-continued") for j in (1, 2, 3, 4)]
    ca["analyse"](rows)
    out = capsys.readouterr().out
    assert "d_raw = rl − raw: no teacher seed with all three arms' students yet; verdict" in out, out
    ca["analyse"](rows + [student_row("raw", 1, j, 0.25) for j in (1, 2, 3, 4)])
    out = capsys.readouterr().out
    assert "d_raw = rl − raw: +0.250 (one teacher seed: no interval); verdict" in out and "nan" not in out, out


class FakeUnits:
    """A stand-in for a unit: each kind (a teacher arm's teacher, a student) takes its own seconds of a fake clock.
    Like the real unit runner it starts nothing when the estimate it is given does not fit before the deadline."""

    def __init__(self, seconds, stop_at=None):
        self.now, self.seconds, self.calls, self.stop_at, self.deadline = 0.0, seconds, [], stop_at, None

    def clock(self):
        return self.now

    def __call__(self, name, seed, need):
        if self.deadline is not None and self.now + need >= self.deadline:
            return None  # unit_runner.run: "time.time() + need > deadline", a moment after run_units looked
        self.calls.append((name, seed))
        took = self.seconds["student" if ".student" in name else name.split(".")[0]]
        if self.stop_at == (name, seed):
            self.now += 10 * took
            return None
        self.now += took
        return {"unit": name, "arm": name.split(".")[0], "seed": seed, "seconds": took}


def test_runner_deadline_guard_per_kind_append_and_resume(tc, tmp_path):
    run, path, logs = tc["run_units"], tmp_path / "units.jsonl", []
    took = {"rl": 100.0, "sft-continued": 50.0, "student": 10.0}
    first = dict.fromkeys(tc["FIRST_ESTIMATE"], 150.0)
    units = FakeUnits(took)
    # 100 s: the first estimate of rl's teacher (150 s) does not fit: nothing starts
    assert run([1], path, units, 100, first, units.clock, logs.append, students=1) == []
    assert units.calls == [] and "seed 1 rl.teacher not started" in logs[-1]
    # 355 s: seed 1's units at their first estimates (150 s each; 180 s used), then seed 2's at their kind's last
    # durations: the teachers (100, 50) and two students (10 each) fit, raw's student (10) not with 5 s left
    rows = run([1, 2], path, units, 355, first, units.clock, logs.append, students=1)
    seed_units = ["rl.teacher", "sft-continued.teacher", "rl.student1", "sft-continued.student1", "raw.student1"]
    assert [(r["unit"], r["seed"]) for r in rows] == [(u, 1) for u in seed_units] + [(u, 2) for u in seed_units[:4]]
    assert "seed 2 raw.student1 not started: needs ~10 s, 5 s left" in logs[-1] and units.now == 350
    assert [json.loads(x)["unit"] for x in path.read_text().splitlines()] == [r["unit"] for r in rows]
    # resumed: the done units are skipped
    units.calls.clear()
    run([1, 2], path, units, units.now + 200, first, units.clock, logs.append, students=1)
    assert units.calls == [("raw.student1", 2)] and len(path.read_text().splitlines()) == 10


def test_progress_counts_units_and_hours_left_and_shows_no_arm_value(tmp_path):
    """`--progress` (the real command on a units file): each teacher seed's units done, the seeds not started as
    spans, the units left and their CPU hours at the median unit of each kind; never a row's pass@1, whose digits
    would unblind whoever reads it."""
    path = tmp_path / "units.jsonl"
    rows = [("rl.teacher", 1, 3600.0), ("sft-continued.teacher", 1, 1800.0)]
    rows += [(f"{arm}.student{j}", 1, 900.0 + 900.0 * (arm == "raw")) for arm in ("rl", "sft-continued", "raw")
             for j in range(1, 5)]  # fmt: skip
    rows += [("rl.teacher", 2, 7200.0), ("sft-continued.teacher", 2, 5400.0), ("rl.student1", 2, 900.0)]
    path.write_text("".join(json.dumps({"unit": u, "seed": s, "seconds": t, "pass1": 0.123456}) + "\n"
                            for u, s, t in rows))  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--progress", "--units", str(path), "--seeds", "1,2,3,4,6"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == [
        "teacher seed 1: complete: 2 of 2 teachers, 12 of 12 students",
        "teacher seed 2: in progress: 2 of 2 teachers, 1 of 12 students",
        "teacher seeds 3-4, 6: not started",
        # medians: rl 1.5 h, sft-continued 1 h, student 0.25 h (9 at 900 s, 4 at 1800 s); left: seed 2's 11
        # students and 3 seeds' 2 teachers and 12 students: 11 × 0.25 + 3 × (1.5 + 1 + 12 × 0.25) = 19.25 h
        "complete seeds: 1 of 5; left: 53 units, about 19 CPU hours at the median unit of each kind so far "
        "(rl 1.50 h, sft-continued 1.00 h, student 0.25 h)",
    ]
    assert "0.12" not in done.stdout + done.stderr


def test_a_unit_stopped_at_the_deadline_appends_nothing(tc, tmp_path):
    path = tmp_path / "units.jsonl"
    units = FakeUnits({"rl": 10.0, "sft-continued": 10.0, "student": 10.0}, stop_at=("rl.teacher", 1))
    first = dict.fromkeys(tc["FIRST_ESTIMATE"], 10.0)
    assert tc["run_units"]([1], path, units, 1000, first, units.clock, lambda _: None) == []
    assert not path.exists() and units.calls == [("rl.teacher", 1)]


def test_the_rl_teacher_and_the_students_start_as_pieces_and_sft_continued_does_not(tc, tmp_path):
    """rl's teacher unit and a student unit may start with PIECE seconds left though their estimate is longer (they
    checkpoint and continue next time); sft-continued's teacher waits for a session with room for its whole
    estimate."""
    piece, first, logs = tc["run_units"].__globals__["PIECE"], dict(tc["FIRST_ESTIMATE"]), []
    took = {"rl": 10.0, "sft-continued": 10.0, "student": 10.0}
    units = FakeUnits(took, stop_at=("rl.teacher", 1))
    units.deadline = piece - 1
    assert tc["run_units"]([1], tmp_path / "u.jsonl", units, piece - 1, first, units.clock, logs.append) == []
    assert units.calls == [] and "seed 1 rl.teacher not started" in logs[-1]
    units.deadline = piece + 1
    assert tc["run_units"]([1], tmp_path / "u.jsonl", units, piece + 1, first, units.clock, logs.append) == []
    assert units.calls == [("rl.teacher", 1)] and "the next run goes on from what it kept" in logs[-1]
    units = FakeUnits(took, stop_at=("rl.student1", 1))
    done = {"unit": "rl.teacher", "arm": "rl", "seed": 1, "seconds": 10.0}
    (tmp_path / "v.jsonl").write_text(json.dumps(done) + "\n")
    first["sft-continued"] = 2 * piece
    assert tc["run_units"]([1], tmp_path / "v.jsonl", units, piece + 1, first, units.clock, logs.append) == []
    assert units.calls == [] and "seed 1 sft-continued.teacher not started" in logs[-1]
    (tmp_path / "v.jsonl").write_text(json.dumps(done) + "\n" + json.dumps(done | {"unit": "sft-continued.teacher"}))
    first["student"] = 2 * piece
    assert tc["run_units"]([1], tmp_path / "v.jsonl", units, piece + 1, first, units.clock, logs.append) == []
    assert units.calls == [("rl.student1", 1)] and "the next run goes on from what it kept" in logs[-1]


def test_a_unit_stopped_at_the_deadline_keeps_its_seconds_for_the_next_piece(tc, tmp_path, capsys):
    import time

    grace = tc["unit_runner"].__globals__["GRACE"]
    run = tc["unit_runner"](tmp_path, True, None, time.time() + grace + 4, tmp_path / "units.jsonl")
    assert run("rl.teacher", 1, 1.0) is None  # the tiny rl unit takes longer than 4 s: SIGTERM, then killed
    pieces = [json.loads(x) for x in tc["pieces_file"](tmp_path, "rl.teacher", 1).read_text().splitlines()]
    assert len(pieces) == 1 and 3.0 <= pieces[0]["seconds"] < grace + 30
    # what the piece kept (on a slow machine nothing, on a fast one sft's first checkpoints) is recorded and said
    from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout

    kept, layout = pieces[0]["kept"], RunLayout.for_run(tmp_path, "teach-rl-seed1")
    for stage, what in (k.split("/") for k in kept):  # distill resumes by row; every other stage from a checkpoint
        if stage == "distill":
            assert what.endswith(" rows"), what
        else:
            assert (layout.checkpoints_dir(stage) / what / CHECKPOINT_COMPLETE).is_file(), what
    kept_note = tc["unit_runner"].__globals__["kept_note"]
    assert f"rl.teacher: the piece kept {kept_note(kept)}" in capsys.readouterr().out
    assert not (tmp_path / "unit-rl.teacher-seed1.json").exists() and (tmp_path / "unit-rl.teacher-seed1.log").exists()


def test_a_stopped_piece_names_the_checkpoints_its_next_piece_goes_on_from(tc, tmp_path):
    """What a piece kept: the newest complete checkpoint of each unfinished stage; a finished stage's, an
    incomplete checkpoint (no marker: not every rank saved it) and another unit's run are not."""
    from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout

    kept = tc["unit_runner"].__globals__["kept_progress"]
    assert kept(tmp_path, "rl.teacher", 4) == []  # the unit never started: no run folder
    layout = RunLayout.for_run(tmp_path, "teach-rl-seed4")
    for stage, step, complete in [("sft", 8, True), ("rl", 5, True), ("rl", 10, True), ("rl", 15, False)]:
        layout.checkpoint_dir(stage, step).mkdir(parents=True)
        if complete:
            (layout.checkpoint_dir(stage, step) / CHECKPOINT_COMPLETE).touch()
    layout.stage_done("sft").touch()
    (layout.root / "distill").mkdir()
    for other_folder in ("plots", "tracking/tensorboard/rl", "cache"):  # the run's own folders, not stages
        (layout.root / other_folder).mkdir(parents=True)
    other = RunLayout.for_run(tmp_path, "teach-rl-seed4-student1")
    other.checkpoint_dir("student", 12).mkdir(parents=True)
    (other.checkpoint_dir("student", 12) / CHECKPOINT_COMPLETE).touch()
    assert kept(tmp_path, "rl.teacher", 4) == ["rl/checkpoint-10"]
    assert kept(tmp_path, "rl.student1", 4) == ["student/checkpoint-12"]
    assert kept(tmp_path, "rl.student2", 4) == []


def test_a_piece_stopped_in_distill_names_the_rows_its_next_piece_keeps(tc, tmp_path):
    """Distill resumes by row, not from a checkpoint: a piece stopped in it kept the rows in the part files of the
    run's spec (a torn last line is no row; the parts of an edited spec are not read by the restart, so not
    counted)."""
    import yaml
    from suite_helpers import tiny_doc

    from rlt.contract.layout import RunLayout
    from rlt.spec.fingerprint import compared_fingerprint
    from rlt.spec.run import RLTRun
    from rlt.stages.distill_parts import append_rows, parts_dir, rank_file

    kept = tc["unit_runner"].__globals__["kept_progress"]
    layout = RunLayout.for_run(tmp_path, "teach-rl-seed6")
    doc = tiny_doc()
    layout.run_file.parent.mkdir(parents=True)
    layout.run_file.write_text(yaml.safe_dump(doc))
    for stage in ("sft", "rl"):
        layout.stage_done(stage).parent.mkdir(parents=True)
        layout.stage_done(stage).touch()
    mine = parts_dir(layout.stage_dir("distill"), compared_fingerprint(RLTRun.model_validate(doc).spec, "distill"))
    append_rows(rank_file(mine, 0), [(0, {"a": 1}), (1, {"a": 2})])
    append_rows(rank_file(mine, 1), [(2, {"a": 3})])
    with rank_file(mine, 1).open("a") as torn:
        torn.write('{"index": 3, "ro')
    append_rows(rank_file(parts_dir(layout.stage_dir("distill"), "an-edited-spec"), 0), [(5, {"a": 6})])
    assert kept(tmp_path, "rl.teacher", 6) == ["distill/3 rows"]
    layout.stage_done("distill").touch()
    assert kept(tmp_path, "rl.teacher", 6) == []  # a finished stage keeps nothing to go on from


def test_a_unit_taken_down_with_its_runner_keeps_its_seconds_too(tc, tmp_path, monkeypatch):
    """The runner stopped before the deadline (SIGTERM at a session's end: run_until takes the unit down and the
    runner exits): the piece's seconds are kept as at a deadline, so the finished unit's row counts every piece."""
    import time

    def taken_down(cmd, *a):
        raise SystemExit(143)

    monkeypatch.setitem(tc["unit_runner"].__globals__, "run_until", taken_down)
    run = tc["unit_runner"](tmp_path, True, None, time.time() + 3600, tmp_path / "units.jsonl")
    with pytest.raises(SystemExit):
        run("rl.teacher", 2, 1.0)
    pieces = tc["pieces_file"](tmp_path, "rl.teacher", 2).read_text().splitlines()
    assert len(pieces) == 1 and json.loads(pieces[0])["seconds"] >= 0


def test_unit_runner_starts_a_piece_and_refuses_another_settings_unit(tc, tmp_path, monkeypatch):
    import time

    calls = []
    monkeypatch.setitem(tc["unit_runner"].__globals__, "run_until", lambda cmd, *a: calls.append(cmd) or None)
    piece = tc["unit_runner"].__globals__["PIECE"]
    run = tc["unit_runner"](tmp_path, False, None, time.time() + piece + 30, tmp_path / "units.jsonl")
    assert run("rl.teacher", 2, piece) is None and len(calls) == 1  # what run_units passes
    assert calls[0][-4:] == ["--unit", "rl.teacher", "--seed", "2"]
    (tmp_path / "unit-raw.student1-seed2.json").write_text(json.dumps({"unit": "raw.student1", "settings": "quick"}))
    with pytest.raises(SystemExit, match="a quick unit, this run is protocol"):
        run("raw.student1", 2, 1.0)


def test_convergence_stop_keeps_the_best_epoch(tc, cc, tiny, formatter, tmp_path):
    """The callback on a real tiny model: the held-out loss each epoch; two epochs without improvement stop
    training; the best epoch's weights are put back at the end."""
    import torch
    from transformers import TrainerControl

    from rlt.stages.sft import sft_rows

    model, tok = tiny
    model = type(model)(model.config)
    model.load_state_dict(tiny[0].state_dict())
    s = tc["QUICK"]
    rows = sft_rows(tc["loss_rows"](s), formatter, tok, "reject", 384)
    record = tmp_path / "convergence.json"
    cb = cc["convergence_callback"](rows, 2, record)
    control = TrainerControl()
    best = cc["heldout_loss"](model, rows)
    cb.on_epoch_end(None, None, control, model=model)
    assert cb.losses == [pytest.approx(best)] and not control.should_training_stop
    for epoch in (2, 3):
        with torch.no_grad():  # an epoch that made things far worse (no near-tie for rounding to decide):
            for p in model.parameters():  # every weight x3 makes the random model's predictions confident and wrong
                p.mul_(3.0)
        cb.on_epoch_end(None, None, control, model=model)
        assert cb.losses[-1] > best + 1.0, cb.losses  # nats: far from any rounding
        assert control.should_training_stop == (epoch == 3)
    assert json.loads(record.read_text()) == {"losses": cb.losses, "best_epoch": 1, "stopped": True}
    cb.on_train_end(None, None, control, model=model)
    assert cc["heldout_loss"](model, rows) == pytest.approx(best)  # the best weights are the final model


@pytest.mark.parametrize(
    "losses, stops_at, best",
    [
        ([3.0, 2.0, 2.5, 2.6, 2.7], 4, 2),  # two epochs without improvement after the best
        ([3.0, 3.1, 3.2, 3.3], 3, 1),  # never better than the first
        ([3.0, 2.0, 2.0, 2.5, 1.0], 4, 2),  # a tie is no improvement: the earlier epoch stays the best
        ([3.0, 2.0, 2.5, 1.9, 2.0, 2.1, 1.0], 6, 4),  # an improvement after one bad epoch starts the count again
        ([3.0, 2.0, 1.5, 1.4, 1.3], None, 5),  # always better: runs to its last epoch, keeps that one
    ],
)
def test_the_stop_rule_on_scripted_losses(cc, tmp_path, losses, stops_at, best):
    """The callback driven by a loss sequence of the test's choosing (no training, no numerics): training stops
    exactly `patience` (2) epochs after the best one, and the weights put back at the end are that epoch's. Each
    epoch's weights are the epoch's number, so the restored model names the epoch it came from."""
    import torch
    from transformers import TrainerControl

    model = torch.nn.Linear(1, 1, bias=False)
    scripted = iter(losses)
    record = tmp_path / "convergence.json"
    cb = cc["convergence_callback"]([], 2, record, evaluate=lambda _model: next(scripted))
    control, epoch = TrainerControl(), 0
    while not control.should_training_stop and epoch < len(losses):  # the Trainer's loop over epochs
        epoch += 1
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        cb.on_epoch_end(None, None, control, model=model)
    assert epoch == (stops_at or len(losses)) and control.should_training_stop == (stops_at is not None)
    saved = {"losses": losses[:epoch], "best_epoch": best, "stopped": stops_at is not None}
    assert json.loads(record.read_text()) == saved
    cb.on_train_end(None, None, control, model=model)
    assert float(model.weight) == best
    assert cc["stop_epoch"](losses[:epoch], 2) == (best, stops_at is not None)


@pytest.mark.slow
def test_every_arm_runs_end_to_end_quick(tc, tmp_path):
    """One teacher seed of every arm on the tiny model (--secondary, QUICK's 2 students per arm), each unit a process:
    the teacher units train and explain, each student unit distils its teacher's dataset (raw and friendly: those
    traces) under student seed 100·s + j, and --analyse reads the rows."""
    out = tmp_path / "tc"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--seeds", "3", "--minutes", "40", "--secondary"]
    done = subprocess.run(cmd + ["--lock", "", "--nice", "0"], capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "units.jsonl").read_text().splitlines()]
    s = tc["QUICK"]
    plan = tc["run_units"].__globals__["plan"]
    assert [(r["unit"], r["seed"]) for r in rows] == plan([3], s.students, secondary=True)
    assert all(r["settings"] == "quick" for r in rows)
    teachers = {r["arm"]: r for r in rows if r["kind"] == "teacher"}
    students = [r for r in rows if r["kind"] == "student"]
    assert set(teachers["rl"]["stage_seconds"]) == {"sft", "rl", "distill"}
    assert all(v > 0 for r in rows for v in r["stage_seconds"].values())  # a stage done in an earlier piece too
    tokens = teachers["rl"]["rl_tokens"]  # the compute the rl arm spent beyond its steps, measured
    assert tokens["steps"] == s.rl_steps and 0 < tokens["generated"] <= s.rl_steps * s.questions * s.generations * s.cap
    assert set(teachers["sft-continued"]["stage_seconds"]) == set(teachers["sft-convergence"]["stage_seconds"])
    assert set(teachers["sft-continued"]["stage_seconds"]) == {"sft", "distill"}

    def dataset(t):
        return gzip.decompress((out / "records" / t["dataset"]).read_bytes())

    for t in teachers.values():
        data = dataset(t)
        assert hashlib.sha256(data).hexdigest() == t["dataset_sha256"] and t["explanations"]["rows"] == s.train_rows
    train = tc["training_rows"](s)
    for r in students:
        assert set(r["stage_seconds"]) == {"student", "evaluate"}, r["unit"]
        assert len(r["correct"]) == s.heldout and r["pass1"] == sum(r["correct"]) / s.heldout
        folder = out / f"teach-{r['arm']}-seed3-student{r['student']}"
        assert f"seed: {300 + r['student']}" in (folder / "run.yaml").read_text()
        data = (folder / "distill" / "dataset.jsonl").read_bytes()
        if r["arm"] in teachers:  # the teacher unit's explanations, as written
            assert data == dataset(teachers[r["arm"]])
        else:
            traces = [json.loads(x)["reasoning_trace"] for x in data.decode().splitlines()]
            want = train if r["arm"] == "raw" else tc["friendly_rows"](train)
            assert traces == [w["reasoning_trace"] for w in want]
    rl = dataset(teachers["rl"]).decode()
    assert [json.loads(x)["reasoning_trace"] for x in rl.splitlines()] != [r["reasoning_trace"] for r in train]
    conv = teachers["sft-convergence"]["convergence"]
    assert 1 <= len(conv["losses"]) <= s.max_epochs and conv["best_epoch"] <= len(conv["losses"])

    # the warm-up is the same optimizer steps in rl and sft-continued (constant schedules, one teacher seed)
    def sft_losses(arm):
        lines = (out / f"teach-{arm}-seed3" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["loss"] for x in lines if json.loads(x).get("stage") == "sft" and "loss" in json.loads(x)]

    assert sft_losses("sft-continued")[: s.warmup_steps] == sft_losses("rl")
    assert len(sft_losses("sft-continued")) == s.warmup_steps + s.rl_steps
    # the runner stays blind (counts only); --analyse prints the arm values and the contrasts
    assert "d_raw" not in done.stdout and f"{len(rows)} rows in" in done.stdout
    shown = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--analyse", "--units", str(out / "units.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert (
        "d_raw = rl − raw" in shown.stdout and "verdict (registered rule, margin 0.1): not in (1 of 15" in shown.stdout
    )


def test_sft_convergence_in_the_real_stage_stops_and_saves_the_best_epoch(tc, tmp_path, monkeypatch):
    """The arm's teacher unit on the tiny model, its held-out evaluation scripted (the outcome must not hang on a training
    trajectory): the real sft stage stops two epochs after the best one, before its 6 epochs, and the model the
    stage saves is the best epoch's weights, not the last epoch's."""
    import dataclasses

    import torch

    from rlt.data.models import load_model
    from rlt.spec.inputs import ModelRef
    from rlt.stages import trainer as stage_trainer

    losses = [3.0, 2.0, 2.5, 2.6, 2.7, 2.8]  # best at epoch 2; a stop rule that fails runs all 6
    scripted, seen = iter(losses), []

    def evaluate(model):
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return next(scripted)

    real = tc["convergence_stop"].__wrapped__.__globals__["convergence_callback"]
    monkeypatch.setitem(
        tc["convergence_stop"].__wrapped__.__globals__,
        "convergence_callback",
        lambda rows, patience, record: real(rows, patience, record, evaluate),
    )
    original = stage_trainer.TrainerRun.trainer
    s = dataclasses.replace(tc["QUICK"], sft_lr=1e-3, max_epochs=len(losses))
    row = tc["teacher_unit"](s, tmp_path, "sft-convergence", 1)
    conv = row["convergence"]
    assert set(row["stage_seconds"]) == {"sft", "distill"}  # a teacher unit: no student, no evaluation
    assert stage_trainer.TrainerRun.trainer is original  # the callback is added within the unit only
    assert conv == {"losses": losses[:4], "best_epoch": 2, "stopped": True} and len(seen) == 4
    saved = load_model(ModelRef(model=str(tmp_path / "teach-sft-convergence-seed1" / "sft" / "model")), "cpu")
    state = saved.state_dict()
    assert any(not torch.equal(seen[1][k], seen[3][k]) for k in state)  # training moved the weights after epoch 2
    for key, value in state.items():
        assert torch.equal(value.to(seen[1][key].dtype), seen[1][key]), f"{key}: not epoch 2's weights"


def test_commit_puts_a_teachers_dataset_beside_its_row(tc, tmp_path, monkeypatch):
    """--commit's record: the units file and the teacher's archive in one commit, nothing else that was edited."""
    for k in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{k}_NAME", "t")
        monkeypatch.setenv(f"GIT_{k}_EMAIL", "t@example.com")

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / "notes.md").write_text("x\n")
    git("add", ".")
    git("commit", "-q", "-m", "start")
    (tmp_path / "notes.md").write_text("edited, not to be committed\n")
    units = tmp_path / "units.jsonl"
    units.write_text('{"unit": "rl.teacher", "seed": 1}\n')
    archive = tmp_path / "records" / "rl-seed1.jsonl.gz"
    archive.parent.mkdir()
    archive.write_bytes(gzip.compress(b"explanations\n"))
    tc["commit_rows"](units, "teaching comparison: unit rl.teacher of teacher seed 1", also=[archive])
    assert git("show", "--name-only", "--format=", "HEAD").split() == ["records/rl-seed1.jsonl.gz", "units.jsonl"]
    assert git("status", "--porcelain").split() == ["M", "notes.md"]


def test_a_second_runner_on_the_same_folder_is_refused(tmp_path):
    """One runner per results folder: a second (one left running from a session before, say) would run the unit the
    first is running and append its row twice. The runner script itself, started while the lock is held, refuses
    naming the holder's pid; once the holder lets go, a runner may start."""
    import os
    import subprocess
    import sys

    one_runner = runpy.run_path(str(ROOT / "benchmarks" / "unit_runner.py"), run_name="not_main")["one_runner"]
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path), "--minutes", "1", "--lock", ""]
    cmd += ["--seeds", "1"]
    with one_runner(tmp_path):
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0 and f"another runner works on {tmp_path} (pid {os.getpid()})" in second.stderr
        with pytest.raises(SystemExit, match="another runner"), one_runner(tmp_path):
            pass
    with one_runner(tmp_path):  # released: the next runner takes it
        pass
