"""The run's children checked by the API server itself before any is created: a server-side dry-run.

The offline door (`rlt validate`) restates Kubernetes' rules in Python; the API server that will store the children
is the reference. Before the first create of a new run, and when each stage begins, every child the stage needs is
rendered and POSTed with `dryRun=All` (validated and admitted as a create, stored nowhere), and so is a bare Pod built
from each Job's and StatefulSet's pod template (rlt_operator.apply.admission), so that pod-level admission (a LimitRange, a
quota on pods or GPUs, Pod Security, pod webhooks) is asked too. Any refusal holds the run with nothing created, so
no pod starts and nothing holds quota:
- invalid (400, 413, 422): `ChildrenValid=False`, reason `ChildInvalid`, naming the run's own field that produced the
  refused child field (`spec_field`, a table from child paths back to spec paths);
- refused by the cluster (403: a quota, a LimitRange, a policy or webhook, Pod Security, RBAC; 404: no namespace):
  reason `ChildRefused`, naming the cluster object the server's message names and the run's field it weighs
  (admission.refused_by);
- a name that is someone else's object (409): reason `NameConflict`, naming it. A 409 for the run's own child (it
  exists: a later stage, a new generation) is no refusal.
The check is repeated with back-off while refused (a quota or policy may change meanwhile) and at once after a spec
edit. Each refusal is also a Warning Event.

Pure parts (rendering, the path table, the condition) and one thin call (`check`); `rlt validate --server`
(rlt_operator.apply.server_check) uses the same rendering, call and table against the current kubeconfig.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlt.checks.validation import validate_spec
from rlt.contract import env as pod_env
from rlt.spec.run import RLTRunSpec, needs_generators
from rlt_operator import builders
from rlt_operator.apply import admission
from rlt_operator.apply.writes import BACKOFF_CAP, BACKOFF_FIRST, NAME_CONFLICT
from rlt_operator.status import model as status_model
from rlt_operator.status.conditions import hold, ready_condition, set_condition
from rlt_operator.status.model import ConditionType, RLTRunStatus

# The server's answers that say the object itself is wrong: bad request, too large, invalid.
INVALID_CODES = (400, 413, 422)
# Every answer that holds the run: invalid, forbidden (quota, LimitRange, policy, RBAC), not found, name taken.
REFUSAL_CODES = (400, 403, 404, 409, 413, 422)
# What `rlt validate --server` reports (rlt_operator.apply.server_check): every refusal but 409 (the run's children exist:
# it runs already).
CLI_CODES = (400, 403, 404, 413, 422)
REASON = "ChildInvalid"  # the child is invalid: the run's field is to fix
REFUSED = "ChildRefused"  # the cluster refuses it: a quota, a LimitRange, a policy, a permission, a taken name
OPERATOR = "(set by the operator, not by the spec)"
POD = "spec.template.spec."
ROLES = {"jobs": "trainer", "statefulsets": "generator"}


class DryRunner(Protocol):
    def dry_run_create(self, plural: str, namespace: str, manifest: dict[str, Any]) -> tuple[int, dict[str, Any]]: ...


# --------------------------------------------------------------------------- rendering


def stage_children(
    ref: builders.RunRef, spec: RLTRunSpec, stage: str, restarts: int = 0, scrapers: tuple[str, ...] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """(plural, manifest) of every child the stage needs, run-wide ones first, as status.decide creates them."""
    out: list[tuple[str, dict[str, Any]]] = [("configmaps", builders.configmap(ref, spec))]
    claim = builders.pvc(ref, spec)
    if claim is not None:
        out.append(("persistentvolumeclaims", claim))
    if needs_generators(spec, stage):
        out += [
            ("networkpolicies", builders.generator_network_policy(ref, spec, scrapers)),
            ("services", builders.generator_service(ref, spec, stage, restarts)),
            ("statefulsets", builders.generator_statefulset(ref, spec, stage, restarts)),
        ]
    out += [
        ("services", builders.trainer_service(ref, spec, stage, restarts)),
        ("jobs", builders.trainer_job(ref, spec, stage, restarts)),
    ]
    return out


def checked_children(
    ref: builders.RunRef, spec: RLTRunSpec, stage: str, restarts: int = 0, scrapers: tuple[str, ...] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """What the stage's dry-run sends: its children, each Job and StatefulSet followed by the pod it would make."""
    return admission.with_pods(stage_children(ref, spec, stage, restarts, scrapers))


def run_children(ref: builders.RunRef, spec: RLTRunSpec) -> list[tuple[str, dict[str, Any]]]:
    """Every child of every enabled stage and their pods (each distinct manifest once): what `rlt validate --server`
    sends."""
    out: list[tuple[str, dict[str, Any]]] = []
    for stage in spec.stages.enabled():
        for plural, body in checked_children(ref, spec, stage):
            if (plural, body) not in out:
                out.append((plural, body))
    return out


# --------------------------------------------------------------------------- child paths back to spec paths


def _at(obj: Any, path: str) -> Any:
    """The value at a Kubernetes field path (`a.b[0].c`) of a manifest, or None."""
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            i = int(part[1:-1])
            obj = obj[i] if isinstance(obj, list) and i < len(obj) else None
        else:
            obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


_RESOURCE_FIELDS = (
    (r"\.requests\[cpu\]", ".cpu"),
    (r"\.limits\[cpu\]", ".cpuLimit"),
    (r"\.requests\[memory\]", ".memory"),
    (r"\.limits\[memory\]", ".memoryLimit"),
    (r"\.(?:requests|limits)\[nvidia\.com/gpu\]", ".gpus"),
)


def _resource_field(rest: str) -> str:
    for pattern, name in _RESOURCE_FIELDS:
        if re.match(pattern, rest):
            return name
    extended = re.match(r"\.(?:requests|limits)\[([^\]]+)\]", rest)
    return f".extra[{extended.group(1)}]" if extended else ""


def _env_field(spec: RLTRunSpec, var: str, rest: str) -> str:
    """The spec field an environment variable of a pod comes from (the user's env last: it overrides ours)."""
    user = [i for i, e in enumerate(spec.env) if e.name == var]
    if user:
        return f"spec.env[{user[-1]}]{rest}"
    if var == pod_env.HF_TOKEN.name:
        return f"spec.hfTokenSecret{rest.split('.secretKeyRef', 1)[-1] if '.secretKeyRef' in rest else ''}"
    for i, e in enumerate(spec.outputs.credentials):
        if e.name == var:
            return f"spec.outputs.credentials[{i}]"
    mlflow = spec.tracking.mlflow
    for i, e in enumerate(mlflow.credentials if mlflow else []):
        if e.name == var:
            return f"spec.tracking.mlflow.credentials[{i}]"
    if var == "WANDB_API_KEY":
        return "spec.tracking.wandb.apiKeySecret"
    if var == pod_env.RUN_YAML.name:
        return "spec (the whole spec, copied into the pod template)"
    if var in (pod_env.MASTER_ADDR.name,):
        return "metadata.name"
    return OPERATOR


def _volume_field(spec: RLTRunSpec, role: str, name: Any, rest: str) -> str:
    if name == "data":
        return "spec.storage.existingClaim" if spec.storage.existing_claim else "metadata.name"
    if name == "dshm":
        return f"spec.resources.{role}.sharedMemory"
    return OPERATOR


# Pod template fields copied from spec.scheduling: the rest of the path is the same below them.
_SCHEDULING = {
    "nodeSelector": "nodeSelector",
    "tolerations": "tolerations",
    "affinity": "affinity",
    "imagePullSecrets": "imagePullSecrets",
    "priorityClassName": "priorityClassName",
    "serviceAccountName": "serviceAccountName",
    "serviceAccount": "serviceAccountName",
}


def _pod_field(spec: RLTRunSpec, role: str, child: dict[str, Any], path: str) -> str:
    """The spec field of a field of a pod template (`path` below spec.template.spec.)."""
    head = re.match(r"[A-Za-z]+", path)
    word, rest = (head.group(0), path[head.end() :]) if head else ("", path)
    if word in _SCHEDULING:
        return f"spec.scheduling.{_SCHEDULING[word]}{rest}"
    if word == "terminationGracePeriodSeconds":
        return "spec.resources.trainer.terminationGracePeriodSeconds"
    if word in ("subdomain", "hostname"):
        return "metadata.name"
    volume = re.match(r"volumes\[(\d+)\](.*)", path)
    if volume:
        return _volume_field(spec, role, _at(child, f"{POD}volumes[{volume.group(1)}].name"), volume.group(2))
    box = re.match(r"(initContainers|containers)\[(\d+)\]\.?([A-Za-z]*)(.*)", path)
    if not box:
        return OPERATOR
    kind, index, what, rest = box.groups()
    init = kind == "initContainers"
    if what == "env":
        entry = re.match(r"\[(\d+)\](.*)", rest)
        if not entry:
            return "spec.env"
        var = _at(child, f"{POD}{kind}[{index}].env[{entry.group(1)}].name")
        return _env_field(spec, str(var), entry.group(2))
    if what == "image":
        return f"spec.images.{'trainer' if init else role}"
    if what == "imagePullPolicy":
        return "spec.images.pullPolicy"
    if what == "resources":
        return OPERATOR if init else f"spec.resources.{role}{_resource_field(rest)}"
    if what in ("command", "args"):
        return "spec.teacher.model" if role == "generator" else "spec.stages"
    return OPERATOR


def spec_field(plural: str, child: dict[str, Any], path: str, spec: RLTRunSpec, message: str = "") -> str:
    """The run's field that produced `path` of the child `plural` (a field path as the API server names it)."""
    path = path.strip()
    role = ROLES.get(plural, "trainer")
    if path.startswith(POD) and plural in ROLES:
        return _pod_field(spec, role, child, path[len(POD) :])
    # a pod template's metadata: the API server names it without ".metadata" (spec.template.labels)
    annotations = re.match(r"spec\.template\.(?:metadata\.)?annotations", path)
    if annotations:
        return "spec.scheduling.podAnnotations" + path[annotations.end() :]
    if re.match(r"(spec\.template\.)?(metadata\.)?labels", path):
        queue = spec.scheduling.queue_name
        return "spec.scheduling.queueName" if queue and queue in message else "metadata.name"
    if path.startswith(("metadata.name", "metadata.generateName", "spec.serviceName")):
        return "metadata.name"
    if path.startswith("metadata.namespace"):
        return "metadata.namespace"
    table: dict[str, dict[str, str]] = {
        "jobs": {
            "spec.completions": "spec.resources.trainer.nodes",
            "spec.parallelism": "spec.resources.trainer.nodes",
        },
        "statefulsets": {"spec.replicas": "spec.resources.generator.replicas"},
        "persistentvolumeclaims": {
            "spec.resources": "spec.storage.size",
            "spec.storageClassName": "spec.storage.storageClassName",
            "spec.accessModes": "spec.storage.accessMode",
        },
        "configmaps": {"data": "spec (the whole spec: the pods' config)"},
        "services": {"spec.selector": "metadata.name"},
        "networkpolicies": {"spec.podSelector": "metadata.name", "spec.ingress": "metadata.name"},
    }
    for prefix, where in table.get(plural, {}).items():
        if path.startswith(prefix):
            return where
    return OPERATOR


# --------------------------------------------------------------------------- a refusal


@dataclass(frozen=True)
class Refusal:
    plural: str
    name: str
    status: int
    causes: tuple[tuple[str, str, str], ...]  # (spec field or cluster object, child field, what the server says)
    owner: str = ""  # for a pod of admission.template_pod: its Job or StatefulSet (`jobs/NAME`)
    # a cluster object refused it although the status says invalid: a ValidatingAdmissionPolicy answers 422 (its
    # validations' default reason is Invalid) with a cause that names no field
    by_cluster: bool = False

    @property
    def reason(self) -> str:
        """ChildInvalid when the child is invalid (a field to fix), NameConflict when its name is someone else's
        object, ChildRefused when the cluster refuses it otherwise."""
        if self.status == 409:
            return NAME_CONFLICT
        return REASON if self.status in INVALID_CODES and not self.by_cluster else REFUSED

    def lines(self) -> list[str]:
        """One line per refused field, the run's field (or the cluster object) first (as `rlt validate` names
        fields)."""
        what = f"the pod of {self.owner}" if self.owner else f"{self.plural}/{self.name}"
        return [
            f"{where}: {says} (the API server refused {what}" + (f" at {child_path})" if child_path else ")")
            for where, child_path, says in self.causes
        ]

    @property
    def message(self) -> str:
        return "; ".join(self.lines())


def refusal(
    plural: str, child: dict[str, Any], status: int, answer: dict[str, Any], spec: RLTRunSpec, namespace: str = ""
) -> Refusal:
    """The server's Status for a refused dry-run: each cause mapped to the spec field behind it, or, for a refusal
    that names no field, the cluster object that refused (admission.refused_by)."""
    meta = child.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), namespace or str(meta.get("namespace") or "")
    message = str(answer.get("message") or answer or f"HTTP {status}")
    owner = admission.pod_owner(child) if plural == "pods" else ""
    owner_plural = owner.split("/")[0]
    causes = [c for c in (answer.get("details") or {}).get("causes") or [] if isinstance(c, dict)]
    if status == 409:  # someone else's object has the name (the run's own child is no refusal: check's `ours`)
        where = f"metadata.name ({plural}/{name} is someone else's object: rename or remove it, or rename the run)"
        return Refusal(plural, name, status, ((where, "", message),), owner)
    if status not in INVALID_CODES or not causes:  # no field named (a quota, a policy, a webhook, 413): who refused
        by = admission.refused_by(message, plural, namespace, spec, owner_plural)
        where = by or ("spec (the whole spec: the pods' config)" if plural == "configmaps" else OPERATOR)
        return Refusal(plural, name, status, ((where, "", message),), owner)
    out, by_cluster = [], False
    for c in causes:
        path, says = str(c.get("field") or ""), str(c.get("message") or c.get("reason") or message)
        if owner and path.startswith("spec."):  # a pod's field: the same field of its Job's or StatefulSet's template
            where = spec_field(owner_plural, {"spec": {"template": child}}, "spec.template." + path, spec, says)
        elif path:
            where = spec_field(plural, child, path, spec, says)
        else:  # no field: a policy's refusal (422) names its policy
            by = admission.refused_by(says, plural, namespace, spec, owner_plural)
            where, by_cluster = by or OPERATOR, by_cluster or bool(by)
        out.append((where, path, says))
    return Refusal(plural, name, status, tuple(out), owner, by_cluster)


def check(
    runner: DryRunner,
    namespace: str,
    spec: RLTRunSpec,
    children: list[tuple[str, dict[str, Any]]],
    codes: tuple[int, ...] = REFUSAL_CODES,
    ours: Callable[[str, str], bool] | None = None,
) -> list[Refusal]:
    """Dry-run every child (the thin call); the refusals with one of `codes`, less a 409 for a child `ours` says is
    the run's own (it exists already; nor is the pod of such a Job or StatefulSet asked: its own pods count against
    a quota already). A 5xx raises from the runner as a create's does."""
    out: list[Refusal] = []
    existing: set[str] = set()  # the run's own Jobs and StatefulSets that exist
    for plural, body in children:
        if plural == "pods" and admission.pod_owner(body) in existing:
            continue
        code, answer = runner.dry_run_create(plural, namespace, body)
        if code == 409 and ours is not None and ours(plural, str(body["metadata"]["name"])):
            existing.add(f"{plural}/{body['metadata']['name']}")
            continue
        if code in codes:
            out.append(refusal(plural, body, code, answer, spec, namespace))
    return out


# --------------------------------------------------------------------------- the operator's gate


@dataclass
class ChildrenCheck:
    """One run's last check (kept between reconciles, lost on restart: the next create checks again)."""

    key: tuple[int, str] | None = None  # (generation, stage) checked
    refusals: list[Refusal] = field(default_factory=list)
    checked_at: float = 0.0
    failures: int = 0  # checks refused in a row for this key: the back-off's exponent
    next_check: float = 0.0
    reported: set[str] = field(default_factory=set)

    def due(self, key: tuple[int, str], now: float) -> bool:
        """A new generation or stage at once; a refused one again after its back-off (a quota, a LimitRange or a
        policy may be changed meanwhile, which no watch of ours sees)."""
        return key != self.key or (bool(self.refusals) and now >= self.next_check)

    def checked(self, key: tuple[int, str], refusals: list[Refusal], now: float) -> None:
        self.failures = (self.failures + 1 if key == self.key else 1) if refusals else 0
        self.key, self.refusals, self.checked_at = key, refusals, now
        self.next_check = now + min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** max(0, self.failures - 1))
        if not refusals:
            self.reported = set()

    def requeue(self, now: float) -> float | None:
        """Seconds until a refused check is due again (the reconcile comes back then), None when none is held."""
        return max(0.0, self.next_check - now) if self.refusals else None


async def gate(
    runner: DryRunner,
    ref: builders.RunRef,
    raw_spec: dict[str, Any],
    decided: dict[str, Any],
    generation: int,
    actions: list[Any],
    memory: ChildrenCheck,
    now: float,
    scrapers: tuple[str, ...] = (),
    ours: Callable[[str, str], bool] | None = None,
) -> tuple[list[Any], list[tuple[str, str, str]]]:
    """The decision's actions, less every create while a child of the stage (or a pod it would make) is refused;
    the Warning Events to post (each refusal once). Checks when a create is due for a new generation or stage, and
    again with back-off after a refusal. `ours(plural, name)`: whether an existing object is the run's own child
    (its 409 is no refusal)."""
    if not any(a.verb == "create" for a in actions):
        return actions, []
    stage, restarts = str(decided.get("stage") or ""), int(decided.get("restarts") or 0)
    key = (generation, stage)
    if stage and memory.due(key, now):
        spec = validate_spec(raw_spec, name=ref.name, source=f"rltrun/{ref.name}")  # creates only follow a valid one
        shape = decided.get("trainerShape") or {}
        if shape.get("stage") == stage:  # the shape the gang is created with (frozen once it has a checkpoint)
            spec = builders.with_trainer_shape(spec, int(shape["nodes"]), int(shape["gpus"]))
        children = checked_children(ref, spec, stage, restarts, scrapers)
        refused = await asyncio.to_thread(check, runner, ref.namespace, spec, children, REFUSAL_CODES, ours)
        memory.checked(key, refused, now)
    if not memory.refusals:
        return actions, []
    news = [("Warning", r.reason, r.message) for r in memory.refusals if r.message not in memory.reported]
    memory.reported |= {r.message for r in memory.refusals}
    return [a for a in actions if a.verb != "create"], news


def with_condition(run_status: dict[str, Any], memory: ChildrenCheck, now: dt.datetime) -> dict[str, Any]:
    """ChildrenValid from the last check: False with the first refusal (the run's reason and Ready's while it lasts),
    True once the stage's children passed. Unchanged before any check."""
    if memory.key is None:
        return run_status
    typed = RLTRunStatus.model_validate(run_status)
    conds = typed.conditions = typed.conditions or []
    if memory.refusals:
        more = len(memory.refusals) - 1
        message = memory.refusals[0].message + (f" (and {more} more child(ren) refused)" if more else "")
        reason = memory.refusals[0].reason
        set_condition(conds, ConditionType.CHILDREN_VALID, False, reason, message, now)
        hold(typed, reason, message)
    else:
        message = f"the API server accepted every child of stage {memory.key[1]} and their pods (dry-run)"
        set_condition(conds, ConditionType.CHILDREN_VALID, True, "Valid", message, now)
    ready_condition(typed, now)
    out = typed.model_dump(mode="json", by_alias=True, exclude_none=True)
    status_model.check(out)
    return out
