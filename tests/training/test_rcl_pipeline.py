"""A real rcl run of the tiny example (sft -> rl -> evaluate, TRL trainers, no mocks), then `rlt eval` reports."""

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from suite_helpers import ROOT

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.run.plots import read_metrics
from rlt.stages.context import StageContext
from rlt.stages.rcl import run_teaching_eval
from rlt.stages.record import Recorder

TINY = ROOT / "manifests" / "examples" / "rltrun-rcl-tiny.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(run_to_end):
    done = run_to_end(load_valid_run(TINY))
    return done.run, done.out, done.layout, done.summary


def test_stages_and_per_step_rcl_metrics(finished):
    run, _, layout, summary = finished
    assert list(summary["stages"]) == ["sft", "rl", "evaluate"]
    for stage in ("sft", "rl", "evaluate"):
        assert layout.stage_done(stage).exists()
    assert (layout.model_dir("rl") / "model.safetensors").exists()
    rows = read_metrics(layout.metrics_file)
    rl = [r for r in rows if r["stage"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:
        assert {
            "rcl_apg",
            "rcl_ndr",
            "rcl_tes",
            "rcl_acc_with",
            "rcl_acc_without",
            "rcl_teaching_tokens",
            "rcl_format_ok",
            "reward",
            "seconds_generate",
            "seconds_score",
        } <= r.keys()
        assert 0.0 <= r["rcl_ndr"] <= 1.0 and -1.0 <= r["rcl_apg"] <= 1.0
    ev = [r for r in rows if r["stage"] == "evaluate"]
    assert len(ev) == 1 and {"rcl_apg", "rcl_ndr"} <= ev[0].keys()


def test_evaluate_stage_and_rlt_eval_write_the_report(finished):
    run, out, layout, _ = finished
    eval_dir = layout.root / "eval"
    assert (eval_dir / "rl" / "metrics.json").exists()
    run_teaching_eval(run, out, teacher="none", device="cpu")
    report = run_teaching_eval(run, out, teacher="initial", device="cpu")
    assert report == eval_dir / "report.md"
    text = report.read_text()
    for label in ("| rl (", "| none (", "| initial ("):
        assert label in text
    for label in ("rl", "none", "initial"):
        m = json.loads((eval_dir / label / "metrics.json").read_text())
        assert m["problems"] == run.spec.stages.evaluate.limit
        assert {"apg", "ndr", "tes", "acc_with", "acc_without", "teaching_tokens", "seconds"} <= m.keys()
        assert (eval_dir / label / "plot.png").stat().st_size > 0
        problems = [json.loads(line) for line in (eval_dir / label / "problems.jsonl").read_text().splitlines()]
        assert len(problems) == m["problems"] and {"question", "acc_with", "acc_without"} <= problems[0].keys()
    none = json.loads((eval_dir / "none" / "metrics.json").read_text())
    assert none["apg"] == 0.0 and none["ndr"] == 1.0 and none["teaching_tokens"] == 0


def test_recorder_exports_rcl_gauges(finished, tmp_path):
    run = finished[0]
    reg = CollectorRegistry()
    metrics = TrainerMetrics(run.name, method="rcl", registry=reg)
    Recorder(StageContext(run, RunLayout(tmp_path), metrics), "rl", 2).record(
        1, {"rcl_apg": 0.25, "rcl_ndr": 0.99, "rcl_tes": 1.5}
    )
    text = generate_latest(reg).decode()
    assert 'rlt_rcl_apg{method="rcl",namespace="local",run="rcl-tiny",stage="rl"} 0.25' in text
    assert 'rlt_rcl_ndr{method="rcl",namespace="local",run="rcl-tiny",stage="rl"} 0.99' in text
