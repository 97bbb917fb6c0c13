"""What a step costs and what a stop costs, from the plan (pure, torch-free: the operator sizes the trainer's grace
period with it): the phases of one optimizer step of each Trainer stage, one checkpoint save, the grace period a stop
needs, the work a stop can lose, and the share of the held GPU-seconds that does useful work (goodput).

A stop (SIGTERM: preemption, drain, eviction, suspend) ends at the next boundary the ranks agree on
(rlt.stages.preemption): the gang abandons the step in progress and saves the last completed one. Within the grace
period, it loses the abandoned step's work so far (at most one step). Past the grace period (SIGKILL before the save
ends), or on a node loss, it loses everything since the last periodic checkpoint: up to `saveSteps` steps. A stop
may arrive at any phase of a step, and before the first micro-batch of a GRPO step come the rollout, the scoring
and the reference/old-policy passes: the grace period a stop needs is all of them plus one micro-batch of the
longest allowed row plus one save. It is a sum, not the longest phase, so that it holds whichever phase ends the
ranks check the stop at; a grace period longer than needed costs nothing (the pod exits when its save ends). The
plan also checks that the checkpoint interval (saveSteps x step) is near the one that costs least: Young's interval
sqrt(2 x save x MTBF), which balances the time spent saving against the expected time lost to a SIGKILL, warning past
twice it (where the expected cost is 25 % above the least) with the saveSteps / terminationGracePeriodSeconds to set.

The figures are estimates for planning, stated here so a reader can redo them:
- tokens per row: the teacher's prompt, measured on the run's rows where `rlt plan` can read them and the teacher's
  tokenizer (PromptTokens), else DEFAULT_PROMPT_TOKENS, plus the completion: MEAN_COMPLETION_SHARE of
  maxCompletionLength on average, maxCompletionLength at the longest; sft/student rows at half their maxLength;
- compute: 6 FLOPs per trainable parameter per token (forward and backward), 4 per frozen parameter of the trained
  model (LoRA's base: forward, and backward to its input), 2 more per parameter when gradient checkpointing
  recomputes the forward; 2 per parameter per token for each forward pass without gradient: GRPO's reference
  (beta > 0), the old policy (importance sampling on, server/colocate), the reward's student (scoring); at
  UTILISATION of the GPU's dense bf16 peak (PEAK_FLOPS) on every trainer rank;
- rank imbalance: ZeRO synchronises the ranks at every layer (ZeRO-3) or every micro-step's gradient reduction, so
  each micro-step lasts as long as the longest row any rank holds: the update and the passes take rank_imbalance(world)
  times their balanced time (not the scoring: a rank scores its rows alone);
- rollout (rl): the longer of the throughput bound (the step's completion tokens over the sequences decoded at once,
  DECODE_TOKENS_PER_S each; at most VLLM_MAX_NUM_SEQS per engine and what its KV cache holds) and the longest-sequence
  bound (maxCompletionLength at DECODE_TOKENS_PER_S: one sequence decodes no faster), plus the weight transfer (the
  teacher's weights at WEIGHT_SYNC_BYTES_PER_S) before it;
- a save: the checkpoint's bytes (rlt.checks.model_shape.checkpoint_bytes) at the volume's write rate
  (storage.writeBytesPerSecond, else rlt.spec.resources.DEFAULT_WRITE_RATE: a baseline, so no further margin), plus
  EXIT_SECONDS for the launcher and ranks to leave."""

from __future__ import annotations

import math

from rlt.checks.model_shape import ModelShape, Shapes, known_shape
from rlt.checks.plan_terms import PromptTokens, StepTime, stage_terms
from rlt.spec.k8s import quantity_value
from rlt.spec.resources import DEFAULT_WRITE_RATE, GRACE_FLOOR_SECONDS
from rlt.spec.run import RLTRunSpec, stage_settings
from rlt.spec.stages import teacher_prompt_tokens, trained_student

# PromptTokens and StepTime live in rlt.checks.plan_terms (a stage's terms build them); re-exported for callers.
__all__ = ["PromptTokens", "StepTime"]

PEAK_FLOPS = 989e12  # H100 SXM dense bf16 (A100: 312e12: the estimate is then ~3x short)
UTILISATION = 0.35  # model FLOPs utilisation of a long-sequence 7B update with ZeRO-3 and checkpointing
DECODE_TOKENS_PER_S = 30.0  # per sequence, vLLM at full batch, 7B on one H100 (budgets assumes 10 as a floor)
MEAN_COMPLETION_SHARE = 0.5  # completions average half of maxCompletionLength
# A teacher prompt (question + solution, the chat template) when the rows cannot be measured: Bespoke-Stratos-17k's
# are 1-2k tokens (issue 43's read of the data); the upper end, so the step time errs long, never maxPromptLength
# (16k by default: 2x the update's tokens).
DEFAULT_PROMPT_TOKENS = 2048
# Each doubling of the ranks adds this much to the time a micro-step waits for its slowest rank (one row per
# micro-step, rows dealt at random): 1.54 at 4 ranks, 1.81 at 8, 2.08 at 16, close to issue 43's simulation of
# realistic length spreads (1.5, 1.8, 2.1). Balancing the ranks' rows by tokens brings it to ~1.05-1.1.
IMBALANCE_PER_DOUBLING = 0.27
# rl deals each step's rows across the ranks by tokens (rlt.stages.balance) for the loss types where a row weighs the
# same in any micro-batch: measured 1.068 at 4 ranks (benchmarks/rank_balance.py), simulated 1.02 at 8 and 1.04 at
# 16 with a paper-scale step; 0.035 a doubling covers the measurement.
BALANCED_IMBALANCE_PER_DOUBLING = 0.035
# The weight transfer before each rollout (TRL's server mode: the ZeRO-3 gather of each parameter, one HTTP request
# and an NCCL broadcast to the engines per parameter): ~15 s for a 7B model in bf16; an estimate, to be measured.
WEIGHT_SYNC_BYTES_PER_S = 1e9
EXIT_SECONDS = 60  # ranks and launcher leaving, the marker written
MTBF_SECONDS = 24 * 3600  # a gang's mean time between losses (SIGKILL past the grace period, a node lost, an OOM)


def default_prompts(spec: RLTRunSpec) -> PromptTokens:
    n = min(DEFAULT_PROMPT_TOKENS, teacher_prompt_tokens(spec))
    return PromptTokens(n, n, "not measured: rlt.checks.step_time.DEFAULT_PROMPT_TOKENS")


def write_rate(spec: RLTRunSpec) -> tuple[float, str]:
    """(bytes per second the run's volume writes, where the figure comes from)."""
    given = spec.storage.write_bytes_per_second
    if given is not None:
        return float(quantity_value(given)), f"storage.writeBytesPerSecond {given}"
    return float(quantity_value(DEFAULT_WRITE_RATE)), (
        f"the default {DEFAULT_WRITE_RATE}: common default storage classes' baseline; set storage.writeBytesPerSecond"
    )


def rank_imbalance(world: int, dealt: bool = False) -> float:
    """How much longer a synchronised micro-step lasts than a balanced one on `world` ranks: rows dealt at random
    (IMBALANCE_PER_DOUBLING) or by tokens (BALANCED_IMBALANCE_PER_DOUBLING)."""
    per_doubling = BALANCED_IMBALANCE_PER_DOUBLING if dealt else IMBALANCE_PER_DOUBLING
    return 1.0 + per_doubling * math.log2(max(1, world))


def seconds_of(flops: float) -> float:
    """Seconds one GPU takes for `flops` at UTILISATION of PEAK_FLOPS."""
    return flops / (PEAK_FLOPS * UTILISATION)


def step_time(
    spec: RLTRunSpec,
    stage: str,
    shape: ModelShape,
    trainable: int,
    checkpoint: int,
    mean: float,
    longest: float,
    dealt: bool = False,
) -> StepTime:
    """The update of one optimizer step of Trainer stage `stage` of a model of `shape` with `trainable` parameters,
    over rows of `mean` tokens (`longest` at most; `dealt`: dealt across the ranks by tokens), and the save of a
    `checkpoint`-byte checkpoint. The phases before the update are the stage's (rlt.checks.stage_terms)."""
    st = stage_settings(spec, stage)
    res = spec.resources.trainer
    world = res.nodes * max(1, res.gpus)
    per_token = 6 * trainable + 4 * (shape.params - trainable)
    recompute_per_token = 2 * shape.params if st.gradient_checkpointing else 0
    rows = st.batch_size / world  # rows per rank per step
    micro = max(1, st.batch_size // (st.per_device_batch_size * world))
    rate, _ = write_rate(spec)
    return StepTime(
        stage,
        micro_batches=micro,
        update_work=seconds_of(rows * mean * per_token),
        recompute=seconds_of(rows * mean * recompute_per_token),
        imbalance=rank_imbalance(world, dealt=dealt),
        longest_micro=seconds_of(st.per_device_batch_size * longest * (per_token + recompute_per_token)),
        save=checkpoint / rate + EXIT_SECONDS,
        save_steps=st.save_steps,
        trainer_gpus=world,
    )


def checkpoint_interval(save: float) -> float:
    """Young's checkpoint interval (seconds of training between saves) for a save of `save` seconds."""
    return math.sqrt(2 * save * MTBF_SECONDS)


def preemption_notes(
    spec: RLTRunSpec, times: list[StepTime], grace_period: tuple[int, str], prompts: PromptTokens | None = None
) -> tuple[list[str], list[str]]:
    """The plan's lines on stopping: the inputs it assumed (prompt length, write rate), per stage the phases of a
    step, the save, the grace period a stop needs and what a stop loses; a warning (with the value to set) when
    saveSteps x step is over twice Young's interval or the trainer pods' grace period (`grace_period`: seconds,
    where they come from) is below what a stop needs. (lines, warnings)."""
    grace, source = grace_period
    if not times:
        return [], []
    rate, rate_source = write_rate(spec)
    out = [
        f"the trainer pods' grace period: {grace} s ({source})",
        f"write rate: {rate / 1e6:.0f} MB/s ({rate_source})",
    ]
    for t in [t for t in times if t.reads_prompts][:1]:
        p = prompts or default_prompts(spec)
        out.append(f"{t.stage} prompts: mean {p.mean}, longest {p.longest} tokens ({p.source})")
    warn: list[str] = []
    for t in times:
        loss = t.save_steps * t.step
        out += phase_lines(spec, t)
        out.append(
            f"{t.stage}: a stop needs {t.grace} s = {stop_wait(t)} + a save {minutes(t.save)}; within the grace period "
            f"({grace} s) it loses the step in progress only, a SIGKILL or node loss up to saveSteps × step = "
            f"{minutes(loss)}"
        )
        best = checkpoint_interval(t.save)
        if loss > 2 * best:
            warn.append(
                f"{t.stage}: saveSteps {t.save_steps} × step ≈ {minutes(loss)} is over twice the checkpoint "
                f"interval that costs least ({minutes(best)} for a {minutes(t.save)} save, one loss a day); set "
                f"stages.{t.stage}.saveSteps: {max(1, round(best / t.step))}"
            )
        if grace < t.grace:
            warn.append(
                f"{t.stage}: the trainer pods' grace period, {grace} s ({source}), is below the {t.grace} s a stop "
                f"needs ({stop_wait(t)}, plus a save); set resources.trainer.terminationGracePeriodSeconds: {t.grace}"
            )
    return out, warn


def stop_wait(t: StepTime) -> str:
    """The phases a stop may wait for before its save, named with their bounds."""
    parts = [f"rollout {minutes(t.rollout)}"] if t.rollout else []
    parts += [f"scoring {minutes(t.scoring)}"] if t.scoring else []
    parts += [f"{t.passes_name} {minutes(t.passes)}"] if t.passes else []
    return " + ".join([*parts, f"the longest micro-batch {minutes(t.longest_micro)}"])


def phase_lines(spec: RLTRunSpec, t: StepTime) -> list[str]:
    """A step of `t.stage` phase by phase, each with how it was bounded."""
    world = t.trainer_gpus
    lines = [
        f"{t.stage}: one step ≈ {minutes(t.step)} = "
        + " + ".join(
            f"{name} {minutes(v)}"
            for name, v in (
                ("rollout", t.rollout),
                ("scoring", t.scoring),
                (t.passes_name, t.passes),
                ("update", t.update),
            )
            if v
        )
        + f"; a save ≈ {minutes(t.save)} every {t.save_steps} steps (rlt.checks.step_time)"
    ]
    if t.rollout:
        rl = stage_settings(spec, t.stage)  # the stage whose step this is
        bound = "the longest completion" if t.longest_bound >= t.throughput_bound else "throughput"
        lines.append(
            f"{t.stage}: rollout {minutes(t.rollout)}, bound by {bound}: the longer of the throughput bound "
            f"({minutes(t.throughput_bound)}: {rl.batch_size} completions of {rl.max_completion_length * MEAN_COMPLETION_SHARE:.0f} "
            f"tokens on average at {DECODE_TOKENS_PER_S:.0f} tokens/s per sequence) and the longest allowed completion "
            f"({minutes(t.longest_bound)}: {rl.max_completion_length} tokens), plus the weight transfer "
            f"({minutes(t.transfer)})"
        )
    recompute = ", gradient-checkpoint recompute" if t.recompute else ""
    dealt = t.imbalance < rank_imbalance(world)  # rows dealt by tokens (rl, rlt.stages.balance)
    constant = "BALANCED_IMBALANCE_PER_DOUBLING, rows dealt by tokens" if dealt else "IMBALANCE_PER_DOUBLING"
    lines.append(
        f"{t.stage}: update {minutes(t.update)} over {t.micro_batches} micro-batches per rank (forward and backward"
        f"{recompute}, ×{t.imbalance:.2f} rank imbalance at {world} ranks: rlt.checks.step_time.{constant})"
    )
    return lines


def goodput(t: StepTime) -> tuple[float, list[tuple[str, float]]]:
    """(the share of the GPU-seconds the stage holds that does useful work, the rest by cause as shares, largest
    first). Useful: the update's forward and backward at balanced ranks, and generation at full decode slots. The
    held GPUs: the trainer's, and the generators' in server mode; a step's period includes its share of a save."""
    period = t.step + t.save / max(1, t.save_steps)
    gen, trainers = t.generator_gpus, t.trainer_gpus
    held = (trainers + gen) * period
    generating = gen or (trainers if t.rollout else 0)  # colocate/inprocess generate on the trainer GPUs
    useful = trainers * t.update_work + generating * t.busy_generation
    losses = [
        ("trainers idle during the rollout", trainers * t.rollout if gen else 0.0),
        ("generators idle during scoring, passes and update", gen * (t.step - t.rollout)),
        (
            "decode slots empty (the longest completions' tail, the weight transfer)",
            generating * t.rollout - generating * t.busy_generation,
        ),
        ("rank imbalance", trainers * (t.imbalance - 1) * (t.update_work + t.recompute + t.passes_work)),
        ("scoring", trainers * t.scoring),
        (t.passes_name, trainers * t.passes_work),
        ("gradient-checkpoint recompute", trainers * t.recompute),
        ("saves", (trainers + gen) * t.save / max(1, t.save_steps)),
    ]
    ranked = sorted(((name, v / held) for name, v in losses if v > 0), key=lambda x: -x[1])
    return useful / held, ranked


def goodput_line(t: StepTime) -> str:
    share, losses = goodput(t)
    gpus = t.trainer_gpus + t.generator_gpus
    lost = ", ".join(f"{name} {v:.0%}" for name, v in losses if v >= 0.005)
    return (
        f"{t.stage}: {share:.0%} of the {gpus} GPUs' held GPU-seconds do useful work (update and busy generation); "
        f"lost: {lost}"
    )


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def trainer_step_times(
    spec: RLTRunSpec,
    shapes: Shapes,
    gpu: bool = True,
    prompts: PromptTokens | None = None,
    gpu_memory: int | None = None,
) -> list[StepTime]:
    """One optimizer step and one checkpoint save of each enabled Trainer stage whose model shape is known (rl rows
    of `prompts`, default_prompts when None; generators of `gpu_memory` GPUs, the spec's when None): each stage's
    terms (rlt.checks.plan_terms.stage_terms) say it."""
    times = [stage_terms(s).step_time(spec, shapes, gpu, prompts, gpu_memory) for s in spec.stages.enabled()]
    return [t for t in times if t is not None]


def trainer_grace_period(spec: RLTRunSpec) -> tuple[int, str]:
    """(the trainer pods' terminationGracePeriodSeconds, where it comes from). The spec's value when set; else the
    larger of GRACE_FLOOR_SECONDS and what a stop needs by the plan (StepTime.grace: the longest wait for a boundary
    plus one save), sized from the shapes known without torch or a file (rlt.checks.model_shape.known_shape), as the
    operator's image has neither; GRACE_FLOOR_SECONDS when a model is not among them."""
    set_value = spec.resources.trainer.termination_grace_period_seconds
    if set_value is not None:
        return set_value, "resources.trainer.terminationGracePeriodSeconds"
    # the shapes trainer_step_times reads: each enabled stage names those its step reads
    models = set().union(*(stage_terms(s).step_models(spec) for s in spec.stages.enabled()))
    if not models:
        return GRACE_FLOOR_SECONDS, "the default (no Trainer stage)"
    trained = trained_student(spec).model
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
        f"{minutes(longest.save)} at {write_rate(spec)[0] / 1e6:.0f} MB/s"
    )
