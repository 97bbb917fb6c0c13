"""The student stage's settings: supervised distillation of a student on the run's distillation dataset."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from rlt.spec.inputs import ModelRef
from rlt.spec.stages.shared import SFT_OWNED_ARGS, SupervisedStage


class StudentStage(SupervisedStage):
    """Supervised distillation of a student on the distill stage's dataset (student format, loss on the answer)."""

    owned_trainer_args: ClassVar[dict[str, str]] = SFT_OWNED_ARGS

    enabled: bool = Field(False, description="Run this stage.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    model: ModelRef | None = Field(None, description="Student to train (default: spec.student).")
    over_long: Literal["drop", "truncate", "best_fit"] = Field(
        "best_fit",
        description="Rows over maxLength (the whole student chat): drop them, truncate them (large students are "
        "hurt by cropped traces), or use the best-rewarded distill candidate that fits (dropped when none fits).",
    )

    def named_models(self, name: str) -> list[tuple[str, Any]]:
        return [(f"spec.stages.{name}.model", self.model)] if self.model is not None else []


def own_student(spec: Any, enabled: bool = False) -> ModelRef | None:
    """The model the student stage names itself (stages.student.model), None when it trains spec.student (and,
    with `enabled`, when the stage is off)."""
    st: StudentStage = spec.stages.student
    return st.model if st.enabled or not enabled else None


def trained_student(spec: Any) -> ModelRef:
    """The student the student stage trains and evaluate tests by default: stages.student.model, else spec.student."""
    ref: ModelRef = own_student(spec) or spec.student
    return ref
