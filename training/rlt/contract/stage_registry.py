"""The stages of a run in one table: their order, what each produces and consumes (by role) and how it runs.

The table carries the data flow: `producer_of(role, stages, before)` is the one lookup of where a stage's input
comes from, which the stages (through rlt.contract.layout.RunLayout.input_of), spec.outputs, the operator's status
and `rlt compare` all ask.

The spec (stage order, which stages a method has), the run layout (each stage's folder), the stage dispatch
(`rlt.stages.stage_function`), the re-run plan (`rlt.spec.fingerprint`), the validators and the operator's builders all
read this table instead of naming stages themselves. It imports nothing from the rest of rlt but the method table
beside it (rlt.contract.method_registry: which stages a method has and their functions; the spec imports both);
the accessors that read a stage's settings from a spec live beside the spec, in rlt.spec.run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from rlt.contract.method_registry import load_function, method_info

# The module holding a stage's plan terms (memory, disk, step time: rlt.checks.plan_terms.StageTerms) as TERMS.
STAGE_TERMS = "rlt.checks.stage_terms.{stage}"
# The module holding a stage's part of `rlt run`'s summary (rlt.run.summaries.StageSummary), where it has one.
STAGE_SUMMARIES = "rlt.run.summaries.{stage}"


# What a stage produces and consumes, by role: teacher/student a model (<folder>/model), dataset the distillation
# dataset (<folder>/dataset.jsonl), report an evaluation report (<folder>/). Where each lies: RunLayout.product.
Role = Literal["teacher", "student", "dataset", "report"]


@dataclass(frozen=True)
class StageInfo:
    name: str
    produces: Role
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
    # a setting that, raised on a finished stage, continues it from its last checkpoint (under a constant schedule
    # without warmup, steps 1..n then n+1..m from the checkpoint equal one run of m steps: fingerprint._flat_schedule)
    extendable: str | None = None
    # its settings that later stages read even when it is disabled (distill ranks by rl's reward at rl's temperature):
    # a disabled stage's fingerprint fields (rlt.spec.fingerprint)
    read_when_disabled: tuple[str, ...] = ()
    # a stage without a Trainer that writes each row once made and, re-run, makes only the rest (Ctrl-C loses none)
    resumes_by_row: bool = False
    # the roles it reads, each the product of the last enabled stage before it that produces the role
    # (producer_of; a stage's function finds the file with RunLayout.input_of)
    consumes: tuple[Role, ...] = ()
    # A stage kept outside rlt names its own modules: its settings model ("module:Class", a
    # rlt.spec.stage_settings.StageSettings that joins spec.stages under the stage's name), its plan terms' module
    # (else STAGE_TERMS's) and its function ("module:function", for every method it has; else its method's row's, rlt.contract.method_registry).
    settings: str | None = None
    terms: str | None = None
    function: str | None = None

    @property
    def trainer(self) -> bool:
        return self.trl_config is not None

    @property
    def terms_module(self) -> str:
        return self.terms or STAGE_TERMS.format(stage=self.name)


STAGES: tuple[StageInfo, ...] = (
    # name, produces, TRL config (None: no Trainer), uses generators, reads spec.dataset, folder
    StageInfo("sft", "teacher", "SFTConfig", False, True, "sft"),
    StageInfo(
        "rl",
        "teacher",
        "GRPOConfig",
        True,
        True,
        "rl",
        extendable="steps",
        read_when_disabled=("reward", "temperature"),
        consumes=("teacher",),
    ),
    StageInfo("distill", "dataset", None, True, True, "distill", consumes=("teacher",), resumes_by_row=True),
    StageInfo("student", "student", "SFTConfig", False, False, "student", consumes=("dataset",)),
    StageInfo("evaluate", "report", None, False, True, "eval", consumes=("student",)),
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
    """The stages teaching method `method` has (its row in rlt.contract.method_registry), in run order."""
    own = method_info(method).stages
    return tuple(s.name for s in STAGES if own is None or s.name in own)


def stage_function(name: str, method: str = "rlt") -> Callable[..., str]:
    """The function running stage `name` for teaching method `method` (imported on first use: heavy modules)."""
    if stage_info(name).name not in method_stages(method):
        raise ValueError(f"method {method} has no stage {name!r} (stages: {', '.join(method_stages(method))})")
    fn: Callable[..., str] = load_function(stage_info(name).function or method_info(method).function(name))
    return fn


def stages_before(name: str) -> tuple[str, ...]:
    return STAGE_ORDER[: STAGE_ORDER.index(stage_info(name).name)]


def teacher_stages_before(name: str) -> tuple[str, ...]:
    """The stages before `name` that produce a teacher, newest first: where `name` looks for its teacher."""
    return tuple(s for s in reversed(stages_before(name)) if s in TEACHER_STAGES)


def producer_of(role: Role, stages: Iterable[str], before: str | None = None) -> str | None:
    """The one lookup of the data flow: the last of `stages` (by run order) that produces `role`, among those before
    `before` when given; None when there is none. With the run's enabled stages it answers where a stage's input
    comes from (before=the stage), which file spec.outputs pushes, what the operator's status names and what
    `rlt compare` distils from."""
    allowed = set(stages_before(before)) if before is not None else set(STAGE_ORDER)
    found = [s.name for s in STAGES if s.produces == role and s.name in allowed and s.name in set(stages)]
    return found[-1] if found else None


def newest_teacher_stage(stages: Iterable[str], before: str | None = None) -> str | None:
    """The stage whose model is the teacher (producer_of "teacher"); None: the run's teacher is spec.teacher."""
    return producer_of("teacher", stages, before)
