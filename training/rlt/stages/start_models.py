"""Which model a stage starts from (the newest earlier teacher) and the LoRA adapter it trains on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlt.contract.layout import MissingStageInput
from rlt.contract.stage_registry import teacher_stages_before
from rlt.spec.run import stage_settings
from rlt.stages.context import StageContext

if TYPE_CHECKING:
    from peft import LoraConfig

    from rlt.spec.inputs import ModelRef


def newest_teacher(ctx: StageContext, for_stage: str, strict: bool = True) -> tuple[ModelRef, str]:
    """The teacher stage `for_stage` works from: the newest model of the run's earlier teacher stages
    (rlt.contract.stage_registry), as (ModelRef, stage); spec.teacher, labelled "initial", when none has produced one.

    `strict`: an enabled earlier teacher stage that has not finished is an error (it must run first); otherwise it
    is passed over."""
    spec = ctx.spec
    for stage in teacher_stages_before(for_stage):
        if not stage_settings(spec, stage).enabled:
            continue
        if ctx.layout.stage_done(stage).exists():
            path = str(ctx.layout.model_dir(stage))
            return spec.teacher.model_copy(update={"model": path, "revision": None}), stage
        if strict:
            raise MissingStageInput(
                f"stage {for_stage} needs the {stage} stage's model at {ctx.layout.model_dir(stage)}; "
                f"run stage {stage} first"
            )
    return spec.teacher, "initial"


def peft_config(ref: ModelRef) -> LoraConfig | None:
    """PEFT LoraConfig for a model with `lora` set (handed to TRL's trainers as peft_config), else None."""
    if ref.lora is None:
        return None
    from peft import LoraConfig

    lo = ref.lora
    targets = "all-linear" if lo.target_modules == ["all-linear"] else lo.target_modules
    return LoraConfig(
        r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
