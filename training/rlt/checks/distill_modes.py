"""Where distillation's GPUs go (`rlt plan`, issue 51): distill decodes every question's candidates with the teacher
and scores each with the reward's student. Served by the generators (mode server) the trainer GPUs only score, a
small share of the work; the plan puts three layouts side by side, each's wall time and goodput (the decoding at
full slots and the scoring over the GPUs held), and chooses the shortest (the same GPUs are held in each):
- served: the spec's generators decode, the trainer ranks score as completions arrive (the two overlap);
- colocated: every GPU of the run holds a vLLM engine beside the student and decodes, then scores, its share
  (the engine's share: what the student and its scoring micro-batch leave);
- moved: the fewest trainer GPUs whose scoring keeps up with the decoding score, the rest join the generators.
The estimate: decoding at the GPU's per-sequence rate (rlt.checks.gpu_figures) on every slot of an engine's KV
cache (MEAN_COMPLETION_SHARE of maxNewTokens on average), scoring at 2 FLOPs per student parameter per token at the
step time's utilisation (rlt.checks.step_time.seconds_of)."""

from __future__ import annotations

import math

from rlt.checks.gpu_figures import figures
from rlt.checks.gpu_memory import VLLM_NON_KV
from rlt.checks.model_shape import Shapes, dtype_bytes
from rlt.checks.plan_terms import CUDA_OVERHEAD, PromptTokens, scoring_bytes_per_token, scoring_token_cap
from rlt.checks.step_time import MEAN_COMPLETION_SHARE, default_prompts, minutes, seconds_of
from rlt.spec.budgets import VLLM_MAX_NUM_SEQS
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import generation, reward_settings

MAX_SHARE = 0.9  # vLLM's default gpuMemoryUtilization: the most an engine is given of a GPU


def _slots(spec: RLTRunSpec, shapes: Shapes, gpu_memory: int, share: float, length: int, tp: int) -> int:
    """Sequences of `length` tokens one engine of `tp` GPUs decodes at once with `share` of each GPU."""
    teacher = shapes.teacher
    assert teacher is not None
    b = dtype_bytes(spec.teacher)
    kv = int(share * gpu_memory) - teacher.params * b // tp - VLLM_NON_KV
    per_seq = length * teacher.kv_bytes_per_token * b // tp
    return max(0, min(VLLM_MAX_NUM_SEQS, kv // per_seq if per_seq else 0))


def distill_lines(
    spec: RLTRunSpec, shapes: Shapes, gpu_memory: int, prompts: PromptTokens | None, rows: int | None
) -> list[str]:
    """One line per layout (wall time, goodput) and the one the plan chooses, or why none is planned."""
    d, res = spec.stages.distill, spec.resources
    if shapes.teacher is None or shapes.student is None or rows is None:
        return ["distill layouts: not planned (the models' shapes or the rows are unknown)"]
    if rows == 0:
        return ["distill layouts: not planned (no training rows: spec.dataset)"]
    if generation(spec).mode == "server" and not res.generator.gpus:
        return ["distill layouts: not planned (the generators hold MIG slices: resources.generator.gpus is 0)"]
    questions = min(rows, d.limit or rows)
    p = (prompts or default_prompts(spec)).mean
    new = d.max_new_tokens * MEAN_COMPLETION_SHARE
    seqs = questions * d.samples_per_question
    decode = figures(spec).decode_tokens_per_s
    length = math.ceil(p + new)
    score_gpu_s = seconds_of(seqs * (p + new) * 2 * shapes.student.params, spec)  # one GPU's seconds
    trainers = res.trainer.nodes * max(1, res.trainer.gpus)
    served = res.generator.replicas * res.generator.gpus if generation(spec).mode == "server" else 0
    total = trainers + served
    gen = res.generator
    tp = gen.tensor_parallel_size
    layouts: list[tuple[str, float, float, str]] = []  # name, wall seconds, goodput, how

    def add(name: str, engines: int, slots: int, scorers: int, in_turn: bool, how: str) -> None:
        if engines <= 0 or slots <= 0 or scorers <= 0:
            return
        decoding = seqs * new / (engines * slots * decode)
        scoring = score_gpu_s / scorers
        wall = decoding + scoring if in_turn else max(decoding, scoring)
        useful = engines * tp_of(name) * decoding + score_gpu_s
        layouts.append((name, wall, useful / (total * wall), how))

    def tp_of(name: str) -> int:
        return 1 if name == "colocated" else tp

    if served:
        slots = _slots(spec, shapes, gpu_memory, generation(spec).gpu_memory_utilization, length, tp)
        engines = res.generator.engines
        held = f" (of {served} held)" if engines * tp < served else ""
        add(
            "served",
            engines,
            slots,
            trainers,
            False,
            f"{engines * tp} generator GPUs{held} decode, {trainers} trainer GPUs score",
        )
        # the fewest scorers that keep up with the decoding; the rest of the trainer GPUs decode too
        for scorers in range(1, trainers if slots else 1):
            moved = (served + trainers - scorers) // tp
            if score_gpu_s / scorers <= seqs * new / (moved * slots * decode):
                add("moved", moved, slots, scorers, False, f"{scorers} GPU(s) score, {moved * tp} decode")
                break
    sb = dtype_bytes(spec.student)
    cap = reward_settings(spec).max_batch_tokens or scoring_token_cap(spec, shapes.student, gpu_memory, sb)
    beside = shapes.student.params * sb + cap * scoring_bytes_per_token(shapes.student, sb) + CUDA_OVERHEAD
    share = min(MAX_SHARE, math.floor(100 * (gpu_memory - beside) / gpu_memory) / 100)
    slots = _slots(spec, shapes, gpu_memory, share, length, 1) if share > 0 else 0
    add("colocated", total, slots, total, True, f"{total} GPUs each decode (share {share:.2f}), then score")
    if not layouts:
        return ["distill layouts: none fits (the teacher's engine leaves no KV cache)"]
    out = [
        f"distill layout {name}: {how}: {minutes(wall)} for {seqs} candidates of ~{new:.0f} tokens, goodput {g:.0%}"
        for name, wall, g, how in layouts
    ]
    best = min(layouts, key=lambda x: x[1])  # the same GPUs held: the shortest wall time costs least
    runs = "served" if served else "in process (HF generate; no vLLM engine in distill's pods)"
    note = {
        "served": "",
        "moved": "; per-stage GPU counts are not expressible in one run's spec today (one trainer pod shape)",
        "colocated": "; rlt.stages.distill generates in process with HF generate, not vLLM, when there are no "
        "generator pods: this layout needs a colocated vLLM engine in distill (not built)",
    }[best[0]]
    out.append(
        f"distill: the plan chooses {best[0]} (the fewest GPU-hours: {minutes(best[1])} × {total} GPUs); the spec runs "
        f"it {runs}{note}"
    )
    return out
