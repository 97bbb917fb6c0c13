"""The CRD's own door: every pattern, bound and `x-kubernetes-validations` CEL rule of the generated CRD refuses exactly
what the pydantic model (and so `rlt validate` and the operator) refuses, on the same inputs.

The CEL rules are compiled and evaluated by cel-python (celpy), with the Kubernetes `quantity()` library function
bound to rlt's one quantity parser (rlt.spec.k8s.quantity_value); the schema part (types, patterns, bounds) by
jsonschema, after the apiserver's defaulting (every property default filled in, as the apiserver does before it
validates)."""

from __future__ import annotations

import copy
import math
import sys
from fractions import Fraction

import jsonschema
import pytest
from suite_helpers import deep_merge, openapi_to_jsonschema, tiny_doc

from rlt.checks.validation import run_name_problem
from rlt.spec.k8s import quantity_value
from rlt.spec.loading import SpecError, parse_run
from rlt_operator import crd

celpy = pytest.importorskip("celpy")
from celpy import celtypes  # noqa: E402

ROOT = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


class _Quantity(celtypes.StringType):
    """The value `quantity(s)` returns in the apiserver's CEL library: here the string, compared by its value."""


def _quantity(s):
    q = _Quantity(str(s))
    quantity_value(str(q))  # an unparsable quantity is an evaluation error, as in the apiserver
    return q


def _compare_to(a, b) -> celtypes.IntType:
    x, y = Fraction(quantity_value(str(a))), Fraction(quantity_value(str(b)))
    return celtypes.IntType((x > y) - (x < y))


def _is_quantity(s) -> celtypes.BoolType:
    try:
        quantity_value(str(s))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _as_approximate_float(q) -> celtypes.DoubleType:
    value = quantity_value(str(q))
    # Go's AsApproximateFloat gives +Inf past the largest double, where Python's float() raises
    return celtypes.DoubleType(float(value) if value < sys.float_info.max else math.inf)


def _is_greater_than(a, b) -> celtypes.BoolType:
    return celtypes.BoolType(quantity_value(str(a)) > quantity_value(str(b)))


FUNCTIONS = {
    "quantity": _quantity,
    "compareTo": _compare_to,
    "isQuantity": _is_quantity,
    "asApproximateFloat": _as_approximate_float,
    "isGreaterThan": _is_greater_than,
}
_ENV = celpy.Environment()
_PROGRAMS: dict[str, object] = {}


def _program(rule: str):
    """A rule compiled once (the property test evaluates every rule thousands of times)."""
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule), functions=FUNCTIONS)
    return _PROGRAMS[rule]


def _rules(node, path=""):
    """(schema path, rule) of every CEL rule, walking properties, list items and map values."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in (node.get("properties") or {}).items():
        yield from _rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _rules(node[key], f"{path}[]")


def _defaulted(value, schema):
    """The apiserver's defaulting: missing properties with a default get it, recursively into what is present."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _defaulted(value[name], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            _defaulted(v, schema["items"])
    return value


def _without_nulls(value):
    """The value as the apiserver's CEL sees it: a null in a nullable field is absent (has() is false), as
    kube-apiserver 1.36 shows (tests/real_cluster: `maxModelLen: null` is accepted)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _cel_failures(value, schema, path="") -> list[str]:
    """Messages of the CEL rules the value breaks, evaluating each rule where its schema node has a value."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(_without_nulls(value))})
        except celpy.CELEvalError as err:  # cel-python raises some evaluation errors instead of returning them
            result = err
        if isinstance(result, celpy.CELEvalError) or not result:
            out.append(f"{path or '<root>'}: {rule['message']}")
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value and value[name] is not None:
                out += _cel_failures(value[name], sub, f"{path}.{name}")
        if isinstance(schema.get("additionalProperties"), dict):
            out += [f for v in value.values() for f in _cel_failures(v, schema["additionalProperties"], path)]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        out += [f for v in value for f in _cel_failures(v, schema["items"], f"{path}[]")]
    return out


_SCHEMA = jsonschema.Draft4Validator(
    openapi_to_jsonschema({**ROOT, "properties": {**ROOT["properties"], "status": {}}})
)


def crd_refusals(doc) -> list[str]:
    """What `kubectl apply` would hear from the apiserver: schema errors, then CEL rule messages."""
    doc = _defaulted(copy.deepcopy(doc), ROOT)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in _SCHEMA.iter_errors(doc)]
    return errors or _cel_failures(doc, ROOT)


def model_refusals(doc) -> list[str]:
    try:
        run = parse_run(copy.deepcopy(doc))
    except SpecError as err:
        return err.problems
    problem = run_name_problem(run.name)
    return [problem] if problem else []


def _patched(patch: dict, name: str | None = None) -> dict:
    doc = tiny_doc()

    deep_merge(doc["spec"], patch)
    if name is not None:
        doc["metadata"]["name"] = name
    return doc


def _trainer(**res):
    return {"resources": {"trainer": res}}


# Refused by the model and the operator only: the CRD has no map-key rules (rlt_operator.crd._structural says why).
MODEL_ONLY = {"extended resource name without a domain", "annotation key with spaces", "annotation key two slashes"}

# (case, spec patch, run name, the field the model names or None when valid)
CASES = [
    ("limit equals request in other units", _trainer(memory="1Gi", memoryLimit="1024Mi"), None, None),
    ("limit above request", _trainer(memory="1000Gi", memoryLimit="1Ti"), None, None),
    ("limit below request", _trainer(memory="64Gi", memoryLimit="32Gi"), None, "memoryLimit"),
    ("decimal G below binary Gi", _trainer(memory="8Gi", memoryLimit="8G"), None, "memoryLimit"),
    ("limit below the default request", _trainer(gpus=1, memoryLimit="8Gi"), None, "memoryLimit"),
    ("limit at the default floor", _trainer(gpus=0, memoryLimit="8Gi"), None, None),
    ("limit under the default floor", _trainer(gpus=0, memoryLimit="7Gi"), None, "memoryLimit"),
    ("limit as an exponent", _trainer(memory="1e9", memoryLimit="1G"), None, None),
    ("cpu limit under the default", _trainer(gpus=0, cpuLimit="500m"), None, "cpuLimit"),
    ("cpu limit at the default", _trainer(gpus=0, cpuLimit="1"), None, None),
    ("cpu limit in millicores", _trainer(cpu="4", cpuLimit="4000m"), None, None),
    ("cpu limit fractional below", _trainer(gpus=1, cpuLimit="3.5"), None, "cpuLimit"),
    ("quantity with a space", {"storage": {"size": "1 TB"}}, None, "storage.size"),
    ("quantity with a bad suffix", {"storage": {"size": "1TB"}}, None, "storage.size"),
    ("quantity negative", _trainer(memory="-1Gi"), None, "memory"),
    ("storage of zero", {"storage": {"size": "0Gi"}}, None, "storage.size"),
    ("storage of a millibyte", {"storage": {"size": "1m"}}, None, None),
    ("write rate of zero", {"storage": {"writeBytesPerSecond": "0"}}, None, "writeBytesPerSecond"),
    ("write rate of 250 MB/s", {"storage": {"writeBytesPerSecond": "250M"}}, None, None),
    ("image with a space", {"images": {"trainer": "ghcr.io/x/y: 1"}}, None, "images.trainer"),
    ("quantity .5", _trainer(cpu=".5"), None, None),
    ("quantity too long", _trainer(cpu="1" * 65), None, "cpu"),
    ("extended resource not a number", _trainer(extra={"rdma/hca": "lots"}), None, "extra"),
    ("extended resource name without a domain", _trainer(extra={"hca": "1"}), None, "extra"),
    ("extended resource fine", _trainer(extra={"nvidia.com/mig-3g.40gb": "1"}), None, None),
    ("annotation key with spaces", {"scheduling": {"podAnnotations": {"not a key!": "x"}}}, None, "podAnnotations"),
    ("annotation key with a prefix", {"scheduling": {"podAnnotations": {"example.com/ok-1": "x y"}}}, None, None),
    ("annotation key two slashes", {"scheduling": {"podAnnotations": {"a/b/c": "x"}}}, None, "podAnnotations"),
    ("node selector value with a space", {"scheduling": {"nodeSelector": {"pool": "a b"}}}, None, "nodeSelector"),
    ("queue name not a label value", {"scheduling": {"queueName": "bad queue!"}}, None, "queueName"),
    ("queue name too long", {"scheduling": {"queueName": "q" * 64}}, None, "queueName"),
    ("queue name fine", {"scheduling": {"queueName": "team-a.gpu-queue"}}, None, None),
    ("storage class uppercase", {"storage": {"storageClassName": "Fast"}}, None, "storageClassName"),
    ("env var name with a dash", {"env": [{"name": "MY-VAR", "value": "1"}]}, None, "env"),
    ("secret name with underscore", {"hfTokenSecret": {"name": "hf_token"}}, None, "hfTokenSecret"),
    (
        "generator tp x dp over gpus",
        {"resources": {"generator": {"gpus": 3, "tensorParallelSize": 2, "dataParallelSize": 2}}},
        None,
        "generator",
    ),
    (
        "generator tp x dp fits",
        {"resources": {"generator": {"gpus": 4, "tensorParallelSize": 2, "dataParallelSize": 2}}},
        None,
        None,
    ),
    (
        "colocate without trainer gpus",
        {"resources": {"trainer": {"gpus": 0}}, "stages": {"rl": {"generation": {"mode": "colocate"}}}},
        None,
        "gpus",
    ),
    (
        "colocate with a trainer gpu",
        {"resources": {"trainer": {"gpus": 1}}, "stages": {"rl": {"generation": {"mode": "colocate"}}}},
        None,
        None,
    ),
    (
        "colocate on a disabled rl",
        {
            "resources": {"trainer": {"gpus": 0}},
            "stages": {"rl": {"enabled": False, "generation": {"mode": "colocate"}}},
        },
        None,
        None,
    ),
    (
        "rl batch not a multiple of the group",
        {"stages": {"rl": {"batchSize": 10, "numGenerations": 4}}},
        None,
        "batchSize",
    ),
    (
        "rl micro-batch does not divide",
        {"stages": {"rl": {"batchSize": 8, "numGenerations": 4, "perDeviceBatchSize": 3}}},
        None,
        "batchSize",
    ),
    (
        "rl batches divide",
        {"stages": {"rl": {"batchSize": 8, "numGenerations": 4, "perDeviceBatchSize": 2}}},
        None,
        None,
    ),
    (
        "sft micro-batch does not divide",
        {"stages": {"sft": {"batchSize": 6, "perDeviceBatchSize": 4}}},
        None,
        "batchSize",
    ),
    (
        "student micro-batch does not divide",
        {"stages": {"student": {"batchSize": 6, "perDeviceBatchSize": 4}}},
        None,
        "batchSize",
    ),
    (
        "student batch not a multiple of the trainer processes",
        {"resources": {"trainer": {"gpus": 3}}, "stages": {"student": {"enabled": True, "batchSize": 4}}},
        None,
        "batchSize",
    ),
    (
        "batches a multiple of the trainer processes",
        {
            "resources": {"trainer": {"gpus": 2}},
            "stages": {
                "sft": {"perDeviceBatchSize": 2},
                "student": {"enabled": True, "batchSize": 8, "perDeviceBatchSize": 2},
            },
        },
        None,
        None,
    ),
    ("rl batch over 8 default processes", {"resources": {"trainer": {"gpus": 8}}}, None, "batchSize"),
    (
        "evaluate with no held-out rows",
        {"dataset": {"source": "org/data"}, "stages": {"evaluate": {"enabled": True}}},
        None,
        "evalFraction",
    ),
    (
        "evaluate on held-out rows",
        {"dataset": {"source": "org/data", "evalFraction": 0.1}, "stages": {"evaluate": {"enabled": True}}},
        None,
        None,
    ),
    ("evaluate a built-in task on fresh problems", {"stages": {"evaluate": {"enabled": True}}}, None, None),
    (
        "server generators without a device",
        {"stages": {"rl": {"generation": {"mode": "server"}}}, "resources": {"generator": {"gpus": 0}}},
        None,
        "gpus",
    ),
    (
        "server generators on a MIG device",
        {
            "stages": {"rl": {"generation": {"mode": "server"}}},
            "resources": {"generator": {"gpus": 0, "extra": {"nvidia.com/mig-3g.40gb": "1"}}},
        },
        None,
        None,
    ),
    (
        "prompt and completion over maxModelLen",
        {"stages": {"rl": {"generation": {"mode": "colocate", "maxModelLen": 200}}}},
        None,
        "maxModelLen",
    ),
    (
        "prompt and completion within maxModelLen",
        {"stages": {"rl": {"generation": {"mode": "colocate", "maxModelLen": 280}}}},
        None,
        None,
    ),
    ("run name of 40", {}, "a" * 40, None),
    ("run name of 41", {}, "a" * 41, "metadata.name"),
    ("run name with a digit first", {}, "1run", "metadata.name"),
    ("run name ending in a dash", {}, "run-", "metadata.name"),
]


@pytest.mark.parametrize("case, patch, name, field", CASES, ids=[c[0] for c in CASES])
def test_the_crd_refuses_what_the_model_refuses(case, patch, name, field):
    doc = _patched(patch, name)
    model, schema = model_refusals(doc), crd_refusals(doc)
    if field is None:
        assert model == [] and schema == [], (model, schema)
    else:
        assert any(field in p for p in model), model
        if case in MODEL_ONLY:
            assert schema == [], f"the CRD refuses a case listed as model-only: {schema}"
        else:
            assert schema, f"the CRD lets through what the model refuses: {model}"


def test_every_cel_rule_is_exercised_both_ways():
    """Each CEL rule of the CRD is broken by some case above and kept by another: none is dead or always false."""
    rules = {r["message"] for _, r in _rules(ROOT)}
    broken = {m.split(": ", 1)[1] for c in CASES for m in crd_refusals(_patched(c[1], c[2])) if ": " in m}
    assert rules <= broken, f"CEL rules no case breaks: {rules - broken}"
    valid = [_patched(c[1], c[2]) for c in CASES if c[3] is None]
    assert all(crd_refusals(d) == [] for d in valid)


def _cel_errors(value, schema) -> list[str]:
    """Evaluation errors (not refusals) of every CEL rule where its node has a value: the API server evaluates the
    rules even when the schema has refused a field, and adds such errors to its refusal."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = _ENV.program(_ENV.compile(rule["rule"]), functions=FUNCTIONS)
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, celpy.CELEvalError):
            out.append(f"{rule['message']}: {result}")
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if isinstance(value.get(name), (dict, list)):
                out += _cel_errors(value[name], sub)
    return out


@pytest.mark.parametrize(
    "patch",
    [
        {"stages": {"rl": {"batchSize": 8, "numGenerations": 0}}},
        {"stages": {"sft": {"batchSize": 8, "perDeviceBatchSize": 0}}},
        {"storage": {"size": "1 TB"}},
        _trainer(cpu="lots", cpuLimit="4"),
        _trainer(memoryLimit="8 Gi"),
        _trainer(gpus=2**62, memoryLimit="1Gi"),
        {"resources": {"generator": {"gpus": 1, "tensorParallelSize": 2**62, "dataParallelSize": 2**62}}},
    ],
    ids=[
        "numGenerations 0",
        "perDeviceBatchSize 0",
        "size 1 TB",
        "cpu not a quantity",
        "limit not a quantity",
        "gpus near int64",
        "tp x dp past int64",
    ],
)
def test_no_cel_rule_fails_at_evaluation(patch):
    """A value the schema refuses gets the schema's message only: no 'modulus by zero', no quantity parse error,
    no int overflow from a CEL rule beside it."""
    doc = _defaulted(_patched(patch), ROOT)
    assert _cel_errors(doc, ROOT) == []
