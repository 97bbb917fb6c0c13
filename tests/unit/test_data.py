"""Dataset loading: built-in tasks, local files with column mapping, conversations, bad rows by index."""

import json

import pytest

from rlt import tasks
from rlt.data import DataError, load_data
from rlt.prompts import Formatter, bundled_formats, resolve_format
from rlt.spec import DatasetSpec, FormatSpec

FMT = resolve_format(FormatSpec())
STRATOS = resolve_format(FormatSpec(preset="stratos-tags"))


def test_builtin_tasks_are_deterministic_and_correct():
    a = tasks.generate("mixed", 50, seed=7)
    assert a == tasks.generate("mixed", 50, seed=7)
    assert a != tasks.generate("mixed", 50, seed=8)
    for row in a:
        if row["question"].startswith("What is"):
            expr = row["question"].removeprefix("What is ").rstrip("?")
            assert row["solution"] == f"The answer is {eval(expr)}."  # noqa: S307 - our own generated arithmetic
        else:
            expr, target = row["solution"].split(" = ")
            assert eval(expr) == int(target)  # noqa: S307
        assert row["reasoning_trace"]
    with pytest.raises(ValueError, match="unknown built-in task 'poetry'"):
        tasks.generate("poetry", 1)


def test_jsonl_with_column_mapping_and_limit(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"q": f"Q{i}", "a": f"A{i}", "why": f"W{i}"}) + "\n" for i in range(5)))
    spec = DatasetSpec(source=str(path), columns={"question": "q", "solution": "a", "reasoningTrace": "why"}, limit=3)
    data = load_data(spec, FMT)
    assert [r["question"] for r in data.train] == ["Q0", "Q1", "Q2"]
    assert data.train[1] == {"question": "Q1", "solution": "A1", "reasoning_trace": "W1", "row": 1}


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "Q", "solution": "A"}) + "\n")
    with pytest.raises(DataError, match=r"row 0: column 'question' is missing \(columns: prompt, solution\)"):
        load_data(DatasetSpec(source=str(path)), FMT)


def test_bad_rows_rejected_or_skipped_by_index(tmp_path):
    rows = [{"question": "Q0", "solution": "A0"}, {"question": "Q1", "solution": ""},
            {"question": "Q2 </explain>", "solution": "A2"}, {"question": "Q3", "solution": "A3"}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"row 1: solution: missing or empty"):
        load_data(DatasetSpec(source=str(path)), FMT)
    data = load_data(DatasetSpec(source=str(path), badRows="skip"), FMT)
    assert [r["row"] for r in data.train] == [0, 3]
    assert len(data.skipped) == 2 and "row 2: question: contains the format tag '</explain>'" in data.skipped[1]


def test_conversations_layout(tmp_path):
    conv = lambda body: {"conversations": [{"from": "user", "value": "What is 2+2?"},  # noqa: E731
                                           {"from": "assistant", "value": body}]}
    rows = [conv("<|begin_of_thought|>\n\nadd\n\n<|end_of_thought|>\n\n<|begin_of_solution|>4<|end_of_solution|>"),
            conv("<|begin_of_thought|>never closed <|begin_of_solution|>4<|end_of_solution|>"),
            conv("no tags at all")]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_data(DatasetSpec(source=str(path), layout="conversations", badRows="skip"), STRATOS)
    assert data.train == [{"question": "What is 2+2?", "solution": "4", "reasoning_trace": "\n\nadd\n\n", "row": 0}]
    assert "row 1: conversations[1]: <|begin_of_thought|> is never closed" in data.skipped[0]
    assert "row 2: conversations[1]: no closed <|begin_of_solution|>" in data.skipped[1]


def test_parquet_and_eval_split(tmp_path):
    import pandas as pd

    pd.DataFrame({"question": [f"Q{i}" for i in range(20)], "solution": ["A"] * 20}).to_parquet(tmp_path / "d.parquet")
    data = load_data(DatasetSpec(source=str(tmp_path / "d.parquet"), evalFraction=0.25), FMT)
    assert len(data.train) == 15 and len(data.eval) == 5
    assert not {r["row"] for r in data.train} & {r["row"] for r in data.eval}


def test_formats_are_data_and_overridable(tmp_path):
    assert {"default", "stratos-tags"} <= set(bundled_formats())
    fmt = resolve_format(FormatSpec(studentSystemPrompt="EXACT PROMPT", tags={"thoughtStart": "<t>"}))
    assert fmt.student_system_prompt == "EXACT PROMPT" and fmt.tags.thought_start == "<t>" and fmt.tags.thought_end == "</think>"
    f = Formatter(fmt)
    assert f.split_explanation("abc</explain>tail") == ("abc", True)
    assert f.split_explanation("abc") == ("abc", False)
    custom = tmp_path / "f.yaml"
    custom.write_text("tags: {thoughtStart: a, thoughtEnd: b, solutionStart: c, solutionEnd: d, explanationStart: e, "
                      "explanationEnd: f}\nstudentSystemPrompt: s\nteacherSystemPrompt: t\n")
    assert resolve_format(FormatSpec(file=str(custom))).tags.explanation_end == "f"
