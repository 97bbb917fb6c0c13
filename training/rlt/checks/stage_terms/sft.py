"""The sft stage's plan terms: a Trainer stage on spec.teacher, rows of maxLength, dealt across the ranks by tokens
(issue 51: rlt.stages deals sft's rows as rl's, so each micro-step waits for a near-balanced slowest rank)."""

from __future__ import annotations

from dataclasses import dataclass

from rlt.checks.model_shape import ModelShape, Shapes
from rlt.checks.plan_terms import PromptTokens, StepTime
from rlt.checks.stage_terms.trainer import TrainerTerms
from rlt.checks.step_time import step_time
from rlt.spec.run import RLTRunSpec


@dataclass(frozen=True)
class SftTerms(TrainerTerms):
    def step_phases(
        self, spec: RLTRunSpec, shape: ModelShape, shapes: Shapes, trainable: int, checkpoint: int,
        prompts: PromptTokens | None, gpu_memory: int | None,
    ) -> StepTime:  # fmt: skip
        length: int = self.settings(spec).max_length
        return step_time(spec, self.name, shape, trainable, checkpoint, length / 2, length, dealt=True)


TERMS = SftTerms("sft")
