"""The student stage's plan terms: a Trainer stage on the student it distils into (stages.student.model, else
spec.student), over the distillation dataset, whose rows the plan does not know before distill writes them."""

from __future__ import annotations

from dataclasses import dataclass

from rlt.checks.model_shape import ModelShape, Shapes
from rlt.checks.stage_terms.trainer import TrainerTerms
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRunSpec
from rlt.spec.stages import trained_student


@dataclass(frozen=True)
class StudentTerms(TrainerTerms):
    def model(self, spec: RLTRunSpec, shapes: Shapes) -> tuple[ModelRef, ModelShape | None]:
        return trained_student(spec), shapes.student_stage(spec)

    def steps(self, spec: RLTRunSpec, rows: int | None) -> int | None:
        # its rows are distill's output, not spec.dataset's: only maxSteps bounds it in advance
        return super().steps(spec, None)

    def step_models(self, spec: RLTRunSpec) -> set[str]:
        return {trained_student(spec).model}


TERMS = StudentTerms("student")
