"""`rlt compare` on a tiny configuration: the report's structure, and every number in it read from a run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from suite_helpers import tiny_doc

from rlt.run.compare import ARMS, run_compare
from rlt.spec.loading import parse_run

pytestmark = pytest.mark.slow


def tiny_compare_doc():
    doc = tiny_doc()
    doc["metadata"]["name"] = "tiny-compare"
    doc["spec"]["dataset"]["source"] = "builtin:mixed"
    st = doc["spec"]["stages"]
    st["sft"]["maxSteps"] = 1
    st["rl"]["steps"] = 1
    st["student"] = {
        "enabled": True,
        "maxSteps": 2,
        "batchSize": 2,
        "perDeviceBatchSize": 2,
        "learningRate": 1.0e-3,
        "maxLength": 400,
        "gradientCheckpointing": False,
    }
    st["evaluate"] = {"enabled": True, "samples": 2, "maxNewTokens": 16, "limit": 6, "batchSize": 6}
    return doc


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    run = parse_run(tiny_compare_doc())
    report = run_compare(run, out, device="cpu", show_progress=False)
    return run, out / run.name / "compare", report


def read(path):
    return json.loads(Path(path).read_text())


def jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_report_files_and_structure(compared):
    run, root, report = compared
    assert {p.name for p in root.iterdir()} >= {
        "report.json",
        "report.md",
        "accuracy.png",
        "correlation.png",
        "rl_teacher",
        "sft_teacher",
        "dataset_traces",
        "untrained",
    }
    assert read(root / "report.json") == json.loads(json.dumps(report))
    assert set(report["arms"]) == set(ARMS)
    assert report["correlation"].keys() == {"accuracyGain", "logprobGain"}
    for measure in report["correlation"].values():
        assert measure.keys() == {"pooled", "rl_teacher", "sft_teacher"}
        assert measure["pooled"]["n"] == 2 * report["taughtQuestions"]
    md = (root / "report.md").read_text()
    for arm in ("untrained", *ARMS):
        assert f"| {arm} |" in md


def test_same_questions_and_budget_for_every_arm(compared):
    run, root, report = compared
    rows = {arm: jsonl(root / arm / "distill" / "dataset.jsonl") for arm in ARMS}
    questions = {arm: [(r["source_row"], r["question"]) for r in rs] for arm, rs in rows.items()}
    assert questions["rl_teacher"] == questions["sft_teacher"] == questions["dataset_traces"]
    assert [q for q, _ in questions["rl_teacher"]] == report["taughtRows"]
    assert len(report["taughtRows"]) == run.spec.stages.distill.limit
    # the SFT-only teacher is the very model RL started from
    assert (root / "sft_teacher" / "sft").resolve() == (root / "rl_teacher" / "sft").resolve()
    for arm in ARMS:
        trained = [r for r in jsonl(root / arm / "metrics.jsonl") if r["stage"] == "student"]
        assert [r["step"] for r in trained] == [1, 2]  # the same student budget
        assert report["arms"][arm]["studentRows"] == read(root / arm / "student" / "rows.json")["counts"]


def test_every_number_comes_from_a_run(compared):
    run, root, report = compared
    base = read(root / "untrained" / "eval" / "report.json")
    assert report["untrained"]["accuracy"] == base["accuracy"] and base["model"] == "untrained"
    assert report["evalQuestions"] == base["questions"] == 6
    for arm, a in report["arms"].items():
        ev = read(root / arm / "eval" / "report.json")
        taught = read(root / arm / "eval-taught" / "report.json")
        assert a["accuracy"] == ev["accuracy"] and a["stderr"] == ev["stderr"]
        assert a["gainOverUntrained"] == pytest.approx(ev["accuracy"] - base["accuracy"])
        assert a["taughtAccuracy"] == taught["accuracy"]
        per_q = jsonl(root / arm / "eval" / "per_question.jsonl")
        assert ev["accuracy"] == pytest.approx(sum(q["accuracy"] for q in per_q) / len(per_q))
        rewards = [r["reward"] for r in jsonl(root / arm / "distill" / "dataset.jsonl")]
        if arm == "dataset_traces":
            assert a["meanReward"] is None and set(rewards) == {None}
        else:
            assert a["meanReward"] == pytest.approx(sum(rewards) / len(rewards))
    base_taught = {q["row"]: q["accuracy"] for q in jsonl(root / "untrained" / "eval-taught" / "per_question.jsonl")}
    for p in report["points"]:
        distilled = {r["source_row"]: r for r in jsonl(root / p["arm"] / "distill" / "dataset.jsonl")}
        taught = {q["row"]: q["accuracy"] for q in jsonl(root / p["arm"] / "eval-taught" / "per_question.jsonl")}
        assert p["reward"] == distilled[p["sourceRow"]]["reward"]
        assert p["accuracyGain"] == pytest.approx(taught[p["sourceRow"]] - base_taught[p["sourceRow"]])
    import numpy as np

    xs, ys = [p["reward"] for p in report["points"]], [p["logprobGain"] for p in report["points"]]
    assert report["correlation"]["logprobGain"]["pooled"]["pearson"] == pytest.approx(np.corrcoef(xs, ys)[0, 1])


def rlt_compare(path, out, *flags):
    """`rlt compare FILE --output-dir OUT` as a user runs it, in a process of its own."""
    cmd = [sys.executable, "-m", "rlt.cli", "compare", str(path), "--output-dir", str(out), "--no-progress", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_cli_rerun_reuses_every_finished_part(compared, tmp_path):
    """`rlt compare` as a user runs it; a second call skips the finished stages and evaluations."""
    run, root, report = compared
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_compare_doc()))
    out = root.parent.parent
    proc = rlt_compare(path, out, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("done before, skipped") == 7  # sft, rl, 2 distills, 3 students
    assert "| rl_teacher |" in proc.stdout
    again = read(root / "report.json")
    assert again["arms"] == json.loads(json.dumps(report["arms"]))


def test_cli_refuses_stages_trained_on_another_split(compared, tmp_path):
    """Adding evalFraction after a compare changes which rows are taught: like `rlt run`, compare refuses to reuse
    the finished stages (exit 78, the field named) instead of reporting on students taught held-out questions."""
    run, root, report = compared
    doc = tiny_compare_doc()
    doc["spec"]["dataset"]["evalFraction"] = 0.25
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    before = read(root / "report.json")
    proc = rlt_compare(path, root.parent.parent)
    assert proc.returncode == 78, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "dataset.evalFraction 0.0 -> 0.25" in proc.stderr and "a new --output-dir folder" in proc.stderr, proc.stderr
    assert "starting" not in proc.stdout and "done before, skipped" not in proc.stdout
    assert read(root / "report.json") == before
