"""A real distill → student → evaluate run on the tiny model (TRL SFTTrainer, in-process generation, no mocks)."""

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from suite_helpers import tiny_doc

from rlt.contract.layout import RunLayout
from rlt.contract.metrics import TrainerMetrics
from rlt.run.plots import read_metrics
from rlt.spec.loading import parse_run
from rlt.stages.context import StageContext
from rlt.stages.evaluate import run_evaluate

pytestmark = pytest.mark.slow


def tiny_run(**stages):
    doc = tiny_doc()
    doc["metadata"]["name"] = "tiny-student"
    doc["spec"]["dataset"].update(source="builtin:mixed", evalFraction=0.25)
    doc["spec"]["stages"].update(sft={"enabled": False}, rl={"enabled": False})
    doc["spec"]["stages"]["distill"].update(limit=6)
    doc["spec"]["stages"].update(stages)
    return parse_run(doc)


STUDENT = {
    "enabled": True,
    "maxSteps": 3,
    "batchSize": 2,
    "perDeviceBatchSize": 2,
    "learningRate": 1.0e-3,
    "maxLength": 190,
    "overLong": "best_fit",
    "gradientCheckpointing": False,
}
EVALUATE = {"enabled": True, "samples": 2, "maxNewTokens": 16, "limit": 5, "batchSize": 4}


@pytest.fixture(scope="module")
def finished(run_to_end):
    done = run_to_end(tiny_run(student=STUDENT, evaluate=EVALUATE))
    return done.run, done.layout, done.summary


def test_student_is_trained_on_the_distillation_rows(finished):
    run, layout, summary = finished
    assert list(summary["stages"]) == ["distill", "student", "evaluate"]
    assert (layout.model_dir("student") / "model.safetensors").exists()
    assert (layout.model_dir("student") / "tokenizer.json").exists()
    rows = json.loads(layout.student_dataset_report.read_text())
    assert rows["policy"] == "best_fit" and len(rows["rows"]) == 6
    assert sum(rows["counts"].values()) == 6
    for r in rows["rows"]:  # every action is explained by the row's length
        assert (r["action"] == "kept") == (r["tokens"] <= 190) or r["action"] == "replaced"
    student = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "student"]
    assert [r["step"] for r in student] == [1, 2, 3] and all(r["loss"] > 0 for r in student)


def test_distill_rows_keep_every_candidate_best_first(finished):
    run, layout, _ = finished
    for line in layout.distill_dataset.read_text().splitlines():
        row = json.loads(line)
        rewards = [c["reward"] for c in row["candidates"]]
        assert rewards == sorted(rewards, reverse=True) == sorted(row["candidate_rewards"], reverse=True)
        assert row["candidates"][0]["reasoning_trace"] == row["reasoning_trace"]


def test_evaluation_report_files_agree(finished):
    run, layout, _ = finished
    ev = layout.eval_dir
    assert ev == layout.root / "eval"
    assert {p.name for p in ev.iterdir()} >= {"report.json", "report.md", "per_question.jsonl", "accuracy.png", "DONE"}
    report = json.loads((ev / "report.json").read_text())
    per_q = [json.loads(line) for line in (ev / "per_question.jsonl").read_text().splitlines()]
    assert report["model"] == "student" and report["modelPath"] == str(layout.model_dir("student"))
    assert report["questions"] == len(per_q) == 5 and report["samples"] == 2 and report["answers"] == 10
    assert report["answerType"] == "builtin"
    for q in per_q:
        assert len(q["answers"]) == 2
        assert q["accuracy"] == sum(a["correct"] for a in q["answers"]) / 2
    assert report["accuracy"] == pytest.approx(sum(q["accuracy"] for q in per_q) / 5)
    assert report["correct"] == sum(a["correct"] for q in per_q for a in q["answers"])
    assert f"| student | 5 | 2 | {report['accuracy']:.3f} |" in (ev / "report.md").read_text()
    evals = [r for r in read_metrics(layout.metrics_file) if r["stage"] == "evaluate"]
    assert evals[-1]["step"] == 5 and evals[-1]["accuracy"] == pytest.approx(report["accuracy"])


def test_held_out_questions_are_not_taught(finished):
    run, layout, _ = finished
    taught = {json.loads(line)["question"] for line in layout.distill_dataset.read_text().splitlines()}
    asked = {json.loads(line)["question"] for line in (layout.eval_dir / "per_question.jsonl").read_text().splitlines()}
    assert asked and not taught & asked


def test_evaluate_exports_accuracy_for_the_untrained_student(tmp_path, monkeypatch):
    from rlt.stages import evaluate as evaluation

    graded, real_grade = [], evaluation.grade
    monkeypatch.setattr(
        evaluation, "grade", lambda row, output, *rest: graded.append(output) or real_grade(row, output, *rest)
    )
    run = tiny_run(distill={"enabled": False}, evaluate={**EVALUATE, "temperature": 0, "samples": 1, "limit": 3})
    registry = CollectorRegistry()
    ctx = StageContext(
        run,
        RunLayout.for_run(tmp_path, run.name),
        TrainerMetrics(run.name, registry=registry),
        "cpu",
        show_progress=False,
    )
    run_evaluate(ctx)
    report = json.loads((ctx.layout.eval_dir / "report.json").read_text())
    assert report["model"] == "baseline" and report["questions"] == 3 and report["answers"] == 3
    assert len(graded) == 3  # each answer graded once (for the live accuracy and the report alike)
    text = generate_latest(registry).decode()
    labels = 'method="rlt",model="baseline",namespace="local",run="tiny-student",stage="evaluate"'
    assert f"rlt_eval_accuracy{{{labels}}} {float(report['accuracy'])}" in text
    assert f"rlt_eval_questions_total{{{labels}}} 3.0" in text
    assert f"rlt_eval_answers_total{{{labels}}} 3.0" in text


def test_evaluate_without_held_out_rows_names_the_fields(tmp_path):
    from rlt.data.dataset import DataError

    run = tiny_run(distill={"enabled": False}, evaluate=EVALUATE)
    # a file of one's own (a built-in task has fresh problems to hold out), with no held-out split
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i} + 1?", "solution": str(i + 1)}) + "\n" for i in range(8)))
    run.spec.dataset.source = str(rows)
    run.spec.dataset.eval_fraction = 0.0
    ctx = StageContext(run, RunLayout.for_run(tmp_path, run.name), None, "cpu", show_progress=False)
    with pytest.raises(DataError, match="stages.evaluate.dataset.*evalFraction"):
        run_evaluate(ctx)
