"""Per-stage settings: the Trainer options shared by the Trainer stages, then sft, rl, distill, student, evaluate."""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from rlt.contract.api import (
    Strict,
)
from rlt.contract.stage_registry import STAGE_ORDER, STAGES, stage_info
from rlt.spec.inputs import DatasetSpec, ModelRef
from rlt.spec.k8s import cel_rules
from rlt.spec.stage_settings import WORLD_BOUND, CelRule, Rollout, StageSettings, stage_value, trainer_value

# --------------------------------------------------------------------------- stages


# trainerArgs keys rlt sets itself, per Trainer stage, with what to set instead or why the value is fixed: two sources
# for one option would make the effective value depend on merge order. tests/training/test_trainer_args.py holds
# each table equal to the keys the stage's config builder (stages/sft.py, stages/rl.py) really sets.
_INSTEAD = "set spec.stages.{stage}."
TRAINER_OWNED_ARGS: dict[str, str] = {
    "output_dir": "the run's layout decides it",
    "report_to": "set spec.tracking",
    "run_name": "the run's name (metadata.name)",
    "logging_dir": "set spec.tracking (TensorBoard writes under the run's folder)",
    "deepspeed": _INSTEAD + "deepspeedZeroStage",
    "accelerator_config": "the launch (processes and devices) decides it",
    "use_cpu": "the device decides it",
    "bf16": _INSTEAD + "precision",
    "fp16": _INSTEAD + "precision",
    "learning_rate": _INSTEAD + "learningRate",
    "lr_scheduler_type": _INSTEAD + "lrScheduler",
    "warmup_steps": _INSTEAD + "warmupRatio",
    "warmup_ratio": _INSTEAD + "warmupRatio",
    "weight_decay": _INSTEAD + "weightDecay",
    "max_grad_norm": _INSTEAD + "maxGradNorm",
    "per_device_train_batch_size": _INSTEAD + "perDeviceBatchSize",
    "gradient_accumulation_steps": _INSTEAD + "batchSize and perDeviceBatchSize",
    "gradient_checkpointing": _INSTEAD + "gradientCheckpointing",
    "save_steps": _INSTEAD + "saveSteps",
    "save_strategy": _INSTEAD + "saveSteps",
    "save_total_limit": _INSTEAD + "saveTotalLimit",
    "logging_steps": _INSTEAD + "loggingSteps",
    "seed": "set spec.seed",
    "disable_tqdm": "the progress bar is rlt's",
    "ddp_timeout": "set by rlt from generation.serverTimeoutSeconds and the stage's lengths (rlt.spec.budgets)",
}
SFT_OWNED_ARGS: dict[str, str] = {
    **TRAINER_OWNED_ARGS,
    "num_train_epochs": _INSTEAD + "epochs",
    "max_steps": _INSTEAD + "maxSteps",
    "max_length": _INSTEAD + "maxLength",
    "completion_only_loss": "the loss is on the completion only (the stage's prompt/completion rows)",
    "packing": "rows are one prompt/completion each; packing would mix the completion-only loss masks",
}
# The teacher warm-up keeps the RLT reference code's AdamW beta2 (0.95); the student stage passes adam_beta2 through.
TEACHER_SFT_OWNED_ARGS: dict[str, str] = {
    **SFT_OWNED_ARGS,
    "adam_beta2": "fixed at the RLT reference code's 0.95 for the teacher warm-up",
}
RL_OWNED_ARGS: dict[str, str] = {
    **TRAINER_OWNED_ARGS,
    "max_steps": _INSTEAD + "steps",
    "steps_per_generation": _INSTEAD + "batchSize (one generation round per optimizer step)",
    "num_generations": _INSTEAD + "numGenerations",
    "num_iterations": "fixed at 1: the RLT reward scores the policy that sampled, once per generation round",
    "max_completion_length": _INSTEAD + "maxCompletionLength",
    "temperature": _INSTEAD + "temperature",
    "top_p": _INSTEAD + "topP",
    "top_k": "fixed off (clean sampling: the reward's teacher log-probs follow only temperature and topP)",
    "min_p": "fixed off (clean sampling: the reward's teacher log-probs follow only temperature and topP)",
    "repetition_penalty": "fixed at 1 (clean sampling: the reward's teacher log-probs follow only temperature and topP)",
    "beta": _INSTEAD + "beta",
    "model_init_kwargs": "set by rlt: the reference model loads in spec.teacher.dtype",
    "loss_type": _INSTEAD + "lossType",
    "scale_rewards": "fixed at 'group' (the paper's per-question normalisation of the RLT reward)",
    "mask_truncated_completions": "fixed off: unclosed explanations pay spec.stages.rl.reward.formatPenalty instead",
    "sync_ref_model": _INSTEAD + "refSync.enabled",
    "ref_model_mixup_alpha": _INSTEAD + "refSync.alpha",
    "ref_model_sync_steps": _INSTEAD + "refSync.steps",
    "use_vllm": _INSTEAD + "generation.mode",
    "vllm_mode": _INSTEAD + "generation.mode",
    "vllm_server_base_url": _INSTEAD + "generation.serverUrl",
    "vllm_server_timeout": _INSTEAD + "generation.serverTimeoutSeconds",
    "vllm_gpu_memory_utilization": _INSTEAD + "generation.gpuMemoryUtilization",
    "vllm_max_model_length": _INSTEAD + "generation.maxModelLen",
    "vllm_importance_sampling_correction": _INSTEAD + "generation.importanceSampling",
    "vllm_importance_sampling_mode": _INSTEAD + "generation.importanceSampling",
    "vllm_importance_sampling_clip_max": _INSTEAD + "generation.importanceSamplingCap",
}


# The same rules as CEL for the CRD (tests/operator/test_crd_cel.py holds the two equal).
# Guarded against a zero divisor (the schema's minimum refuses it; the rule must not add a "modulus by zero" error).
_MICRO_BATCH_RULE = (
    "self.perDeviceBatchSize <= 0 || self.batchSize % self.perDeviceBatchSize == 0",
    "batchSize must be a multiple of perDeviceBatchSize",
    ".batchSize",
)
_GROUP_RULE = (
    "self.numGenerations <= 0 || self.batchSize % self.numGenerations == 0",
    "batchSize must be divisible by numGenerations",
    ".batchSize",
)
# vLLM refuses a request whose prompt + max_tokens exceed --max-model-len (the rows would fail mid-run).
_MODEL_LEN_RULE = (
    "!has(self.generation) || self.generation.mode == 'inprocess' || !has(self.generation.maxModelLen) || "
    "self.maxPromptLength + self.maxCompletionLength <= self.generation.maxModelLen",
    "maxPromptLength + maxCompletionLength must not exceed generation.maxModelLen",
    ".generation.maxModelLen",
)


def _check_micro_batches(batch_size: int, per_device_batch_size: int) -> None:
    if batch_size % per_device_batch_size:
        raise ValueError(f"batchSize: {batch_size} must be a multiple of perDeviceBatchSize ({per_device_batch_size})")


# Passes over the rows a supervised stage may make: the RLT reference warmed the teacher up for 10.
MAX_EPOCHS = 10_000


class TrainerOptions(StageSettings):
    """Options every TRL-trained stage (sft, rl, student) shares, plus the trainerArgs escape hatch."""

    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0 = off).")
    logging_steps: int = Field(1, gt=0, description="Log (metrics.jsonl, tracking, Prometheus) every N steps.")
    save_total_limit: int | None = Field(
        2,
        gt=0,
        description="Keep at most this many checkpoints (null: all of them; each holds the optimizer states, several "
        "times the model's size: `rlt plan` shows what they take on the volume). When the stage finishes only the "
        "last is kept, without its optimizer states except for rl (docs/operator.md).",
    )
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Training precision; auto = fp32 on CPU, bf16 on GPU."
    )
    deepspeed_zero_stage: Literal[0, 1, 2, 3] = Field(
        3, description="DeepSpeed ZeRO stage when running distributed (the accelerate launch and the Trainer's)."
    )
    trainer_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More TRL config options (SFTConfig / GRPOConfig field names, snake_case), "
        "passed as given; each is checked against the TRL config's own field type. Options rlt sets itself are "
        "refused, naming the spec field to use (or why the value is fixed).",
    )
    owned_trainer_args: ClassVar[dict[str, str]] = TRAINER_OWNED_ARGS

    @classmethod
    def run_cel_rules(cls, name: str) -> list[CelRule]:
        fields = cls.model_fields
        batch = stage_value(name, "batchSize", fields["batch_size"].default)
        micro = stage_value(name, "perDeviceBatchSize", fields["per_device_batch_size"].default)
        enabled = stage_value(name, "enabled", fields["enabled"].default)
        nodes, gpus = trainer_value("nodes"), trainer_value("gpus")
        world = f"({nodes} * ({gpus} > 0 ? {gpus} : 1))"
        return [
            (
                f"!{enabled} || {micro} <= 0 || {nodes} > {WORLD_BOUND} || {gpus} > {WORLD_BOUND} || "
                f"({batch} % {micro} == 0 && ({batch} / {micro}) % {world} == 0)",
                f"stages.{name}.batchSize must be a multiple of perDeviceBatchSize × trainer processes "
                "(resources.trainer.nodes × gpus)",
                f".stages.{name}.batchSize",
            )
        ]

    def run_problems(self, name: str, spec: Any) -> list[str]:
        # every Trainer stage has enabled, batchSize and perDeviceBatchSize (SupervisedStage, RlStage)
        enabled, batch, micro = (getattr(self, f) for f in ("enabled", "batch_size", "per_device_batch_size"))
        tr = spec.resources.trainer
        world = tr.nodes * max(tr.gpus, 1)
        if not enabled or batch % (micro * world) == 0:
            return []
        return [
            f"stages.{name}.batchSize: {batch} is not a multiple of perDeviceBatchSize × trainer processes = {micro} "
            f"× {world} (resources.trainer.nodes × gpus, one process on a CPU pod); the trainer would run another "
            "batch size"
        ]

    @field_validator("deepspeed_zero_stage", mode="before")
    @classmethod
    def _zero_an_integer(cls, value: Any) -> Any:
        # a Literal of ints compares by equality, so it takes True as 1 and 0.0 as 0; the CRD's integer enum takes
        # neither (both found by the door's property test)
        if isinstance(value, bool):
            raise ValueError(f"Input should be 0, 1, 2 or 3, not the boolean {str(value).lower()}")
        if isinstance(value, float):
            raise ValueError(f"Input should be 0, 1, 2 or 3 (an integer), not the number {value!r}")
        return value


class SupervisedStage(TrainerOptions):
    """Settings of the supervised stages (TRL SFTTrainer, loss on the completion only): sft and student."""

    model_config = ConfigDict(json_schema_extra=cel_rules(_MICRO_BATCH_RULE))

    enabled: bool = Field(True, description="Run this stage.")
    epochs: float = Field(
        1.0,
        gt=0,
        le=MAX_EPOCHS,  # the plan derives a step count from it: a huge float overflows on the way to an int
        description="Passes over the training rows (the RLT reference code warmed the teacher up for 10).",
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

    owned_trainer_args: ClassVar[dict[str, str]] = TEACHER_SFT_OWNED_ARGS


class RewardSpec(Strict):
    """R = r_SS − λ·r_KL − formatPenalty·[explanation not closed]."""

    alpha: float = Field(0.01, ge=0, description="Weight of the min (r_SS) / max (r_KL) term.")
    kl_weight: float = Field(
        3.0,
        ge=0,
        alias="lambda",
        description="λ: weight of r_KL, the reward's KL term between teacher and student over the explanation "
        "(R = r_SS − λ·r_KL). Not stages.rl.beta, the GRPO loss's KL of the policy to its reference.",
    )
    format_penalty: float = Field(1.0, ge=0, description="Subtracted when the explanation is not closed.")
    student_temperature: float | None = Field(
        None, gt=0, description="Temperature of the student's log-probs (default: rl.temperature)."
    )
    batch_size: int = Field(
        2, gt=0, description="Scoring micro-batch: small on CPU (batching only adds memory there), 16-32 on a GPU."
    )
    share_prefix: bool = Field(True, description="Run a group's shared prompt prefix once and reuse its KV cache.")
    max_batch_tokens: int | None = Field(
        None,
        gt=0,
        description="Scoring micro-batch cap in padded tokens (rows × longest row); a longer row is scored alone. "
        "Default: from the capacity plan, a tenth of the GPU's memory over the student's bytes per token "
        "(`rlt plan` prints it).",
    )


class ServerSpec(Strict):
    """Where a stage's samples come from: in-process, or a vLLM OpenAI server given by URL."""

    mode: Literal["inprocess", "server"] = Field(
        "inprocess", description="inprocess: the trainer generates; server: a vLLM OpenAI server at serverUrl."
    )
    server_url: str | None = Field(
        None, description="Base URL of the vLLM server (mode=server): give it yourself, no server is started for it."
    )
    server_timeout_seconds: int = Field(600, gt=0, description="How long to wait for the server.")


class GenerationSpec(ServerSpec):
    """Where RL/distill completions come from, and the run's vLLM generators (rl only: evaluate has ServerSpec)."""

    mode: Literal["inprocess", "server", "colocate"] = Field(  # type: ignore[assignment]  # rl adds colocate
        "inprocess",
        description="inprocess: the trainer generates; server: vLLM OpenAI server(s) (TRL server mode); "
        "colocate: vLLM inside each trainer process on its GPU (TRL colocate mode; how one GPU runs GRPO "
        "with vLLM).",
    )
    server_url: str | None = Field(
        None,
        description="Base URL of the vLLM server (mode=server): the operator sets it to its generators (they serve "
        "rl and distill).",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vLLM --gpu-memory-utilization of the generators."
    )
    max_model_len: int | None = Field(None, gt=0, description="vLLM --max-model-len (default: the model's own).")
    importance_sampling: Literal["off", "sequenceMask", "sequenceTruncate", "tokenMask", "tokenTruncate"] = Field(
        "off",
        description="Server or colocate mode: TRL's correction for vLLM/trainer log-prob mismatch (off, as in the "
        "paper; when on, the masked or clipped share per step is a metric).",
    )
    importance_sampling_cap: float = Field(3.0, gt=1, description="Upper bound of the importance ratio when it is on.")
    overlap: Literal["none", "oneStepOff"] = Field(
        "none",
        description="none: each step generates, then trains. oneStepOff: the generators produce step k+1's rollouts "
        "while the trainers update on step k (a row is trained at most one optimizer step after the weights that "
        "sampled it; the GRPO clip and the importance ratio correct for it). For mode server; mode colocate has "
        "nothing to overlap (the same GPUs generate and train). `rlt plan` prints each mode's goodput and the one "
        "it would choose (docs/goodput.md).",
    )


class RefSyncSpec(Strict):
    """TR-DPO style soft update of the GRPO reference: ref ← α·policy + (1−α)·ref every `steps`."""

    enabled: bool = Field(True, description="Soft-update the reference (only when beta > 0).")
    alpha: float = Field(0.9, gt=0, le=1, description="Weight of the policy in the update.")
    steps: int = Field(32, gt=0, description="Update every N steps.")


# The loss types whose gradient is one sum over a step's rows, whichever micro-batch holds a row: rl deals those rows
# across the ranks by tokens (rlt.stages.balance), and the plan charges the dealt rank imbalance (rlt.checks.step_time).
DEALABLE_LOSSES = ("grpo", "dr_grpo", "dapo")


class RlStage(TrainerOptions):
    """GRPO of the teacher with the RLT reward (TRL GRPOTrainer)."""

    model_config = ConfigDict(json_schema_extra=cel_rules(_GROUP_RULE, _MICRO_BATCH_RULE, _MODEL_LEN_RULE))
    owned_trainer_args: ClassVar[dict[str, str]] = RL_OWNED_ARGS

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
    beta: float = Field(
        0.04,
        ge=0,
        description="β: the GRPO loss's KL coefficient, of the policy to its reference model (TRL's beta; the "
        "rlt_policy_kl metric). Not stages.rl.reward.lambda, the reward's teacher-student KL weight.",
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field(
        "grpo",
        description="How TRL aggregates the token losses (its GRPOConfig.loss_type): grpo (per-sequence mean, as in "
        "the paper), dr_grpo (a global constant), dapo (active tokens of the global batch), bnpo (of the local "
        "batch).",
    )
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
        gen = self.generation
        need = self.max_prompt_length + self.max_completion_length
        if gen.mode != "inprocess" and gen.max_model_len is not None and need > gen.max_model_len:
            raise ValueError(
                f"generation.maxModelLen: {gen.max_model_len} is below maxPromptLength + maxCompletionLength = "
                f"{need}; vLLM would refuse the longest requests"
            )
        return self

    def rollout(self, spec: Any) -> Rollout | None:
        wait = self.generation.server_timeout_seconds if self.generation.mode == "server" else 0
        return Rollout(self.batch_size, self.max_completion_length, wait)

    @classmethod
    def run_cel_rules(cls, name: str) -> list[CelRule]:
        mode = (
            f"has(self.stages) && has(self.stages.{name}) && has(self.stages.{name}.generation) && "
            f"self.stages.{name}.enabled && self.stages.{name}.generation.mode == "
        )
        # the apiserver fills in the defaults before it evaluates the rules, so only the objects can be absent
        colocate = (
            f"!({mode}'colocate') || !has(self.resources) || !has(self.resources.trainer) || "
            "self.resources.trainer.gpus > 0",
            f"stages.{name}.generation.mode colocate runs vLLM on the trainer's GPUs: resources.trainer.gpus must "
            "be at least 1",
            ".resources.trainer.gpus",
        )
        server = (
            f"!({mode}'server') || !has(self.resources) || !has(self.resources.generator) || "
            "self.resources.generator.gpus > 0 || (has(self.resources.generator.extra) && "
            "size(self.resources.generator.extra) > 0)",
            f"stages.{name}.generation.mode server runs vLLM generator pods: resources.generator.gpus must be at "
            "least 1 (or name a device in resources.generator.extra)",
            ".resources.generator.gpus",
        )
        return [*super().run_cel_rules(name), colocate, server]

    def run_problems(self, name: str, spec: Any) -> list[str]:
        problems = super().run_problems(name, spec)
        if not self.enabled:
            return problems
        mode, generator = self.generation.mode, spec.resources.generator
        if mode == "colocate" and spec.resources.trainer.gpus == 0:
            problems.append(
                "resources.trainer.gpus: 0 with stages.rl.generation.mode colocate, which runs vLLM on the "
                "trainer's GPUs; give the trainer GPUs or use mode server (vLLM pods) or inprocess"
            )
        if (
            mode == "server"
            and self.generation.overlap == "oneStepOff"
            and self.generation.importance_sampling == "off"
        ):
            problems.append(
                "stages.rl.generation.importanceSampling: off with overlap oneStepOff; a row sampled by the previous "
                "step's weights needs the importance ratio: use tokenTruncate (TRL's default) or another mode"
            )
        if mode == "colocate" and self.generation.overlap != "none":
            problems.append(
                f"stages.rl.generation.overlap: {self.generation.overlap} with mode colocate, whose trainer GPUs "
                "generate and train in turn (nothing to overlap); use mode server with overlap oneStepOff, or overlap "
                "none"
            )
        if mode == "server" and not generator.gpus and not generator.extra:
            problems.append(
                "resources.generator.gpus: 0 with stages.rl.generation.mode server, whose vLLM generator pods "
                "need a GPU (or a device named in resources.generator.extra, e.g. a MIG profile)"
            )
        if mode == "server" and generator.replicas > 1:
            # TRL's client drives ONE server (one base URL, one NCCL weight-sync group): behind a Service, the other
            # replicas would generate from stale weights and weight updates would land on the wrong one.
            problems.append(
                f"resources.generator.replicas: {generator.replicas} with stages.rl.generation.mode server; TRL "
                "keeps exactly one vLLM server in sync, so use replicas: 1 and spread its GPUs with "
                "dataParallelSize / tensorParallelSize"
            )
        return problems


class DistillStage(StageSettings):
    """The trained teacher explains every question; the best of N candidates (by RLT reward) is kept."""

    enabled: bool = Field(True, description="Run this stage.")
    samples_per_question: int = Field(1, gt=0, description="Candidates per question, ranked by the RLT reward.")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature of the explanations.")
    max_new_tokens: int = Field(16384, gt=0, description="Longest explanation in tokens.")
    limit: int | None = Field(None, gt=0, description="Explain at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Questions generated together.")

    def rollout(self, spec: Any) -> Rollout | None:
        # the ranks finish their shares at different times: the gather waits at most one batch of the slowest rank
        gen = spec.stages.rl.generation  # distill samples where rl does
        wait = gen.server_timeout_seconds if gen.mode == "server" else 0
        return Rollout(self.batch_size * self.samples_per_question, self.max_new_tokens, wait)

    def run_problems(self, name: str, spec: Any) -> list[str]:
        rl = spec.stages.rl
        served = stage_info(name).uses_generators and rl.generation.mode == "server"  # rlt.spec.run.needs_generators
        if not (self.enabled and served and rl.generation.max_model_len):
            return []
        need = rl.max_prompt_length + self.max_new_tokens
        if need <= rl.generation.max_model_len:
            return []
        return [
            f"stages.rl.generation.maxModelLen: {rl.generation.max_model_len} is below stages.rl.maxPromptLength + "
            f"stages.{name}.maxNewTokens = {need} (the generators serve {name} too)"
        ]


class StudentStage(SupervisedStage):
    """Supervised distillation of a student on the distill stage's dataset (student format, loss on the answer)."""

    owned_trainer_args: ClassVar[dict[str, str]] = SFT_OWNED_ARGS

    enabled: bool = Field(False, description="Run this stage.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    model: ModelRef | None = Field(None, description="Student to train (default: spec.student).")
    over_long: Literal["drop", "truncate", "best_fit"] = Field(
        "best_fit",
        description="Rows over maxLength (the whole student chat): drop them, truncate them (large students are "
        "hurt by cropped traces), or use the best-rewarded distill candidate that fits (dropped when none fits).",
    )


class EvaluateStage(StageSettings):
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
    generation: ServerSpec = Field(default_factory=ServerSpec, description="In-process or a vLLM server.")

    @model_validator(mode="after")
    def _greedy_single(self) -> EvaluateStage:
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"samples: greedy decoding (temperature 0) gives one answer; got samples={self.samples}")
        return self

    def rollout(self, spec: Any) -> Rollout | None:
        wait = self.generation.server_timeout_seconds if self.generation.mode == "server" else 0
        return Rollout(self.batch_size * self.samples, self.max_new_tokens, wait)

    @classmethod
    def run_cel_rules(cls, name: str) -> list[CelRule]:
        return [
            (
                f"!has(self.stages) || !has(self.stages.{name}) || !self.stages.{name}.enabled || "
                f"has(self.stages.{name}.dataset) || self.dataset.evalFraction > 0.0 || "
                "self.dataset.source.startsWith('builtin:')",
                f"dataset.evalFraction must be above 0 (held-out rows) when stages.{name} is enabled without "
                f"stages.{name}.dataset",
                ".dataset.evalFraction",
            )
        ]

    def run_problems(self, name: str, spec: Any) -> list[str]:
        # a built-in task is evaluated on fresh problems (rlt.data.eval_set), whatever the method
        fresh = spec.dataset.source.startswith("builtin:")
        if self.enabled and self.dataset is None and spec.dataset.eval_fraction <= 0 and not fresh:
            return [
                f"dataset.evalFraction: 0 leaves no held-out rows for stages.{name}; set it above 0 (e.g. 0.1) "
                f"or give stages.{name}.dataset"
            ]
        return []


class Stages(Strict):
    """The stages of a run, run in this order; each runs when enabled."""

    sft: SftStage = Field(default_factory=SftStage)
    rl: RlStage = Field(default_factory=RlStage)
    distill: DistillStage = Field(default_factory=DistillStage)
    student: StudentStage = Field(default_factory=StudentStage)
    evaluate: EvaluateStage = Field(default_factory=EvaluateStage)

    def enabled(self) -> list[str]:
        return [name for name in STAGE_ORDER if getattr(self, name).enabled]


def _with_outside_stages(stages: type[Stages]) -> type[Stages]:
    """Stages, with a field for each stage of the table kept outside rlt (StageInfo.settings: its settings model)."""
    extra: dict[str, Any] = {}
    for info in STAGES:
        if info.settings is not None:
            module, name = info.settings.split(":")
            model = getattr(importlib.import_module(module), name)
            extra[info.name] = (model, Field(default_factory=model, description=model.__doc__))
    if not extra:
        return stages
    return create_model("Stages", __base__=stages, __doc__=stages.__doc__, **extra)


Stages = _with_outside_stages(Stages)  # type: ignore[misc]


# --------------------------------------------------------------------------- cluster (operator only)
