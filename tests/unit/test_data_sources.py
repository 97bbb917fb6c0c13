"""One boundary around every data source: whatever a reader meets becomes one DataError line naming the file, the
line or row where known, and what was expected; nothing ambiguous is chosen silently; no traceback, no hang."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from suite_helpers import tiny_doc

from rlt.data.dataset import DataError, check_data, data_system_prompt
from rlt.method.prompts import resolve_format
from rlt.spec.inputs import DatasetSpec, FormatSpec

FMT = resolve_format(FormatSpec())
GOOD = {"question": "1+1?", "solution": "2"}
SOLVED = f"{FMT.tags.solution_start}2{FMT.tags.solution_end}"


def _jsonl(path: Path, *rows: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(**spec) -> str:
    with pytest.raises(DataError) as err:
        check_data(DatasetSpec.model_validate(spec), FMT)
    said = str(err.value)
    assert "\n" not in said, said
    return said


def _parquet(path: Path, names: list[str], rows: int = 1) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [pa.array([f"{name}{i}" for i in range(rows)], type=pa.string()) for name in names]
    pq.write_table(pa.Table.from_arrays(columns, names=names), path)
    return path


# ---------------------------------------------------------------------------------------------- folders and paths


def test_a_folder_whose_files_have_different_columns_names_them(tmp_path):
    _jsonl(tmp_path / "d" / "a.jsonl", GOOD)
    _jsonl(tmp_path / "d" / "b.jsonl", {"prompt": "1+1?", "answer": 2})
    said = _refused(source=str(tmp_path / "d"))
    assert "different columns" in said and "a.jsonl" in said and "b.jsonl" in said, said


def test_a_missing_split_is_named_with_the_splits_there(tmp_path):
    _jsonl(tmp_path / "d" / "train.jsonl", GOOD)
    said = _refused(source=str(tmp_path / "d"), split="test")
    assert "no split 'test'" in said and "train" in said, said


def test_a_missing_split_of_a_saved_dataset_is_named(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list([GOOD])}).save_to_disk(str(tmp_path / "saved"))
    said = _refused(source=str(tmp_path / "saved"), split="validation")
    assert "no split 'validation'" in said and "train" in said, said


def test_a_broken_saved_dataset_is_one_line(tmp_path):
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_info.json").write_text("{}")  # the marker of a saved dataset, nothing else
    said = _refused(source=str(tmp_path / "saved"))
    assert f"{tmp_path / 'saved'}" in said and "saved dataset" in said, said


def test_a_folder_without_data_files_says_so(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("questions to come")  # not data: not read as rows of text
    said = _refused(source=str(tmp_path / "notes"))
    assert "holds no data files" in said, said


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("/", "the filesystem root"),
        ("/tmp/" + "a" * 300 + ".jsonl", "too long"),
        ("/tmp/" + "a" * 300 + "/data.jsonl", "too long"),
        ("/dev/null", "a device file"),
        ("/dev/zero", "a device file"),
    ],
    ids=["root", "long-name", "long-folder", "dev-null", "dev-zero"],
)
def test_paths_that_are_not_data_are_named_as_what_they_are(source, says):
    said = _refused(source=source)
    assert source[:40] in said and says in said and "does not exist" not in said, said


def test_a_data_file_linked_to_a_device_is_never_read_forever(tmp_path):
    link = tmp_path / "data.jsonl"
    link.symlink_to("/dev/zero")
    said = _refused(source=str(link))
    assert "a device file" in said, said


# ---------------------------------------------------------------------------------------------- values of rows


@pytest.mark.parametrize("value", [["1+1?"], {"text": "1+1?"}, 7], ids=["list", "object", "number"])
def test_conversation_turns_that_are_not_text_name_the_turn(tmp_path, value):
    row = {"conversations": [{"from": "user", "value": value}, {"from": "gpt", "value": SOLVED}]}
    said = _refused(source=str(_jsonl(tmp_path / "c.jsonl", row)), layout="conversations")
    assert "line 1" in said and "conversations[0]" in said and "expected text" in said, said
    row["conversations"] = [{"from": "user", "value": "1+1?"}, {"from": "gpt", "value": value}]
    said = _refused(source=str(_jsonl(tmp_path / "c.jsonl", row)), layout="conversations")
    assert "line 1" in said and "conversations[1]" in said and "expected text" in said, said


@pytest.mark.parametrize("value", [["be brief"], {"text": "be brief"}, 7], ids=["list", "object", "number"])
def test_a_system_column_that_is_not_text_names_the_row(tmp_path, value):
    path = _jsonl(tmp_path / "s.jsonl", {**GOOD, "system": "be brief"}, {**GOOD, "system": value})
    with pytest.raises(DataError) as err:
        data_system_prompt(DatasetSpec(source=str(path), columns={"system": "system"}))
    assert "line 2" in str(err.value) and "system" in str(err.value) and "expected text" in str(err.value)


# ---------------------------------------------------------------------------------------------- ambiguity


def test_a_key_given_twice_in_a_json_row_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + '\n{"question": "1+1?", "question": "2+2?", "solution": "2"}\n')
    said = _refused(source=str(path))
    assert "line 2" in said and "'question' is given twice" in said, said
    path.write_text('[{"question": "1+1?", "solution": "2", "solution": "3"}]')  # a JSON list of rows too
    assert "'solution' is given twice" in _refused(source=str(path))


def test_duplicate_columns_are_refused(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("question,solution,question\n1+1?,2,2+2?\n")
    said = _refused(source=str(csv))
    assert "line 1" in said and "column 'question' is given twice" in said, said
    said = _refused(source=str(_parquet(tmp_path / "d.parquet", ["question", "solution", "question"])))
    assert "column 'question' is given twice" in said and "FieldRef" not in said, said


def test_two_fields_mapped_to_one_column_are_refused(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", {"text": "1+1? 2", "why": "adding"})
    said = _refused(source=str(path), columns={"question": "text", "solution": "text"})
    assert "spec.dataset.columns" in said and "question" in said and "solution" in said and "'text'" in said, said


def test_a_system_prompt_that_differs_between_rows_is_refused(tmp_path):
    path = _jsonl(tmp_path / "s.jsonl", {**GOOD, "system": "be brief"}, GOOD, {**GOOD, "system": "be long"})
    with pytest.raises(DataError) as err:
        data_system_prompt(DatasetSpec(source=str(path), columns={"system": "system"}))
    assert "line 3" in str(err.value) and "different system prompt than line 1" in str(err.value)


# ---------------------------------------------------------------------------------------------- words


def test_csv_line_numbers_are_file_lines_after_quoted_newlines(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text('question,solution\n"a question\nover three\nlines",2\n"1+1?",\n')
    said = _refused(source=str(csv))
    assert "line 5: solution" in said, said  # the header is line 1, the first row lines 2-4


def test_an_empty_parquet_file_is_said_in_our_words(tmp_path):
    empty = tmp_path / "d.parquet"
    empty.write_bytes(b"")
    said = _refused(source=str(empty))
    assert "an empty file (0 bytes)" in said and "Parquet file size" not in said, said
    said = _refused(source=str(_parquet(tmp_path / "none.parquet", ["question", "solution"], rows=0)))
    assert "no rows" in said, said


def _mixed_folder(tmp_path: Path) -> str:
    _jsonl(tmp_path / "d" / "a.jsonl", GOOD)
    _jsonl(tmp_path / "d" / "b.jsonl", {"prompt": "1+1?", "answer": 2})
    return str(tmp_path / "d")


def _twice(tmp_path: Path) -> str:
    (tmp_path / "d.jsonl").write_text('{"question": "1+1?", "question": "2+2?", "solution": "2"}\n')
    return str(tmp_path / "d.jsonl")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_mixed_folder, "different columns"),
        (lambda _: "/dev/zero", "/dev/zero: a device file"),
        (_twice, "line 1: key 'question' is given twice"),
    ],
    ids=["mixed-folder", "device", "key-twice"],
)
def test_rlt_validate_and_run_say_a_data_source_problem_in_one_line(tmp_path, make, says):
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": make(tmp_path)}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    for command in ("validate", "run"):
        args = [command, "run.yaml"] + (["--output-dir", "out", "--metrics-port", "-1"] if command == "run" else [])
        res = subprocess.run(
            [sys.executable, "-m", "rlt.cli", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
        lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
        assert len(lines) == (2 if command == "validate" else 1), res.stderr
        assert says in lines[-1], lines[-1]


def test_a_built_in_task_of_astronomical_size_is_refused_before_generating(tmp_path):
    """The rows of a built-in task are generated and held in memory: a size no machine holds is refused at once."""
    from rlt.spec.inputs import MAX_BUILTIN_ROWS

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="size"):  # the spec's own bound, before anything reads the source
        DatasetSpec.model_validate({"source": "builtin:mixed", "size": 10**15})
    with pytest.raises(DataError) as err:  # a spec built without validation meets the same bound in the reader
        check_data(DatasetSpec.model_construct(source="builtin:mixed", size=10**15, seed=0), FMT)
    said = str(err.value)
    assert time.perf_counter() - t0 < 60, "generated rows before refusing"  # 10**15 rows: never, on any machine
    assert "spec.dataset.size" in said and f"{MAX_BUILTIN_ROWS}" in said, said


def test_a_benchmark_that_cannot_be_read_is_one_line(tmp_path):
    """A benchmark's hub data set read in a pod: whatever `datasets` raises (here: no such data set) is one line."""
    from rlt.data.benchmarks import Benchmark, load_benchmark

    bench = Benchmark(name="gone", hub_id=str(tmp_path / "gone"), split="test", answer="math", columns={})
    with pytest.raises(DataError) as err:
        load_benchmark(bench)
    assert "\n" not in str(err.value) and "gone" in str(err.value) and "cannot be read" in str(err.value)


def test_the_files_of_a_folder_are_held_to_the_same_rules(tmp_path):
    """A folder's files are read by `datasets`, which keeps the last of two keys and the first of two columns: they
    are checked as single files are, each problem naming the file and its line."""
    _jsonl(tmp_path / "d" / "train.jsonl", GOOD)
    (tmp_path / "d" / "more.jsonl").write_text(
        json.dumps(GOOD) + '\n{"question": "a", "question": "b", "solution": "2"}\n'
    )
    said = _refused(source=str(tmp_path / "d"))
    assert "more.jsonl line 2" in said and "'question' is given twice" in said, said
    (tmp_path / "d" / "more.jsonl").unlink()
    (tmp_path / "d" / "more.csv").write_text("question,solution,solution\n1+1?,2,3\n")
    (tmp_path / "d" / "train.jsonl").unlink()
    said = _refused(source=str(tmp_path / "d"))
    assert "more.csv line 1" in said and "column 'solution' is given twice" in said, said


def test_a_device_inside_a_dataset_folder_is_named_not_read(tmp_path):
    _jsonl(tmp_path / "d" / "train.jsonl", GOOD)
    (tmp_path / "d" / "more.jsonl").symlink_to("/dev/zero")
    said = _refused(source=str(tmp_path / "d"))
    assert "more.jsonl: a device file" in said, said


@pytest.mark.parametrize("other", ["more.jsonl", "sub/more.jsonl"])
def test_a_folder_file_that_datasets_would_not_read_is_named_not_dropped(tmp_path, other):
    """Once one file of a folder is named for a split (train.jsonl), `datasets` reads only the files named for
    splits: a valid file beside it would be dropped in silence. It is refused, named; files all named for splits,
    or none named, are read whole."""
    _jsonl(tmp_path / "d" / "train.jsonl", GOOD)
    _jsonl(tmp_path / "d" / other, GOOD)
    said = _refused(source=str(tmp_path / "d"))
    assert other in said and "would ignore" in said and "train: 1 files" in said, said
    (tmp_path / "d" / "train.jsonl").rename(tmp_path / "d" / "first.jsonl")
    assert len(check_data(DatasetSpec(source=str(tmp_path / "d")), FMT).train) == 2


def test_a_source_under_the_home_folder_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _jsonl(tmp_path / "d.jsonl", GOOD, GOOD)
    assert len(check_data(DatasetSpec(source="~/d.jsonl"), FMT).train) == 2


def test_hidden_and_dunder_folders_of_a_dataset_folder_are_not_its_files(tmp_path):
    """`datasets` skips a folder's hidden and `__` folders (a notebook's .ipynb_checkpoints/ copies): so does rlt."""
    _jsonl(tmp_path / "d" / "rows.jsonl", GOOD, GOOD)
    _jsonl(tmp_path / "d" / ".ipynb_checkpoints" / "rows-checkpoint.jsonl", GOOD)
    _jsonl(tmp_path / "d" / "__cache" / "old.jsonl", {"other": "columns"})
    assert len(check_data(DatasetSpec(source=str(tmp_path / "d")), FMT).train) == 2
