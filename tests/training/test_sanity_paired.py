"""benchmarks/sanity_paired.py (issue 46): the pre-registered decision rule on synthetic pairs, its simulated error
rates, and the runner's deadline guard, append-as-each-pair-ends and resume, without training a model (the unit is
a stand-in that advances a fake clock)."""

import contextlib
import fcntl
import json
import os
import runpy
from pathlib import Path

import numpy as np
import pytest
from suite_helpers import ROOT


@pytest.fixture(scope="module")
def sp():
    return runpy.run_path(str(ROOT / "benchmarks" / "sanity_paired.py"), run_name="not_main")


def wobble(center, n, amp):
    return list(center + amp * np.tile([1.0, -1.0], n // 2 + 1)[:n])


def test_rule_pass_fail_inconclusive(sp):
    decide = sp["decide"]
    # a clear effect: both 99 % lower bounds above 0 at 12 pairs -> PASS at the interim look
    res = decide(wobble(1.6, 12, 0.9), wobble(1.1, 12, 0.9))
    assert res["verdict"].startswith("PASS at the interim") and min(res["interim_lower_99"]) > 0
    # 12 pairs without the interim PASS: the experiment is not in yet
    assert decide(wobble(0.5, 12, 0.9), wobble(0.5, 12, 0.9))["verdict"] == "not in (12 of 24 pairs)"
    # 24 pairs, small sure effect: 95 % lower bounds > 0 but not 99 % at 12 -> PASS at the final look
    d = wobble(0.5, 24, 0.8)
    res = decide(d, d)
    assert res["verdict"] == "PASS" and min(res["interim_lower_99"]) < 0 < res["d"][1]
    # nothing there: d's upper 95 % bound below the margin 0.8 -> FAIL
    res = decide(wobble(0.0, 24, 0.9), wobble(0.3, 24, 0.9))
    assert res["verdict"] == "FAIL" and res["d"][2] < sp["MARGIN"]
    # too noisy to tell: d's interval straddles both 0 and the margin -> inconclusive
    res = decide(wobble(0.3, 24, 2.5), wobble(0.3, 24, 2.5))
    assert res["verdict"] == "inconclusive" and res["d"][1] < 0 and res["d"][2] > sp["MARGIN"]
    # real beats shuffled but not the start: not PASS
    assert decide(wobble(1.0, 24, 0.5), wobble(0.0, 24, 0.5))["verdict"] != "PASS"
    # the interim PASS stands even when later pairs would have undone it (the experiment stopped at 12)
    late = np.asarray(wobble(1.6, 12, 0.9) + wobble(-3.0, 12, 0.9))
    code, used = sp["decide_arrays"](late, late)
    assert int(code) == 0 and int(used) == 12
    with pytest.raises(ValueError, match="24 pairs"):
        sp["decide_arrays"](np.zeros(12), np.zeros(12))


def test_simulated_error_rates(sp):
    sim = sp["simulate"]
    null = sim(0.0, 0.0, 0.0, reps=4000)
    assert null["PASS"] < 0.03 and null["FAIL"] > 0.75  # no effect: PASS rare, FAIL usual
    observed = sim(1.12, -0.48, 0.0, reps=4000)
    assert observed["PASS"] > 0.95 and observed["FAIL"] < 0.01 and observed["interim_stop"] > 0.5
    margin = sim(0.56, -0.24, 0.0, reps=4000)
    assert margin["FAIL"] < 0.05  # FAIL at an effect of the margin's size: ~2.5 %, one-sided


class FakeUnits:
    """A stand-in for a trained-and-measured unit: takes `seconds` of a fake clock and returns an objective."""

    def __init__(self, seconds=300.0, stop_at=None):
        self.now, self.seconds, self.calls, self.stop_at = 0.0, seconds, [], stop_at

    def clock(self):
        return self.now

    def __call__(self, arm, seed, need):
        self.calls.append((arm, seed))
        if self.stop_at == (arm, seed):
            self.now += 10 * self.seconds
            return None
        self.now += self.seconds
        return {"objective": -5.0 if arm == "real" else -6.0, "seconds": self.seconds}


def test_deadline_guard_append_and_resume(sp, tmp_path):
    run, path, logs = sp["run_pairs"], tmp_path / "pairs.jsonl", []
    units = FakeUnits(seconds=300)
    # the first estimate (900 s a unit) says a pair needs 1800 s: with 1000 s nothing starts
    assert run([4, 5], path, units, -6.5, 1000, 900, units.clock, logs.append) == []
    assert units.calls == [] and not path.exists() and "not started" in logs[-1]
    # 2000 s: the first pair (600 s) runs; then the estimate is 300 s a unit and two more pairs fit (1800 s used),
    # a fourth would need 600 s with 200 left
    rows = run([4, 5, 6, 7, 8], path, units, -6.5, 2000, 900, units.clock, logs.append)
    assert [r["seed"] for r in rows] == [4, 5, 6] and units.now <= 2000
    assert "seed 7 real not started" in logs[-1]
    on_disk = [json.loads(x) for x in path.read_text().splitlines()]
    assert on_disk == rows and rows[0]["d"] == pytest.approx(1.0) and rows[0]["real_vs_start"] == pytest.approx(1.5)
    # resumed: the done seeds are skipped, the next runs
    units.calls.clear()
    rows = run([4, 5, 6, 7], path, units, -6.5, units.now + 700, 900, units.clock, logs.append)
    assert [r["seed"] for r in rows] == [7] and units.calls == [("real", 7), ("shuffled", 7)]
    assert len(path.read_text().splitlines()) == 4


def test_unit_stopped_at_deadline_appends_nothing(sp, tmp_path):
    path = tmp_path / "pairs.jsonl"
    units = FakeUnits(seconds=100, stop_at=("shuffled", 4))
    rows = sp["run_pairs"]([4, 5], path, units, -6.5, 5000, 100, units.clock, lambda _: None)
    assert rows == [] and not path.exists() and units.calls == [("real", 4), ("shuffled", 4)]


def test_interim_pass_stops_the_runner(sp, tmp_path):
    path = tmp_path / "pairs.jsonl"
    for i, (d, r) in enumerate(zip(wobble(1.6, 12, 0.9), wobble(1.1, 12, 0.9), strict=True)):
        row = {"seed": 4 + i, "d": d, "real_vs_start": r, "real_seconds": 1.0, "shuffled_seconds": 1.0}
        path.write_text(path.read_text() + json.dumps(row) + "\n" if path.exists() else json.dumps(row) + "\n")
    units, logs = FakeUnits(), []
    assert sp["run_pairs"](sp["SEEDS"], path, units, -6.5, 1e9, 1, units.clock, logs.append) == []
    assert units.calls == [] and "PASS at the interim" in logs[-1]


def test_bad_rows_and_deadlines_are_named(sp, tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"seed": 4}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        sp["read_rows"](bad)
    import datetime as dt

    now = dt.datetime(2026, 11, 27, 22, 0, tzinfo=dt.UTC)
    assert sp["deadline_ts"]("23:18", None, now) - now.timestamp() == 78 * 60
    assert sp["deadline_ts"](None, 5, now) - now.timestamp() == 300
    assert sp["deadline_ts"]("00:35", None, now) - now.timestamp() == (2 * 60 + 35) * 60  # past midnight: tomorrow's
    assert sp["deadline_ts"]("09:59", None, now) - now.timestamp() == (11 * 60 + 59) * 60
    morning = dt.datetime(2026, 11, 27, 7, 0, tzinfo=dt.UTC)
    assert sp["deadline_ts"]("20:00", None, morning) - morning.timestamp() == 13 * 3600  # later today: today's
    for hhmm, minutes, msg in (("21:00", None, "already past"), ("2318", None, "HH:MM"), (None, 0, "positive")):
        with pytest.raises(SystemExit, match=msg):
            sp["deadline_ts"](hhmm, minutes, now)


def test_unit_runner_reuses_a_measured_unit_and_lock_waits_no_longer_than_the_deadline(sp, tmp_path):
    row = {"arm": "real", "seed": 4, "seconds": 123.0, "summary": {"objective_reward": -5.5}}
    (tmp_path / "units.jsonl").write_text(json.dumps(row) + "\n")
    lock = tmp_path / "heavy.lock"
    with lock.open("w") as held:  # someone else's heavy run holds the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        run = sp["unit_runner"](tmp_path, str(lock), deadline=0.0)
        got = run("real", 4, 10.0)  # measured before: not rerun
        assert got == {"objective": -5.5, "seconds": 123.0, "summary": row["summary"]}
        assert run("shuffled", 4, 10.0) is None  # lock busy past the deadline: nothing started


def test_unit_runner_rechecks_the_deadline_once_it_holds_the_lock(sp, tmp_path):
    """Waiting for the lock may eat the time the guard counted on: with the lock free but less time left than the
    unit's estimate, nothing starts (sanity.py would fail here on the empty folder if it were started)."""
    import time

    run = sp["unit_runner"](tmp_path, str(tmp_path / "heavy.lock"), deadline=time.time() + 30)
    assert run("real", 5, 600.0) is None
    assert not (tmp_path / "sanity-real-seed5").exists()


def test_analyse_prints_the_table_and_draws_the_plot(sp, tmp_path, capsys):
    path, plot = tmp_path / "pairs.jsonl", tmp_path / "sanity-paired.png"
    for i, (d, r) in enumerate(zip(wobble(1.6, 12, 0.9), wobble(1.1, 12, 0.9), strict=True)):
        row = {"seed": 4 + i, "real": -5.0, "shuffled": -5.0 - d, "start": -5.0 - r, "d": d, "real_vs_start": r}
        sp["append_row"](path, row | {"real_seconds": 300.0, "shuffled_seconds": 200.0})
    res = sp["analyse"](path, plot)
    out = capsys.readouterr().out
    assert res["verdict"].startswith("PASS at the interim") and "| 15 |" in out and f"plot: {plot}" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_the_null_where_real_equals_start_and_the_control_drifts(sp):
    """Issue 52: with real = start and the control drifting down, d passes on the drift alone and only r guards
    PASS; a start measured once and taken as exact lets its shared error through (about a third of the time at the
    paired run's real-arm sd 0.25), the start measured with 4 sampling seeds and its error in r's interval does not."""
    sim = sp["simulate"]
    registered = sim(0.0, sp["DRIFT"], 0.0, reps=4000, sd_real=0.25)
    corrected = sim(0.0, sp["DRIFT"], 0.0, reps=4000, sd_real=0.25, start_seeds=sp["START_SEEDS"])
    assert registered["PASS"] > 0.25 and corrected["PASS"] < 0.06
    # with no start error the widened interval is the plain one (up to the t approximation)
    r = np.asarray(wobble(1.0, 12, 0.3))
    plain, widened = sp["bounds"](r, 0.95), sp["bounds_with_start"](r, 0.0, 3.0, 0.95)
    assert widened[1] == pytest.approx(plain[1], abs=0.01) and widened[0] == pytest.approx(plain[0])
    # a start error of the pairs' own size widens it
    assert sp["bounds_with_start"](r, 0.3, 3.0, 0.95)[1] < plain[1] - 0.2


def test_a_pair_commits_its_units_secondary_measures(sp, tmp_path):
    path = tmp_path / "pairs.jsonl"

    def unit(arm, seed, need):
        summary = {"objective_reward": -5.0 if arm == "real" else -6.0, "heldout_reward": -6.5}
        return {"objective": summary["objective_reward"], "seconds": 1.0, "summary": summary}

    rows = sp["run_pairs"]([4], path, unit, -6.5, 1e12, 1.0, lambda: 0.0, lambda _: None)
    on_disk = json.loads(path.read_text())
    assert on_disk == rows[0] and on_disk["real_summary"]["heldout_reward"] == -6.5
    assert on_disk["shuffled_summary"]["objective_reward"] == -6.0


def test_analyse_puts_the_starts_error_into_real_minus_start(sp, tmp_path, capsys):
    path, seeds = tmp_path / "pairs.jsonl", tmp_path / "start-seeds.json"
    for i, real in enumerate(wobble(-5.0, 12, 0.2)):  # a start measured once at -6.5; its 4-seed mean is -6.0
        row = {"seed": 4 + i, "real": real, "shuffled": -6.0, "start": -6.5, "d": real + 6.0}
        sp["append_row"](path, row | {"real_vs_start": real + 6.5, "real_seconds": 1.0, "shuffled_seconds": 1.0})
    seeds.write_text(json.dumps({"objectives": [-6.2, -5.8, -6.0, -6.0], "mean": -6.0, "se": 0.08}))
    res = sp["analyse"](path, None, seeds)
    out = capsys.readouterr().out
    assert "4 sampling seeds: s.e. 0.080, 3 df" in out
    m, lo, hi = res["real_vs_start_with_start_error"]
    assert m == pytest.approx(1.0) and lo < 1.0 - 0.15 and hi > 1.0 + 0.15  # the mean start, its error in the width


def test_a_unit_runs_this_checkouts_code_whatever_the_environment_puts_first(tmp_path, monkeypatch):
    """unit_runner.run_until starts a unit with this checkout's training/ first on PYTHONPATH: a unit's row names
    the commit it ran on, and a worktree sharing another checkout's .venv (whose editable install points there)
    must not import that checkout's code. Here an `rlt` package earlier on PYTHONPATH stands for it."""
    import sys
    import time

    ur = runpy.run_path(str(ROOT / "benchmarks" / "unit_runner.py"), run_name="not_main")
    other = tmp_path / "other"
    (other / "rlt").mkdir(parents=True)
    (other / "rlt" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(other))
    log = tmp_path / "unit.log"
    cmd = [sys.executable, "-c", "import rlt; print(rlt.__file__)"]
    assert ur["run_until"](cmd, time.time() + 120, 0.0, log) == 0
    assert log.read_text().strip() == str(ROOT / "training" / "rlt" / "__init__.py")


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="the kernel has no scheduler autogroups")
def test_a_low_priority_runner_and_its_units_give_way_to_other_sessions(tmp_path):
    """Nice orders processes only inside their autogroup (one per session), so a runner at --nice 19 in a session
    of its own, and each unit it starts in a new session, must set their groups' niceness too, or they take a full
    share beside a CI run. Real processes: a runner leading its own session (as `setsid nohup` starts it) lowers its
    priority and runs a unit that reports its group; a runner inside another's session leaves that group alone."""
    import subprocess
    import sys

    # The group's niceness, the last word of /proc/PID/autogroup; the kernel's default group (processes whose
    # sessions descend from init's, as a CI job's may) shows nothing there and cannot be reniced: "default".
    group_nice = "(open('/proc/self/autogroup').read().split() or ['default'])[-1]"
    unit = f"import os; print(os.nice(0), {group_nice})"
    runner = (
        f"import sys, time; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import unit_runner as ur; "
        f"ur.lower_priority(7); print({group_nice}, flush=True); "
        f"sys.exit(ur.run_until([sys.executable, '-c', {unit!r}], time.time() + 120))"
    )

    def run(own_session: bool) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", runner], start_new_session=own_session, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split("\n")

    own_group, unit_line, _ = run(own_session=True)
    assert own_group == "7"  # the runner's own group gives way
    assert unit_line == "7 7"  # the unit: its nice inherited, and its new group given the runner's niceness

    def this_group_nice() -> str:
        return (Path("/proc/self/autogroup").read_text().split() or ["default"])[-1]

    before = this_group_nice()
    shared_group, unit_line, _ = run(own_session=False)
    assert shared_group == before == this_group_nice()  # this session's group (or the default one): untouched
    assert unit_line == "7 7"


def test_a_runner_stopped_gives_its_unit_the_grace_to_save(tmp_path):
    """The runner itself gets SIGTERM (a session ending): its unit gets SIGTERM and up to the grace period to save
    its last step (as at the deadline) before the SIGKILL, so the piece keeps what it trained. Real processes: the
    runner (unit_runner.run_until under stop_on_sigterm) and a unit that saves on SIGTERM."""
    import signal
    import subprocess
    import sys
    import time

    saved = tmp_path / "saved"
    unit = (
        "import signal, sys, time, pathlib\n"
        "def stop(*_):\n"
        f"    time.sleep(0.5); pathlib.Path({str(saved)!r}).write_text('step saved'); sys.exit(75)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('unit running', flush=True)\n"
        "time.sleep(600)\n"
    )
    runner = (
        f"import sys, time; sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "from unit_runner import run_until, stop_on_sigterm\n"
        "stop_on_sigterm()\n"
        f"run_until([sys.executable, '-c', {unit!r}], time.time() + 600, 30.0, __import__('pathlib').Path({str(tmp_path / 'unit.log')!r}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "unit running" not in ((tmp_path / "unit.log").read_text() if (tmp_path / "unit.log").exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, "the unit never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert saved.exists(), "the unit was killed without its grace: its piece's training is lost"
