"""The committed CRD equals the one generated from the spec model, is structural, and validates like the model."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from suite_helpers import EXAMPLES as EXAMPLE_DIR
from suite_helpers import deep_merge, hack_module, openapi_to_jsonschema

from rlt_operator import crd
from rlt_operator.status.observed import Observed

CRD_PATH = hack_module("generate").CRD_PATH

EXAMPLES = sorted(EXAMPLE_DIR.glob("*.yaml"))


def test_committed_crd_is_generated():
    assert CRD_PATH.read_text() == crd.render(), "run `make crd` and commit the result"


@pytest.fixture(scope="module")
def validator():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = copy.deepcopy(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    schema["properties"]["status"] = {"type": "object"}
    return jsonschema.Draft4Validator(openapi_to_jsonschema(schema, closed=True))  # pruned fields flagged


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
    # Kubernetes' own Affinity and Toleration (rlt.spec.k8s_api), not free-form objects the API server would pass on
    scheduling = spec["properties"]["scheduling"]["properties"]
    assert "x-kubernetes-preserve-unknown-fields" not in scheduling["affinity"]
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        in scheduling["affinity"]["properties"]["nodeAffinity"]["properties"]
    )
    assert scheduling["tolerations"]["items"]["properties"]["operator"]["enum"] == ["", "Equal", "Exists"]
    cols = version["additionalPrinterColumns"]
    assert [c["name"] for c in cols] == [
        "Phase",
        "Stage",
        "Trainer",
        "Step",
        "Reward",
        "Restarts",
        "Reason",
        "Age",
        "Message",
    ]
    # on-call: why a run needs attention is in the default columns of `kubectl get rlt -A`; -o wide adds the detail
    assert [c["name"] for c in cols if c.get("priority") == 1] == ["Message"], "-o wide adds it"
    status = root["properties"]["status"]
    for c in [c for c in cols if c["jsonPath"].startswith(".status.")]:  # a field the status schema keeps
        node = root
        for part in re.findall(r"[^.\[]+(?:\[[^\]]*\])?", c["jsonPath"]):
            if "[?(" in part:  # a list filtered by a field (a condition by type): its items' schema
                node = (node.get("properties", {}).get(part.split("[", 1)[0]) or {}).get("items")
                continue
            node = node.get("properties", {}).get(part)
            assert node is not None, f"{c['name']}: {c['jsonPath']} is not in the schema"
    assert status["properties"]["progress"]["properties"]["stepOfTotal"]["type"] == "string"
    assert version["subresources"] == {"status": {}}
    assert crd.crd()["spec"]["names"]["shortNames"] == ["rlt"]


def _undescribed(node, path):
    """Properties without a description (what `kubectl explain` would show empty), walking objects and lists."""
    for name, sub in (node.get("properties") or {}).items():
        if not sub.get("description"):
            yield f"{path}.{name}"
        yield from _undescribed(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _undescribed(node[key], f"{path}[]")


def _bounds(node, path="openAPIV3Schema"):
    for key in ("minimum", "maximum"):
        if isinstance(node.get(key), (int, float)):
            yield f"{path}.{key}", node[key]
    for name, sub in (node.get("properties") or {}).items():
        yield from _bounds(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _bounds(node[key], f"{path}[]")


def test_numeric_bounds_survive_the_api_servers_float64():
    """kube-apiserver keeps minimum/maximum as float64: a bound that float64 cannot hold exactly (the int64 extremes
    of tolerationSeconds) makes 1.36 refuse every run that sets the field. Such fields say `format: int64` instead,
    as Kubernetes' own schemas do."""
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    inexact = [(path, v) for path, v in _bounds(root) if isinstance(v, int) and int(float(v)) != v]
    assert not inexact, inexact
    toleration = root["properties"]["spec"]["properties"]["scheduling"]["properties"]["tolerations"]["items"]
    seconds = toleration["properties"]["tolerationSeconds"]
    assert seconds["format"] == "int64" and "minimum" not in seconds and "maximum" not in seconds


def test_every_spec_and_status_field_has_a_description_for_kubectl_explain():
    """Walks the schema generated from the pydantic models: a field's own description or its model's docstring."""
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert list(_undescribed(root["properties"]["spec"], "spec")) == []
    assert list(_undescribed(root["properties"]["status"], "status")) == []


def test_crd_is_a_valid_apiextensions_object():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd.crd(), "1.31.0", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_schema(validator, path):
    doc = yaml.safe_load(path.read_text())
    errors = [e.message for e in validator.iter_errors(doc)]
    assert errors == []


@pytest.mark.parametrize(
    "patch, word",
    [
        ({"stages": {"rl": {"numGenerations": 1}}}, "minimum"),
        ({"stages": {"rl": {"deepspeedZeroStage": 4}}}, "is not one of"),
        ({"resources": {"trainer": {"nodes": "two"}}}, "is not of type"),
        ({"teacher": None}, "is not of type"),
        ({"stages": {"rl": {"bogus": 1}}}, "Additional properties"),
    ],
)
def test_schema_rejects_what_the_model_rejects(validator, patch, word):
    doc = yaml.safe_load(EXAMPLES[-1].read_text())

    deep_merge(doc["spec"], patch)
    messages = " | ".join(e.message for e in validator.iter_errors(doc))
    assert word in messages


def prune(value, schema):
    """What a real API server keeps of `value` under a structural schema (apiextensions pruning)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields")
        out = {}
        for k, v in value.items():
            if k in props:
                out[k] = prune(v, props[k])
            elif isinstance(extra, dict):
                out[k] = prune(v, extra)
            elif keep:
                out[k] = v
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in value]
    return value


def _statuses_the_operator_writes():
    """Statuses from decisions that together touch every field: fresh, progress, restart, suspend, invalid,
    pod problems, and a finished run with every output (student enabled)."""
    import datetime as dt

    from op_harness import EXAMPLES as EX

    from rlt_operator import builders as b
    from rlt_operator.status import decide as S

    ref = b.RunRef(name="t", namespace="ns", uid="u")
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    sp = yaml.safe_load((EX / "rltrun-tiny.yaml").read_text())["spec"]
    sp["stages"]["student"] = {"enabled": True}
    sp["stages"]["evaluate"] = {"enabled": True}
    out = []
    d = S.decide(ref, 1, sp, None, Observed(), now)
    out.append(d.status)
    lbl = lambda st, r=0: b.labels("t", b.ROLE_TRAINER, st, r)  # noqa: E731
    job = {
        "name": "t-sft",
        "labels": lbl("sft"),
        "deleting": False,
        "completions": 1,
        "active": 1,
        "succeeded": 0,
        "failed": 0,
        "conditions": [],
    }
    obs = Observed(jobs={"t-sft": job}, persistentvolumeclaims={"t-data": {"name": "t-data", "phase": "Pending"}})
    d = S.decide(
        ref,
        1,
        sp,
        d.status,
        obs,
        now,
        {
            "stage": "sft",
            "step": 3,
            "totalSteps": 10,
            "rewardMean": 0.5,
            "tokensPerSecond": 12.5,
            "lastCheckpoint": "/data/t/c",
            "updateTime": "2026-01-01T00:00:00Z",
        },
    )
    out.append(d.status)
    failed = dict(job, active=0, failed=1)
    d = S.decide(ref, 1, sp, d.status, Observed(jobs={"t-sft": failed}), now)
    out.append(d.status)
    out.append(S.decide(ref, 2, {**sp, "suspend": True}, d.status, Observed(), now).status)
    out.append(S.decide(ref, 3, {**sp, "seed": -1}, d.status, Observed(), now).status)
    stages = ["sft", "rl", "distill", "student", "evaluate"]
    done = {
        f"t-{s}": {
            "name": f"t-{s}",
            "labels": lbl(s),
            "deleting": False,
            "completions": 1,
            "active": 0,
            "succeeded": 1,
            "failed": 0,
            "conditions": [{"type": "Complete", "status": "True"}],
        }
        for s in stages
    }
    fin = S.decide(ref, 4, sp, d.status, Observed(jobs=done), now).status
    assert fin["phase"] == "Succeeded" and "studentCheckpoint" in fin["outputs"]
    out.append(fin)
    return out


def test_every_status_field_the_operator_writes_survives_pruning_with_the_crds_own_schema():
    schema = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    status_schema = schema["properties"]["status"]
    assert not status_schema.get("x-kubernetes-preserve-unknown-fields"), "the schema must list the fields"
    statuses = _statuses_the_operator_writes()
    for st in statuses:
        assert prune({"status": st}, schema)["status"] == st
    written = {k for st in statuses for k in st}
    assert written >= {
        "phase",
        "stage",
        "restarts",
        "lastFailure",
        "progress",
        "outputs",
        "conditions",
        "completionTime",
        "reason",
        "message",
    }


def test_a_status_field_missing_from_the_model_is_an_error():
    from pydantic import ValidationError

    from rlt_operator.status import model as status_model

    with pytest.raises(ValidationError, match=r"outputs\.studentModel\n  Extra inputs are not permitted"):
        status_model.check({"phase": "Running", "outputs": {"studentModel": "/x"}})


def test_phases_and_condition_types_come_from_their_enums():
    """Adding a phase or a condition type is one edit of its StrEnum: the CRD, the status check and the phase metric
    follow, and a condition the enum does not list is refused before it is written."""
    from rlt.contract.api import Phase
    from rlt.contract.metrics import METRIC_DEFS
    from rlt_operator.status import model as status_model
    from rlt_operator.status.model import ConditionType

    status = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [p.value for p in Phase]
    described = status["conditions"]["items"]["properties"]["type"]["description"].rstrip(".").split(", ")
    assert described == [c.value for c in ConditionType] and len(set(described)) == len(described)
    help_text = METRIC_DEFS["rlt_run_phase"].help
    assert all(p.value in help_text for p in Phase)
    cond = {"type": "SpecValid", "status": "True"}
    status_model.check({"conditions": [cond]})
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"conditions\.0\.type\n  Input should be 'Ready', 'SpecValid'"):
        status_model.check({"conditions": [{**cond, "type": "SpecVaild"}]})


# Every example as it was at an earlier commit (copied from git history when it changed): a stored RLTRun of that
# shape must stay valid under the CRD as the schema evolves (docs/operator.md, "CRD versions"). When an example
# changes, add its old version here: `git show <commit>:manifests/examples/<name>.yaml`.
HISTORY = sorted((Path(__file__).parent / "crd_history").glob("*.yaml"))


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_the_crd_keeps_accepting_every_earlier_example(validator, path):
    doc = yaml.safe_load(path.read_text())
    assert [e.message for e in validator.iter_errors(doc)] == [], f"{path.name}: a stored run of this shape breaks"


def test_the_crd_history_holds_earlier_examples():
    assert len(HISTORY) >= 10
    assert {p.name.split("@")[0] for p in HISTORY} <= {p.stem for p in EXAMPLES}
