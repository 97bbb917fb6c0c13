"""The distill stage's plan terms: each process scores with the reward's student and, generating in process, holds
the teacher and its KV cache; served by the generators, it keeps a number of sequences in flight per rank. It writes
the distillation dataset to the volume."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlt.checks.model_shape import ModelShape, Shapes, dtype_bytes
from rlt.checks.plan_terms import (
    CHARS_PER_TOKEN,
    Plan,
    PlanInputs,
    PromptTokens,
    StagePlan,
    StepTime,
    generation_check,
    generator_kv_sequences,
    gib,
    sampling_terms,
    scoring_bytes_per_token,
    scoring_token_cap,
    scoring_tokens,
)
from rlt.checks.step_time import MEAN_COMPLETION_SHARE
from rlt.spec.budgets import VLLM_MAX_NUM_SEQS
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import generation, reward_settings, teacher_prompt_tokens


@dataclass(frozen=True)
class DistillTerms:
    name: str = "distill"

    def plan(self, spec: RLTRunSpec, shapes: Shapes, at: PlanInputs, plan: Plan) -> StagePlan | None:
        d, gen = spec.stages.distill, generation(spec)
        terms: list[tuple[str, int]] = []
        if shapes.student is not None:
            sb = dtype_bytes(spec.student, at.gpu)
            cap = reward_settings(spec).max_batch_tokens or scoring_token_cap(spec, shapes.student, at.gpu_memory, sb)
            tokens = scoring_tokens(spec, cap)
            terms += [
                ("reward student (scoring)", shapes.student.params * sb),
                (f"scoring micro-batch ({tokens} tokens)", tokens * scoring_bytes_per_token(shapes.student, sb)),
            ]
        if gen.mode != "server" and shapes.teacher is not None:
            b = dtype_bytes(spec.teacher, at.gpu)
            terms += sampling_terms(
                shapes.teacher, b, d.batch_size * d.samples_per_question, teacher_prompt_tokens(spec) + d.max_new_tokens
            )
        if terms:
            plan.checks.append(generation_check(self.name, terms, at, "samplesPerQuestion"))
        lines = []
        if gen.mode == "server":
            in_flight = distill_sequences_in_flight(spec, shapes.teacher, at.gpu_memory)[1]
            lines.append(
                f"distill, at prompts of maxPromptLength {teacher_prompt_tokens(spec)} (each rank counts its rows' mean "
                f"prompt): {in_flight}"
            )
        generated = 0
        if at.rows is not None:
            generated = min(at.rows, d.limit or at.rows) * d.samples_per_question * d.max_new_tokens * CHARS_PER_TOKEN
        return StagePlan(0, (0, generated), lines)

    def step_time(
        self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, prompts: PromptTokens | None, gpu_memory: int | None
    ) -> StepTime | None:
        return None  # no Trainer: a stop loses the batch in flight, the rows written are kept

    def step_models(self, spec: RLTRunSpec) -> set[str]:
        return set()


def distill_sequences_in_flight(
    spec: RLTRunSpec, shape: ModelShape | None, gpu_memory: int, prompt_tokens: int | None = None
) -> tuple[int, str]:
    """How many sequences (one request each) one distill rank keeps in flight, and why.

    Each generator engine decodes min(its KV capacity, vLLM's max-num-seqs) sequences at once; the trainer ranks share
    that evenly. A sequence counts its prompt (`prompt_tokens`: the rank's mean prompt; the plan, not knowing the
    rows, takes maxPromptLength) plus the expected completion, MEAN_COMPLETION_SHARE of maxNewTokens (the step-time
    estimate's assumption): vLLM allocates KV pages as tokens are made, so the expected length, not the longest,
    sets how many sequences share the cache. More in flight would wait in vLLM's queue or be preempted and
    recomputed; fewer leaves decode slots idle. The rank sends the next sequence as soon as one finishes
    (rlt.method.pipeline.as_completed), so the slots stay filled, not only at the start of a wave. Without the
    teacher's shape, max-num-seqs alone bounds it."""
    d, res = spec.stages.distill, spec.resources
    servers = max(1, res.generator.engines)
    ranks = res.trainer.nodes * max(1, res.trainer.gpus)
    prompt = teacher_prompt_tokens(spec) if prompt_tokens is None else prompt_tokens
    length = prompt + math.ceil(d.max_new_tokens * MEAN_COMPLETION_SHARE)
    per_server = VLLM_MAX_NUM_SEQS
    why = f"vLLM's max-num-seqs {VLLM_MAX_NUM_SEQS}"
    if shape is not None:
        kv = generator_kv_sequences(spec, shape, gpu_memory, length)
        if kv < per_server:
            per_server, why = kv, f"a KV cache of {kv} sequences of {length} tokens ({gib(gpu_memory)} GPUs)"
    else:
        why += " (the teacher's shape is unknown: its KV cache is not counted)"
    k = max(1, per_server * servers // ranks)
    return k, (
        f"{k} sequence(s) in flight per rank, one request each, the next sent as one finishes: {servers} generator "
        f"engine(s) of {why} each, shared by {ranks} rank(s)"
    )


TERMS = DistillTerms()
