"""The Kubernetes side of a run (operator only): pod resources, storage, images, env, scheduling."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlt.spec.base import (
    Strict,
)

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def quantity_bytes(q: str) -> int:
    """A Kubernetes quantity (the spec's pattern guarantees its form) in bytes."""
    for table in (_BINARY, _DECIMAL):
        for suffix in sorted(table, key=len, reverse=True):
            if q.endswith(suffix):
                return int(float(q[: -len(suffix)]) * table[suffix])
    return int(float(q))


class PodResources(Strict):
    gpus: int = Field(1, ge=0, description="nvidia.com/gpu per pod (0 with MIG: name the MIG profile in extra).")
    cpu: str | None = Field(
        None, pattern=_QUANTITY, description="CPU request, e.g. '16' (default: 4 per GPU, at least 1)."
    )
    memory: str | None = Field(
        None,
        pattern=_QUANTITY,
        description="Memory request for the processes, e.g. '200Gi' "
        "(default: 32Gi per GPU, at least 8Gi); sharedMemory is added to it.",
    )
    cpu_limit: str | None = Field(None, pattern=_QUANTITY, description="CPU limit (default: none).")
    memory_limit: str | None = Field(
        None, pattern=_QUANTITY, description="Memory limit (default: none); sharedMemory is added to it."
    )
    shared_memory: str = Field(
        "16Gi",
        pattern=_QUANTITY,
        description="Size of the memory-backed /dev/shm emptyDir (NCCL, dataloaders); it counts "
        "as the pod's memory, so it is added to the memory request and limit.",
    )
    extra: dict[str, str] = Field(
        default_factory=dict,
        description="More extended resources, request = limit, e.g. "
        "rdma/rdma_shared_device_a: '1' or nvidia.com/mig-3g.40gb: '1'.",
    )


class TrainerResources(PodResources):
    nodes: int = Field(1, gt=0, description="Trainer pods (one per node) in the Indexed Job.")
    gpus: int = Field(8, ge=0, description="GPUs per trainer pod (= processes per node).")


class GeneratorResources(PodResources):
    replicas: int = Field(
        1, gt=0, description="vLLM server replicas (rl in server mode: exactly 1, see dataParallelSize)."
    )
    tensor_parallel_size: int = Field(1, gt=0, description="vLLM tensor parallelism (≤ gpus).")
    data_parallel_size: int = Field(
        1,
        gt=0,
        description="vLLM data parallelism inside the one server "
        "(--data-parallel-size): how rl in server mode uses more generation GPUs; "
        "tensorParallelSize × dataParallelSize ≤ gpus.",
    )

    @model_validator(mode="after")
    def _tp_fits(self) -> GeneratorResources:
        if self.gpus and self.tensor_parallel_size > self.gpus:
            raise ValueError(f"tensorParallelSize: {self.tensor_parallel_size} exceeds gpus ({self.gpus})")
        if self.gpus and self.tensor_parallel_size * self.data_parallel_size > self.gpus:
            raise ValueError(
                f"dataParallelSize: tensorParallelSize × dataParallelSize = "
                f"{self.tensor_parallel_size * self.data_parallel_size} exceeds gpus ({self.gpus})"
            )
        return self


class Resources(Strict):
    """Pods of the run on a cluster (ignored by `rlt run`)."""

    trainer: TrainerResources = Field(
        default_factory=TrainerResources, description="The trainer's Indexed Job: one pod per node, torchrun inside."
    )
    generator: GeneratorResources = Field(
        default_factory=GeneratorResources, description="vLLM servers (generation.mode: server of stages.rl)."
    )


class Storage(Strict):
    """The run's volume (a PVC mounted at /data in every pod)."""

    size: str = Field("200Gi", description="PVC size for checkpoints, datasets and outputs.")
    storage_class_name: str | None = Field(None, description="StorageClass of the PVC (default: the cluster's).")
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        "ReadWriteOnce", description="ReadWriteMany is needed when pods of a run land on several nodes."
    )
    existing_claim: str | None = Field(None, description="Use this PVC instead of creating one (kept on delete).")
    retention_policy: Literal["Retain", "Delete"] = Field(
        "Retain",
        description="What happens to the run's own PVC (checkpoints, datasets) when the RLTRun is deleted: "
        "Retain keeps it (no owner reference; a new run of the same name reuses it), Delete removes it.",
    )


class Images(Strict):
    """Container images of the run's pods (build and push them: `make images`)."""

    trainer: str = Field("ghcr.io/rlt-dev/rlt-trainer:0.1.0", description="Image running `rlt stage`.")
    generator: str = Field("ghcr.io/rlt-dev/rlt-generator:0.1.0", description="vLLM server image.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy of every container."
    )


class SecretKeyRef(Strict):
    """A key of a Secret in the run's namespace."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key inside it.")


class KeyRef(Strict):
    name: str = Field(min_length=1, description="Secret or ConfigMap name.")
    key: str = Field(min_length=1, description="Key inside it.")
    optional: bool | None = Field(None, description="Start the pod even when the key is missing.")


class EnvVarSource(Strict):
    """Where a variable's value comes from (a Kubernetes EnvVarSource): secrets stay out of the RLTRun."""

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: dict[str, Any] | None = Field(None, description="A field of the pod (downward API).")
    resource_field_ref: dict[str, Any] | None = Field(None, description="A resource of the container.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if (
            sum(
                v is not None
                for v in (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
            )
            != 1
        ):
            raise ValueError("valueFrom: give exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef")
        return self


class EnvVar(Strict):
    """An environment variable of every pod of the run."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str | None = Field(None, description="Literal value (written into the run's ConfigMap: no secrets).")
    value_from: EnvVarSource | None = Field(None, description="Value from a Secret, ConfigMap or the pod.")

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"valueFrom: {self.name} has both value and valueFrom; give one")
        return self


class Scheduling(Strict):
    """Where and how the run's pods are scheduled."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Pod nodeSelector (labels a node must carry)."
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Pod tolerations (passed through).")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity (passed through).")
    priority_class_name: str | None = Field(None, description="PriorityClass of every pod.")
    queue_name: str | None = Field(None, description="Kueue LocalQueue; set as kueue.x-k8s.io/queue-name on every pod.")
    service_account_name: str | None = Field(None, description="ServiceAccount of the pods (its token is not mounted).")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Names of Secrets to pull images with.")
    pod_annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations on every pod of the run (e.g. for a network operator or a sidecar injector).",
    )


class SecretEnvVar(Strict):
    """An environment variable of every pod whose value comes from a Kubernetes Secret (never from the spec)."""

    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Variable name, e.g. AWS_ACCESS_KEY_ID."
    )
    secret_key_ref: SecretKeyRef = Field(description="Secret name and key holding the value.")
