"""The stages of a run in one table: their order, what each produces and how it runs.

The spec (stage order, which stages a method has), the run layout (each stage's folder), the stage dispatch
(`rlt.stages.stage_function`), the re-run plan (`rlt.spec.fingerprint`), the validators and the operator's builders all
read this table instead of naming stages themselves. It imports nothing from the rest of rlt (the spec imports it);
the accessors that read a stage's settings from a spec live beside the spec, in rlt.spec.run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

# The function running a stage, per teaching method: rlt's live in rlt.stages.<stage>, rcl's in rlt.stages.rcl.
STAGE_FUNCTIONS = {"rlt": "rlt.stages.{stage}:run_{stage}", "rcl": "rlt.stages.rcl:run_rcl_{stage}"}
# The module holding a stage's plan terms (memory, disk, step time: rlt.checks.plan_terms.StageTerms) as TERMS.
STAGE_TERMS = "rlt.checks.stage_terms.{stage}"
# The module holding a stage's part of `rlt run`'s summary (rlt.run.summaries.StageSummary), where it has one.
STAGE_SUMMARIES = "rlt.run.summaries.{stage}"


@dataclass(frozen=True)
class StageInfo:
    name: str
    # teacher/student: a model in <folder>/model; dataset: the distillation dataset; report: the evaluation report
    produces: Literal["teacher", "student", "dataset", "report"]
    # the teaching methods that have the stage (see STAGE_FUNCTIONS)
    methods: tuple[str, ...]
    # The TRL config class of a Trainer stage (its trainerArgs are checked against it), None for the others. Trainer
    # stages run accelerate + DeepSpeed over resources.trainer.nodes pods, checkpoint, and resume; the others run one
    # pod with a process per GPU, each taking its share of the rows.
    trl_config: Literal["SFTConfig", "GRPOConfig"] | None
    # samples from the teacher: served by the run's vLLM generators when stages.rl.generation.mode is server
    uses_generators: bool
    # reads spec.dataset (unless the stage's own settings name a dataset)
    reads_dataset: bool
    # folder under the run's root
    folder: str
    # a setting that, raised on a finished stage, continues it from its last checkpoint (RL's schedule is constant:
    # steps 1..n then n+1..m from the checkpoint equal one run of m steps)
    extendable: str | None = None
    # A stage kept outside rlt names its own modules: its settings model ("module:Class", a
    # rlt.spec.stage_settings.StageSettings that joins spec.stages under the stage's name), its plan terms' module
    # (else STAGE_TERMS's) and its function ("module:function", for every method it has; else STAGE_FUNCTIONS').
    settings: str | None = None
    terms: str | None = None
    function: str | None = None

    @property
    def trainer(self) -> bool:
        return self.trl_config is not None

    @property
    def terms_module(self) -> str:
        return self.terms or STAGE_TERMS.format(stage=self.name)


BOTH = ("rlt", "rcl")
STAGES: tuple[StageInfo, ...] = (
    # name, produces, methods, TRL config (None: no Trainer), uses generators, reads spec.dataset, folder
    StageInfo("sft", "teacher", BOTH, "SFTConfig", False, True, "sft"),
    StageInfo("rl", "teacher", BOTH, "GRPOConfig", True, True, "rl", extendable="steps"),
    StageInfo("distill", "dataset", ("rlt",), None, True, True, "distill"),
    StageInfo("student", "student", ("rlt",), "SFTConfig", False, False, "student"),
    StageInfo("evaluate", "report", BOTH, None, False, True, "eval"),
)
STAGE_ORDER: tuple[str, ...] = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}
TRAINER_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.trainer)
TEACHER_STAGES: tuple[str, ...] = tuple(s.name for s in STAGES if s.produces == "teacher")


def stage_info(name: str) -> StageInfo:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r} (stages: {', '.join(STAGE_ORDER)})") from None


def method_stages(method: str) -> tuple[str, ...]:
    """The stages teaching method `method` has, in run order."""
    return tuple(s.name for s in STAGES if method in s.methods)


def stage_function(name: str, method: str = "rlt") -> Callable[..., str]:
    """The function running stage `name` for teaching method `method` (imported on first use: heavy modules)."""
    if method not in stage_info(name).methods:
        raise ValueError(f"method {method} has no stage {name!r} (stages: {', '.join(method_stages(method))})")
    module, function = (stage_info(name).function or STAGE_FUNCTIONS[method].format(stage=name)).split(":")
    fn: Callable[..., str] = getattr(importlib.import_module(module), function)
    return fn


def stages_before(name: str) -> tuple[str, ...]:
    return STAGE_ORDER[: STAGE_ORDER.index(stage_info(name).name)]


def teacher_stages_before(name: str) -> tuple[str, ...]:
    """The stages before `name` that produce a teacher, newest first: where `name` looks for its teacher."""
    return tuple(s for s in reversed(stages_before(name)) if s in TEACHER_STAGES)


def newest_teacher_stage(stages: Iterable[str], before: str | None = None) -> str | None:
    """The last stage of `stages` (by run order) that produces a teacher, among those before `before` when given;
    None when there is none (the run's teacher is then spec.teacher)."""
    allowed = set(teacher_stages_before(before)) if before is not None else set(TEACHER_STAGES)
    found = [s for s in STAGE_ORDER if s in allowed and s in set(stages)]
    return found[-1] if found else None
