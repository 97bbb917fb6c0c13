"""The CRD's CEL rules stay within what a real API server accepts and never fail at run time.

A real kube-apiserver estimates each rule's worst-case cost from the schema before it accepts a CRD, and refuses the
whole CRD when a rule's estimate exceeds the budget (cel-python, which evaluates the rules in test_crd_cel.py, has no
cost estimator, and kmock installs any CRD). This is the in-CI guard, a static check of the constructs the estimator
cannot bound or that raise evaluation errors; tests/real_cluster/ installs the CRD on a real API server.

- no `string(...)`: the estimator cannot bound the length of a number printed as a string (the cause of
  "estimated rule cost exceeds budget by factor of more than 100x" on every real server);
- every string, list or map a rule reads is bounded (maxLength / enum, maxItems, maxProperties);
- `quantity(x)` only after `isQuantity(x)`, `a % b` only after `b <= 0 ||`, no int products (overflow): a value the
  schema refuses must get the schema's message, not also an evaluation error;
- a rule on a field names it (fieldPath, reason), so the refusal says which field.
"""

from __future__ import annotations

import re

import pytest

from rlt_operator import crd

ROOT = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
# The API server bounds these itself (ObjectMeta: a name is a DNS subdomain of at most 253 characters).
SERVER_BOUNDED = {"metadata.name"}


def _rules(node, path=""):
    for rule in node.get("x-kubernetes-validations", []):
        yield path or "<root>", node, rule
    for name, sub in (node.get("properties") or {}).items():
        yield from _rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _rules(node[key], f"{path}[]")


def _resolve(node, dotted: str):
    """The schema of `self.<dotted>` from the rule's node, or None past the schema (a method name)."""
    for part in dotted.split("."):
        props = node.get("properties") or {}
        if part not in props:
            return None
        node = props[part]
    return node


def cost_problems(node, rule: str) -> list[str]:
    """What in one rule the API server's cost estimator cannot bound, or what can raise at evaluation time."""
    out = []
    if re.search(r"\bstring\(", rule):
        out.append("string(...) has no length bound the estimator can see: compare numbers instead")
    for ref in sorted(set(re.findall(r"\bself((?:\.\w+)+)", rule))):
        parts = ref.lstrip(".").split(".")
        # the longest prefix that is a field (the rest is a method: size, matches, ...)
        for n in range(len(parts), 0, -1):
            field = ".".join(parts[:n])
            sub = _resolve(node, field)
            if sub is not None:
                break
        else:
            out.append(f"self{ref}: not in the schema")
            continue
        if field in SERVER_BOUNDED:
            continue
        kind = sub.get("type")
        if kind == "string" and "maxLength" not in sub and "enum" not in sub:
            out.append(f"self.{field}: a string without maxLength or enum")
        if kind == "array" and "maxItems" not in sub:
            out.append(f"self.{field}: a list without maxItems")
        if kind == "object" and isinstance(sub.get("additionalProperties"), dict) and "maxProperties" not in sub:
            out.append(f"self.{field}: a map without maxProperties")
    for arg in re.findall(r"\bquantity\((self(?:\.\w+)+)\)", rule):
        if f"isQuantity({arg})" not in rule:
            out.append(f"quantity({arg}) without isQuantity({arg}) first: an evaluation error on a bad value")
    for divisor in re.findall(r"%\s*(self(?:\.\w+)+)", rule):
        if f"{divisor} <= 0 ||" not in rule and f"{divisor} == 0 ||" not in rule:
            out.append(f"% {divisor} without a guard against zero: 'modulus by zero' at evaluation")
    if re.search(r"(?<!double\()\bself(?:\.\w+)+\s*\*|\*\s*self\.", rule):
        out.append("an int product can overflow (an evaluation error): multiply double(...)s")
    return out


RULES = list(_rules(ROOT))


@pytest.mark.parametrize("path, node, rule", RULES, ids=[f"{p}:{r['message'][:40]}" for p, _n, r in RULES])
def test_every_cel_rule_is_bounded_and_cannot_fail(path, node, rule):
    assert cost_problems(node, rule["rule"]) == [], f"{path}: {rule['rule']}"


@pytest.mark.parametrize("path, node, rule", RULES, ids=[f"{p}:{r['message'][:40]}" for p, _n, r in RULES])
def test_every_rule_on_a_field_names_it(path, node, rule):
    """A rule that reads one field of its object reports at that field (the server's refusal names it)."""
    assert rule.get("fieldPath", "").startswith("."), f"{path}: {rule['message']} has no fieldPath"
    assert rule.get("reason") == "FieldValueInvalid"
    # a real API server refuses a fieldPath that is not a property of the schema ("must be a valid path")
    target = _resolve(ROOT if path == "<root>" else node, rule["fieldPath"].lstrip("."))
    assert target is not None, f"{path}: fieldPath {rule['fieldPath']} is not in the schema"


def test_the_guard_catches_what_real_servers_refused():
    """The rules a real 1.29/1.36 API server refused (issue 31), and the runtime errors it reported."""
    node = {
        "properties": {
            "gpus": {"type": "integer"},
            "memory": {"type": "string", "maxLength": 64},
            "memoryLimit": {"type": "string", "maxLength": 64},
            "free": {"type": "string"},
            "batchSize": {"type": "integer"},
            "numGenerations": {"type": "integer"},
        }
    }
    old = (  # the generated memoryLimit rule before the fix
        "!has(self.memoryLimit) || quantity(self.memoryLimit).compareTo((has(self.memory) ? quantity(self.memory) "
        ": quantity(string(self.gpus * 32 > 8 ? self.gpus * 32 : 8) + 'Gi'))) >= 0"
    )
    assert any("string(" in p for p in cost_problems(node, old))
    assert any("overflow" in p for p in cost_problems(node, old))
    assert any("isQuantity" in p for p in cost_problems(node, old))
    assert any("without maxLength" in p for p in cost_problems(node, "self.free.matches('^a$')"))
    assert any("modulus" in p for p in cost_problems(node, "self.batchSize % self.numGenerations == 0"))
    assert cost_problems(node, "self.numGenerations <= 0 || self.batchSize % self.numGenerations == 0") == []
