"""What the API server's pod validation (pkg/apis/core/validation) refuses in the values a run passes into its pods,
beyond the OpenAPI schema: the downward API of an env var (validateObjectFieldSelector,
validateContainerResourceFieldSelector and its divisors), node field selectors (validateNodeFieldSelectorRequirement),
extended-resource names as validateContainerResourceName reads them, and quantities the operator sums.

Each function raises ValueError('<field>: <problem>') so the path of the refusal names the field; rlt.spec.k8s_api
attaches the first three to Kubernetes' own models, rlt.spec.resources the last two to the pod resources.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from pydantic import TypeAdapter, ValidationError

from rlt.spec.k8s import MAX_QUANTITY_VALUE, DNS1123Subdomain, QualifiedName, quantity_value

# validEnvDownwardAPIFieldPathExpressions: what an env var may read of its pod (metadata.labels and
# metadata.annotations only with a key); tests/real_cluster/test_server_pod_rules.py holds it to the real server.
ENV_FIELD_PATHS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.hostIPs",
        "status.podIP",
        "status.podIPs",
    }
)
_SUBSCRIPTED = ("metadata.labels", "metadata.annotations")
# validContainerResourceFieldPathExpressions and the hugepages prefixes
RESOURCE_FIELDS = frozenset(
    f"{kind}.{name}" for kind in ("limits", "requests") for name in ("cpu", "memory", "ephemeral-storage")
)
_HUGEPAGES = ("limits.hugepages-", "requests.hugepages-")
# validContainerResourceDivisorForCPU / ForMemory (compared by value: the server compares the canonical form)
CPU_DIVISORS = {Fraction(1, 1000): "1m", Fraction(1): "1"}
BYTE_DIVISORS = {Fraction(1): "1"}
BYTE_DIVISORS.update({Fraction(10 ** (3 * (i + 1))): f"1{s}" for i, s in enumerate("kMGTPE")})
BYTE_DIVISORS.update({Fraction(2 ** (10 * (i + 1))): f"1{s}i" for i, s in enumerate("KMGTPE")})


def _grammar(kind: Any, value: str, field: str) -> None:
    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError as err:
        raise ValueError(f"{field}: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def object_field_selector(s: Any) -> None:
    """An env var's fieldRef: apiVersion v1 (the server's default when unset) and a path env vars may read."""
    if s.apiVersion not in (None, "v1"):
        raise ValueError(f"apiVersion: {s.apiVersion!r} is not supported by the downward API (only v1)")
    path = s.fieldPath
    if path.endswith("']") and "['" in path:
        base, key = path[:-2].split("['", 1)
        if base not in _SUBSCRIPTED:
            raise ValueError(
                f"fieldPath: {path!r}: {base} does not support a subscript (only {', '.join(_SUBSCRIPTED)})"
            )
        if not key:
            raise ValueError(f"fieldPath: {path!r} has an empty key")
        # the API server checks an annotation key lower-cased, a label key as written
        _grammar(QualifiedName, key.lower() if base == "metadata.annotations" else key, "fieldPath")
    elif path not in ENV_FIELD_PATHS:
        raise ValueError(
            f"fieldPath: {path!r} is not a field an env var can read (supported: {', '.join(sorted(ENV_FIELD_PATHS))},"
            " metadata.labels['<key>'], metadata.annotations['<key>'])"
        )


def resource_field_selector(s: Any) -> None:
    """An env var's resourceFieldRef: a container resource the downward API exposes, a divisor it takes."""
    resource = s.resource
    if resource not in RESOURCE_FIELDS and not resource.startswith(_HUGEPAGES):
        raise ValueError(
            f"resource: {resource!r} is not supported (supported: {', '.join(sorted(RESOURCE_FIELDS))}, "
            "limits.hugepages-<size>, requests.hugepages-<size>)"
        )
    if s.containerName:
        # the env goes into every container of the run (trainer and generator): a named container is absent from
        # the others' pods, and the kubelet fails to start them
        raise ValueError(f"containerName: {s.containerName!r}; leave it out (the container's own resources are read)")
    if s.divisor is None or quantity_value(s.divisor) == 0:
        return  # unset: the server's default (1)
    value = quantity_value(s.divisor)
    allowed = CPU_DIVISORS if resource.endswith(".cpu") else BYTE_DIVISORS
    if value not in allowed:
        raise ValueError(
            f"divisor: {s.divisor!r} is not supported with {resource} (only {', '.join(allowed.values())})"
        )


def node_selector_term(term: Any) -> None:
    """matchFields: the only node field a selector may read is metadata.name, with In/NotIn and one node name."""
    for i, req in enumerate(term.matchFields or []):
        where = f"matchFields.{i}"
        if req.key != "metadata.name":
            raise ValueError(f"{where}.key: {req.key!r} is not a valid field selector key (only metadata.name)")
        if req.operator not in ("In", "NotIn"):
            raise ValueError(f"{where}.operator: {req.operator} is not supported for a node field selector (In, NotIn)")
        if len(req.values or []) != 1:
            raise ValueError(f"{where}.values: must be exactly one node name with operator {req.operator}")
        _grammar(DNS1123Subdomain, req.values[0], f"{where}.values")


# ------------------------------------------------------------------------------------------------ pod resources

GPU = "nvidia.com/gpu"  # the operator's name for resources.<role>.gpus (rlt_operator.builders.common.GPU)
_REQUESTS_PREFIX = "requests."


def extended_resource_problem(name: str) -> str | None:
    """Why `name` cannot be an extended resource of a pod. The pod validator (validateContainerResourceName) refuses
    a name starting with "requests." or whose "requests." + name is no qualified name. A name in Kubernetes' own
    domain it lets through, but the scheduler counts it as a native node resource that no device plugin can
    advertise, so the pod stays Pending: refused here too (the one place rlt is stricter than the server)."""
    domain = name.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return (
            f"{name!r} is in Kubernetes' own domain (kubernetes.io): the scheduler reads it as a native resource no "
            "device plugin advertises, so the pod would stay Pending; use your device's domain"
        )
    if name.startswith(_REQUESTS_PREFIX):
        return f"{name!r} starts with 'requests.', which Kubernetes keeps for quota names"
    if len(_REQUESTS_PREFIX + domain) > 253:
        return f"{name!r}: its domain is {len(domain)} characters, over 244 (the server checks it behind 'requests.')"
    return None


def _mi(value: Fraction) -> Fraction:
    # the operator writes memory plus /dev/shm rounded up to Mi (rlt_operator.builders.common._plus_shm)
    return Fraction(math.ceil(value / 2**20) * 2**20)


def resource_problems(res: Any) -> list[str]:
    """'field: problem' lines for a role's resources as the operator renders them into the container."""
    out = []
    for name in res.extra:
        problem = extended_resource_problem(name)
        if problem:
            out.append(f"extra: key {problem}")
    if res.gpus and GPU in res.extra:
        out.append(f"extra: {GPU} is also set by gpus ({res.gpus}); give it once (gpus)")
    sums = {
        "gpus": Fraction(res.gpus),
        "cpu": quantity_value(res.cpu_request()),
        "memory": _mi(quantity_value(res.memory_request()) + quantity_value(res.shared_memory)),
    }
    if res.memory_limit is not None:
        sums["memoryLimit"] = _mi(quantity_value(res.memory_limit) + quantity_value(res.shared_memory))
    for field, total in sums.items():
        if total > MAX_QUANTITY_VALUE:
            what = {"gpus": "the GPU count", "cpu": "the CPU request (4 per GPU unless cpu is set)"}.get(
                field, f"{field} plus sharedMemory (what the pod requests)"
            )
            out.append(f"{field}: {what} is above 2^63-1, the most a Kubernetes quantity holds")
    return out


# ------------------------------------------------------------------------------------------------ object metadata


def object_meta(meta: Any) -> None:
    """apimachinery's ValidateObjectMeta on what the schema leaves free: generateName is a name prefix (a DNS
    subdomain once its trailing '-' is masked), each finalizer a qualified name, orphan and foregroundDeletion not
    both."""
    if meta.generateName:
        masked = meta.generateName[:-1] + "a" if meta.generateName.endswith("-") else meta.generateName
        _grammar(DNS1123Subdomain, masked, "generateName")
    finalizers = meta.finalizers or []
    for i, name in enumerate(finalizers):
        try:
            TypeAdapter(QualifiedName).validate_python(name)
        except ValidationError:
            raise ValueError(
                f"finalizers.{i}: {name!r} is not a finalizer name (a qualified name: [DNS-subdomain prefix/]name of "
                "letters, digits, '-', '_', '.'; e.g. example.com/cleanup)"
            ) from None
    if "orphan" in finalizers and "foregroundDeletion" in finalizers:
        raise ValueError("finalizers: orphan and foregroundDeletion cannot both be set")
