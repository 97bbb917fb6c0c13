"""The sft stage's settings: the supervised warm-up of the teacher."""

from __future__ import annotations

from typing import ClassVar

from rlt.spec.stages.shared import SFT_OWNED_ARGS, SupervisedStage

# The teacher warm-up keeps the RLT reference code's AdamW beta2 (0.95); the student stage passes adam_beta2 through.
TEACHER_SFT_OWNED_ARGS: dict[str, str] = {
    **SFT_OWNED_ARGS,
    "adam_beta2": "fixed at the RLT reference code's 0.95 for the teacher warm-up",
}


class SftStage(SupervisedStage):
    """Supervised warm-up of the teacher on teacher-format traces; loss on the explanation only."""

    owned_trainer_args: ClassVar[dict[str, str]] = TEACHER_SFT_OWNED_ARGS
