"""Dataset loading: built-in tasks, local files with column mapping, conversations, bad rows by index."""

import json

import pytest

from rlt.data import tasks
from rlt.data.dataset import DataError, load_data
from rlt.method.prompts import Formatter, bundled_formats, resolve_format
from rlt.spec.inputs import DatasetSpec, FormatSpec

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
    with pytest.raises(DataError, match=r"line 1: column 'question' is missing \(columns: prompt, solution\)") as err:
        load_data(DatasetSpec(source=str(path)), FMT)
    # the only row is bad: skipping cannot help, so the message must not suggest it
    assert "badRows: skip would drop every row" in str(err.value) and "set spec.dataset.badRows" not in str(err.value)


def test_bad_rows_rejected_or_skipped_by_index(tmp_path):
    rows = [
        {"question": "Q0", "solution": "A0"},
        {"question": "Q1", "solution": ""},
        {"question": "Q2 </explain>", "solution": "A2"},
        {"question": "Q3", "solution": "A3"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        DataError,
        match=r"line 2: solution: empty \(1 more bad row; `rlt validate` lists them\); "
        r"set spec.dataset.badRows: skip to drop the 2 bad rows$",
    ):
        load_data(DatasetSpec(source=str(path)), FMT)
    data = load_data(DatasetSpec(source=str(path), badRows="skip"), FMT)
    assert [r["row"] for r in data.train] == [0, 3]
    assert len(data.skipped) == 2 and "line 3: question: contains the format tag '</explain>'" in data.skipped[1]


def test_conversations_layout(tmp_path):
    def conv(body):
        return {
            "conversations": [
                {"from": "user", "value": "What is 2+2?"},
                {"from": "assistant", "value": body},
            ]
        }

    rows = [
        conv("<|begin_of_thought|>\n\nadd\n\n<|end_of_thought|>\n\n<|begin_of_solution|>4<|end_of_solution|>"),
        conv("<|begin_of_thought|>never closed <|begin_of_solution|>4<|end_of_solution|>"),
        conv("no tags at all"),
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_data(DatasetSpec(source=str(path), layout="conversations", badRows="skip"), STRATOS)
    assert data.train == [{"question": "What is 2+2?", "solution": "4", "reasoning_trace": "\n\nadd\n\n", "row": 0}]
    assert "line 2: conversations[1]: <|begin_of_thought|> is never closed" in data.skipped[0]
    assert "line 3: conversations[1]: no closed <|begin_of_solution|>" in data.skipped[1]


def test_parquet_and_eval_split(tmp_path):
    import pandas as pd

    pd.DataFrame({"question": [f"Q{i}" for i in range(20)], "solution": ["A"] * 20}).to_parquet(tmp_path / "d.parquet")
    data = load_data(DatasetSpec(source=str(tmp_path / "d.parquet"), evalFraction=0.25), FMT)
    assert len(data.train) == 15 and len(data.eval) == 5
    assert not {r["row"] for r in data.train} & {r["row"] for r in data.eval}


def test_formats_are_data_and_overridable(tmp_path):
    assert {"default", "stratos-tags"} <= set(bundled_formats())
    fmt = resolve_format(FormatSpec(studentSystemPrompt="EXACT PROMPT", tags={"thoughtStart": "<t>"}))
    assert (
        fmt.student_system_prompt == "EXACT PROMPT"
        and fmt.tags.thought_start == "<t>"
        and fmt.tags.thought_end == "</think>"
    )
    f = Formatter(fmt)
    assert f.split_explanation("abc</explain>tail") == ("abc", True)
    assert f.split_explanation("abc") == ("abc", False)
    custom = tmp_path / "f.yaml"
    custom.write_text(
        "tags: {thoughtStart: a, thoughtEnd: b, solutionStart: c, solutionEnd: d, explanationStart: e, "
        "explanationEnd: f}\nstudentSystemPrompt: s\nteacherSystemPrompt: t\n"
    )
    assert resolve_format(FormatSpec(file=str(custom))).tags.explanation_end == "f"


def _jsonl(path, rows, blank_after_first=False):
    lines = [json.dumps(r) for r in rows]
    if blank_after_first:
        lines.insert(1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_numeric_solution_is_used_as_its_text_and_other_types_are_named(tmp_path):
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"question": "6*7?", "solution": 42},
            {"question": "Q", "solution": 2.5},
            {"question": "Q", "solution": True},
            {"question": "Q", "solution": None},
            {"question": "Q", "solution": ["a"]},
        ],
        blank_after_first=True,
    )
    data = load_data(DatasetSpec(source=str(path), badRows="skip"), FMT)
    assert [r["solution"] for r in data.train] == ["42", "2.5"]
    assert data.numbers == ["line 1: solution", "line 3: solution"]  # line 2 is blank: lines are the file's own
    problems = [s.split(" ", 1)[1] for s in data.skipped]
    assert problems == [
        "line 4: solution: expected text, got the boolean true",
        "line 5: solution: missing (null)",
        'line 6: solution: expected text, got list ["a"]',
    ]


def test_csv_lines_count_the_header_and_broken_jsonl_lines_are_named(tmp_path):
    (tmp_path / "d.csv").write_text("question,solution\nQ1,A1\nQ2,\nQ3,7\n")
    data = load_data(DatasetSpec(source=str(tmp_path / "d.csv"), badRows="skip"), FMT)
    assert [r["question"] for r in data.train] == ["Q1", "Q3"] and data.train[1]["solution"] == "7"
    assert data.skipped == [f"{tmp_path / 'd.csv'} line 3: solution: missing (null)"]
    (tmp_path / "b.jsonl").write_text('{"question": "Q", "solution": "A"}\n{"question": "Q2", \n')
    with pytest.raises(
        DataError, match=r"b.jsonl line 2: not valid JSON .*set spec.dataset.badRows: skip to drop the 1"
    ):
        load_data(DatasetSpec(source=str(tmp_path / "b.jsonl")), FMT)


def test_csv_cells_are_read_as_the_text_they_are(tmp_path):
    """pandas types a CSV column: a number column with an empty cell would be floats (41 -> "41.0"), `007` an int,
    `True` a boolean, `NA` and `None` missing. Each cell is its own text; only an empty cell is missing."""
    (tmp_path / "d.csv").write_text("question,solution\nQ1,41\nQ2,\nQ3,007\nQ4,2.50\nQ5,True\nQ6,NA\nQ7,None\n")
    data = load_data(DatasetSpec(source=str(tmp_path / "d.csv"), badRows="skip"), FMT)
    assert [r["solution"] for r in data.train] == ["41", "007", "2.50", "True", "NA", "None"]
    assert data.skipped == [f"{tmp_path / 'd.csv'} line 3: solution: missing (null)"] and data.numbers == []
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.csv").write_text("question,solution\nQ1,41\nQ2,\n")
    (folder / "b.csv").write_text("question,solution\nQ3,007\n")
    data = load_data(DatasetSpec(source=str(folder), badRows="skip"), FMT)
    assert sorted(r["solution"] for r in data.train) == ["007", "41"]
    # pandas' to_csv writes its index under a blank header name: read as pandas names it, the rows as before
    (tmp_path / "p.csv").write_text(",question,solution\n0,Q1,41\n1,Q2,7\n")
    assert [r["solution"] for r in load_data(DatasetSpec(source=str(tmp_path / "p.csv")), FMT).train] == ["41", "7"]


def test_a_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"^spec.dataset.source: file data/nope.jsonl does not exist$"):
        load_data(DatasetSpec(source="data/nope.jsonl"), FMT)


def test_check_data_counts_what_skip_would_drop(tmp_path):
    from rlt.data.dataset import check_data

    path = _jsonl(
        tmp_path / "d.jsonl", [{"question": f"Q{i}", "solution": "" if i % 3 == 0 else "A"} for i in range(9)]
    )
    report = check_data(DatasetSpec(source=str(path), badRows="skip"), FMT)
    assert len(report.train) == 6 and report.read == 9 and len(report.skipped) == 3
    with pytest.raises(DataError, match=r"line 1: solution: empty \(2 more bad rows.*drop the 3 bad rows$"):
        check_data(DatasetSpec(source=str(path)), FMT)


def test_skip_warns_once_per_load(tmp_path, caplog):
    path = _jsonl(tmp_path / "d.jsonl", [{"question": "Q", "solution": ""}] * 5 + [{"question": "Q", "solution": "A"}])
    with caplog.at_level("WARNING", logger="rlt.data.dataset"):
        load_data(DatasetSpec(source=str(path), badRows="skip"), FMT)
    assert [r.getMessage() for r in caplog.records] == [
        f"skipping 5 of 6 rows of {path} (badRows: skip), first line 1: solution: empty"
    ]


def test_the_sft_target_of_a_tokenizer_without_eos_ends_at_the_closing_tag():
    """A tokenizer with no eos token (eos_token None) adds nothing after the explanation's closing tag, not "None"."""
    fmt = Formatter(FMT)
    assert fmt.teacher_completion("so 5", None) == f"so 5{FMT.tags.explanation_end}"
    assert fmt.teacher_completion("so 5", "<|im_end|>") == f"so 5{FMT.tags.explanation_end}<|im_end|>"
