"""What the cluster's admission says about a run's children: the pods they would make, and who refused.

A Job or StatefulSet is admitted long before its pods are: a LimitRange, a ResourceQuota on pods or GPUs, Pod
Security and pod webhooks only see the pods, which the Job or StatefulSet controller creates later (a FailedCreate
Event nobody reads). So the dry-run also sends a bare Pod built from each pod template (`template_pod`): the pod the
controller would create, under a name of its own, with the template's labels and annotations.

A refusal that is not about a field (a 403 from a quota, a LimitRange, a policy, a webhook, Pod Security or RBAC; a
404; a 409 for someone else's object) is named by the cluster object the API server's Status message names, and,
where the message names a resource (a quota's `requests.nvidia.com/gpu`, a LimitRange's `cpu per Container`), by the
run's field that sets it (`refused_by`). Pure: strings in, strings out.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from rlt.spec.run import RLTRunSpec
from rlt_operator.builders.common import IPC_LOCK, L_ROLE, ROLE_GENERATOR

# The pod of a Job or StatefulSet sent with dryRun=All: never stored, so its name only has to be valid and not taken.
POD_SUFFIX = "-admission-check"
ROLES = {"jobs": "trainer", "statefulsets": "generator"}


def template_pod(plural: str, child: dict[str, Any]) -> dict[str, Any] | None:
    """The bare Pod the Job's or StatefulSet's controller would create from its template (no owner reference: the
    controller does not exist yet), or None for another kind."""
    if plural not in ROLES:
        return None
    template = child["spec"]["template"]
    meta = template.get("metadata") or {}
    pod_meta: dict[str, Any] = {
        "name": child["metadata"]["name"] + POD_SUFFIX,
        "labels": dict(meta.get("labels") or {}),
    }
    if child["metadata"].get("namespace"):
        pod_meta["namespace"] = child["metadata"]["namespace"]
    if meta.get("annotations"):
        pod_meta["annotations"] = dict(meta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": copy.deepcopy(template["spec"])}


def with_pods(children: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The children and, after each Job or StatefulSet, the pod it would make."""
    out: list[tuple[str, dict[str, Any]]] = []
    for plural, body in children:
        out.append((plural, body))
        pod = template_pod(plural, body)
        if pod is not None:
            out.append(("pods", pod))
    return out


def pod_owner(pod: dict[str, Any]) -> str:
    """`jobs/NAME` or `statefulsets/NAME` for a pod of template_pod ('' for any other)."""
    name = str((pod.get("metadata") or {}).get("name") or "")
    if not name.endswith(POD_SUFFIX):
        return ""
    owner = name[: -len(POD_SUFFIX)]
    role = ((pod.get("metadata") or {}).get("labels") or {}).get(L_ROLE)
    return f"{'statefulsets' if role == ROLE_GENERATOR else 'jobs'}/{owner}"


# --------------------------------------------------------------------------- who refused

_QUOTA = re.compile(r"(?:exceeded|failed|status unknown for) quota: ([^,:\s]+)")
_QUOTA_REQUESTED = re.compile(r"requested: (\S+?), used:")
_QUOTA_UNSET = re.compile(r"must specify ([\w./-]+)")
_LIMIT = re.compile(r"(maximum|minimum) ([\w./-]+) usage per (Container|Pod|PersistentVolumeClaim)")
_RATIO = re.compile(r"([\w./-]+) max limit to request ratio per (Container|Pod)")
_POLICY = re.compile(r"ValidatingAdmissionPolicy '([^']+)'(?: with binding '([^']+)')?")
_WEBHOOK = re.compile(r'admission webhook "([^"]+)"')
_PSA = re.compile(r'violates PodSecurity "([^"]+)"')
_RBAC = re.compile(r'User "([^"]+)" cannot (\w+) resource "([^"]+)"(?: in API group "([^"]*)")?')
_ACCOUNT = re.compile(r"error looking up service account ([^/\s]+)/([^:\s]+)")
_NAMESPACE_GONE = re.compile(r'namespaces? "([^"]+)" not found')
_PRIORITY = re.compile(r"no PriorityClass with name (\S+) was found")


def _resource_field(role: str, resource: str, plural: str) -> str:
    """The run's field behind a quota's or LimitRange's resource name (`requests.nvidia.com/gpu`, `limits.cpu`,
    `pods`, `persistentvolumeclaims`), or ''."""
    if resource.startswith("count/"):  # one more object of a kind: no field of the run sets it
        return ""
    if plural == "persistentvolumeclaims" or resource in ("persistentvolumeclaims", "requests.storage", "storage"):
        return "spec.storage.size" if "storage" in resource else "spec.storage"
    if resource == "pods":
        return f"spec.resources.{role}.{'replicas' if role == 'generator' else 'nodes'}"
    kind, _, name = (
        resource.partition(".") if resource.startswith(("requests.", "limits.")) else ("requests", "", resource)
    )
    fields = {"cpu": "cpu", "memory": "memory", "nvidia.com/gpu": "gpus"}
    if name not in fields and not kind:
        return ""
    if name in ("cpu", "memory") and kind == "limits":
        return f"spec.resources.{role}.{name}Limit"
    if name in fields:
        return f"spec.resources.{role}.{fields[name]}"
    return f"spec.resources.{role}.extra[{name}]" if "/" in name else ""


def _against(fields: list[str]) -> str:
    kept = list(dict.fromkeys(f for f in fields if f))
    return f", against {', '.join(kept)}" if kept else ""


def refused_by(message: str, plural: str, namespace: str, spec: RLTRunSpec | None = None, owner: str = "") -> str:
    """The cluster object (and the run's fields it weighs) that a refusal's Status message names, e.g.
    `ResourceQuota gpus, against spec.resources.trainer.gpus`; '' when the message names none. `owner` is the
    plural of a pod's Job or StatefulSet (the role whose resources count)."""
    role = ROLES.get(owner, "trainer")
    quota = _QUOTA.search(message)
    if quota:
        named = _QUOTA_REQUESTED.search(message)
        resources = [r.split("=")[0] for r in named.group(1).split(",")] if named else []
        resources += _QUOTA_UNSET.findall(message)
        return f"ResourceQuota {quota.group(1)}" + _against([_resource_field(role, r, plural) for r in resources])
    limits = _LIMIT.findall(message)
    ratios = _RATIO.findall(message)
    if limits or ratios:
        fields = [
            _resource_field(role, f"{'limits' if m == 'maximum' else 'requests'}.{r}", plural) for m, r, _ in limits
        ]
        fields += [_resource_field(role, f"limits.{r}", plural) for r, _ in ratios]
        return f"a LimitRange in namespace {namespace} (kubectl -n {namespace} get limitrange)" + _against(fields)
    policy = _POLICY.search(message)
    if policy:
        binding = f" (binding {policy.group(2)})" if policy.group(2) else ""
        return f"ValidatingAdmissionPolicy {policy.group(1)}{binding}"
    webhook = _WEBHOOK.search(message)
    if webhook:
        return f"admission webhook {webhook.group(1)}"
    psa = _PSA.search(message)
    if psa:
        # the one capability a container of the run may keep (builders.common.container_security)
        rdma = [f"spec.resources.{role}.ipcLock"] if IPC_LOCK in message else []
        where = f'Pod Security "{psa.group(1)}" of namespace {namespace} (label pod-security.kubernetes.io/enforce)'
        return where + _against(rdma)
    rbac = _RBAC.search(message)
    if rbac:
        group = f".{rbac.group(4)}" if rbac.group(4) else ""
        return f"RBAC: {rbac.group(1)} may not {rbac.group(2)} {rbac.group(3)}{group} in namespace {namespace}"
    account = _ACCOUNT.search(message)
    if account:
        asked = spec is not None and spec.scheduling.service_account_name == account.group(2)
        return f"ServiceAccount {account.group(2)}" + _against(["spec.scheduling.serviceAccountName" if asked else ""])
    priority = _PRIORITY.search(message)
    if priority:
        return f"PriorityClass {priority.group(1)} (not found), against spec.scheduling.priorityClassName"
    if "being terminated" in message:
        return f"namespace {namespace} (being deleted)"
    gone = _NAMESPACE_GONE.search(message)
    if gone:
        return f"namespace {gone.group(1)} (not found)"
    return ""


def rbac_denial(message: str) -> tuple[str, str] | None:
    """(verb, resource[.group]) of an RBAC 403's message (`User "u" cannot create resource "jobs" in API group
    "batch" ...`), or None for any other refusal."""
    rbac = _RBAC.search(message)
    if not rbac:
        return None
    return rbac.group(2), rbac.group(3) + (f".{rbac.group(4)}" if rbac.group(4) else "")
