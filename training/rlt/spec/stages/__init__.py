"""Per-stage settings, one module a stage (sft, rl, distill, student, evaluate; what they share in `shared`), and
the table of them on the run's spec (`Stages`). The names are re-exported here, so importers name rlt.spec.stages."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import Field, create_model

from rlt.contract.api import Strict
from rlt.contract.stage_registry import STAGE_ORDER, STAGES
from rlt.spec.stages.distill import DistillStage
from rlt.spec.stages.evaluate import EvaluateStage
from rlt.spec.stages.rl import (
    DEALABLE_LOSSES,
    RL_OWNED_ARGS,
    GenerationSpec,
    RefSyncSpec,
    RewardSpec,
    RlStage,
    generation,
    reward_settings,
    student_temperature,
    teacher_completion_tokens,
    teacher_prompt_tokens,
    teacher_temperature,
)
from rlt.spec.stages.sft import TEACHER_SFT_OWNED_ARGS, SftStage
from rlt.spec.stages.shared import (
    MAX_EPOCHS,
    SFT_OWNED_ARGS,
    TRAINER_OWNED_ARGS,
    ServerSpec,
    SupervisedStage,
    TrainerOptions,
)
from rlt.spec.stages.student import StudentStage, own_student, trained_student

__all__ = [
    "DEALABLE_LOSSES",
    "MAX_EPOCHS",
    "RL_OWNED_ARGS",
    "SFT_OWNED_ARGS",
    "TEACHER_SFT_OWNED_ARGS",
    "TRAINER_OWNED_ARGS",
    "DistillStage",
    "EvaluateStage",
    "GenerationSpec",
    "RefSyncSpec",
    "RewardSpec",
    "RlStage",
    "ServerSpec",
    "SftStage",
    "Stages",
    "StudentStage",
    "SupervisedStage",
    "TrainerOptions",
    "generation",
    "own_student",
    "reward_settings",
    "student_temperature",
    "teacher_completion_tokens",
    "teacher_prompt_tokens",
    "teacher_temperature",
    "trained_student",
]


class Stages(Strict):
    """The stages of a run, run in this order; each runs when enabled."""

    sft: SftStage = Field(default_factory=SftStage)
    rl: RlStage = Field(default_factory=RlStage)
    distill: DistillStage = Field(default_factory=DistillStage)
    student: StudentStage = Field(default_factory=StudentStage)
    evaluate: EvaluateStage = Field(default_factory=EvaluateStage)

    def enabled(self) -> list[str]:
        return [name for name in STAGE_ORDER if getattr(self, name).enabled]


def _with_outside_stages(stages: type[Stages]) -> type[Stages]:
    """Stages, with a field for each stage of the table kept outside rlt (StageInfo.settings: its settings model)."""
    extra: dict[str, Any] = {}
    for info in STAGES:
        if info.settings is not None:
            module, name = info.settings.split(":")
            model = getattr(importlib.import_module(module), name)
            extra[info.name] = (model, Field(default_factory=model, description=model.__doc__))
    if not extra:
        return stages
    return create_model("Stages", __base__=stages, __doc__=stages.__doc__, **extra)


Stages = _with_outside_stages(Stages)  # type: ignore[misc]


# --------------------------------------------------------------------------- cluster (operator only)
