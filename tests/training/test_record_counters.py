"""The stage record's counters with loggingSteps > 1 (rlt.stages.record): a step that is not logged still counts."""

from __future__ import annotations

import json

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
