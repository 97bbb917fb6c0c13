"""A researcher's own Bespoke-Stratos style rows through `rlt validate`: the hints name the fix that works (the format
preset the rows' tags belong to, the conversations layout, the chat column), and ShareGPT's human/gpt roles are read."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from suite_helpers import tiny_doc

STRATOS = (
    "<|begin_of_thought|>\n\nTwo apples and two more make four.\n\n<|end_of_thought|>\n\n"
    "<|begin_of_solution|>\n\n4\n\n<|end_of_solution|>"
)


def turns(user_role="user", assistant_role="assistant", keys=("from", "value"), body=STRATOS):
    role, text = keys
    return [{role: user_role, text: "Anna has 2 apples and gets 2 more. How many?"}, {role: assistant_role, text: body}]


def validate(tmp_path, rows, dataset, fmt=None):
    data = tmp_path / "word.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": str(data), **dataset}
    # stratos-tags prompts are ~300 tokens of the tiny model's tokenizer (tests/unit/test_prompt_lengths_cli.py)
    doc["spec"]["stages"]["sft"]["maxLength"] = doc["spec"]["stages"]["rl"]["maxPromptLength"] = 1024
    if fmt:
        doc["spec"]["format"] = fmt
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", str(path)], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in res.stderr, res.stderr
    return res


def test_stratos_tags_without_the_preset_suggest_the_preset(tmp_path):
    rows = [{"conversations": turns()}] * 3
    res = validate(tmp_path, rows, {"layout": "conversations"})
    assert res.returncode == 1
    assert "uses the tags of format preset 'stratos-tags': set spec.format.preset: stratos-tags" in res.stderr
    assert "fix the data or spec.dataset.columns" not in res.stderr, res.stderr
    ok = validate(tmp_path, rows, {"layout": "conversations"}, {"preset": "stratos-tags"})
    assert ok.returncode == 0, ok.stderr


def test_a_conversations_column_without_the_layout_suggests_the_layout(tmp_path):
    res = validate(tmp_path, [{"conversations": turns()}] * 3, {})
    assert res.returncode == 1
    assert (
        "column 'question' is missing (columns: conversations); the rows hold chat turns in 'conversations': "
        "set spec.dataset.layout: conversations" in res.stderr
    ), res.stderr


def test_a_messages_column_is_named_missing_and_can_be_mapped(tmp_path):
    rows = [{"messages": turns(keys=("role", "content"))}] * 3
    res = validate(tmp_path, rows, {"layout": "conversations"}, {"preset": "stratos-tags"})
    assert res.returncode == 1
    assert (
        "column 'conversations' is missing (columns: messages); map it: spec.dataset.columns.conversations: messages"
        in res.stderr
    ), res.stderr
    mapped = validate(
        tmp_path,
        rows,
        {"layout": "conversations", "columns": {"conversations": "messages"}},
        {"preset": "stratos-tags"},
    )
    assert mapped.returncode == 0, mapped.stderr
    assert "3 usable rows" in mapped.stdout


def test_sharegpt_roles_and_a_system_turn_are_read(tmp_path):
    system = [{"from": "system", "value": "Think step by step."}]
    rows = [{"conversations": turns("human", "gpt")}, {"conversations": system + turns("human", "gpt")}]
    res = validate(tmp_path, rows, {"layout": "conversations"}, {"preset": "stratos-tags"})
    assert res.returncode == 0, res.stderr
    assert "2 usable rows" in res.stdout
    bad = validate(tmp_path, [{"conversations": turns("customer", "gpt")}], {"layout": "conversations"})
    assert "expected the user turn (from/role: user or human), got 'customer'" in bad.stderr, bad.stderr


def test_relative_paths_are_read_from_the_files_folder(tmp_path):
    """`rlt validate project/run.yaml` from another folder: `source: word.jsonl` is the file beside run.yaml."""
    project = tmp_path / "project"
    project.mkdir()
    rows = [{"question": f"What is {i} + 2?", "reasoning_trace": "add", "solution": str(i + 2)} for i in range(5)]
    (project / "word.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tiny_doc()
    doc["spec"]["dataset"] = {"source": "word.jsonl"}
    (project / "run.yaml").write_text(yaml.safe_dump(doc))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "rlt.cli", "validate", "../project/run.yaml"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=elsewhere,
    )
    assert res.returncode == 0, res.stderr
    assert "spec.dataset: 5 usable rows" in res.stdout
