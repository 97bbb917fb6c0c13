"""Evaluation as records: grading, the evaluation report and the compare report are pure functions of typed
records; writing and reading them back loses nothing. No model is loaded."""

import json
from types import SimpleNamespace

import pytest

from rlt.contract.layout import RunLayout
from rlt.data.answers import between
from rlt.run.compare import ArmResult, build_report, correlations, teaching_points
from rlt.spec.loading import parse_run
from rlt.stages.evaluate import (
    EvalReport,
    EvalSet,
    grade_question,
    read_report,
    read_results,
    write_report,
)
from rlt.stages.evaluate import build_report as build_eval_report

TAGS = ("<answer>", "</answer>")
SETTINGS = SimpleNamespace(samples=2, temperature=0.7, max_new_tokens=16)


def results():
    rows = [
        {"row": 3, "question": "What is 2 + 2?", "solution": "4"},
        {"row": 7, "question": "What is 3 * 3?", "solution": "9"},
        {"row": 9, "question": "What is 10 - 1?", "solution": "9"},
    ]
    outputs = [
        ["<answer>4</answer>", "<answer>5</answer>"],
        ["<answer>9</answer>", "so \\boxed{9}"],
        ["no idea", "<answer>8</answer>"],
    ]
    return [grade_question(r, o, "math", TAGS) for r, o in zip(rows, outputs, strict=True)]


def test_each_answer_is_graded_into_its_own_record():
    first, second, third = results()
    assert first.row == 3 and [(a.extracted, a.correct) for a in first.answers] == [("4", True), ("5", False)]
    assert [a.text for a in first.answers] == ["<answer>4</answer>", "<answer>5</answer>"]
    assert [a.correct for a in second.answers] == [True, True] and second.accuracy == 1.0
    assert [a.correct for a in third.answers] == [False, False] and third.accuracy == 0.0


def test_report_is_built_from_the_graded_questions():
    graded = results()
    report = build_eval_report("student", "/m", EvalSet([], "math", "held out"), SETTINGS, graded, 1.26, 40)
    assert report.accuracy == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert (report.questions, report.correct, report.answers) == (3, 3, 6)
    # standard error over questions: sample std of (0.5, 1, 0) / sqrt(3)
    assert report.stderr == pytest.approx(0.5 / 3**0.5)
    assert report.seconds == 1.3 and report.generated_tokens == 40 and report.samples == 2
    one = build_eval_report("student", "/m", EvalSet([], "math", "x"), SETTINGS, graded[:1], 1.0, 0)
    assert one.stderr is None  # undefined for a single question


def test_written_report_reads_back_as_the_same_records(tmp_path):
    graded = results()
    report = build_eval_report("baseline", "/m", EvalSet([], "math", "held out"), SETTINGS, graded, 2.0, 12)
    write_report(tmp_path, report, graded)
    assert read_report(tmp_path) == report and read_results(tmp_path) == graded
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["modelPath"] == "/m" and doc["answerType"] == "math" and doc["generatedTokens"] == 12
    first = json.loads((tmp_path / "per_question.jsonl").read_text().splitlines()[0])
    assert first == {
        "row": 3,
        "question": "What is 2 + 2?",
        "solution": "4",
        "accuracy": 0.5,
        "answers": [
            {"text": "<answer>4</answer>", "extracted": "4", "correct": True},
            {"text": "<answer>5</answer>", "extracted": "5", "correct": False},
        ],
    }
    assert "| baseline | 3 | 2 | 0.500 |" in (tmp_path / "report.md").read_text()


def _report(label, accuracy, correct, answers):
    return EvalReport(label, "/m", "d", "math", answers // 2, 2, 0.7, 16, accuracy, 0.1, correct, answers, 1.0, 0)


def test_compare_report_from_records(tmp_path):
    run = parse_run(
        {
            "apiVersion": "rlt.dev/v1alpha1",
            "kind": "RLTRun",
            "metadata": {"name": "c"},
            "spec": {"teacher": {"model": "t"}, "student": {"model": "s"}, "dataset": {"source": "builtin:mixed"}},
        }
    )
    rows = [
        {"source_row": 1, "question": "a", "reward": -1.0},
        {"source_row": 2, "question": "b", "reward": 0.0},
        {"source_row": 3, "question": "c", "reward": 2.0},
    ]
    before = {1: 0.0, 2: 0.5, 3: 0.5}
    after = {1: 0.0, 2: 1.0, 3: 1.0}
    points = teaching_points("rl_teacher", rows, after, before, [0.1, 0.2, 0.6])
    assert [(p.source_row, p.accuracy_gain, p.logprob_gain) for p in points] == [
        (1, 0.0, 0.1),
        (2, 0.5, 0.2),
        (3, 0.5, 0.6),
    ]
    points += teaching_points("sft_teacher", rows, before, before, [0.0, 0.0, 0.0])
    corr = correlations(points)
    assert corr["logprobGain"]["rl_teacher"]["pearson"] == pytest.approx(
        0.8 / (42 / 9 * 0.14) ** 0.5
    )  # by hand: Σdxdy / √(Σdx² Σdy²)
    assert corr["accuracyGain"]["sft_teacher"]["pearson"] is None  # constant gains: undefined, said why
    assert corr["accuracyGain"]["pooled"]["n"] == 6

    layout = RunLayout(tmp_path)
    arms = [
        ArmResult(
            arm,
            rows if arm != "dataset_traces" else [{**r, "reward": None} for r in rows],
            {"kept": 3},
            _report(arm, acc, correct, 8),
            _report(arm, 0.75, 6, 8),
            layout.compare_arm(arm),
            layout.compare_arm(arm).model_dir("student"),
        )
        for arm, acc, correct in (("rl_teacher", 0.5, 4), ("sft_teacher", 0.25, 2), ("dataset_traces", 0.125, 1))
    ]
    untrained = (_report("untrained", 0.25, 2, 8), _report("untrained", 0.5, 4, 8), layout.compare_arm("untrained"))
    evalset = EvalSet([{"question": "q"}] * 4, "math", "held out")
    report = build_report(run, rows, evalset, untrained, arms, points, 12.34)
    assert report["wallSeconds"] == 12.3 and report["taughtRows"] == [1, 2, 3] and report["evalQuestions"] == 4
    assert report["untrained"]["accuracy"] == 0.25 and report["untrained"]["taughtAccuracy"] == 0.5
    rl = report["arms"]["rl_teacher"]
    assert rl["gainOverUntrained"] == pytest.approx(0.25) and rl["meanReward"] == pytest.approx(1 / 3)
    # Wilson over the 4 questions (accuracy 0.5), not over the 8 answers pooled ([0.215, 0.785]): samples of one
    # question are not independent
    assert rl["ci95"] == pytest.approx([0.1500, 0.8500], abs=1e-3)
    assert rl["evalReport"] == str(tmp_path / "compare" / "rl_teacher" / "eval" / "report.json")
    assert rl["taughtReport"] == str(tmp_path / "compare" / "rl_teacher" / "eval-taught" / "report.json")
    assert report["arms"]["dataset_traces"]["meanReward"] is None
    assert report["points"][0] == {
        "arm": "rl_teacher",
        "sourceRow": 1,
        "reward": -1.0,
        "accuracyGain": 0.0,
        "logprobGain": 0.1,
    }
    assert report["correlation"] == corr


@pytest.mark.parametrize(
    "text,kw,want",
    [
        ("a <t>x</t> b <t>y</t>", {}, "x"),
        ("a <t>x</t> b <t>y</t>", {"last": True}, "y"),
        ("a <t>x", {}, None),  # unclosed
        ("a <t>x", {"open_end": True}, "x"),
        ("no tags", {"open_end": True}, None),
        ("<t></t>", {}, ""),  # closed around nothing: empty, not missing
    ],
)
def test_between_tags(text, kw, want):
    assert between(text, "<t>", "</t>", **kw) == want


def test_compare_plot_draws_the_tables_wilson_intervals_and_says_so(tmp_path):
    """accuracy.png of `rlt compare` shows the 95 % Wilson intervals its table gives (not ± s.e.) and labels them;
    a single evaluation without intervals keeps ± s.e., also labelled."""
    import matplotlib.image

    from rlt.run.compare import wilson_interval
    from rlt.stages.evaluate import error_bars, plot_accuracy

    reports = [
        {"model": "untrained", "accuracy": 0.25, "stderr": 0.1, "ci95": wilson_interval(0.25, 20)},
        {"model": "rl_teacher", "accuracy": 0.5, "stderr": 0.1, "ci95": wilson_interval(0.5, 20)},
    ]
    (lower, upper), what = error_bars(reports)
    assert what == "error bars: 95 % Wilson interval"
    lo, hi = wilson_interval(0.25, 20)
    assert lower[0] == pytest.approx(0.25 - lo) and upper[0] == pytest.approx(hi - 0.25) and lower[0] != upper[0]
    assert error_bars([{"model": "student", "accuracy": 0.5, "stderr": 0.1}]) == (
        [[0.1], [0.1]],
        "error bars: ± 1 standard error",
    )
    path = plot_accuracy(reports, tmp_path / "accuracy.png", "held-out")
    assert matplotlib.image.imread(path).shape[0] > 100
