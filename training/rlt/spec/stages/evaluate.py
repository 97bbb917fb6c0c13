"""The evaluate stage's settings: accuracy of a model on held-out questions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlt.spec.inputs import DatasetSpec, ModelRef
from rlt.spec.stage_settings import CelRule, Rollout, StageSettings
from rlt.spec.stages.shared import ServerSpec


class EvaluateStage(StageSettings):
    """Accuracy of a model on a held-out split, pass@1 averaged over `samples` answers per question."""

    enabled: bool = Field(False, description="Run this stage.")
    model: ModelRef | None = Field(
        None,
        description="Model to evaluate (default: the student stage's model when it is enabled, else the "
        "untrained student: stages.student.model or spec.student).",
    )
    dataset: DatasetSpec | None = Field(
        None,
        description="Evaluation data: a benchmark name or hub id (aime2024, math500, gpqa-diamond; see "
        "docs/evaluation.md), any dataset, or a built-in task (default: the held-out part of spec.dataset, which "
        "needs spec.dataset.evalFraction > 0).",
    )
    answer_type: Literal["auto", "math", "choice", "builtin"] = Field(
        "auto",
        description="How answers are checked: math (extracted and normalised), choice (a letter), builtin "
        "(the built-in task's checker: countdown expressions are verified); auto picks from the dataset.",
    )
    samples: int = Field(1, gt=0, description="Answers sampled per question (pass@1 is averaged over them).")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature; 0 = greedy (then use samples: 1).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest token set of this mass.")
    max_new_tokens: int = Field(1024, gt=0, description="Length limit of each answer.")
    limit: int | None = Field(None, gt=0, description="Evaluate at most this many questions.")
    batch_size: int = Field(8, gt=0, description="Prompts generated together (in-process).")
    generation: ServerSpec = Field(default_factory=ServerSpec, description="In-process or a vLLM server.")

    @model_validator(mode="after")
    def _greedy_single(self) -> EvaluateStage:
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"samples: greedy decoding (temperature 0) gives one answer; got samples={self.samples}")
        return self

    def rollout(self, spec: Any) -> Rollout | None:
        wait = self.generation.server_timeout_seconds if self.generation.mode == "server" else 0
        return Rollout(self.batch_size * self.samples, self.max_new_tokens, wait)

    @classmethod
    def run_cel_rules(cls, name: str) -> list[CelRule]:
        return [
            (
                f"!has(self.stages) || !has(self.stages.{name}) || !self.stages.{name}.enabled || "
                f"has(self.stages.{name}.dataset) || self.dataset.evalFraction > 0.0 || "
                "self.dataset.source.startsWith('builtin:')",
                f"dataset.evalFraction must be above 0 (held-out rows) when stages.{name} is enabled without "
                f"stages.{name}.dataset",
                ".dataset.evalFraction",
            )
        ]

    def run_problems(self, name: str, spec: Any) -> list[str]:
        # a built-in task is evaluated on fresh problems (rlt.data.eval_set), whatever the method
        fresh = spec.dataset.source.startswith("builtin:")
        if self.enabled and self.dataset is None and spec.dataset.eval_fraction <= 0 and not fresh:
            return [
                f"dataset.evalFraction: 0 leaves no held-out rows for stages.{name}; set it above 0 (e.g. 0.1) "
                f"or give stages.{name}.dataset"
            ]
        return []

    def named_models(self, name: str) -> list[tuple[str, Any]]:
        return [(f"spec.stages.{name}.model", self.model)] if self.model is not None else []

    def named_datasets(self, name: str) -> list[tuple[str, Any]]:
        return [(f"spec.stages.{name}.dataset", self.dataset)] if self.dataset is not None else []
