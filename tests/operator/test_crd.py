"""The committed CRD equals the one generated from the spec model, is structural, and validates like the model."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

from rlt_operator import crd

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "manifests" / "examples").glob("*.yaml"))


def test_committed_crd_is_generated():
    assert crd.CRD_PATH.read_text() == crd.render(), "run `rlt crd --write` and commit the result"


def _openapi_to_jsonschema(node):
    """Draft 4 understands OpenAPI's boolean exclusiveMinimum; only `nullable` needs translating."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if node.pop("nullable", False):
        node["type"] = [node["type"], "null"]
        if "enum" in node:
            node["enum"] = node["enum"] + [None]
    if node.get("type") == "object" and "properties" in node:
        node["additionalProperties"] = False  # what apiserver pruning would drop, we flag
    return node


@pytest.fixture(scope="module")
def validator():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = copy.deepcopy(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    schema["properties"]["status"] = {"type": "object"}
    return jsonschema.Draft4Validator(_openapi_to_jsonschema(schema))


def _structural(node, path="openAPIV3Schema"):
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return
    assert "type" in node, f"{path}: every node of a structural schema needs a type"
    assert "$ref" not in node and "anyOf" not in node and "const" not in node, path
    for name, sub in (node.get("properties") or {}).items():
        _structural(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        _structural(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _structural(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_with_descriptions_and_printer_columns():
    version = crd.crd()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    _structural(root)
    spec = root["properties"]["spec"]
    assert spec["required"] == ["teacher", "student", "dataset"]
    rl = spec["properties"]["stages"]["properties"]["rl"]["properties"]
    assert rl["numGenerations"]["minimum"] == 1 and rl["numGenerations"]["exclusiveMinimum"] is True
    assert rl["deepspeedZeroStage"]["enum"] == [0, 1, 2, 3]
    assert "description" in spec["properties"]["suspend"]
    assert spec["properties"]["scheduling"]["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "Stage", "Step", "Reward", "Restarts", "Age"]
    assert version["subresources"] == {"status": {}}
    assert crd.crd()["spec"]["names"]["shortNames"] == ["rlt"]


def test_crd_is_a_valid_apiextensions_object():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd.crd(), "1.31.0", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_schema(validator, path):
    doc = yaml.safe_load(path.read_text())
    errors = [e.message for e in validator.iter_errors(doc)]
    assert errors == []


@pytest.mark.parametrize("patch, word", [
    ({"stages": {"rl": {"numGenerations": 1}}}, "minimum"),
    ({"stages": {"rl": {"deepspeedZeroStage": 4}}}, "is not one of"),
    ({"resources": {"trainer": {"nodes": "two"}}}, "is not of type"),
    ({"teacher": None}, "is not of type"),
    ({"stages": {"rl": {"bogus": 1}}}, "Additional properties"),
])
def test_schema_rejects_what_the_model_rejects(validator, patch, word):
    doc = yaml.safe_load(EXAMPLES[-1].read_text())

    def merge(dst, src):
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = v
    merge(doc["spec"], patch)
    messages = " | ".join(e.message for e in validator.iter_errors(doc))
    assert word in messages
