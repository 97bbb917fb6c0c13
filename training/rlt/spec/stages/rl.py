"""The rl stage's settings: GRPO of the teacher with the RLT reward, its generation and its reference sync."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import ConfigDict, Field, model_validator

from rlt.contract.api import Strict
from rlt.contract.method_registry import method_info
from rlt.spec.k8s import cel_rules
from rlt.spec.stage_settings import CelRule, Rollout
from rlt.spec.stages.shared import (
    INSTEAD,
    MICRO_BATCH_RULE,
    TRAINER_OWNED_ARGS,
    ServerSpec,
    TrainerOptions,
    check_micro_batches,
)

# spec.stages.rl.generation.overlap: the one place its values are named (the runtime, the plan and the docs read them)
Overlap = Literal["none", "oneStepOff", "partialRollouts"]
NO_OVERLAP, ONE_STEP_OFF, PARTIAL_ROLLOUTS = get_args(Overlap)

RL_OWNED_ARGS: dict[str, str] = {
    **TRAINER_OWNED_ARGS,
    "max_steps": INSTEAD + "steps",
    "steps_per_generation": INSTEAD + "batchSize (one generation round per optimizer step)",
    "num_generations": INSTEAD + "numGenerations",
    "num_iterations": "fixed at 1: the RLT reward scores the policy that sampled, once per generation round",
    "max_completion_length": INSTEAD + "maxCompletionLength",
    "temperature": INSTEAD + "temperature",
    "top_p": INSTEAD + "topP",
    "top_k": "fixed off (clean sampling: the reward's teacher log-probs follow only temperature and topP)",
    "min_p": "fixed off (clean sampling: the reward's teacher log-probs follow only temperature and topP)",
    "repetition_penalty": "fixed at 1 (clean sampling: the reward's teacher log-probs follow only temperature and topP)",
    "beta": INSTEAD + "beta",
    "model_init_kwargs": "set by rlt: the reference model loads in spec.teacher.dtype",
    "loss_type": INSTEAD + "lossType",
    "scale_rewards": "fixed at 'group' (the paper's per-question normalisation of the RLT reward)",
    "mask_truncated_completions": "fixed off: unclosed explanations pay spec.stages.rl.reward.formatPenalty instead",
    "sync_ref_model": INSTEAD + "refSync.enabled",
    "ref_model_mixup_alpha": INSTEAD + "refSync.alpha",
    "ref_model_sync_steps": INSTEAD + "refSync.steps",
    "use_vllm": INSTEAD + "generation.mode",
    "vllm_mode": INSTEAD + "generation.mode",
    "vllm_server_base_url": INSTEAD + "generation.serverUrl",
    "vllm_server_timeout": INSTEAD + "generation.serverTimeoutSeconds",
    "vllm_gpu_memory_utilization": INSTEAD + "generation.gpuMemoryUtilization",
    "vllm_max_model_length": INSTEAD + "generation.maxModelLen",
    "vllm_enable_sleep_mode": "set by rlt: on in colocate mode (the engine sleeps while the trainer updates)",
    "vllm_importance_sampling_correction": INSTEAD + "generation.importanceSampling",
    "vllm_importance_sampling_mode": INSTEAD + "generation.importanceSampling",
    "vllm_importance_sampling_clip_max": INSTEAD + "generation.importanceSamplingCap",
}


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
    overlap: Overlap = Field(
        NO_OVERLAP,
        description="none: each step generates, then trains. oneStepOff: the generators produce step k+1's rollouts "
        "while the trainers update on step k (a row is trained at most one optimizer step after the weights that "
        "sampled it; the GRPO clip and the importance ratio correct for it). partialRollouts (mode server): two "
        "steps' rollouts in flight, their unfinished rows held through each weight push and continued under the "
        "new weights, so the engines' decode slots stay full (a row's tokens come from up to two policies, each "
        "token's sampling log-prob kept; at most two steps off-policy; not the same run to run). Modes colocate "
        "and inprocess have no time to gain by it (the same GPUs generate and train). `rlt plan` prints each mode's goodput and the one "
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

    model_config = ConfigDict(json_schema_extra=cel_rules(_GROUP_RULE, MICRO_BATCH_RULE, _MODEL_LEN_RULE))
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
        check_micro_batches(self.batch_size, self.per_device_batch_size)
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

    def training_rows_problem(self, rows: int, source: str) -> str | None:
        per_step = self.batch_size // self.num_generations  # TRL deals whole steps of questions, drops the rest
        if rows >= per_step:
            return None
        return (
            f"spec.stages.rl.batchSize: a step takes {per_step} questions (batchSize {self.batch_size} / "
            f"numGenerations {self.num_generations}) but {source} has {rows} usable training rows, so rl would "
            "train no step (lower batchSize, or add rows)"
        )

    def run_problems(self, name: str, spec: Any) -> list[str]:
        problems = super().run_problems(name, spec)
        if not self.enabled:
            return problems
        mode, generator = self.generation.mode, spec.resources.generator
        overlap = self.generation.overlap
        ahead = overlap != NO_OVERLAP  # rows sampled ahead of the update: oneStepOff or partialRollouts
        if mode == "colocate" and spec.resources.trainer.gpus == 0:
            problems.append(
                "resources.trainer.gpus: 0 with stages.rl.generation.mode colocate, which runs vLLM on the "
                "trainer's GPUs; give the trainer GPUs or use mode server (vLLM pods) or inprocess"
            )
        if mode == "server" and ahead and self.generation.importance_sampling == "off":
            problems.append(
                f"stages.rl.generation.importanceSampling: off with overlap {overlap}; a row sampled by earlier "
                "steps' weights needs the importance ratio: use tokenTruncate (TRL's default) or another mode"
            )
        if overlap == PARTIAL_ROLLOUTS and mode == "inprocess":
            problems.append(
                "stages.rl.generation.overlap: partialRollouts with mode inprocess; partial rollouts hold the "
                "generators' unfinished rows through the weight push (vLLM's pause and resume), which an in-process "
                "sampler has no way to do: use mode server, or overlap oneStepOff"
            )
        if ahead and mode == "inprocess" and self.top_p < 1:
            # the behaviour log-probs are of the nucleus renormalised; TRL's policy log-probs are the plain tempered
            # softmax: their ratio is the nucleus mass (< 1) even on-policy, and GRPO's clip would bias the update
            problems.append(
                f"stages.rl.topP: {self.top_p} with overlap oneStepOff in mode inprocess; the ratio of the policy to "
                "the behaviour policy would carry the nucleus' mass: use topP 1, or mode server (TRL's importance "
                "sampling)"
            )
        if ahead and mode == "inprocess" and self.trainer_args.get("cast_lm_head_to_fp32"):
            problems.append(
                "stages.rl.trainerArgs.cast_lm_head_to_fp32 with overlap oneStepOff in mode inprocess; TRL's fp32 "
                "head is a closure over the policy's own head, so the behaviour copy would sample with the weights "
                "the optimizer is changing: drop it, or use mode server"
            )
        if ahead and method_info(spec.method).samples_student:
            problems.append(
                f"stages.rl.generation.overlap: {overlap} with method {spec.method}, which samples the frozen "
                "student during rl (its probes in the background rollout, its answers in the reward on the training "
                "thread: one model, torch's shared generator, two threads), so the run would depend on thread "
                "timing: use overlap none"
            )
        if mode == "colocate" and self.generation.overlap != NO_OVERLAP:
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


def generation(spec: Any) -> GenerationSpec:
    """Where the run's teacher samples come from: rl's generation settings, which distill shares (the run's vLLM
    generators serve both; the operator fills serverUrl in)."""
    gen: GenerationSpec = spec.stages.rl.generation
    return gen


def teacher_prompt_tokens(spec: Any) -> int:
    """The longest teacher prompt the run takes: rl's maxPromptLength (distill, evaluate and the plan size theirs
    from it)."""
    tokens: int = spec.stages.rl.max_prompt_length
    return tokens


def teacher_completion_tokens(spec: Any) -> int:
    """The longest completion the generators decode for rl (its maxCompletionLength)."""
    tokens: int = spec.stages.rl.max_completion_length
    return tokens


def reward_settings(spec: Any) -> RewardSpec:
    """The RLT reward's settings (stages.rl.reward): rl trains with it, distill ranks candidates by it, the plan
    sizes the scoring micro-batch from it."""
    reward: RewardSpec = spec.stages.rl.reward
    return reward


def teacher_temperature(spec: Any) -> float:
    """The temperature of the teacher's log-probs in the reward RL optimises: rl's, at which its policy samples."""
    rl: RlStage = spec.stages.rl
    return rl.temperature


def student_temperature(spec: Any) -> float:
    """The temperature of the student's log-probs in the reward: reward.studentTemperature, else rl's temperature."""
    rl: RlStage = spec.stages.rl
    return rl.reward.student_temperature or rl.temperature
