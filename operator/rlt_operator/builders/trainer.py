"""The trainer gang of a stage: its launch command, its headless Service and its indexed Job (one pod per node)."""

from __future__ import annotations

from typing import Any

from rlt.checks.step_time import local_checkpoint_size, trainer_grace_period
from rlt.contract import env as pod_env
from rlt.contract.exitcodes import DISRUPTION, FAIL_FAST, TERMINATION_LOG
from rlt.contract.layout import PVC_MOUNT
from rlt.contract.stage_registry import stage_info
from rlt.spec.loading import ENV_SOURCE
from rlt.spec.run import RLTRunSpec, stage_settings, zero_stage
from rlt_operator.builders.common import (
    ACCELERATE_PRECISION,
    JOB_INDEX_ANNOTATION,
    L_ROLE,
    L_RUN,
    L_SHAPE,
    L_STAGE,
    MASTER_PORT,
    METRICS_PORT,
    PREFLIGHT_RESOURCES,
    ROLE_TRAINER,
    RunRef,
    common_env,
    labels,
    object_meta,
    pod_container,
    pod_resources,
    pod_spec_base,
    trainer_name,
    type_meta,
    with_queue,
)
from rlt_operator.builders.run_children import (
    pod_config,
)

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
    stage_args = ["stage", stage, "--config", f"{ENV_SOURCE}{pod_env.RUN_YAML.name}", "--root", PVC_MOUNT]
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
        f"$({pod_env.NODE_RANK.name})",
        "--main_process_ip",
        f"$({pod_env.MASTER_ADDR.name})",
        "--main_process_port",
        f"$({pod_env.MASTER_PORT.name})",
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
        "metadata": object_meta(ref, name, labels(ref.name, ROLE_TRAINER, stage)),
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
    lbls = with_queue(labels(ref.name, ROLE_TRAINER, stage, restart), spec)
    grace, _ = trainer_grace_period(spec)  # the spec's, or sized from the plan's estimate of a stop
    env: list[dict[str, Any]] = [
        {"name": pod_env.MASTER_ADDR.name, "value": f"{name}-0.{name}.{ref.namespace}.svc"},
        {"name": pod_env.MASTER_PORT.name, "value": str(MASTER_PORT)},
        {"name": pod_env.NNODES.name, "value": str(nodes)},
        {"name": pod_env.NPROC_PER_NODE.name, "value": str(max(res.gpus, 1))},
        {"name": pod_env.WORLD_SIZE.name, "value": str(nodes * max(res.gpus, 1))},
        {
            "name": pod_env.NODE_RANK.name,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX_ANNOTATION}']"}},
        },
        {"name": pod_env.METRICS_PORT.name, "value": str(METRICS_PORT)},
        # torchrun waits this long for its ranks after forwarding SIGTERM (default 30 s): they save meanwhile
        {"name": pod_env.SHUTDOWN_TIMEOUT.name, "value": str(grace)},
        {"name": pod_env.ALLOC_CONF.name, "value": "expandable_segments:True"},
    ]
    # The spec this gang was created with, in the (immutable) pod template: a pod that starts late (a slow image
    # pull) reads the same spec as its running peers, not a later edit (a mounted ConfigMap changes under pods).
    snapshot = {"name": pod_env.RUN_YAML.name, "value": pod_config(ref, spec)}
    local = local_checkpoints_volume(spec)
    if local is not None:  # saves staged there (rlt.stages.staged_saves), made durable on the volume behind
        env.append({"name": pod_env.LOCAL_CHECKPOINTS.name, "value": LOCAL_CHECKPOINTS_MOUNT})
    pod = pod_spec_base(ref.name, spec, res.shared_memory)
    pod.update(
        {
            "restartPolicy": "Never",  # a failed rank fails the Job; the operator restarts the gang
            "subdomain": name,
            # SIGTERM → the gang stops at a micro-batch and saves (rlt.stages.preemption); SIGKILL only after this
            "terminationGracePeriodSeconds": grace,
            # Preflight: the same validation as `rlt validate` and the operator, plus what only the pod can see
            # (format files, a stage of an earlier run on a retained volume). Exits CONFIG_ERROR, which the
            # podFailurePolicy turns into a failed Job; its last log lines become the termination message the
            # operator puts in the run's status.
            "initContainers": [
                pod_container(
                    spec,
                    "validate",
                    spec.images.trainer,
                    [
                        "rlt",
                        "preflight",
                        f"{ENV_SOURCE}{pod_env.RUN_YAML.name}",
                        "--stage",
                        stage,
                        "--root",
                        PVC_MOUNT,
                        "--message-file",
                        TERMINATION_LOG,
                    ],
                    [snapshot, *common_env(ref, spec, stage)],
                    # requests = limits: an init container without them would drop a Guaranteed pod to Burstable.
                    {"requests": dict(PREFLIGHT_RESOURCES), "limits": dict(PREFLIGHT_RESOURCES)},
                    # The capacity line (fits, not checked, or the misfit) is written here even on success: the
                    # operator's CapacityOK condition reads it from the pod's status (rlt_operator.status.gang).
                    terminationMessagePath=TERMINATION_LOG,
                    terminationMessagePolicy="FallbackToLogsOnError",
                )
            ],
            "containers": [
                pod_container(
                    spec,
                    "trainer",
                    spec.images.trainer,
                    trainer_command(spec, stage),
                    [snapshot, *env, *common_env(ref, spec, stage)],
                    pod_resources(res),
                    ipc_lock=res.locks_memory(),
                    ports=[
                        {"name": "rendezvous", "containerPort": MASTER_PORT},
                        {"name": "metrics", "containerPort": METRICS_PORT},
                    ],
                )
            ],
        }
    )
    if local is not None:
        pod["volumes"].append(local)
        trainer = pod["containers"][0]
        trainer["volumeMounts"].append({"name": local["name"], "mountPath": LOCAL_CHECKPOINTS_MOUNT})
        size = local.get("emptyDir", {}).get("sizeLimit")
        if size:  # the scheduler places the pod where the node's ephemeral storage holds it
            trainer["resources"]["requests"]["ephemeral-storage"] = size
    return {
        **type_meta("jobs"),
        "metadata": object_meta(ref, name, {**lbls, L_SHAPE: shape_label(spec, stage)}),
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,  # gang restarts are counted by the RLTRun (spec.backoffLimit)
            "podFailurePolicy": pod_failure_policy(),
            "template": {"metadata": _template_meta(lbls, spec), "spec": pod},
        },
    }


LOCAL_CHECKPOINTS_MOUNT = "/local-checkpoints"


def local_checkpoints_volume(spec: RLTRunSpec) -> dict[str, Any] | None:
    """The trainer pod's volume for staged saves (resources.trainer.localCheckpoints): a generic ephemeral volume of
    its StorageClass, else an emptyDir on the node's ephemeral storage; sized by the spec or the plan
    (rlt.checks.step_time.local_checkpoint_size). None when turned off."""
    lc = spec.resources.trainer.local_checkpoints
    if not lc.enabled:
        return None
    size, _ = local_checkpoint_size(spec)
    quantity = lc.size or (f"{size // 2**30}Gi" if size else None)
    if lc.storage_class_name is not None:
        claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "storageClassName": lc.storage_class_name}
        # validation refuses a storage class without a size the plan or the spec gives
        claim["resources"] = {"requests": {"storage": quantity or "0"}}
        return {"name": "local-checkpoints", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    return {"name": "local-checkpoints", "emptyDir": {"sizeLimit": quantity} if quantity else {}}


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
