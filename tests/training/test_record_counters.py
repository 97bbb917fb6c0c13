"""The stage record's counters with loggingSteps > 1 (rlt.stages.record): a step that is not logged still counts."""

from __future__ import annotations

import json
import math

from prometheus_client import CollectorRegistry
from suite_helpers import TINY
from transformers import TrainerControl, TrainerState

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.stages.context import StageContext
from rlt.stages.record import Recorder, make_callback


def test_tokens_of_steps_between_two_logs_are_counted_once(tmp_path):
    run = load_valid_run(TINY)
    registry = CollectorRegistry()
    recorder = Recorder(StageContext(run, RunLayout(tmp_path), TrainerMetrics(run.name, registry=registry)), "rl", 6)
    step_tokens = iter([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    callback = make_callback(
        recorder, lambda seconds: {"generated_tokens": next(step_tokens), "scored_tokens": 1.0}, show_progress=False
    )
    state, control = TrainerState(max_steps=6), TrainerControl()
    for step in range(1, 7):  # loggingSteps 2: transformers logs after steps 2, 4 and 6
        state.global_step = step
        callback.on_step_begin(None, state, control)
        callback.on_step_end(None, state, control)
        if step % 2 == 0:
            callback.on_log(None, state, control, logs={"loss": 0.5})

    def total(name: str) -> float | None:
        return registry.get_sample_value(name, {"namespace": "local", "run": run.name, "method": "rlt", "stage": "rl"})

    assert total("rlt_generated_tokens_total") == 210.0, "every step's tokens, not only the logged steps'"
    assert total("rlt_scored_tokens_total") == 6.0
    rows = [json.loads(line) for line in recorder.ctx.layout.metrics_file.read_text().splitlines()]
    assert [(r["step"], r["generated_tokens"]) for r in rows] == [(2, 30.0), (4, 70.0), (6, 110.0)]


LABELS = {"namespace": "local", "stage": "rl", "method": "rlt"}


def _six_steps_logging_every_third(tmp_path, step_values, progress_every_s, sample):
    """A Trainer's callbacks for six steps with loggingSteps 3: sample(registry, labels, progress) after each."""
    run = load_valid_run(TINY)
    registry = CollectorRegistry()
    recorder = Recorder(StageContext(run, RunLayout(tmp_path), TrainerMetrics(run.name, registry=registry)), "rl", 6)
    callback = make_callback(recorder, lambda seconds: dict(step_values), show_progress=False)
    recorder.progress_every_s = progress_every_s
    labels = LABELS | {"run": run.name}
    state, control = TrainerState(max_steps=6), TrainerControl()
    seen = []
    for step in range(1, 7):
        state.global_step = step
        callback.on_step_begin(None, state, control)
        callback.on_step_end(None, state, control)
        if step % 3 == 0:
            callback.on_log(None, state, control, logs={"loss": 0.5})
        seen.append(sample(registry, labels, json.loads(recorder.ctx.layout.progress_file.read_text())))
    return seen, registry, labels, recorder


def test_the_step_and_the_step_time_move_with_every_step_between_two_logs(tmp_path):
    """loggingSteps 3: status.progress.step (read from rlt_step), RLTRunStalled's mean step time and the Step rate
    panel (rlt_step_seconds) must see every step, or a run with slow steps alerts as stalled between two logs and
    its step rate reads a third. metrics.jsonl still has a row per log only."""

    def sample(registry, labels, progress):
        return (
            registry.get_sample_value("rlt_step", labels),
            progress["step"],
            registry.get_sample_value("rlt_step_seconds_count", labels),
            registry.get_sample_value("rlt_step_phase_seconds_count", labels | {"phase": "generate"}),
        )

    # progress_every_s 0: progress.json too, every step (at most every 5 s in a run: its fsync)
    seen, registry, labels, recorder = _six_steps_logging_every_third(tmp_path, {"seconds_generate": 0.25}, 0.0, sample)
    assert seen == [(float(s), s, float(s), float(s)) for s in range(1, 7)]
    assert registry.get_sample_value("rlt_step_phase_seconds_sum", labels | {"phase": "generate"}) == 1.5
    rows = [json.loads(line) for line in recorder.ctx.layout.metrics_file.read_text().splitlines()]
    assert [(r["step"], r["seconds_generate"]) for r in rows] == [(3, 0.25), (6, 0.25)]


def test_progress_json_between_logs_waits_its_interval_and_logs_always_write(tmp_path):
    """progress.json is an fsync on the step's path (~6 ms on a busy disk): between two logs it is written at most
    every progress_every_s, from the first step on; a log writes it always, and the step gauge moves every step."""

    def sample(registry, labels, progress):
        return registry.get_sample_value("rlt_step", labels), progress["step"]

    # progress_every_s inf: no clock in the test, only the first step and the logs write
    seen, *_ = _six_steps_logging_every_third(tmp_path, {}, math.inf, sample)
    assert seen == [(1.0, 1), (2.0, 1), (3.0, 3), (4.0, 3), (5.0, 3), (6.0, 6)]
