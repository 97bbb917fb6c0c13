"""What a preemption costs, from the plan (pure): the time of one optimizer step of each Trainer stage, the time of
one checkpoint save, the grace period a stop needs, and the work a stop can lose.

A stop (SIGTERM: preemption, drain, eviction, suspend) ends at the next micro-batch boundary (rlt.stages.preemption):
the gang abandons the step in progress and saves the last completed one. Within the grace period, it loses the
abandoned step's work so far (at most one step). Past the grace period (SIGKILL before the save ends), or on a node
loss, it loses everything since the last periodic checkpoint: up to `saveSteps` steps. So the plan checks that the
grace period covers the wait for a boundary (one micro-batch, or the rest of a rollout) plus one save, and that
the checkpoint interval (saveSteps × step) is near the one that costs least: Young's interval sqrt(2 × save ×
MTBF), which balances the time spent saving against the expected time lost to a SIGKILL. It warns past twice that
interval (where the expected cost is 25 % above the least) and suggests the saveSteps / terminationGracePeriodSeconds
to set.

The figures are estimates for planning, stated here so a reader can redo them:
- update: 6 FLOPs per trainable parameter per token (forward and backward), 2 per frozen parameter per token for
  each frozen forward (GRPO's reference at beta > 0, the reward's student), at UTILISATION of the GPU's dense bf16
  peak (PEAK_FLOPS);
- rollout (rl): the step's completions at MEAN_COMPLETION_SHARE of maxCompletionLength, decoded DECODE_TOKENS_PER_S
  per sequence with up to VLLM_MAX_NUM_SEQS sequences per server at once;
- tokens per row: the prompt (maxPromptLength) plus the mean completion; sft/student rows at half their maxLength;
- a save: the checkpoint's bytes (rlt.checks.model_shape.checkpoint_bytes) at WRITE_BYTES_PER_S to the volume, times
  SAVE_MARGIN, plus EXIT_SECONDS for the launcher and ranks to leave."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlt.checks.model_shape import ModelShape, Shapes, checkpoint_bytes, dtype_bytes, known_shape, trainable_params
from rlt.spec.budgets import VLLM_MAX_NUM_SEQS
from rlt.spec.resources import GRACE_FLOOR_SECONDS
from rlt.spec.run import RLTRunSpec, stage_settings

PEAK_FLOPS = 989e12  # H100 SXM dense bf16 (A100: 312e12: the estimate is then ~3× short)
UTILISATION = 0.35  # model FLOPs utilisation of a long-sequence 7B update with ZeRO-3 and checkpointing
DECODE_TOKENS_PER_S = 30.0  # per sequence, vLLM at full batch, 7B on one H100 (budgets assumes 10 as a floor)
MEAN_COMPLETION_SHARE = 0.5  # completions average half of maxCompletionLength
WRITE_BYTES_PER_S = 500e6  # a network volume's sustained write (ReadWriteMany NFS/CephFS class)
SAVE_MARGIN = 2.0
EXIT_SECONDS = 60  # ranks and launcher leaving, the marker written
MTBF_SECONDS = 24 * 3600  # a gang's mean time between losses (SIGKILL past the grace period, a node lost, an OOM)


@dataclass(frozen=True)
class StepTime:
    stage: str
    rollout: float  # seconds of generation per step
    update: float  # seconds of forward/backward (and frozen forwards) per step
    micro_batches: int  # per rank per step
    save: float  # seconds to write one checkpoint and exit

    @property
    def step(self) -> float:
        return self.rollout + self.update

    @property
    def grace(self) -> int:
        """The grace period a stop needs: the longest wait for a boundary (one micro-batch, or a rollout: GRPO
        generates at its first micro-batch) plus a save."""
        return math.ceil(max(self.update / max(1, self.micro_batches), self.rollout) + self.save)


def step_time(
    spec: RLTRunSpec,
    stage: str,
    shape: ModelShape,
    trainable: int,
    checkpoint: int,
    student: ModelShape | None = None,
) -> StepTime:
    """One optimizer step of Trainer stage `stage` (sft, rl, student) of a model of `shape` with `trainable`
    parameters, and the save of a `checkpoint`-byte checkpoint."""
    st = stage_settings(spec, stage)
    res = spec.resources.trainer
    world = res.nodes * max(1, res.gpus)
    rollout = 0.0
    frozen = 0
    if stage == "rl":
        rl = spec.stages.rl
        completion = rl.max_completion_length * MEAN_COMPLETION_SHARE
        tokens = rl.batch_size * (rl.max_prompt_length + completion)
        gen = spec.resources.generator
        servers = gen.replicas * gen.data_parallel_size if rl.generation.mode == "server" else world
        waves = math.ceil(rl.batch_size / (VLLM_MAX_NUM_SEQS * max(1, servers)))
        rollout = waves * completion / DECODE_TOKENS_PER_S
        frozen = (shape.params if rl.beta > 0 and spec.teacher.lora is None else 0) + (
            student.params if student is not None else 0
        )
    else:
        tokens = st.batch_size * (st.max_length or 1024) / 2
    flops = tokens * (6 * trainable + 2 * (shape.params - trainable) + 2 * frozen)
    update = flops / (world * PEAK_FLOPS * UTILISATION)
    micro = max(1, st.batch_size // (st.per_device_batch_size * world))
    save = checkpoint / WRITE_BYTES_PER_S * SAVE_MARGIN + EXIT_SECONDS
    return StepTime(stage, rollout, update, micro, save)


def checkpoint_interval(save: float) -> float:
    """Young's checkpoint interval (seconds of training between saves) for a save of `save` seconds."""
    return math.sqrt(2 * save * MTBF_SECONDS)


def preemption_notes(
    spec: RLTRunSpec, times: list[StepTime], grace_period: tuple[int, str]
) -> tuple[list[str], list[str]]:
    """The plan's lines on stopping: per stage the step time, the save and what a stop loses; a warning (with the
    value to set) when saveSteps × step is over twice Young's interval or the trainer pods' grace period
    (`grace_period`: seconds, where they come from) is below what a stop needs. (lines, warnings)."""
    grace, source = grace_period
    out: list[str] = [f"the trainer pods' grace period: {grace} s ({source})"] if times else []
    warn: list[str] = []
    for t in times:
        save_steps = stage_settings(spec, t.stage).save_steps
        loss = save_steps * t.step
        rollout = f"rollout {minutes(t.rollout)}, " if t.rollout else ""
        out.append(
            f"{t.stage}: one step ≈ {minutes(t.step)} ({rollout}update {minutes(t.update)} over {t.micro_batches} "
            f"micro-batches per rank); a checkpoint save ≈ {minutes(t.save)}; a stop within the grace period "
            f"({grace} s) loses the step in progress only, a SIGKILL or node loss up to saveSteps × step = "
            f"{minutes(loss)} (rlt.checks.step_time)"
        )
        best = checkpoint_interval(t.save)
        if loss > 2 * best:
            warn.append(
                f"{t.stage}: saveSteps {save_steps} × step ≈ {minutes(loss)} is over twice the checkpoint "
                f"interval that costs least ({minutes(best)} for a {minutes(t.save)} save, one loss a day); set "
                f"stages.{t.stage}.saveSteps: {max(1, round(best / t.step))}"
            )
        if grace < t.grace:
            warn.append(
                f"{t.stage}: the trainer pods' grace period, {grace} s ({source}), is below the {t.grace} s a stop "
                "needs (the longest wait for a micro-batch or rollout boundary plus a save); set "
                f"resources.trainer.terminationGracePeriodSeconds: {t.grace}"
            )
    return out, warn


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


TRAINER_STAGES = ("sft", "rl", "student")


def trainer_step_times(spec: RLTRunSpec, shapes: Shapes, gpu: bool = True) -> list[StepTime]:
    """One optimizer step and one checkpoint save of each enabled Trainer stage whose model shape is known."""
    world = spec.resources.trainer.nodes * max(1, spec.resources.trainer.gpus)
    times = []
    for stage in (s for s in spec.stages.enabled() if s in TRAINER_STAGES):
        ref = spec.teacher if stage != "student" else (spec.stages.student.model or spec.student)
        shape = shapes.teacher if stage != "student" else shapes.student_stage(spec)
        if shape is None:
            continue
        trainable = trainable_params(shape, ref)
        zero = stage_settings(spec, stage).deepspeed_zero_stage
        one = checkpoint_bytes(shape, trainable, zero, world, dtype_bytes(ref, gpu))
        times.append(step_time(spec, stage, shape, trainable, one, shapes.student if stage == "rl" else None))
    return times


def trainer_grace_period(spec: RLTRunSpec) -> tuple[int, str]:
    """(the trainer pods' terminationGracePeriodSeconds, where it comes from). The spec's value when set; else the
    larger of GRACE_FLOOR_SECONDS and what a stop needs by the plan (StepTime.grace: the longest wait for a boundary
    plus one save), sized from the shapes known without torch or a file (rlt.checks.model_shape.known_shape), as the
    operator's image has neither; GRACE_FLOOR_SECONDS when a model is not among them."""
    set_value = spec.resources.trainer.termination_grace_period_seconds
    if set_value is not None:
        return set_value, "resources.trainer.terminationGracePeriodSeconds"
    stages = [s for s in spec.stages.enabled() if s in TRAINER_STAGES]
    if not stages:
        return GRACE_FLOOR_SECONDS, "the default (no Trainer stage)"
    # the shapes trainer_step_times reads: the teacher's, the reward's student (rl), the student stage's model
    trained = (spec.stages.student.model or spec.student).model
    models = {spec.teacher.model} if {"sft", "rl"} & set(stages) else set()
    models |= {spec.student.model} if "rl" in stages else set()
    models |= {trained} if "student" in stages else set()
    unknown = sorted(m for m in models if known_shape(m) is None)
    if unknown:
        return GRACE_FLOOR_SECONDS, (
            f"the default: {', '.join(unknown)} not among the shapes known without reading the model "
            "(rlt.checks.model_shape.KNOWN_CONFIGS)"
        )
    shapes = Shapes(known_shape(spec.teacher.model), known_shape(spec.student.model), known_shape(trained))
    longest = max(trainer_step_times(spec, shapes), key=lambda t: t.grace)
    if longest.grace <= GRACE_FLOOR_SECONDS:
        return GRACE_FLOOR_SECONDS, f"the default (a stop needs {longest.grace} s by the plan)"
    wait = longest.grace - longest.save
    return longest.grace, (
        f"sized by the plan: a stop of {longest.stage} waits up to {minutes(wait)} for a boundary, then saves in "
        f"{minutes(longest.save)}"
    )
