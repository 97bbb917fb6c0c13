"""One answer to "which rows does evaluation use?" (rlt.data.eval_set): rlt's evaluate stage, rcl's evaluate stage
(and `rlt eval`) and `rlt compare` get the same rows for the same spec and data."""

from __future__ import annotations

import json

import pytest
from suite_helpers import deep_merge, tiny_doc

from rlt.contract.layout import RunLayout
from rlt.spec.loading import parse_run


def rows_of_the_three(doc: dict, tmp_path) -> dict[str, list[dict]]:
    """The evaluation rows each caller takes for `doc` (method rlt; rcl's caller also for the same doc as rcl)."""
    from rlt.run.compare import Compare
    from rlt.stages.context import StageContext
    from rlt.stages.evaluate import eval_set
    from rlt.stages.rcl import eval_rows

    # evaluate enabled: compare keeps the file's evaluate settings (for a disabled stage it has defaults of its own)
    doc = deep_merge(doc, {"spec": {"stages": {"evaluate": {"enabled": True}}}})
    run = parse_run(doc, "tiny")
    rcl_doc = deep_merge(doc, {"spec": {"method": "rcl", "stages": {"distill": {"enabled": False}}}})
    rcl_run = parse_run(rcl_doc, "tiny")
    ctx = StageContext(run, RunLayout.for_run(tmp_path, run.name), device="cpu", show_progress=False)
    return {
        "evaluate": eval_set(ctx).rows,
        "rcl": eval_rows(rcl_run.spec),
        "compare": Compare(run, tmp_path, "cpu", show_progress=False).eval_set().rows,
    }


def same_rows(rows: dict[str, list[dict]]) -> list[dict]:
    first = rows["evaluate"]
    assert first, "no evaluation rows"
    for caller, got in rows.items():
        assert [r["question"] for r in got] == [r["question"] for r in first], caller
    return first


def test_a_builtin_task_without_held_out_rows_is_evaluated_on_fresh_problems_by_all_three(tmp_path):
    # the tiny example: builtin:arithmetic, evalFraction 0 (rcl refused this before; rlt took fresh problems)
    doc = tiny_doc()
    rows = same_rows(rows_of_the_three(doc, tmp_path))
    from rlt.data.dataset import load_data
    from rlt.method.prompts import resolve_format

    run = parse_run(doc, "tiny")
    trained = {r["question"] for r in load_data(run.spec.dataset, resolve_format(run.spec.format)).train}
    assert len(rows) == 64 and not trained & {r["question"] for r in rows}


def test_the_held_out_part_of_the_dataset_with_a_limit(tmp_path):
    doc = deep_merge(tiny_doc(), {"spec": {"dataset": {"evalFraction": 0.25}, "stages": {"evaluate": {"limit": 5}}}})
    rows = same_rows(rows_of_the_three(doc, tmp_path))
    from rlt.data.dataset import load_data
    from rlt.method.prompts import resolve_format

    run = parse_run(doc, "tiny")
    data = load_data(run.spec.dataset, resolve_format(run.spec.format))
    held_out = [r["question"] for r in data.eval]
    assert len(rows) == 5 and len(held_out) > 5
    assert [r["question"] for r in rows] == held_out[:5]  # the held-out rows, the limit's first: none trained on


def test_an_evaluation_dataset_with_its_own_held_out_part_gives_that_part(tmp_path):
    # the evaluation dataset is the training file with the training split: its held-out rows, never trained on
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "solution": str(i + 1)}) + "\n" for i in range(20))
    )
    split = {"source": str(data), "evalFraction": 0.25, "seed": 3}
    doc = deep_merge(tiny_doc(), {"spec": {"dataset": split, "stages": {"evaluate": {"dataset": split}}}})
    rows = same_rows(rows_of_the_three(doc, tmp_path / "out"))
    from rlt.data.dataset import load_data
    from rlt.method.prompts import resolve_format

    run = parse_run(doc, "tiny")
    data_split = load_data(run.spec.dataset, resolve_format(run.spec.format))
    assert [r["question"] for r in rows] == [r["question"] for r in data_split.eval]
    assert not {r["question"] for r in data_split.train} & {r["question"] for r in rows}


def test_a_spec_built_in_code_without_any_evaluation_rows_is_refused_by_the_one_function():
    from rlt.data.errors import DataError
    from rlt.data.eval_set import evaluation_set
    from rlt.method.prompts import resolve_format
    from rlt.spec.inputs import DatasetSpec

    spec = parse_run(tiny_doc(), "tiny").spec
    # a file dataset without held-out rows (the door refuses this; a spec built in code can still carry it)
    spec = spec.model_copy(update={"dataset": DatasetSpec(source="/nowhere/rows.jsonl")})
    with pytest.raises(DataError, match="stages.evaluate.dataset: not set, and spec.dataset.evalFraction is 0"):
        evaluation_set(spec, resolve_format(spec.format))
