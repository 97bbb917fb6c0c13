"""The rl stage's generation/training modes side by side (`rlt plan`): separate generators (today's), one step off
and colocated, each's step and goodput (rlt.checks.goodput), whether colocated fits in memory, the mode the plan
chooses and why, and the spec values that select it. Pure: spec + shapes in, lines out.

Colocated memory (TRL's colocate mode with vLLM's sleep mode, level 2): every GPU of the run is a trainer GPU; it
keeps the trainer's persistent terms (model states, reference, reward student, buckets, CUDA) and a sleeping engine
(VLLM_ASLEEP) throughout; awake, the engine takes its gpuMemoryUtilization share (weights, working memory, KV
cache), exclusive with the update's activations and the scoring micro-batch (the engine sleeps before the rewards).
The plan gives the engine what the persistent terms leave, and refuses colocated when that cannot hold the weights,
vLLM's working memory and one sequence of the longest allowed row."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlt.checks.goodput import Goodput, goodput, goodput_line
from rlt.checks.gpu_memory import VLLM_NON_KV, kv_sequences
from rlt.checks.model_shape import Shapes, dtype_bytes
from rlt.checks.plan_terms import Plan, PlanInputs, PromptTokens, StepTime, gib, stage_terms
from rlt.contract.method_registry import method_info
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages.rl import NO_OVERLAP, ONE_STEP_OFF, PARTIAL_ROLLOUTS

GENERATOR_SHARE = 0.9  # a generator pod's gpuMemoryUtilization (the spec's default) when a colocated spec is split
MAX_COLOCATED_SHARE = 0.9  # vLLM's own default ceiling; the rest is the allocator's slack
# The plan asks for a change of mode only when it gains this much goodput: less is within the estimates' error, and
# a change of topology has its own risks.
MODE_CHANGE_GAIN = 0.05
ENGINE_PHASE = "vLLM engine awake"
# what each mode that samples ahead of the update costs in policy lag, printed beside its goodput
OFF_POLICY = {
    ONE_STEP_OFF: "; a row is at most 1 optimizer step off-policy",
    PARTIAL_ROLLOUTS: (
        "; a row is at most 2 optimizer steps off-policy, its tokens from up to two policies (each token's sampling "
        "log-prob kept), and the rows depend on when a push meets them: not the same run to run"
    ),
}


@dataclass(frozen=True)
class ModeStep:
    name: str  # separate, oneStepOff, partialRollouts, colocated
    setting: str  # the spec values that select it
    step: StepTime | None
    result: Goodput | None
    refused: str = ""  # why the mode cannot run this spec


def variant(spec: RLTRunSpec, mode: str, overlap: str) -> RLTRunSpec:
    """The spec in another mode. One step off needs the importance ratio (rlt.stages refuses importanceSampling off
    with it): tokenTruncate, TRL's default, where the spec has it off. A colocated spec's GPUs split in half between
    the trainer and one generator (the paper's 4 + 4) for the modes with generator pods."""
    copy = spec.model_copy(deep=True)
    gen = copy.stages.rl.generation
    if mode == "server" and gen.mode == "colocate":
        res = copy.resources
        total = res.trainer.nodes * res.trainer.gpus
        res.trainer.nodes, res.trainer.gpus = (
            max(1, res.trainer.nodes // 2),
            total // 2 // max(1, res.trainer.nodes // 2),
        )
        half = total - total // 2
        # one new generator, not field by field: each assignment is validated, and the file's unused generator
        # (gpus 3, tensorParallelSize 3) made a half-changed one invalid (tensorParallelSize 3 > gpus 1)
        res.generator = res.generator.model_copy(
            update={"replicas": 1, "gpus": half, "tensor_parallel_size": 1, "data_parallel_size": half}
        )
        gen.gpu_memory_utilization = GENERATOR_SHARE
    gen.mode = mode  # type: ignore[assignment]
    gen.overlap = overlap  # type: ignore[assignment]
    if overlap != NO_OVERLAP and gen.importance_sampling == "off":
        gen.importance_sampling = "tokenTruncate"
    return copy


def colocated_variant(spec: RLTRunSpec, node_gpus: int) -> tuple[RLTRunSpec | None, str]:
    """The spec with every GPU of the run (trainer's and generators') a trainer GPU, vLLM colocated; None and why
    when the GPUs do not split into whole nodes."""
    res = spec.resources
    total = res.trainer.nodes * res.trainer.gpus
    if spec.stages.rl.generation.mode == "server":  # the generator pods' GPUs join the trainer's
        total += res.generator.replicas * res.generator.gpus
    per_node = min(total, node_gpus)
    if total == 0 or total % per_node:
        return None, f"{total} GPUs do not split into nodes of {per_node}"
    copy = variant(spec, "colocate", NO_OVERLAP)
    copy.resources.trainer.nodes, copy.resources.trainer.gpus = total // per_node, per_node
    return copy, ""


def colocated_share(spec: RLTRunSpec, shapes: Shapes, gpu_memory: int, longest: int) -> tuple[float | None, str]:
    """The engine's gpuMemoryUtilization on a colocated trainer GPU: what the trainer's persistent terms leave
    (MAX_COLOCATED_SHARE at most); None and why when it cannot hold the weights, VLLM_NON_KV and one row of
    `longest` tokens, or the update alone does not fit."""
    terms_of = stage_terms("rl")
    scratch = Plan(gpu_memory)
    terms_of.plan(spec, shapes, PlanInputs(gpu_memory, True, None, None), scratch)
    check = next(c for c in scratch.checks if c.stage == "rl" and c.resource == "GPU memory per trainer process")
    persistent = sum(b for _, b in check.terms)
    others = max((b for name, b in check.phases if not name.startswith(ENGINE_PHASE)), default=0)
    teacher = shapes.teacher
    assert teacher is not None  # the caller plans rl only with the teacher's shape
    b = dtype_bytes(spec.teacher)
    need = teacher.params * b + VLLM_NON_KV + longest * teacher.kv_bytes_per_token * b
    left = gpu_memory - persistent
    if persistent + others > gpu_memory:
        return None, f"the update alone needs {gib(persistent + others)} of {gib(gpu_memory)}"
    share = min(MAX_COLOCATED_SHARE, math.floor(100 * left / gpu_memory) / 100)
    if share * gpu_memory < need:
        return None, (
            f"the trainer's persistent terms take {gib(persistent)} of {gib(gpu_memory)}; the {gib(left)} left "
            f"cannot hold the engine's weights, working memory and one row of {longest} tokens ({gib(need)})"
        )
    return share, ""


def mode_steps(
    spec: RLTRunSpec, shapes: Shapes, gpu_memory: int, prompts: PromptTokens | None, node_gpus: int
) -> list[ModeStep]:
    """Each mode's rl step and goodput (async saves), or why it cannot run."""
    from rlt.checks.step_time import default_prompts

    terms_of = stage_terms("rl")
    out = []
    has_generators = spec.resources.generator.gpus > 0 or spec.stages.rl.generation.mode == "colocate"
    for name, overlap in (("separate", NO_OVERLAP), (ONE_STEP_OFF, ONE_STEP_OFF), (PARTIAL_ROLLOUTS, PARTIAL_ROLLOUTS)):
        setting = f"stages.rl.generation.mode: server, stages.rl.generation.overlap: {overlap}"
        if overlap != NO_OVERLAP and spec.stages.rl.generation.importance_sampling == "off":
            setting += ", stages.rl.generation.importanceSampling: tokenTruncate"
        if spec.stages.rl.generation.mode == "colocate":
            half = variant(spec, "server", overlap).resources
            setting += (
                f", resources.trainer.gpus: {half.trainer.gpus}, resources.generator.gpus: {half.generator.gpus} "
                f"(dataParallelSize {half.generator.data_parallel_size})"
            )
            if not half.trainer.gpus:  # one GPU: no half of it for the trainer
                total = spec.resources.trainer.nodes * spec.resources.trainer.gpus
                why = f"the run's {total} GPU does not split into a trainer GPU and a generator GPU"
                out.append(ModeStep(name, setting, None, None, why))
                continue
        if not has_generators:
            out.append(ModeStep(name, setting, None, None, "resources.generator.gpus is 0"))
            continue
        if overlap != NO_OVERLAP and method_info(spec.method).samples_student:  # the spec refuses it (rlt.spec.stages)
            why = f"method {spec.method} samples the frozen student during rl on two threads"
            out.append(ModeStep(name, setting, None, None, why))
            continue
        t = terms_of.step_time(variant(spec, "server", overlap), shapes, True, prompts, gpu_memory)
        out.append(ModeStep(name, setting, t, goodput(t) if t else None))
    coloc, why = colocated_variant(spec, node_gpus)
    rl = spec.stages.rl
    longest = (prompts or default_prompts(spec)).longest + rl.max_completion_length
    share = None
    if coloc is not None:
        share, why = colocated_share(coloc, shapes, gpu_memory, longest)
    if coloc is not None and share is not None:
        coloc.stages.rl.generation.gpu_memory_utilization = share
        why = distill_problem(coloc, shapes, gpu_memory)
    if coloc is None or share is None or why:
        out.append(ModeStep("colocated", "stages.rl.generation.mode: colocate", None, None, why))
        return out
    res = coloc.resources.trainer
    mean = (prompts or default_prompts(spec)).mean + math.ceil(rl.max_completion_length / 2)
    seqs = kv_sequences(coloc, shapes.teacher, gpu_memory, mean, 1, dtype_bytes(spec.teacher)) if shapes.teacher else 0
    setting = (
        f"stages.rl.generation.mode: colocate, stages.rl.generation.gpuMemoryUtilization: {share:.2f} (a KV cache of "
        f"{seqs} rows of {mean} tokens per GPU), resources.trainer.nodes: {res.nodes}, resources.trainer.gpus: "
        f"{res.gpus} (no generator pods)"
    )
    t = terms_of.step_time(coloc, shapes, True, prompts, gpu_memory)
    out.append(ModeStep("colocated", setting, t, goodput(t) if t else None))
    return out


def distill_problem(spec: RLTRunSpec, shapes: Shapes, gpu_memory: int) -> str:
    """Without generator pods, distill generates in process (rlt.stages.distill: HF generate with the teacher and
    its KV cache on each GPU): why colocated cannot run the distill stage of `spec`, or ""."""
    if not spec.stages.distill.enabled:
        return ""
    scratch = Plan(gpu_memory)
    stage_terms("distill").plan(spec, shapes, PlanInputs(gpu_memory, True, None, None), scratch)
    misfit = [c for c in scratch.checks if not c.fits]
    if not misfit:
        return ""
    return (
        f"without generator pods distill generates in process, and its {misfit[0].resource} needs "
        f"{gib(misfit[0].total)} of {gib(gpu_memory)} (stages.distill.batchSize × samplesPerQuestion sequences of "
        "maxPromptLength + maxNewTokens)"
    )


def mode_lines(
    spec: RLTRunSpec, shapes: Shapes, gpu_memory: int, prompts: PromptTokens | None, node_gpus: int
) -> tuple[list[str], list[str]]:
    """(goodput lines of each rl mode, today's terms and the choice; a warning when the spec's mode is not the
    chosen one, with the values to set)."""
    from rlt.checks.step_time import minutes

    steps = mode_steps(spec, shapes, gpu_memory, prompts, node_gpus)
    lines = []
    for m in steps:
        if m.step is None or m.result is None:
            lines.append(f"rl mode {m.name} ({m.setting}): refused: {m.refused}")
            continue
        extra = OFF_POLICY.get(m.name, "")
        lines.append(f"{goodput_line(m.step.stage, m.result, f' mode {m.name} ({m.setting})')}{extra}")
    runnable = [m for m in steps if m.result is not None]
    if not runnable:
        return lines, []
    best = max(runnable, key=lambda m: m.result.share if m.result else 0.0)
    others = ", ".join(f"{m.name} {m.result.share:.0%}" for m in runnable if m is not best and m.result)
    assert best.result is not None and best.step is not None
    why = f"the highest goodput: {best.result.share:.0%} (step {minutes(best.result.period)})" + (
        f" against {others}" if others else ""
    )
    if best.name in OFF_POLICY:
        why += f"; its price:{OFF_POLICY[best.name].removeprefix(';')}"
    lines.append(f"rl: the plan chooses {best.name} ({best.setting}): {why}")
    current = _current_mode(spec)
    now = next((m.result.share for m in runnable if m.name == current and m.result), 0.0)
    warnings = []
    if current != best.name and best.result.share - now < MODE_CHANGE_GAIN:
        lines.append(
            f"rl: the spec's {current} stays: {best.name} gains under {MODE_CHANGE_GAIN:.0%} (MODE_CHANGE_GAIN)"
        )
    elif current != best.name:
        warnings.append(
            f"stages.rl.generation: the spec runs rl {current}; the plan chooses {best.name} ({why}); set "
            f"{best.setting}"
        )
    return lines, warnings


def _current_mode(spec: RLTRunSpec) -> str:
    gen = spec.stages.rl.generation
    if gen.mode == "colocate":
        return "colocated"
    if gen.mode == "server":
        return "separate" if gen.overlap == NO_OVERLAP else gen.overlap
    return "inprocess"
