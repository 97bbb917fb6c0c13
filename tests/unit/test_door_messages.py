"""Messages tested for truth (issue 54, class 4/6), written from the class: every refusal line starts with a field
the run file format has, every "set <field>:" it suggests is a field that exists, a value it quotes is one the
file holds, and what it says the file gives or lacks ("give exactly one of", "Field required") is true of the file; a file that also holds a Namespace and a ServiceAccount (as `kubectl apply` takes it) is checked for its
RLTRuns, and the message says which documents were not checked."""

from __future__ import annotations

import re
import types
import typing

import pytest
import yaml
from pydantic import BaseModel
from suite_helpers import EXAMPLES, deep_merge, door_problems, tiny_doc

from rlt.cli import main
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


# One env source given, and invalid inside: the refusal is about that source, never "give exactly one of" (which
# is false of a file that gives exactly one).
SOURCES = [
    {"fieldRef": {"fieldPath": "spec.nope"}},
    {"fieldRef": {"fieldPath": "metadata.labels['a b']"}},
    {"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}},
    {"resourceFieldRef": {"resource": "limits.nope"}},
    {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "-1"}},
    {"secretKeyRef": {"name": "Not_A_Name", "key": "token"}},
    {"configMapKeyRef": {"name": "c", "key": "..data"}},
    {"configMapKeyRef": {"name": "c"}},
]
PATCHES += [{"env": [{"name": "X", "valueFrom": source}]} for source in SOURCES]
PATCHES += [{"env": [{"name": "X", "value": "1", "valueFrom": SOURCES[0]}]}]


MISSING = object()


def _at(doc: typing.Any, where: str) -> typing.Any:
    """The file's value at a refusal line's field path ('spec.env.0.valueFrom'), MISSING where it holds none."""
    node = doc
    for part in where.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def claims_hold(line: str, doc: dict) -> bool:
    """The line's claims about which fields the file gives are true of `doc`: "give exactly one of A, B" where the
    file gives other than one of them, "Field required" where it gives none."""
    where, _, message = line.partition(": ")
    node = _at(doc, where)
    one_of = re.search(r"exactly one of ((?:[A-Za-z]+, )*[A-Za-z]+)", message)
    if one_of:
        given = [f for f in one_of.group(1).split(", ") if isinstance(node, dict) and f in node]
        return len(given) != 1
    if message.startswith("Field required"):
        return node is MISSING
    return True


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: next(iter(p)))
def test_each_refusal_line_names_real_fields_and_values_of_the_file(patch):
    problems = door_problems(patch)
    assert problems, patch
    written = yaml.safe_dump(patch)
    doc = tiny_doc()
    deep_merge(doc["spec"], patch)
    for line in problems:
        assert claims_hold(line, doc), f"false of the file: {line} (all: {problems})"
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


def test_claims_hold_knows_a_false_one_of():
    doc = {"spec": {"env": [{"name": "X", "valueFrom": {"fieldRef": {}}}]}}
    assert not claims_hold("spec.env.0.valueFrom: give exactly one of secretKeyRef, fieldRef", doc)
    assert claims_hold("spec.env.0.valueFrom: give exactly one of secretKeyRef, fieldRef", {"spec": {"env": [{}]}})
    assert not claims_hold("spec.env.0.name: Field required", doc)


def test_field_exists_knows_the_schema():
    assert field_exists("spec.teacher.revision") and field_exists("spec.env.0.valueFrom.secretKeyRef.key")
    assert not field_exists("spec.outputs.revision") and not field_exists("spec.teacher.revisions")
