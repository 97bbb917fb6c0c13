"""The plain progress lines of a training stage (rlt.stages.record): after the first step an estimate, then a line at
a quarter, half and three quarters of the steps with the time left at the piece's own pace. A pod's log has no
progress bar; without these lines it shows nothing between the first step and the stage's end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from suite_helpers import TINY
from transformers import TrainerControl, TrainerState

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.stages import record
from rlt.stages.context import StageContext


@pytest.fixture
def clock(monkeypatch):
    """The record module's clock, moved by hand: each step takes `per_step` seconds."""
    now = SimpleNamespace(t=1000.0, per_step=10.0)
    fake = SimpleNamespace(perf_counter=lambda: now.t, monotonic=lambda: now.t, time=lambda: now.t)
    monkeypatch.setattr(record, "time", fake)
    return now


def run_steps(tmp_path, clock, capsys, total, first=0, log_every=1):
    """Steps first+1..total of a stage through the real callback; the [rl] lines it printed."""
    run = load_valid_run(TINY)
    ctx = StageContext(run, RunLayout(tmp_path), TrainerMetrics(run.name, registry=CollectorRegistry()))
    callback = record.make_callback(record.Recorder(ctx, "rl", total), show_progress=False)
    state, control = TrainerState(max_steps=total, global_step=first), TrainerControl()
    capsys.readouterr()
    callback.on_train_begin(None, state, control)
    for step in range(first + 1, total + 1):
        state.global_step = step
        callback.on_step_begin(None, state, control)
        clock.t += clock.per_step
        callback.on_step_end(None, state, control)
        if step % log_every == 0:
            callback.on_log(None, state, control, logs={"loss": 0.5})
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rl] step")]


def test_a_line_at_each_quarter_with_the_time_left(tmp_path, clock, capsys):
    assert run_steps(tmp_path, clock, capsys, total=60) == [
        "[rl] step 1/60 took 10 s: about 10 min for the 59 steps left",
        "[rl] step 15/60 (25 %) after 2 min: about 8 min left",  # 150 s in, 45 steps at 10 s
        "[rl] step 30/60 (50 %) after 5 min: about 5 min left",
        "[rl] step 45/60 (75 %) after 8 min: about 2 min left",  # 450 s and 150 s
    ]


def test_a_resumed_piece_reports_its_own_pace_and_only_the_quarters_ahead(tmp_path, clock, capsys):
    clock.per_step = 30.0
    assert run_steps(tmp_path, clock, capsys, total=60, first=32) == [
        "[rl] step 33/60 took 30 s: about 14 min for the 27 steps left",
        "[rl] step 45/60 (75 %) after 6 min: about 8 min left",  # 13 steps of 30 s this piece: 390 s; 15 left
    ]


def test_logging_every_few_steps_says_a_passed_quarter_once_at_the_next_log(tmp_path, clock, capsys):
    """loggingSteps 4 of 12: the first log (step 4) is the estimate, step 3's quarter is not said after it;
    step 8 says the half; step 9's quarter falls at the last log, where the stage's own line says it is done."""
    assert run_steps(tmp_path, clock, capsys, total=12, log_every=4) == [
        "[rl] step 4/12 took 10 s: about 80 s for the 8 steps left",
        "[rl] step 8/12 (66 %) after 80 s: about 40 s left",
    ]


def test_quarter_steps():
    assert record.quarter_steps(60) == [15, 30, 45]
    assert record.quarter_steps(6) == [2, 3, 5]
    assert record.quarter_steps(2) == [1]
    assert record.quarter_steps(1) == []
