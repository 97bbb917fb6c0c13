"""The Kubernetes side of a run (operator only): pod resources, storage, images, env, scheduling."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rlt.contract.api import (
    Strict,
)
from rlt.spec.k8s import (
    ConfigKey,
    DNS1123Subdomain,
    EnvVarName,
    Image,
    LabelValue,
    QualifiedName,
    Quantity,
    QueueName,
    ResourceName,
    WholeQuantity,
    cel_rules,
    quantity_value,
)
from rlt.spec.k8s_api import Affinity, ObjectFieldSelector, ResourceFieldSelector, Toleration
from rlt.spec.pod_rules import resource_problems

# The requests a pod gets when the spec names none (per GPU, with a floor), in Python and in the CRD's CEL rules.
CPU_PER_GPU, MIN_CPU = 4, 1
MEMORY_GI_PER_GPU, MIN_MEMORY_GI = 32, 8


def _request_cel(field: str, per_gpu: int, floor: int, unit_bytes: int) -> str:
    """The request as a CEL double in base units (the field's quantity, or the default from the GPUs).

    Numbers, not strings: `quantity(string(<int>) + 'Gi')` has no length bound the API server's cost estimator can
    see, so it refuses the whole CRD ("estimated rule cost exceeds budget"); the arithmetic is in doubles so that
    no gpus value can overflow an int."""
    n = f"double(self.gpus) * {float(per_gpu * unit_bytes)}"
    lo = float(floor * unit_bytes)
    return f"(has(self.{field}) ? quantity(self.{field}).asApproximateFloat() : ({n} > {lo} ? {n} : {lo}))"


def _limit_rule(
    limit: str, request: str, per_gpu: int, floor: int, unit_bytes: int, message: str
) -> tuple[str, str, str]:
    # isQuantity first: a value the field's pattern refuses must not also raise a CEL evaluation error.
    guard = f"!has(self.{limit}) || !isQuantity(self.{limit}) || (has(self.{request}) && !isQuantity(self.{request}))"
    rule = f"{guard} || quantity(self.{limit}).asApproximateFloat() >= " + _request_cel(
        request, per_gpu, floor, unit_bytes
    )
    return (rule, message, f".{limit}")


_LIMIT_RULES = cel_rules(
    _limit_rule(
        "cpuLimit",
        "cpu",
        CPU_PER_GPU,
        MIN_CPU,
        1,
        "cpuLimit must be at least the CPU request (cpu, or its default of 4 per GPU)",
    ),
    _limit_rule(
        "memoryLimit",
        "memory",
        MEMORY_GI_PER_GPU,
        MIN_MEMORY_GI,
        2**30,
        "memoryLimit must be at least the memory request (memory, or its default of 32Gi per GPU)",
    ),
)


class PodResources(Strict):
    model_config = ConfigDict(json_schema_extra=_LIMIT_RULES)

    gpus: int = Field(1, ge=0, description="nvidia.com/gpu per pod (0 with MIG: name the MIG profile in extra).")
    cpu: Quantity | None = Field(None, description="CPU request, e.g. '16' (default: 4 per GPU, at least 1).")
    memory: Quantity | None = Field(
        None,
        description="Memory request for the processes, e.g. '200Gi' "
        "(default: 32Gi per GPU, at least 8Gi); sharedMemory is added to it.",
    )
    cpu_limit: Quantity | None = Field(None, description="CPU limit (default: none); at least the request.")
    memory_limit: Quantity | None = Field(
        None, description="Memory limit (default: none), at least the request; sharedMemory is added to it."
    )
    shared_memory: Quantity = Field(
        "16Gi",
        description="Size of the memory-backed /dev/shm emptyDir (NCCL, dataloaders); it counts "
        "as the pod's memory, so it is added to the memory request and limit.",
    )
    extra: dict[ResourceName, WholeQuantity] = Field(
        default_factory=dict,
        max_length=32,  # bounded: a CEL rule of the run reads it (the API server prices rules by the worst case)
        description="More extended resources, request = limit, e.g. "
        "rdma/rdma_shared_device_a: '1' or nvidia.com/mig-3g.40gb: '1'.",
    )
    ipc_lock: bool | None = Field(
        None,
        description="Give the container the IPC_LOCK capability (every other one stays dropped): NCCL over "
        "InfiniBand/RoCE pins the buffers it registers with the adapter. Default: when a name in extra says rdma. "
        "Pod Security baseline and restricted refuse it; false keeps it dropped.",
    )

    def locks_memory(self) -> bool:
        """Whether the container gets IPC_LOCK: ipcLock, else whether it is given an RDMA device."""
        return self.ipc_lock if self.ipc_lock is not None else any("rdma" in name.lower() for name in self.extra)

    def cpu_request(self) -> str:
        return self.cpu or str(max(MIN_CPU, CPU_PER_GPU * self.gpus))

    def memory_request(self) -> str:
        return self.memory or f"{max(MIN_MEMORY_GI, MEMORY_GI_PER_GPU * self.gpus)}Gi"

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> PodResources:
        # The API server refuses a pod whose limit is below its request (the Job would create no pod).
        for field, limit, request in (
            ("cpuLimit", self.cpu_limit, self.cpu_request()),
            ("memoryLimit", self.memory_limit, self.memory_request()),
        ):
            if limit is not None and quantity_value(limit) < quantity_value(request):
                raise ValueError(f"{field}: {limit} is below the request {request}; a limit must be at least it")
        # what the pod validator refuses in the container's resources the operator renders from these
        problems = resource_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


# A trainer pod's grace period when the spec sets none and the plan asks for less (or cannot size the run):
# 10 minutes, what cluster-autoscaler gives a scale-down by default (rlt.checks.step_time.trainer_grace_period).
GRACE_FLOOR_SECONDS = 600


class LocalCheckpoints(Strict):
    """Where a trainer pod writes its checkpoints first (RLT_LOCAL_CHECKPOINTS, rlt.stages.staged_saves): the
    training loop waits for this write only; a background copy makes each checkpoint durable on the run's volume."""

    enabled: bool = Field(
        True,
        description="Stage saves on pod-local storage (the loop blocks for the local write only); false: saves are "
        "written to the run's volume directly, the loop waiting for the whole write.",
    )
    size: Quantity | None = Field(
        None,
        description="Size of the local checkpoint volume per trainer pod, e.g. '200Gi' (default: sized by the plan: "
        "this pod's share of one checkpoint plus a margin, when the operator knows the models' shapes; `rlt plan` "
        "prints it). An emptyDir's size is also the pod's ephemeral-storage request.",
    )
    storage_class_name: DNS1123Subdomain | None = Field(
        None,
        description="A StorageClass of node-local volumes (e.g. an NVMe class of local-path or TopoLVM): the pod "
        "gets a generic ephemeral volume of it. Unset: an emptyDir on the node's ephemeral storage.",
    )


class TrainerResources(PodResources):
    nodes: int = Field(1, gt=0, description="Trainer pods (one per node) in the Indexed Job.")
    gpus: int = Field(8, ge=0, description="GPUs per trainer pod (= processes per node).")
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=30,
        description="Seconds a trainer pod has after SIGTERM (preemption, drain, eviction, suspend) to reach the "
        "next micro-batch boundary (the step in progress is abandoned) and save the last completed step before "
        "SIGKILL: the rest of one rollout or micro-batch plus one checkpoint save (a ZeRO-3 save of a 7B model with "
        f"its optimizer is ~100 GiB). Unset: the larger of {GRACE_FLOOR_SECONDS} and the plan's estimate of that "
        "need when the operator knows the models' shapes (the published models of "
        f"rlt.checks.model_shape.KNOWN_CONFIGS), else {GRACE_FLOOR_SECONDS}; "
        "`rlt plan` prints the value and warns when it is short. Some stops cap it (cluster-autoscaler scale-down: "
        "10 min by default; spot reclaim: minutes).",
    )
    mtbf_hours: float = Field(
        24.0,
        gt=0,
        description="Mean hours between losses of the trainer gang that its grace period does not save (a node or "
        "GPU lost, an OOM, a SIGKILL, a reclaim without notice): what `rlt plan` sizes the checkpoint interval "
        "with (Young/Daly: sqrt(2 × blocked save time × MTBF)) and flags a saveSteps far from it. The default, one a "
        "day, is a shared cluster's; GPU hardware alone fails far less often (docs/goodput.md).",
    )
    local_checkpoints: LocalCheckpoints = Field(
        default_factory=LocalCheckpoints,
        description="Checkpoints written to pod-local storage first and copied to the run's volume in the "
        "background (the completion marker last).",
    )


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

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": _LIMIT_RULES["x-kubernetes-validations"]
            + cel_rules(
                (
                    # in doubles: a product of two unbounded ints could overflow (a CEL evaluation error)
                    "self.gpus == 0 || double(self.tensorParallelSize) * double(self.dataParallelSize) <= "
                    "double(self.gpus)",
                    "tensorParallelSize × dataParallelSize must not exceed gpus",
                    ".dataParallelSize",
                )
            )["x-kubernetes-validations"]
        }
    )

    @property
    def engines(self) -> int:
        """vLLM engines the generators run: dataParallelSize per replica, each a scheduler with its own decode slots."""
        return self.replicas * self.data_parallel_size

    @property
    def engine_gpus(self) -> int:
        """GPUs the engines use (tensorParallelSize each); a pod's gpus beyond them are held for nothing."""
        return self.engines * self.tensor_parallel_size

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


# The volume's write rate the plan assumes when storage.writeBytesPerSecond is unset (rlt.checks.step_time): the
# baseline of common default storage classes, not their burst: AWS EBS gp3 (the EKS default) 125 MiB/s, GCP
# Filestore basic HDD 100 MB/s, pd-standard ~120 MB/s per TiB; an Azure Standard SSD up to 1 TiB 60-100 MB/s.
DEFAULT_WRITE_RATE = "100M"
MIN_WRITE_RATE = 10**6  # bytes per second: below this a "rate" is a unit slip (1n, 1m), not a volume


class Storage(Strict):
    """The run's volume (a PVC mounted at /data in every pod)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!isQuantity(self.size) || quantity(self.size).isGreaterThan(quantity('0'))",
                "size must be above 0",
                ".size",
            ),
            (
                "!has(self.writeBytesPerSecond) || !isQuantity(self.writeBytesPerSecond) || "
                "quantity(self.writeBytesPerSecond).isGreaterThan(quantity('0'))",
                "writeBytesPerSecond must be above 0",
                ".writeBytesPerSecond",
            ),
        )
    )

    size: Quantity = Field("200Gi", description="PVC size for checkpoints, datasets and outputs.")
    storage_class_name: DNS1123Subdomain | None = Field(
        None, description="StorageClass of the PVC (default: the cluster's)."
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        "ReadWriteOnce", description="ReadWriteMany is needed when pods of a run land on several nodes."
    )
    existing_claim: DNS1123Subdomain | None = Field(
        None, description="Use this PVC instead of creating one (kept on delete)."
    )
    write_bytes_per_second: Quantity | None = Field(
        None,
        description="Sustained write rate of the volume in bytes per second, a quantity (e.g. 250M): what the plan "
        "sizes a checkpoint save with, hence the trainer's grace period and saveSteps (`rlt plan` prints it). "
        f"Unset: {DEFAULT_WRITE_RATE}, the baseline of common default storage classes (AWS gp3 125 MiB/s, GCP "
        "Filestore basic 100 MB/s); set what your class guarantees.",
    )
    retention_policy: Literal["Retain", "Delete"] = Field(
        "Retain",
        description="What happens to the run's own PVC (checkpoints, datasets) when the RLTRun is deleted: "
        "Retain keeps it (no owner reference; a new run of the same name reuses it), Delete removes it.",
    )

    @model_validator(mode="after")
    def _some_size(self) -> Storage:
        if quantity_value(self.size) <= 0:  # the apiserver refuses a claim of no storage
            raise ValueError(f"size: {self.size} must be above 0")
        rate = self.write_bytes_per_second
        if rate is not None and quantity_value(rate) < MIN_WRITE_RATE:
            # the plan divides a checkpoint by it: 1n (a billionth of a byte a second) made a grace period of 1e20 s
            raise ValueError(
                f"writeBytesPerSecond: {rate} is below 1M (1 MB/s), slower than any volume a checkpoint is saved "
                "to; give the class's sustained rate in bytes per second (e.g. 250M)"
            )
        return self


class Images(Strict):
    """Container images of the run's pods (build and push them: `make images`)."""

    trainer: Image = Field("ghcr.io/rlt-dev/rlt-trainer:0.1.0", description="Image running `rlt stage`.")
    generator: Image = Field("ghcr.io/rlt-dev/rlt-generator:0.1.0", description="vLLM server image.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="imagePullPolicy of every container."
    )


class SecretKeyRef(Strict):
    """A key of a Secret in the run's namespace."""

    name: DNS1123Subdomain = Field(description="Secret name.")
    key: ConfigKey = Field("token", description="Key inside it.")


class KeyRef(Strict):
    name: DNS1123Subdomain = Field(description="Secret or ConfigMap name.")
    key: ConfigKey = Field(description="Key inside it.")
    optional: bool | None = Field(None, description="Start the pod even when the key is missing.")


class EnvVarSource(Strict):
    """Where a variable's value comes from (a Kubernetes EnvVarSource): secrets stay out of the RLTRun."""

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(  # type: ignore[valid-type]
        None, description="A field of the pod (downward API)."
    )
    resource_field_ref: ResourceFieldSelector | None = Field(  # type: ignore[valid-type]
        None, description="A resource of the container."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if (
            sum(
                v is not None
                for v in (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
            )
            != 1
        ):
            raise ValueError("give exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef")
        return self


class EnvVar(Strict):
    """An environment variable of every pod of the run."""

    name: EnvVarName = Field(description="Variable name.")
    value: str | None = Field(None, description="Literal value (written into the run's ConfigMap: no secrets).")
    value_from: EnvVarSource | None = Field(None, description="Value from a Secret, ConfigMap or the pod.")

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"valueFrom: {self.name} has both value and valueFrom; give one")
        return self


# NVIDIA's GPU feature discovery labels each GPU node with its GPU's memory in MiB (nvidia.com/gpu.memory=81559 on an
# H100 80GB): a run that selects nodes by it says what its GPUs hold (rlt.checks.gpu_memory.spec_gpu_memory).
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"


class Scheduling(Strict):
    """Where and how the run's pods are scheduled."""

    node_selector: dict[QualifiedName, LabelValue] = Field(
        default_factory=dict, description="Pod nodeSelector (labels a node must carry)."
    )
    tolerations: list[Toleration] = Field(  # type: ignore[valid-type]
        default_factory=list, description="Pod tolerations (Kubernetes' Toleration, checked as the API server does)."
    )
    affinity: Affinity | None = Field(  # type: ignore[valid-type]
        None, description="Pod affinity (Kubernetes' Affinity, checked as the API server does)."
    )
    priority_class_name: DNS1123Subdomain | None = Field(None, description="PriorityClass of every pod.")
    queue_name: QueueName | None = Field(
        None, description="Kueue LocalQueue (its object name); set as kueue.x-k8s.io/queue-name on every pod."
    )
    service_account_name: DNS1123Subdomain | None = Field(
        None, description="ServiceAccount of the pods (its token is not mounted)."
    )
    image_pull_secrets: list[DNS1123Subdomain] = Field(
        default_factory=list, description="Names of Secrets to pull images with."
    )
    pod_annotations: dict[QualifiedName, str] = Field(
        default_factory=dict,
        description="Annotations on every pod of the run (e.g. for a network operator or a sidecar injector).",
    )

    @model_validator(mode="after")
    def _gpu_memory_label(self) -> Scheduling:
        mib = self.node_selector.get(GPU_MEMORY_LABEL)
        if mib is not None and not (mib.isdigit() and int(mib) > 0):
            raise ValueError(
                f"nodeSelector: {GPU_MEMORY_LABEL}={mib!r} matches no node: GPU feature discovery labels a node with "
                "its GPU's memory in MiB, a whole number (81559 on an H100 80GB)"
            )
        return self


class SecretEnvVar(Strict):
    """An environment variable of every pod whose value comes from a Kubernetes Secret (never from the spec)."""

    name: EnvVarName = Field(description="Variable name, e.g. AWS_ACCESS_KEY_ID.")
    secret_key_ref: SecretKeyRef = Field(description="Secret name and key holding the value.")
