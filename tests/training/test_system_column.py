"""The reward scores the student in the chat it was trained in: a dataset whose rows carry the student's system
prompt (Bespoke-Stratos-17k's `system` column) gives it to every student chat, unless spec.format names one; rows
that disagree are one clear error. The 7B examples train on Bespoke-Stratos-17k and leave the column to be read."""

from __future__ import annotations

import json

import pytest
import yaml
from suite_helpers import EXAMPLES, TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.data.errors import DataError
from rlt.spec.loading import parse_run
from rlt.stages.context import StageContext

# a stand-in for a published student prompt, long and with the quirks a paraphrase would lose
PUBLISHED = "Your role: think it through.  Steps separated with '\\n\\n' (sic: analisying) -- then solve:"


def context(tmp_path, rows, **fmt):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = load_valid_run(TINY).model_dump(by_alias=True)
    raw["spec"]["dataset"] = {"source": str(data)}
    raw["spec"]["format"].update(fmt)
    return StageContext(parse_run(raw), RunLayout(tmp_path / "out"), device="cpu")


def rows(systems):
    return [{"question": f"{i}+1?", "solution": str(i + 1), "system": s} for i, s in enumerate(systems)]


def test_the_datas_system_column_is_the_students_system_prompt(tmp_path):
    ctx = context(tmp_path, rows([PUBLISHED] * 3))
    messages = ctx.formatter.student_messages("1+1?", "one and one", "2")  # the chat the reward scores
    assert messages[0] == {"role": "system", "content": PUBLISHED}


def test_spec_format_wins_and_disagreeing_rows_are_one_error(tmp_path):
    assert context(tmp_path, rows([PUBLISHED] * 2), studentSystemPrompt="mine").formatter.fmt.student_system_prompt == (
        "mine"
    )
    with pytest.raises(DataError, match=r"line 3: system: a different system prompt than line 1's"):
        context(tmp_path, rows([PUBLISHED, PUBLISHED, "other"])).formatter  # noqa: B018


@pytest.mark.parametrize("name", ["rltrun-paper-7b.yaml", "rltrun-multinode.yaml"])
def test_the_7b_examples_read_the_students_prompt_from_the_data(name):
    spec = parse_run(yaml.safe_load((EXAMPLES / name).read_text())).spec
    assert spec.dataset.source == "bespokelabs/Bespoke-Stratos-17k"  # its rows carry the student's system prompt
    assert spec.dataset.columns.system == "system"
    assert spec.format.student_system_prompt is None  # no paraphrase standing in for it
