"""What the stages' settings share: the Trainer options of the Trainer stages (sft, rl, student), the supervised
stages' settings (sft, student), the options rlt sets itself, and where a stage's samples come from (ServerSpec)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from rlt.contract.api import Strict
from rlt.spec.k8s import cel_rules
from rlt.spec.stage_settings import WORLD_BOUND, CelRule, StageSettings, stage_value, trainer_value

# trainerArgs keys rlt sets itself, per Trainer stage, with what to set instead or why the value is fixed: two sources
# for one option would make the effective value depend on merge order. tests/training/test_trainer_args.py holds
# each table equal to the keys the stage's config builder (stages/sft.py, stages/rl.py) really sets.
INSTEAD = "set spec.stages.{stage}."
TRAINER_OWNED_ARGS: dict[str, str] = {
    "output_dir": "the run's layout decides it",
    "report_to": "set spec.tracking",
    "run_name": "the run's name (metadata.name)",
    "logging_dir": "set spec.tracking (TensorBoard writes under the run's folder)",
    "deepspeed": INSTEAD + "deepspeedZeroStage",
    "accelerator_config": "the launch (processes and devices) decides it",
    "use_cpu": "the device decides it",
    "bf16": INSTEAD + "precision",
    "fp16": INSTEAD + "precision",
    "learning_rate": INSTEAD + "learningRate",
    "lr_scheduler_type": INSTEAD + "lrScheduler",
    "warmup_steps": INSTEAD + "warmupRatio",
    "warmup_ratio": INSTEAD + "warmupRatio",
    "weight_decay": INSTEAD + "weightDecay",
    "max_grad_norm": INSTEAD + "maxGradNorm",
    "per_device_train_batch_size": INSTEAD + "perDeviceBatchSize",
    "gradient_accumulation_steps": INSTEAD + "batchSize and perDeviceBatchSize",
    "gradient_checkpointing": INSTEAD + "gradientCheckpointing",
    "activation_checkpointing": INSTEAD + "gradientCheckpointing",
    "activation_checkpointing_kwargs": INSTEAD + "uncheckpointedLayers (every_n_layers would choose the layers too)",
    "gradient_checkpointing_kwargs": INSTEAD + "uncheckpointedLayers (every_n_layers would choose the layers too)",
    "save_steps": INSTEAD + "saveSteps",
    "save_strategy": INSTEAD + "saveSteps",
    "save_total_limit": INSTEAD + "saveTotalLimit",
    "logging_steps": INSTEAD + "loggingSteps",
    "seed": "set spec.seed",
    "disable_tqdm": "the progress bar is rlt's",
    "ddp_timeout": "set by rlt from generation.serverTimeoutSeconds and the stage's lengths (rlt.spec.budgets)",
}
SFT_OWNED_ARGS: dict[str, str] = {
    **TRAINER_OWNED_ARGS,
    "num_train_epochs": INSTEAD + "epochs",
    "max_steps": INSTEAD + "maxSteps",
    "max_length": INSTEAD + "maxLength",
    "completion_only_loss": "the loss is on the completion only (the stage's prompt/completion rows)",
    "packing": "rows are one prompt/completion each; packing would mix the completion-only loss masks",
    "train_sampling_strategy": "rows are dealt across ranks by tokens (rlt.stages.sft_balance)",
}
# The teacher warm-up keeps the RLT reference code's AdamW beta2 (0.95); the student stage passes adam_beta2 through.

# The same rules as CEL for the CRD (tests/operator/test_crd_cel.py holds the two equal).
# Guarded against a zero divisor (the schema's minimum refuses it; the rule must not add a "modulus by zero" error).
MICRO_BATCH_RULE = (
    "self.perDeviceBatchSize <= 0 || self.batchSize % self.perDeviceBatchSize == 0",
    "batchSize must be a multiple of perDeviceBatchSize",
    ".batchSize",
)


def check_micro_batches(batch_size: int, per_device_batch_size: int) -> None:
    if batch_size % per_device_batch_size:
        raise ValueError(f"batchSize: {batch_size} must be a multiple of perDeviceBatchSize ({per_device_batch_size})")


# Passes over the rows a supervised stage may make: the RLT reference warmed the teacher up for 10.
MAX_EPOCHS = 10_000


class TrainerOptions(StageSettings):
    """Options every TRL-trained stage (sft, rl, student) shares, plus the trainerArgs escape hatch."""

    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0 = off).")
    logging_steps: int = Field(
        1,
        gt=0,
        description="Log (metrics.jsonl, tracking, Prometheus) every N steps; the step (rlt_step, progress) and the "
        "step-time histograms move every step.",
    )
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
    uncheckpointed_layers: int | None = Field(
        None,
        ge=0,
        description="With gradientCheckpointing: how many decoder layers, the last ones, keep their activations "
        "instead of recomputing them in the backward pass (0: every layer recomputes). Unset: as many as the GPU's "
        "memory holds beside the stage's other terms, the number `rlt plan` prints (rlt.checks.checkpoint_layers; "
        "every layer recomputes on CPU).",
    )
    trainer_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More TRL config options (SFTConfig / GRPOConfig field names, snake_case), "
        "passed as given; each is checked against the TRL config's own field type. Options rlt sets itself are "
        "refused, naming the spec field to use (or why the value is fixed).",
    )
    owned_trainer_args: ClassVar[dict[str, str]] = TRAINER_OWNED_ARGS

    @model_validator(mode="after")
    def _kept_layers_need_checkpointing(self) -> TrainerOptions:
        # sft, rl and student each define gradient_checkpointing; without it every layer keeps its activations
        if self.uncheckpointed_layers is not None and not getattr(self, "gradient_checkpointing", True):
            raise ValueError(
                f"uncheckpointedLayers: {self.uncheckpointed_layers} is set but gradientCheckpointing is false "
                "(every layer keeps its activations); unset uncheckpointedLayers or turn gradientCheckpointing on"
            )
        return self

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

    model_config = ConfigDict(json_schema_extra=cel_rules(MICRO_BATCH_RULE))

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
        check_micro_batches(self.batch_size, self.per_device_batch_size)
        return self


class ServerSpec(Strict):
    """Where a stage's samples come from: in-process, or a vLLM OpenAI server given by URL."""

    mode: Literal["inprocess", "server"] = Field(
        "inprocess", description="inprocess: the trainer generates; server: a vLLM OpenAI server at serverUrl."
    )
    server_url: str | None = Field(
        None, description="Base URL of the vLLM server (mode=server): give it yourself, no server is started for it."
    )
    server_timeout_seconds: int = Field(600, gt=0, description="How long to wait for the server.")
