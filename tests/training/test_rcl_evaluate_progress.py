"""The rcl evaluate stage moves its step while it evaluates (rlt.stages.rcl.evaluate_teaching): one pass over a whole
paper-scale held-out set outlasts RLTRunStalled's wait, so the problems go through in slices of batchSize."""

from __future__ import annotations

import json

import yaml
from prometheus_client import CollectorRegistry
from suite_helpers import ROOT

from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.spec.run import RLTRun
from rlt.stages import record
from rlt.stages.context import StageContext
from rlt.stages.rcl import run_rcl_evaluate


def test_the_evaluate_stage_step_counts_problems_as_each_slice_finishes(tmp_path, monkeypatch):
    doc = yaml.safe_load((ROOT / "manifests" / "examples" / "rltrun-rcl-tiny.yaml").read_text())
    doc["spec"]["stages"]["evaluate"].update({"limit": 5, "batchSize": 2})
    run = RLTRun.model_validate(doc)
    registry = CollectorRegistry()
    layout = RunLayout(tmp_path)
    steps: list[tuple[int, int]] = []
    step_ended = record.Recorder.step_ended

    def seen(self, step, values):
        step_ended(self, step, values)
        steps.append((registry.get_sample_value("rlt_step", labels), self.total))

    monkeypatch.setattr(record.Recorder, "step_ended", seen)
    labels = {"namespace": "local", "run": run.name, "method": "rcl", "stage": "evaluate"}
    run_rcl_evaluate(StageContext(run, layout, TrainerMetrics(run.name, method="rcl", registry=registry), "cpu"))
    assert steps == [(2.0, 5), (4.0, 5), (5.0, 5)]
    assert json.loads(layout.progress_file.read_text())["step"] == 5
    rows = [json.loads(line) for line in layout.metrics_file.read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in rows] == [("evaluate", 5)]
    assert json.loads((layout.eval_dir / "initial" / "metrics.json").read_text())["problems"] == 5
