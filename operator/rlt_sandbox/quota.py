"""ResourceQuota admission of pods, as the API server's quota plugin decides it, for the emulated API.

A pod whose requests or limits would take a namespace's usage over a ResourceQuota's `spec.hard` is refused (403
Forbidden, `exceeded quota: NAME, requested: ..., used: ..., limited: ...`), and a pod that leaves out a request or
limit of cpu or memory that a quota constrains is refused (`failed quota: NAME: must specify ...`). Usage is that of
the namespace's pods that are neither finished (phase Succeeded or Failed) nor being deleted. Covered: `pods`,
`cpu`/`memory`/`ephemeral-storage` (= their `requests.`), `requests.<resource>` and `limits.<resource>` for any
resource (e.g. `requests.nvidia.com/gpu`); object counts of any other kind (`count/jobs.batch`, and the
standard names `persistentvolumeclaims`, `services`, `configmaps`) and a claim's `requests.storage`, used by the
namespace's objects of that kind that are not being deleted (`object_refusal`). Not covered: scopes, scope
selectors, per-StorageClass storage, priority classes, and `status.used` (nothing writes it).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

# A bare compute resource in spec.hard means its request
_BARE = ("cpu", "memory", "ephemeral-storage")
# A quota on these makes every container state them (extended resources such as GPUs need not be stated)
_MUST_SPECIFY = ("requests.cpu", "requests.memory", "limits.cpu", "limits.memory")
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def _quantity(q: str | int | float) -> Decimal:
    """A quantity's value (`500m`, `32Gi`), by the client's parser."""
    value: Decimal = parse_quantity(q)  # type: ignore[no-untyped-call]  # kubernetes ships no type information
    return value


def _key(name: str) -> str:
    return f"requests.{name}" if name in _BARE else name


def pod_usage(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What one pod counts against quotas: `pods` 1, and per resource its effective request and limit (the larger
    of its containers' sum and its largest init container's, as the scheduler and the quota plugin count)."""
    spec = pod.get("spec") or {}
    out: dict[str, Decimal] = {"pods": Decimal(1)}
    for kind in ("requests", "limits"):
        total: dict[str, Decimal] = {}
        for c in spec.get("containers") or []:
            for res, q in ((c.get("resources") or {}).get(kind) or {}).items():
                total[res] = total.get(res, Decimal(0)) + _quantity(q)
        for c in spec.get("initContainers") or []:
            for res, q in ((c.get("resources") or {}).get(kind) or {}).items():
                total[res] = max(total.get(res, Decimal(0)), _quantity(q))
        out |= {f"{kind}.{res}": q for res, q in total.items()}
    return out


def _counts(pod: dict[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")


def show(resource: str, q: Decimal) -> str:
    """A quantity as the API server prints it (canonical form: 1, 500m, 32Gi)."""
    if q != q.to_integral_value():
        return f"{int(q * 1000)}m"
    n = int(q)
    if "memory" in resource or "storage" in resource:
        for suffix, unit in _BINARY:
            if n and n % unit == 0:
                return f"{n // unit}{suffix}"
    return str(n)


def refusal(pod: dict[str, Any], quotas: list[dict[str, Any]], pods: list[dict[str, Any]]) -> str | None:
    """Why the API server refuses to create `pod` in a namespace with `quotas` and `pods` (its other pods), or
    None. The message is the Status message: `pods "NAME" is forbidden: ...`."""
    name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName", "")
    wanted = pod_usage(pod)
    used: dict[str, Decimal] = {}
    for other in pods:
        if _counts(other):
            for res, q in pod_usage(other).items():
                used[res] = used.get(res, Decimal(0)) + q
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = {_key(res): _quantity(q) for res, q in ((quota.get("spec") or {}).get("hard") or {}).items()}
        qname = quota["metadata"]["name"]
        containers = (pod.get("spec") or {}).get("containers") or []
        unset = [
            f"{res} for: {','.join(c['name'] for c in containers if _missing(c, res))}"
            for res in sorted(hard)
            if res in _MUST_SPECIFY and any(_missing(c, res) for c in containers)
        ]
        if unset:
            return f'pods "{name}" is forbidden: failed quota: {qname}: must specify {"; ".join(unset)}'
        over = sorted(res for res, limit in hard.items() if res in wanted and used.get(res, 0) + wanted[res] > limit)
        if over:

            def listed(values: dict[str, Decimal], over: list[str] = over) -> str:
                return ",".join(f"{res}={show(res, values.get(res, Decimal(0)))}" for res in over)

            return (
                f'pods "{name}" is forbidden: exceeded quota: {qname}, requested: {listed(wanted)}, '
                f"used: {listed(used)}, limited: {listed(hard)}"
            )
    return None


def _missing(container: dict[str, Any], res: str) -> bool:
    kind, _, resource = res.partition(".")
    return resource not in ((container.get("resources") or {}).get(kind) or {})


# Kinds whose object count a quota names without `count/` (the quota plugin's standard names)
_STANDARD_COUNTS = ("persistentvolumeclaims", "services", "configmaps", "secrets", "replicationcontrollers")


def object_usage(plural: str, group: str, obj: dict[str, Any]) -> dict[str, Decimal]:
    """What one object of a kind other than pods counts against quotas: its count (`count/<plural>[.<group>]`, and
    the standard name for the core kinds that have one) and, for a claim, the storage it requests."""
    out = {f"count/{plural}{'.' + group if group else ''}": Decimal(1)}
    if not group and plural in _STANDARD_COUNTS:
        out[plural] = Decimal(1)
    if not group and plural == "persistentvolumeclaims":
        storage = (((obj.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
        if storage is not None:
            out["requests.storage"] = _quantity(storage)
    return out


def object_refusal(
    plural: str, group: str, obj: dict[str, Any], quotas: list[dict[str, Any]], others: list[dict[str, Any]]
) -> str | None:
    """Why the API server refuses to create `obj` (not a pod) in a namespace with `quotas` and `others` (its objects
    of the same kind), or None: `persistentvolumeclaims "NAME" is forbidden: exceeded quota: ...`."""
    wanted = object_usage(plural, group, obj)
    used: dict[str, Decimal] = {}
    for other in others:
        if not (other.get("metadata") or {}).get("deletionTimestamp"):
            for res, q in object_usage(plural, group, other).items():
                used[res] = used.get(res, Decimal(0)) + q
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = {res: _quantity(q) for res, q in ((quota.get("spec") or {}).get("hard") or {}).items()}
        over = sorted(res for res, limit in hard.items() if res in wanted and used.get(res, 0) + wanted[res] > limit)
        if over:

            def listed(values: dict[str, Decimal], over: list[str] = over) -> str:
                return ",".join(f"{res}={show(res, values.get(res, Decimal(0)))}" for res in over)

            name = (obj.get("metadata") or {}).get("name", "")
            kind = f"{plural}.{group}" if group else plural
            return (
                f'{kind} "{name}" is forbidden: exceeded quota: {quota["metadata"]["name"]}, requested: '
                f"{listed(wanted)}, used: {listed(used)}, limited: {listed(hard)}"
            )
    return None
