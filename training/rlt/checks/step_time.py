"""What a step costs and what a stop costs, from the plan (pure, torch-free: the operator sizes the trainer's grace
period with it): the phases of one optimizer step of each Trainer stage, one checkpoint save, the grace period a stop
needs, the work a stop can lose, and the share of the held GPU-seconds that does useful work (goodput).

A stop (SIGTERM: preemption, drain, eviction, suspend) ends at the next boundary the ranks agree on
(rlt.stages.preemption): the gang abandons the step in progress and saves the last completed one. Within the grace
period, it loses the abandoned step's work so far (at most one step). Past the grace period (SIGKILL before the save
ends), or on a node loss, it loses everything since the last periodic checkpoint: up to `saveSteps` steps. A stop
may arrive at any phase of a step, and before the first micro-batch of a GRPO step come the rollout, the scoring
and the reference pass: the grace period a stop needs is all of them plus one micro-batch of the
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
  (beta > 0) and the reward's student (scoring); the old policy's, for importance sampling, is folded into the
  update's forward (rlt.stages.folded_ratio); at
  UTILISATION of the GPU's dense bf16 peak (PEAK_FLOPS) on every trainer rank;
- rank imbalance: ZeRO synchronises the ranks at every layer (ZeRO-3) or every micro-step's gradient reduction, so
  each micro-step lasts as long as the longest row any rank holds: the update and the passes take rank_imbalance(world)
  times their balanced time (not the scoring: a rank scores its rows alone);
- rollout (rl): each engine's rows decoded step by step (rlt.checks.decode_tail: at most VLLM_MAX_NUM_SEQS per
  engine and what its KV cache holds, DECODE_TOKENS_PER_S each with the slots full, faster as the batch empties in
  the last rows' tail), plus the weight transfer (the teacher's weights at WEIGHT_SYNC_BYTES_PER_S) before it. The
  earlier bounds stay beside it: the throughput bound (the step's completion tokens over the sequences decoded at
  once) and the longest-sequence bound (maxCompletionLength at DECODE_TOKENS_PER_S); in-process generation (HF
  generate keeps finished rows in its batch) uses the longer of them, and the grace period takes the longer of
  them and the estimate;
- a save: the checkpoint's bytes (rlt.checks.model_shape.checkpoint_bytes) at the volume's write rate
  (storage.writeBytesPerSecond, else rlt.spec.resources.DEFAULT_WRITE_RATE: a baseline, so no further margin), plus
  EXIT_SECONDS for the launcher and ranks to leave."""

from __future__ import annotations

import math

from rlt.checks.gpu_figures import DECODE_TOKENS_PER_S, calibration, figures
from rlt.checks.model_shape import ModelShape, Shapes, known_shape
from rlt.checks.plan_terms import PromptTokens, StepTime, stage_terms
from rlt.spec.k8s import quantity_value
from rlt.spec.resources import DEFAULT_WRITE_RATE, GRACE_FLOOR_SECONDS
from rlt.spec.run import RLTRunSpec, stage_settings
from rlt.spec.stages import teacher_prompt_tokens, trained_student

# PromptTokens and StepTime live in rlt.checks.plan_terms (a stage's terms build them), DECODE_TOKENS_PER_S in
# rlt.checks.gpu_figures (the GPU figures); re-exported for callers.
__all__ = ["DECODE_TOKENS_PER_S", "PromptTokens", "StepTime"]

PEAK_FLOPS = 989e12  # H100 SXM dense bf16; the plan uses the spec's GPU's (rlt.checks.gpu_figures)
UTILISATION = 0.35  # model FLOPs utilisation of a long-sequence 7B update with ZeRO-3 and checkpointing
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
# sft and student deal a window of steps (rlt.stages.sft_balance.StepDeal): a micro-step's rows are neighbours in
# the window's rows sorted by tokens. benchmarks/rank_balance.py's simulation of the sampler on its skewed length mix
# (4096 rows, one per micro-batch): 1.017 at 4 ranks, 1.041 at 8, 1.085 at 16; its 4-rank ZeRO-3 world measured
# 1.02. Rounded up, by ranks; interpolated in log2(ranks), past 16 growing as its last doubling.
WINDOW_DEALT_IMBALANCE = ((1, 1.0), (4, 1.02), (8, 1.05), (16, 1.09))
# The weight transfer before each rollout (TRL's server mode: the ZeRO-3 gather of each parameter, one HTTP request
# and an NCCL broadcast to the engines per parameter): ~15 s for a 7B model in bf16; an estimate, to be measured.
WEIGHT_SYNC_BYTES_PER_S = 1e9
EXIT_SECONDS = 60  # ranks and launcher leaving, the marker written
# A pod's local checkpoint volume over its share of one checkpoint: the Trainer's small files (state, scheduler,
# each rank's RNG) and the estimate's error; a full volume fails the save (an emptyDir past its size is evicted).
LOCAL_MARGIN = 1.2
# A periodic save blocks the training loop for the write to the pod's local disk only; a background copy makes it
# durable on the run's volume (rlt.stages: the marker written after its fsync). The H200 GPU check wrote a Trainer
# checkpoint with its optimizer to local disk at 0.91 GB/s (benchmarks/gpu-runs/2026-11-27-h200); a datacenter
# NVMe writes 2-7 GB/s. `rlt plan --calibration` replaces it with the measured rate.
DEFAULT_LOCAL_WRITE_RATE = 900e6


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


def rank_imbalance(world: int, dealt: bool = False, window: bool = False) -> float:
    """How much longer a synchronised micro-step lasts than a balanced one on `world` ranks: rows dealt at random
    (IMBALANCE_PER_DOUBLING), by tokens one step at a time (rl: BALANCED_IMBALANCE_PER_DOUBLING) or over a window
    of steps (sft, student: WINDOW_DEALT_IMBALANCE)."""
    doublings = math.log2(max(1, world))
    if dealt and window:
        points = [(math.log2(n), f) for n, f in WINDOW_DEALT_IMBALANCE]
        for (x0, f0), (x1, f1) in zip(points, points[1:], strict=False):
            if doublings <= x1 or (x1, f1) == points[-1]:
                return f0 + (f1 - f0) * (doublings - x0) / (x1 - x0)
    per_doubling = BALANCED_IMBALANCE_PER_DOUBLING if dealt else IMBALANCE_PER_DOUBLING
    return 1.0 + per_doubling * doublings


def imbalance_source(dealt: bool, window: bool) -> str:
    """Where rank_imbalance's figure comes from, for the plan's lines."""
    if dealt and window:
        return "rlt.checks.step_time.WINDOW_DEALT_IMBALANCE, rows dealt by tokens over a window of steps"
    if dealt:
        return "rlt.checks.step_time.BALANCED_IMBALANCE_PER_DOUBLING, rows dealt by tokens"
    return "rlt.checks.step_time.IMBALANCE_PER_DOUBLING"


def seconds_of(flops: float, spec: RLTRunSpec) -> float:
    """Seconds one GPU of the spec's model takes for `flops` at UTILISATION of its peak (rlt.checks.gpu_figures)."""
    return flops / (figures(spec).peak_flops * UTILISATION)


def local_write_rate(spec: RLTRunSpec) -> tuple[float, str]:
    """(bytes per second a periodic save writes to the pod's local disk, where the figure comes from)."""
    cal = calibration()
    if cal is not None and cal.local_write_rate is not None:
        return cal.local_write_rate, f"measured: {cal.path}"
    return DEFAULT_LOCAL_WRITE_RATE, "rlt.checks.step_time.DEFAULT_LOCAL_WRITE_RATE (the H200 check's local disk)"


def mtbf_seconds(spec: RLTRunSpec) -> float:
    return spec.resources.trainer.mtbf_hours * 3600


def step_time(
    spec: RLTRunSpec,
    stage: str,
    shape: ModelShape,
    trainable: int,
    checkpoint: int,
    mean: float,
    longest: float,
    dealt: bool = False,
    window: bool = False,
) -> StepTime:
    """The update of one optimizer step of Trainer stage `stage` of a model of `shape` with `trainable` parameters,
    over rows of `mean` tokens (`longest` at most; `dealt`: dealt across the ranks by tokens, over a window of steps
    with `window`), and the save of a
    `checkpoint`-byte checkpoint. The phases before the update are the stage's (rlt.checks.stage_terms)."""
    st = stage_settings(spec, stage)
    res = spec.resources.trainer
    world = res.nodes * max(1, res.gpus)
    per_token = 6 * trainable + 4 * (shape.params - trainable)
    recompute_per_token = 2 * shape.params if st.gradient_checkpointing else 0
    rows = st.batch_size / world  # rows per rank per step
    micro = max(1, st.batch_size // (st.per_device_batch_size * world))
    rate, _ = write_rate(spec)
    local, _ = local_write_rate(spec)
    return StepTime(
        stage,
        micro_batches=micro,
        update_work=seconds_of(rows * mean * per_token, spec),
        recompute=seconds_of(rows * mean * recompute_per_token, spec),
        imbalance=rank_imbalance(world, dealt, window),
        imbalance_source=imbalance_source(dealt, window),
        longest_micro=seconds_of(st.per_device_batch_size * longest * (per_token + recompute_per_token), spec),
        save=checkpoint / rate + EXIT_SECONDS,
        save_local=checkpoint / local,
        staged_saves=res.local_checkpoints.enabled,
        durable_copy=checkpoint / rate,
        save_steps=st.save_steps,
        trainer_gpus=world,
        row_tokens=(mean, longest),
    )


def checkpoint_interval(save: float, mtbf: float) -> float:
    """Young's checkpoint interval (seconds of training between saves) for saves that block `save` seconds and a
    gang lost once every `mtbf` seconds: sqrt(2 × save × MTBF)."""
    return math.sqrt(2 * save * mtbf)


def interval_cost(interval: float, save: float, mtbf: float) -> float:
    """The share of the training time lost to saves and to the work redone after a loss, at `interval` seconds
    between saves (first order, Young): save / interval + interval / (2 × MTBF)."""
    return save / interval + interval / (2 * mtbf)


def save_interval_warning(spec: RLTRunSpec, t: StepTime, asynchronous: bool = True) -> str | None:
    """A warning when saveSteps × step is over twice or under half Young's interval (the lost share is then 25 %
    above the least or more), with the saveSteps to set and what the current one costs."""
    mtbf = mtbf_seconds(spec)
    blocked = t.save_blocked(asynchronous)
    best = checkpoint_interval(blocked, mtbf)
    st = stage_settings(spec, t.stage)
    # the stage's optimizer steps where the spec fixes them (rl's steps, maxSteps); by epochs the rows decide
    total: int | None = getattr(st, "max_steps", None) or getattr(st, "steps", None)
    interval = min(t.save_steps, total or t.save_steps) * t.step
    if 0.5 * best <= interval <= 2 * best:
        return None
    if total is not None and t.save_steps >= total and interval < best:
        return None  # the whole stage is shorter than the interval: saving at its end only is the least cost
    how = "over twice" if interval > best else "under half"
    what = "saves blocking" if interval < best else "work redone after a loss"
    to_set, target, why = max(1, round(best / t.step)), best, ""
    if total is not None and to_set >= total:
        to_set, target = total, total * t.step
        why = f" (the stage's {total} steps ≈ {minutes(target)}: a save at its end only)"
    extra = interval_cost(interval, blocked, mtbf) - interval_cost(target, blocked, mtbf)
    return (
        f"{t.stage}: saveSteps {t.save_steps} × step ≈ {minutes(interval)} is {how} the checkpoint interval that "
        f"costs least ({minutes(best)}: Young/Daly sqrt(2 × {minutes(blocked)} blocked per save × MTBF "
        f"{spec.resources.trainer.mtbf_hours:g} h, resources.trainer.mtbfHours)); it costs {extra:.1%} more of the "
        f"stage's GPU-time in {what}; set stages.{t.stage}.saveSteps: {to_set}{why}"
    )


def preemption_notes(
    spec: RLTRunSpec, times: list[StepTime], grace_period: tuple[int, str], prompts: PromptTokens | None = None
) -> tuple[list[str], list[str]]:
    """The plan's lines on stopping: the inputs it assumed (prompt length, write rate), per stage the phases of a
    step, the save, the grace period a stop needs and what a stop loses; a warning (with the value to set) when
    saveSteps x step is far from Young's interval or the trainer pods' grace period (`grace_period`: seconds,
    where they come from) is below what a stop needs. (lines, warnings)."""
    grace, source = grace_period
    if not times:
        return [], []
    rate, rate_source = write_rate(spec)
    local, local_source = local_write_rate(spec)
    out = [
        f"the trainer pods' grace period: {grace} s ({source})",
        f"write rate: {rate / 1e6:.0f} MB/s ({rate_source})",
    ]
    if spec.resources.trainer.local_checkpoints.enabled:
        size, how = local_checkpoint_size(spec, times)
        out += [
            f"local write rate: {local / 1e6:.0f} MB/s ({local_source}): a periodic save blocks for the local "
            "write, the durable copy to the volume overlaps the next steps",
            f"local checkpoints: the operator mounts a volume of {f'{size / 2**30:.0f} GiB' if size else 'no limit'} "
            f"per trainer pod at RLT_LOCAL_CHECKPOINTS ({how})",
        ]
    else:
        out.append("local checkpoints off (resources.trainer.localCheckpoints.enabled): a save blocks for its write")
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
            f"{minutes(loss)} plus the durable copy in flight ({minutes(t.durable_copy)})"
        )
        flagged = save_interval_warning(spec, t)
        warn += [flagged] if flagged else []
        if grace < t.grace:
            warn.append(
                f"{t.stage}: the trainer pods' grace period, {grace} s ({source}), is below the {t.grace} s a stop "
                f"needs ({stop_wait(t)}, plus a save); set resources.trainer.terminationGracePeriodSeconds: {t.grace}"
            )
    return out, warn


def stop_wait(t: StepTime) -> str:
    """The phases a stop may wait for before its save, named with their bounds."""
    longer = " (its decoding at the earlier bound)" if t.grace_rollout > t.rollout else ""
    parts = [f"rollout {minutes(t.grace_rollout)}{longer}"] if t.rollout else []
    parts += [f"scoring {minutes(t.scoring)}"] if t.scoring else []
    parts += [f"{t.passes_name} {minutes(t.passes)}"] if t.passes else []
    return " + ".join([*parts, f"the longest micro-batch {minutes(t.longest_micro)}"])


def phase_lines(spec: RLTRunSpec, t: StepTime) -> list[str]:
    """A step of `t.stage` phase by phase, each with how it was bounded."""
    world = t.trainer_gpus
    trainer = " + ".join(
        f"{name} {minutes(v)}"
        for name, v in (("scoring", t.scoring), (t.passes_name, t.passes), ("update", t.update))
        if v
    )
    if t.partial_rollouts and t.rollout:
        how = (
            f"the longest of the step's decoding at full slots {minutes(t.busy_generation)} plus the running rows' KV "
            f"recompute {minutes(t.kv_recompute)}, this step's {trainer}, and half of a rollout decoded alone "
            f"{minutes(t.generating / 2)} (it has two steps); then the weight sync {minutes(t.transfer)} (overlap "
            "partialRollouts)"
        )
    elif t.one_step_off and t.rollout:
        how = (
            f"the longer of the next step's decoding {minutes(t.generating)} and this step's {trainer}, then the "
            f"weight sync {minutes(t.transfer)} (overlap oneStepOff)"
        )
    else:
        how = (
            " + ".join([f"rollout {minutes(t.rollout)}"] if t.rollout else []) + (" + " if t.rollout else "") + trainer
        )
    lines = [
        f"{t.stage}: one step ≈ {minutes(t.step)} = {how}; a save ≈ {minutes(t.save)} every {t.save_steps} steps, "
        f"blocking {minutes(t.save_blocked(True))} "
        + ("(the local write; rlt.checks.step_time)" if t.staged_saves else "(the whole save: local checkpoints off)")
    ]
    if t.rollout:
        rl = stage_settings(spec, t.stage)  # the stage whose step this is
        bound = "the longest completion" if t.longest_bound >= t.throughput_bound else "throughput"
        bounds = (
            f"the throughput bound ({minutes(t.throughput_bound)}: {rl.batch_size} completions of "
            f"{rl.max_completion_length * MEAN_COMPLETION_SHARE:.0f} tokens on average at {DECODE_TOKENS_PER_S:.0f} "
            f"tokens/s per sequence) and the longest allowed completion ({minutes(t.longest_bound)}: "
            f"{rl.max_completion_length} tokens at the full batch's rate)"
        )
        how = f"bound by {bound}: the longer of {bounds}"
        if t.decode:
            how = (
                f"decoding {minutes(t.generating)} step by step, the batch emptying in the last rows' tail "
                f"(rlt.checks.decode_tail; the earlier bounds: {bounds}; the grace period takes the longer)"
            )
        lines.append(
            f"{t.stage}: rollout {minutes(t.rollout)}, {how}, plus the weight transfer ({minutes(t.transfer)})"
        )
    recompute = ", gradient-checkpoint recompute" if t.recompute else ""
    lines.append(
        f"{t.stage}: update {minutes(t.update)} over {t.micro_batches} micro-batches per rank (forward and backward"
        f"{recompute}, ×{t.imbalance:.2f} rank imbalance at {world} ranks: {t.imbalance_source})"
    )
    return lines


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


def known_step_times(spec: RLTRunSpec) -> tuple[list[StepTime], str]:
    """The Trainer stages' steps sized from the shapes known without torch or a file (rlt.checks.model_shape.
    known_shape), as the operator's image has neither: (steps, "") or ([], why not)."""
    # the shapes trainer_step_times reads: each enabled stage names those its step reads
    models = set().union(*(stage_terms(s).step_models(spec) for s in spec.stages.enabled()))
    if not models:
        return [], "no Trainer stage"
    unknown = sorted(m for m in models if known_shape(m) is None)
    if unknown:
        return [], (
            f"{', '.join(unknown)} not among the shapes known without reading the model "
            "(rlt.checks.model_shape.KNOWN_CONFIGS)"
        )
    trained = trained_student(spec).model
    shapes = Shapes(known_shape(spec.teacher.model), known_shape(spec.student.model), known_shape(trained))
    return trainer_step_times(every_layer_recomputed(spec), shapes), ""


def every_layer_recomputed(spec: RLTRunSpec) -> RLTRunSpec:
    """The spec with uncheckpointedLayers 0 where it is unset: the operator's image has no TRL, whose loss tile
    sizes the automatic choice reads (rlt.checks.checkpoint_layers), and what the operator sizes from these steps
    (the grace period, the local checkpoint volume) charges every layer's recompute anyway (StepTime.longest_micro)."""
    unset = {}
    for name in spec.stages.enabled():
        st = stage_settings(spec, name)
        if getattr(st, "gradient_checkpointing", False) and st.uncheckpointed_layers is None:
            unset[name] = st.model_copy(update={"uncheckpointed_layers": 0})
    return spec.model_copy(update={"stages": spec.stages.model_copy(update=unset)}) if unset else spec


def local_checkpoint_size(spec: RLTRunSpec, times: list[StepTime] | None = None) -> tuple[int | None, str]:
    """(bytes of a trainer pod's local checkpoint volume, where the figure comes from): the spec's size, else the
    largest share of one checkpoint a pod writes (StepTime.local_bytes; of `times`, else the known shapes') with
    LOCAL_MARGIN, in whole GiB; None when neither says (the volume then has no size limit)."""
    given = spec.resources.trainer.local_checkpoints.size
    if given is not None:
        return int(quantity_value(given)), "resources.trainer.localCheckpoints.size"
    why = ""
    if times is None:
        times, why = known_step_times(spec)
    sized = [t for t in times if t.local_bytes]
    if not sized:
        return None, f"no size limit: {why or 'no Trainer stage sized'}; set resources.trainer.localCheckpoints.size"
    t = max(sized, key=lambda t: t.local_bytes)
    size = math.ceil(t.local_bytes * LOCAL_MARGIN / 2**30) * 2**30
    return size, (
        f"sized by the plan: {t.stage}'s checkpoint, the first pod's share {t.local_bytes / 2**30:.0f} GiB, "
        f"× {LOCAL_MARGIN} (rlt.checks.step_time.LOCAL_MARGIN)"
    )


def trainer_grace_period(spec: RLTRunSpec) -> tuple[int, str]:
    """(the trainer pods' terminationGracePeriodSeconds, where it comes from). The spec's value when set; else the
    larger of GRACE_FLOOR_SECONDS and what a stop needs by the plan (StepTime.grace: the longest wait for a boundary
    plus one save), sized from the shapes known without torch or a file (rlt.checks.model_shape.known_shape), as the
    operator's image has neither; GRACE_FLOOR_SECONDS when a model is not among them."""
    set_value = spec.resources.trainer.termination_grace_period_seconds
    if set_value is not None:
        return set_value, "resources.trainer.terminationGracePeriodSeconds"
    times, why = known_step_times(spec)
    if not times:
        return GRACE_FLOOR_SECONDS, f"the default ({why})" if why == "no Trainer stage" else f"the default: {why}"
    longest = max(times, key=lambda t: t.grace)
    if longest.grace <= GRACE_FLOOR_SECONDS:
        return GRACE_FLOOR_SECONDS, f"the default (a stop needs {longest.grace} s by the plan)"
    wait = longest.grace - longest.save
    return longest.grace, (
        f"sized by the plan: a stop of {longest.stage} waits up to {minutes(wait)} for a boundary, then saves in "
        f"{minutes(longest.save)} at {write_rate(spec)[0] / 1e6:.0f} MB/s"
    )
