"""Messages tested for truth (issue 54, class 4/6), written from the class: every refusal line starts with a field
the run file format has, every "set <field>:" it suggests is a field that exists, and a value it quotes is one the
file holds; a file that also holds a Namespace and a ServiceAccount (as `kubectl apply` takes it) is checked for its
RLTRuns, and the message says which documents were not checked."""

from __future__ import annotations

import re
import types
import typing

import pytest
import yaml
from pydantic import BaseModel
from suite_helpers import EXAMPLES, deep_merge, tiny_doc

from rlt.checks.validation import run_problems
from rlt.cli import main
from rlt.spec.loading import SpecError, parse_run
from rlt.spec.run import RLTRunSpec


def field_exists(path: str) -> bool:
    """Whether `spec.a.b` names a field of the RLTRun schema (list indexes and map keys step into their items)."""
    parts = path.split(".")
    if parts[0] != "spec":
        return parts[0] in ("metadata", "apiVersion", "kind", "<root>", "capacity")
    model: typing.Any = RLTRunSpec
    for part in parts[1:]:
        consumed = False
        while True:  # unwrap Optional, list[...] and dict[..., ...] to the model within
            origin = typing.get_origin(model)
            if origin in (typing.Union, types.UnionType):
                model = next(a for a in typing.get_args(model) if a is not type(None))
            elif origin is typing.Annotated:
                model = typing.get_args(model)[0]
            elif origin in (list, dict):
                if part.isdigit() or origin is dict:
                    model = typing.get_args(model)[-1]
                    consumed = True  # an index or a key: the next part names a field of the item
                break
            else:
                break
        if consumed:
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return True  # a free-form value (trainerArgs, a map's key): its own keys are the user's
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return False
        model = field.annotation
    return True


def _problems(patch: dict) -> list[str]:
    doc = tiny_doc()
    deep_merge(doc["spec"], patch)
    try:
        return run_problems(parse_run(doc, "run.yaml"))
    except SpecError as err:
        return err.problems


# A sample across the classes of the door: hub ids with a revision written in, bad keys, names, splits, sources.
PATCHES = [
    {"teacher": {"model": "Qwen/Qwen2.5-7B-Instruct@main"}},
    {"dataset": {"source": "org/data@v1"}},
    {"stages": {"student": {"model": {"model": "org/m@dev"}}}},
    {"outputs": {"teacher": "hf://org/name@dev"}, "hfTokenSecret": {"name": "hf"}},
    {"outputs": {"distillDataset": "hf://datasets/org/name@x"}, "hfTokenSecret": {"name": "hf"}},
    {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "..data"}}}]},
    {"scheduling": {"queueName": "Team_Queue"}},
    {"teacher": {"model": "Qwen/Qwen2.5-7B-Instruct", "revision": "a b"}},
    {"dataset": {"source": "builtin:arithmetic", "split": " "}},
    {"dataset": {"source": "https://example.com/d.jsonl"}},
    {"teacher": {"model": "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct"}},
]


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: next(iter(p)))
def test_each_refusal_line_names_real_fields_and_values_of_the_file(patch):
    problems = _problems(patch)
    assert problems, patch
    written = yaml.safe_dump(patch)
    for line in problems:
        field = line.split(":", 1)[0]
        assert field_exists(field), f"{field!r} is no field: {line}"
        for suggested in re.findall(r"\bset (spec\.[A-Za-z0-9_.]+|[a-z][A-Za-z0-9_.]*):", line):
            full = suggested if suggested.startswith("spec.") else f"{field.rsplit('.', 1)[0]}.{suggested}"
            assert field_exists(full), f"suggests {full!r}, which does not exist: {line}"
        for quoted in re.findall(r"'([^']{2,})' (?:is|writes)", line):
            assert quoted in written, f"quotes {quoted!r}, which the file does not hold: {line}"


def test_a_file_with_a_namespace_and_a_service_account_checks_the_runs_and_says_so(tmp_path, capsys):
    run = (EXAMPLES / "rltrun-tiny.yaml").read_text()
    extra = "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n---\napiVersion: v1\nkind: ServiceAccount\n"
    extra += "metadata: {name: trainer, namespace: ml}\n---\n"
    path = tmp_path / "all.yaml"
    path.write_text(extra + run)
    assert main(["validate", "--no-data", "--no-plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok (tiny)" in out and "Namespace/ml" in out and "ServiceAccount/trainer" in out, out
    path.write_text(extra.rstrip("-\n") + "\n")
    assert main(["validate", "--no-data", "--no-plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert "no RLTRun document" in err and "Namespace/ml" in err, err
    bad = yaml.safe_load(run)
    bad["spec"]["seed"] = -1
    path.write_text(extra + yaml.safe_dump(bad))  # the run's own problems are still found, named by document
    assert main(["validate", "--no-data", "--no-plan", str(path)]) == 1
    assert "document 2: spec.seed" in capsys.readouterr().err


def test_field_exists_knows_the_schema():
    assert field_exists("spec.teacher.revision") and field_exists("spec.env.0.valueFrom.secretKeyRef.key")
    assert not field_exists("spec.outputs.revision") and not field_exists("spec.teacher.revisions")
