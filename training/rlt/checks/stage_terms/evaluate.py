"""The evaluate stage's plan terms: each process, generating in process, holds the model it tests (the student
stage's) and its KV cache; it writes a report, nothing the plan counts on the volume."""

from __future__ import annotations

from dataclasses import dataclass

from rlt.checks.model_shape import Shapes, dtype_bytes
from rlt.checks.plan_terms import (
    Plan,
    PlanInputs,
    PromptTokens,
    StagePlan,
    StepTime,
    generation_check,
    sampling_terms,
)
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import teacher_prompt_tokens, trained_student


@dataclass(frozen=True)
class EvaluateTerms:
    name: str = "evaluate"

    def plan(self, spec: RLTRunSpec, shapes: Shapes, at: PlanInputs, plan: Plan) -> StagePlan | None:
        e = spec.stages.evaluate
        if e.model is not None:
            # it tests the model it names, whose shape the plan does not read
            plan.notes.append(f"evaluate: {e.model.model} (stages.evaluate.model) is not planned")
            return StagePlan(0, (0, 0))
        shape = shapes.student_stage(spec)
        if e.generation.mode != "server" and shape is not None:
            b = dtype_bytes(trained_student(spec), at.gpu)
            length = teacher_prompt_tokens(spec) + e.max_new_tokens
            terms = sampling_terms(shape, b, e.batch_size * e.samples, length)
            plan.checks.append(generation_check(self.name, terms, at, "samples"))
        return StagePlan(0, (0, 0))

    def step_time(
        self, spec: RLTRunSpec, shapes: Shapes, gpu: bool, prompts: PromptTokens | None, gpu_memory: int | None
    ) -> StepTime | None:
        return None  # no Trainer

    def step_models(self, spec: RLTRunSpec) -> set[str]:
        return set()


TERMS = EvaluateTerms()
