"""Kubernetes' own types for what a run passes through to its pods (tolerations, affinity, env field references)
and for its metadata, built from the OpenAPI schema of the chart's oldest Kubernetes, not re-typed by hand.

`k8s_api.json` holds those definitions as kubernetes-validate ships them for K8S_VERSION (the chart's kubeVersion
floor; `hack/generate.py k8s-api` writes it, a test keeps the file equal to the package's), so the operator, whose
image has no kubernetes-validate, checks the same. From them pydantic models are made (unknown fields refused, types
strict, a field newer than the floor unknown); they give the CRD its schema too. What the schema leaves to the API
server's Go validation (pkg/apis/core/validation: ValidateTolerations, ValidateNodeSelectorRequirement,
ValidateAffinity; apimachinery's ValidateLabelSelectorRequirement) — the operators and effects, key and value
grammars and the rules between fields — is added below, each once, with the API server's own wording where it helps.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from rlt.spec import pod_rules
from rlt.spec.k8s import LabelValue, QualifiedName, Quantity

K8S_VERSION = "1.29.0"  # the chart's kubeVersion floor (tests/unit/test_k8s_api.py holds them equal)
DEFS_FILE = Path(__file__).with_name("k8s_api.json")
_PREFIX = "io.k8s."
ROOTS = (
    "api.core.v1.Toleration",
    "api.core.v1.Affinity",
    "api.core.v1.ObjectFieldSelector",
    "api.core.v1.ResourceFieldSelector",
    "apimachinery.pkg.apis.meta.v1.ObjectMeta",
)


def schema_definitions(version: str = K8S_VERSION) -> dict[str, Any]:
    """The definitions ROOTS need (and what they refer to), from kubernetes-validate's strict schemas."""
    from importlib.resources import files

    path = files("kubernetes_validate").joinpath(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json")
    every: dict[str, Any] = json.loads(path.read_text())["$defs"]
    out: dict[str, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                name = ref.split("/")[-1]
                if name not in out:
                    out[name] = every[name]
                    walk(every[name])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for root in ROOTS:
        walk({"$ref": f"#/$defs/{_PREFIX}{root}"})
    return {"kubernetesVersion": version, "definitions": dict(sorted(out.items()))}


def render() -> str:
    """k8s_api.json's text (hack/generate.py k8s-api writes it)."""
    return json.dumps(schema_definitions(), indent=1, sort_keys=True) + "\n"


@cache
def definitions() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads(DEFS_FILE.read_text())["definitions"]
    return defs


# --------------------------------------------------------------------------------------- what Go validation adds

_TOLERATION = "api.core.v1.Toleration"
_NODE_REQ = "api.core.v1.NodeSelectorRequirement"
_LABEL_REQ = "apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement"
_WEIGHT = Annotated[int, Field(ge=1, le=100, description="Weight, in the range 1-100.")]

# (definition, field) -> the type the API server enforces; "" is the API server's default (Equal, every effect).
FIELD_TYPES: dict[tuple[str, str], Any] = {
    (_TOLERATION, "operator"): Literal["", "Equal", "Exists"],
    (_TOLERATION, "effect"): Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"],
    (_NODE_REQ, "key"): QualifiedName,
    (_NODE_REQ, "operator"): Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
    (_LABEL_REQ, "key"): QualifiedName,
    (_LABEL_REQ, "operator"): Literal["In", "NotIn", "Exists", "DoesNotExist"],
    (_LABEL_REQ, "values"): list[LabelValue],
    ("apimachinery.pkg.apis.meta.v1.LabelSelector", "matchLabels"): dict[QualifiedName, LabelValue],
    ("api.core.v1.PodAffinityTerm", "topologyKey"): QualifiedName,
    ("api.core.v1.WeightedPodAffinityTerm", "weight"): _WEIGHT,
    ("api.core.v1.PreferredSchedulingTerm", "weight"): _WEIGHT,
    ("api.core.v1.ResourceFieldSelector", "divisor"): Quantity,
}


def _toleration(t: Any) -> None:
    operator = t.operator or "Equal"  # the API server's default
    if t.key:
        _qualified(t.key, "key")
    elif operator != "Exists":
        raise ValueError('operator: must be Exists when key is empty (which means "match all values and all keys")')
    if t.tolerationSeconds is not None and t.effect != "NoExecute":
        raise ValueError("effect: must be NoExecute when tolerationSeconds is set")
    if operator == "Exists" and t.value:
        raise ValueError(f"value: must be empty when operator is Exists (got {t.value!r})")
    if operator == "Equal" and t.value:
        _label_value(t.value, "value")


def _values_for(operator: str, values: list[str] | None, numeric: bool) -> None:
    values = values or []
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"values: must be specified when operator is {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"values: may not be specified when operator is {operator}")
    if numeric and operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        raise ValueError(f"values: operator {operator} takes exactly one integer value")


def _qualified(value: str, field: str) -> None:
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(QualifiedName).validate_python(value)
    except ValidationError as err:
        raise ValueError(f"{field}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def _label_value(value: str, field: str) -> None:
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(LabelValue).validate_python(value)
    except ValidationError as err:
        raise ValueError(f"{field}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def _node_selector(s: Any) -> None:
    if not s.nodeSelectorTerms:
        raise ValueError("nodeSelectorTerms: must have at least one node selector term")


RULES: dict[str, Any] = {
    _TOLERATION: _toleration,
    _NODE_REQ: lambda r: _values_for(r.operator, r.values, numeric=True),
    _LABEL_REQ: lambda r: _values_for(r.operator, r.values, numeric=False),
    "api.core.v1.NodeSelector": _node_selector,
    # the pod validator's rules for what an env var reads and what a node field selector names
    "api.core.v1.NodeSelectorTerm": pod_rules.node_selector_term,
    "api.core.v1.ObjectFieldSelector": pod_rules.object_field_selector,
    "api.core.v1.ResourceFieldSelector": pod_rules.resource_field_selector,
    "apimachinery.pkg.apis.meta.v1.ObjectMeta": pod_rules.object_meta,
}


# --------------------------------------------------------------------------------------- schema -> models

_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=True)
_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}
_INT_FORMATS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _short_description(schema: dict[str, Any]) -> str | None:
    text = schema.get("description")
    return text.split(". ")[0].rstrip(".") + "." if text else None  # first sentence: the CRD stays small


def _type_of(schema: dict[str, Any]) -> Any:
    """The Python type of a schema node (its nullability is the caller's)."""
    ref = schema.get("$ref")
    if ref is not None:
        name = ref.split("/")[-1].removeprefix(_PREFIX)
        if name == "apimachinery.pkg.api.resource.Quantity":
            return Quantity
        target = definitions()[_PREFIX + name]
        return model(name) if "properties" in target else _type_of(target)  # Time is a string, FieldsV1 any object
    kinds = schema.get("type")
    kinds = [k for k in (kinds if isinstance(kinds, list) else [kinds]) if k != "null"]
    kind = kinds[0] if kinds else None
    if kind == "array":
        return list[_type_of(schema["items"])]  # type: ignore[misc]
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return dict[str, _type_of(extra)]  # type: ignore[misc]
        return dict[str, Any]  # a free-form object (FieldsV1)
    if kind == "integer" and schema.get("format") in _INT_FORMATS:
        low, high = _INT_FORMATS[schema["format"]]
        return Annotated[int, Field(ge=low, le=high)]
    if kind in _SCALARS:
        return _SCALARS[kind]
    raise ValueError(f"cannot type the schema {schema}")


@cache
def model(name: str) -> type[BaseModel]:
    """The pydantic model of definition `name` (without the io.k8s. prefix), e.g. 'api.core.v1.Toleration'."""
    schema = definitions()[_PREFIX + name]
    required = set(schema.get("required", []))
    fields: dict[str, Any] = {}
    for prop, sub in schema.get("properties", {}).items():
        kind = FIELD_TYPES.get((name, prop)) or _type_of(sub)
        if prop in required:
            fields[prop] = (kind, Field(description=_short_description(sub)))
        else:
            fields[prop] = (kind | None, Field(None, description=_short_description(sub)))
    rule = RULES.get(name)
    validators = {}
    if rule is not None:

        def check(self: BaseModel) -> BaseModel:
            rule(self)
            return self

        validators["_api_server_rules"] = model_validator(mode="after")(check)
    short = name.rsplit(".", 1)[-1]
    # pydantic types __validators__ as plain callables, yet create_model reads the proxy model_validator returns
    made: type[BaseModel] = create_model(
        short,
        __config__=_CONFIG,
        __doc__=_short_description(schema),
        __validators__=validators,  # type: ignore[arg-type]
        **fields,
    )
    return made


def dump(value: BaseModel) -> dict[str, Any]:
    """An object as the API takes it: its JSON names, unset fields left out."""
    out: dict[str, Any] = value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


Toleration = model(_TOLERATION)
Affinity = model("api.core.v1.Affinity")
ObjectFieldSelector = model("api.core.v1.ObjectFieldSelector")
ResourceFieldSelector = model("api.core.v1.ResourceFieldSelector")
ObjectMeta = model("apimachinery.pkg.apis.meta.v1.ObjectMeta")
