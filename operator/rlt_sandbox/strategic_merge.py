"""Strategic-merge patch (`application/strategic-merge-patch+json`) for the built-in kinds, as the API server applies
it: what `helm upgrade`, `helm rollback`, `kubectl apply` (second time on), `kubectl set`/`edit` send.

Written from the Kubernetes API conventions (docs: "Update API Objects in Place Using kubectl patch" and
community/contributors/devel/sig-api-machinery/strategic-merge-patch.md), not from Kubernetes' code:
- maps merge recursively; a null value deletes the key;
- a list whose field declares a patch-merge key (`patchStrategy: merge`, `patchMergeKey`) merges its elements by that
  key: an element of the patch updates the element with the same key, or is appended; `{"$patch": "delete", key: …}`
  removes one; an element `{"$patch": "replace"}` makes the rest of the patch's list the whole list;
- a list of scalars with `patchStrategy: merge` (metadata.finalizers) is a union; `$deleteFromPrimitiveList/<field>`
  removes values from it;
- every other list is atomic: the patch's list replaces it;
- `{"$patch": "replace"}` in a map replaces the map, `{"$patch": "delete"}` deletes it;
- `$retainKeys` (volumes, Deployment strategy) drops the keys of the merged map that it does not list;
- `$setElementOrder/<field>` orders the merged list's elements by the listed keys; elements it does not list keep
  their relative order after those.

Only the fields below declare merge keys here (those of the kinds the chart and the operator create: workloads'
pod templates, Services, object metadata); any other list is treated as atomic, which is what the API server does
for lists without a strategy. Custom resources do not accept strategic-merge patches (the API server answers 415;
clients send JSON merge patches for them): `is_builtin` tells the glue which kinds may.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PatchError", "apply", "is_builtin"]


class PatchError(ValueError):
    """A patch the API server would refuse (the glue answers 422 with this text)."""


@dataclass(frozen=True)
class Struct:
    """A map type: the fields of it that need more than a plain recursive merge."""

    fields: dict[str, Struct | MergeList | ScalarSet] = field(default_factory=dict)


@dataclass(frozen=True)
class MergeList:
    """A list merged by `key` (patchMergeKey); its elements are of type `item`."""

    key: str
    item: Struct = field(default_factory=Struct)


@dataclass(frozen=True)
class ScalarSet:
    """A list of scalars with patchStrategy merge: a union."""


CONTAINER = Struct(
    {
        "env": MergeList("name"),
        "ports": MergeList("containerPort"),
        "volumeMounts": MergeList("mountPath"),
        "volumeDevices": MergeList("devicePath"),
    }
)
POD_SPEC = Struct(
    {
        "containers": MergeList("name", CONTAINER),
        "initContainers": MergeList("name", CONTAINER),
        "ephemeralContainers": MergeList("name", CONTAINER),
        "volumes": MergeList("name"),
        "imagePullSecrets": MergeList("name"),
        "hostAliases": MergeList("ip"),
        "topologySpreadConstraints": MergeList("topologyKey"),
        "resourceClaims": MergeList("name"),
        "schedulingGates": MergeList("name"),
    }
)
METADATA = Struct({"finalizers": ScalarSet(), "ownerReferences": MergeList("uid")})
CONDITIONS = MergeList("type")
TEMPLATE = Struct({"metadata": METADATA, "spec": POD_SPEC})
WORKLOAD_STATUS = Struct({"conditions": CONDITIONS})
POD_STATUS = Struct({"conditions": CONDITIONS})


def _kind(spec: Struct, status: Struct | None = None) -> Struct:
    fields: dict[str, Struct | MergeList | ScalarSet] = {"metadata": METADATA, "spec": spec}
    if status is not None:
        fields["status"] = status
    return Struct(fields)


# (apiVersion group, kind) → the object's type; a built-in kind absent here still merges maps and metadata.
KINDS: dict[tuple[str, str], Struct] = {
    ("", "Pod"): _kind(POD_SPEC, POD_STATUS),
    ("apps", "Deployment"): _kind(Struct({"template": TEMPLATE}), WORKLOAD_STATUS),
    ("apps", "StatefulSet"): _kind(Struct({"template": TEMPLATE}), WORKLOAD_STATUS),
    ("apps", "DaemonSet"): _kind(Struct({"template": TEMPLATE}), WORKLOAD_STATUS),
    ("apps", "ReplicaSet"): _kind(Struct({"template": TEMPLATE}), WORKLOAD_STATUS),
    ("batch", "Job"): _kind(Struct({"template": TEMPLATE}), WORKLOAD_STATUS),
    ("batch", "CronJob"): _kind(
        Struct({"jobTemplate": Struct({"metadata": METADATA, "spec": Struct({"template": TEMPLATE})})})
    ),
    ("", "Service"): _kind(Struct({"ports": MergeList("port")})),
    ("", "Node"): _kind(Struct(), Struct({"conditions": CONDITIONS, "addresses": MergeList("type")})),
}
GENERIC = _kind(Struct())

# API groups whose kinds are compiled into the API server (strategic-merge patches accepted); others are CRDs.
BUILTIN_GROUPS = frozenset(
    {
        "",
        "apps",
        "batch",
        "policy",
        "autoscaling",
        "rbac.authorization.k8s.io",
        "networking.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "discovery.k8s.io",
        "node.k8s.io",
        "apiextensions.k8s.io",
        "admissionregistration.k8s.io",
        "certificates.k8s.io",
    }
)

_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


def is_builtin(group: str) -> bool:
    return group in BUILTIN_GROUPS


def apply(obj: dict[str, Any], patch: Any, group: str, kind: str) -> dict[str, Any]:
    """The object after the strategic-merge `patch`; `obj` is not changed. Raises PatchError for a malformed patch."""
    if not isinstance(patch, dict):
        raise PatchError(f"a strategic-merge patch must be a JSON object, got {type(patch).__name__}")
    merged = _merge_map(copy.deepcopy(obj), patch, KINDS.get((group, kind), GENERIC), "")
    if merged is None:
        raise PatchError('"$patch": "delete" at the top level would delete the object: use DELETE')
    return merged


def _merge_map(base: dict[str, Any], patch: dict[str, Any], schema: Struct, path: str) -> dict[str, Any] | None:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if directive is not None:
        raise PatchError(f'{path or "/"}: unknown "$patch" directive {directive!r} (merge, replace, delete)')
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith(_DELETE_FROM):
            name = key[len(_DELETE_FROM) :]
            if isinstance(base.get(name), list) and isinstance(value, list):
                base[name] = [v for v in base[name] if v not in value]
            continue
        if key.startswith("$"):  # $retainKeys, $setElementOrder: applied below and in _merge_field
            continue
        if value is None:
            base.pop(key, None)
            continue
        merged = _merge_field(base.get(key), value, schema.fields.get(key), f"{path}/{key}", patch.get(_ORDER + key))
        if merged is None:
            base.pop(key, None)
        else:
            base[key] = merged
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError(f'{path or "/"}: "$retainKeys" must be a list of field names')
        base = {k: v for k, v in base.items() if k in retain}
    return base


def _merge_field(base: Any, value: Any, schema: Struct | MergeList | ScalarSet | None, path: str, order: Any) -> Any:
    if isinstance(value, dict):
        struct = schema if isinstance(schema, Struct) else Struct()
        return _merge_map(base if isinstance(base, dict) else {}, value, struct, path)
    if not isinstance(value, list):
        return value
    if isinstance(schema, MergeList):
        merged = _merge_keyed(base if isinstance(base, list) else [], value, schema, path)
        return _reorder(merged, order, schema.key) if isinstance(order, list) else merged
    if isinstance(schema, ScalarSet):
        result = list(base) if isinstance(base, list) else []
        return result + [v for v in value if v not in result]
    return [v for v in value if not (isinstance(v, dict) and "$patch" in v)]  # atomic


def _merge_keyed(base: list[Any], patch: list[Any], schema: MergeList, path: str) -> list[Any]:
    key = schema.key
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    result = list(base)
    for i, item in enumerate(patch):
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"{path}[{i}]: an element of a list merged by {key!r} must be an object with {key!r}")
        at = next((j for j, b in enumerate(result) if isinstance(b, dict) and b.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
            continue
        merged = _merge_map(copy.deepcopy(result[at]) if at is not None else {}, item, schema.item, f"{path}[{i}]")
        if at is None:
            result.append(merged)
        elif merged is None:
            del result[at]
        else:
            result[at] = merged
    return result


def _strip(item: Any) -> Any:
    return {k: v for k, v in item.items() if not k.startswith("$")} if isinstance(item, dict) else item


def _reorder(items: list[Any], order: list[Any], key: str) -> list[Any]:
    rank = {_key_of(o, key): i for i, o in enumerate(order)}
    listed = sorted((it for it in items if _key_of(it, key) in rank), key=lambda it: rank[_key_of(it, key)])
    return listed + [it for it in items if _key_of(it, key) not in rank]


def _key_of(item: Any, key: str) -> Any:
    value = item.get(key) if isinstance(item, dict) else item
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
