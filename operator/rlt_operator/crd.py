"""The RLTRun CustomResourceDefinition, generated from the pydantic spec model (the one schema source).

pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0 schema. The
conversion: inline every $ref, turn `anyOf [X, null]` into `X` + `nullable`, `const` into a
one-value enum, numeric `exclusiveMinimum: n` into `minimum: n, exclusiveMinimum: true`, free-form
dicts (tolerations, affinity) into `x-kubernetes-preserve-unknown-fields`, and drop titles,
`additionalProperties: false` (the apiserver prunes unknown fields instead) and null defaults.
`propertyNames`/`patternProperties` (map keys: label and annotation keys, resource names), which a
structural schema cannot hold, are left to the model and the operator (see `_structural`).

The Kubernetes types (rlt.spec.k8s) bring their patterns and bounds, and the models their cross-field rules as
`x-kubernetes-validations` CEL (limit ≥ request, tensor × data parallel ≤ GPUs, colocate needs trainer GPUs, the
run name's length), so `kubectl apply` refuses those before the operator sees them. The rest of the cross-field
rules (batch sizes that must divide, the prompt format against the method, ...) stay in pydantic and
rlt.checks.validation: the operator holds such a run with SpecValid=False naming the field.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from rlt.contract.api import API_GROUP, API_VERSION, KIND, PLURAL, SHORT_NAME
from rlt.spec.k8s import cel_string
from rlt.spec.run import Metadata, RLTRunSpec
from rlt_operator.status.model import RLTRunStatus

CRD_NAME = f"{PLURAL}.{API_GROUP}"
_INT64_RANGE = (-(2**63), 2**63 - 1)

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Run phase."},
    {"name": "Stage", "type": "string", "jsonPath": ".status.stage", "description": "Stage now running."},
    # A Running run trains (Running) or waits: WaitingForPods, WaitingForGenerators, RestartBackOff, ...
    {
        "name": "Trainer",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="TrainerRunning")].reason',
        "description": "Whether the trainer runs, or what it waits for (condition TrainerRunning's reason).",
    },
    {
        "name": "Step",
        "type": "string",
        "jsonPath": ".status.progress.stepOfTotal",
        "description": "Optimizer step of the running stage, as step/total.",
    },
    {
        "name": "Reward",
        "type": "number",
        "jsonPath": ".status.progress.rewardMean",
        "description": "Mean reward of the last step.",
    },
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Gang restarts."},
    # Why the run needs attention (InvalidSpec, Unschedulable, ImagePullBackOff, BackoffLimitExceeded, ...): in the
    # default columns, so that `kubectl get rlt -A` shows it for every run.
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": ".status.reason",
        "description": "Why the run is in its phase or held.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "priority": 1,
        "description": "Detail for the reason.",
    },
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        # The field's own description wins over the class docstring.
        target.update({k: v for k, v in node.items() if k in ("description", "default")})
        node = target
    return {k: _resolve(v, defs) for k, v in node.items()}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    node.pop("title", None)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        kinds = [s for s in any_of if s.get("type") != "null"]
        if len(kinds) != 1:
            raise ValueError(f"cannot express anyOf {any_of} in a structural schema")
        merged = {**kinds[0], **node}
        if len(kinds) < len(any_of):
            merged["nullable"] = True
        node = merged
        node.pop("title", None)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node and "type" not in node:
        types = {type(v) for v in node["enum"]}
        node["type"] = "integer" if types == {int} else "string"
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            node[flag] = node.pop(bound)
            node[bound] = True
    if node.get("default", 0) is None:
        node.pop("default")
    # The API server keeps numeric bounds as float64: the int64 extremes are not representable (1.36 refuses the
    # CRD's field as "Minimum boundary value must be of type integer", 1.29 compares them wrongly). Kubernetes' own
    # schemas say `format: int64` and carry no bounds, as here.
    if node.get("type") == "integer" and (node.get("minimum"), node.get("maximum")) == _INT64_RANGE:
        del node["minimum"], node["maximum"]
        node["format"] = "int64"
    # Map keys (label/annotation keys, resource names): a structural schema has no key patterns, and a CEL rule
    # iterating a map's keys is priced by the apiserver's cost estimator at the worst case of an unbounded map of
    # unbounded strings, which can make the whole CRD uninstallable ("estimated rule cost exceeds budget"). The
    # model checks the keys; the operator holds such a run with SpecValid=False.
    node.pop("propertyNames", None)
    by_pattern = node.pop("patternProperties", None)
    if by_pattern is not None:  # pydantic's form of a map whose key type has a pattern
        ((_pattern, values),) = by_pattern.items()
        node["additionalProperties"] = values
    extra = node.get("additionalProperties")
    if extra is False:
        node.pop("additionalProperties")
    elif extra is True:
        # A free-form object (passed through to pods): keep whatever the user wrote.
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    return {k: _structural(v) for k, v in node.items()}


def _string_rule(schema: dict[str, Any], var: str) -> str:
    """A CEL condition on the string `var` with the pattern and length bound of a string schema."""
    parts = []
    if "maxLength" in schema:
        parts.append(f"{var}.size() <= {schema['maxLength']}")
    if "pattern" in schema:
        parts.append(f"{var}.matches({cel_string(schema['pattern'])})")
    if not parts or set(schema) - {"type", "pattern", "maxLength", "title"}:
        raise ValueError(f"cannot express {schema} as a CEL rule")
    return " && ".join(parts)


def run_name_rule() -> dict[str, str]:
    """The run name's rule (rlt.spec.k8s.RunName) at the root, where CEL sees metadata.name."""
    name = Metadata.model_json_schema()["properties"]["name"]
    return {
        "rule": _string_rule(name, "self.metadata.name"),
        "message": f"metadata.name must be at most {name['maxLength']} characters (child names add suffixes) and "
        "match " + name["pattern"] + " (its Services need DNS-1035 names)",
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    }


def spec_schema() -> dict[str, Any]:
    raw = RLTRunSpec.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(_resolve(raw, defs))
    schema["description"] = "What to train and how: models, data, stages, and the cluster resources of the run."
    return schema


def status_schema() -> dict[str, Any]:
    """From the typed status model: every field the operator writes is listed, so none is pruned."""
    raw = RLTRunStatus.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(_resolve(raw, defs))
    conditions = schema["properties"]["conditions"]
    conditions.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    return schema


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/name": "rlt"}},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["rlt"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "RLTRun trains a Reinforcement-Learned Teacher (method rlt, or rcl for RCL "
                            "adaptive teaching): SFT warm-up, GRPO with the student-based reward on vLLM "
                            "generators, a distillation dataset, then optionally a student distilled from it "
                            "and an evaluation of the models.",
                            "required": ["spec"],
                            "x-kubernetes-validations": [run_name_rule()],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # name declared so that the name rule's fieldPath (.metadata.name) is a valid path
                                # (the only metadata fields a CRD may restrict are name and generateName)
                                "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    header = (
        "# Generated by `make crd` (hack/generate.py) from rlt.spec.run.RLTRunSpec; do not edit (a test compares it).\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)
