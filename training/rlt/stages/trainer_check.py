"""trainerArgs against the installed TRL: the option table the spec checks them with (rlt/spec/trl_options.json,
rendered here, written by `python hack/generate.py trl-options`, from TRL's own SFTConfig/GRPOConfig dataclass fields and their types), and `rlt validate`'s last
check, building the stage's real config (the same function the stage calls) so TRL's and transformers' own
validation runs on the values before any pod starts."""

from __future__ import annotations

import dataclasses
import enum
import json
import tempfile
import types
import typing
import warnings
from typing import TYPE_CHECKING, Any

from rlt.contract.stage_registry import STAGE_ORDER, TRAINER_STAGES, stage_info
from rlt.spec.run import stage_settings
from rlt.spec.stages import generation
from rlt.spec.trainer_args import Kind

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from rlt.spec.run import RLTRun


def config_class(stage: str) -> type[TrainingArguments]:
    import trl

    name = stage_info(stage).trl_config
    if name is None:
        raise ValueError(f"stage {stage} has no Trainer, so no TRL config")
    cls: type[TrainingArguments] = getattr(trl, name)  # SFTConfig or GRPOConfig
    return cls


def _kinds(hint: Any) -> list[Kind]:
    """The YAML values a dataclass field's type accepts: bool/int/float/str/list/dict/null or an enum's values."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    out: list[Kind] = []
    enums = [a for a in args if isinstance(a, type) and issubclass(a, enum.Enum)]
    for a in args:
        origin = typing.get_origin(a) or a
        if a is type(None):
            out.append("null")
        elif origin is typing.Literal:
            out.append({"enum": list(typing.get_args(a))})
        elif isinstance(a, type) and issubclass(a, enum.Enum):
            out.append({"enum": [m.value for m in a]})
        elif a is str and enums:
            continue  # `SchedulerType | str`: the str is one of the enum's values
        elif origin in (bool, int, float, str):
            out.append(origin.__name__)
        elif origin in (list, tuple):
            out.append("list")
        elif origin is dict:
            out.append("dict")
        # anything else (a ParallelismConfig object) cannot come from YAML: no kind, so any value is refused
    return out


def option_table() -> dict[str, Any]:
    """{config: {option: kinds}} for the TRL config classes of the Trainer stages, from the installed TRL."""
    import trl

    table: dict[str, Any] = {"_trl": trl.__version__}
    for stage in STAGE_ORDER:
        if stage_info(stage).trl_config is None:
            continue
        cls = config_class(stage)
        hints = typing.get_type_hints(cls)
        table[cls.__name__] = {f.name: _kinds(hints[f.name]) for f in dataclasses.fields(cls) if f.init}
    return table


def render() -> str:
    return json.dumps(option_table(), indent=1, sort_keys=True) + "\n"


def check_trainer_args(run: RLTRun) -> list[str]:
    """Problems of every enabled trained stage's trainerArgs: first the table's (rlt.checks.validation reports those
    too), then, when those pass, what building the real config refuses."""
    from rlt.checks.validation import trainer_args_problems

    problems = trainer_args_problems(run.spec)
    if problems:
        return problems
    stages = [
        s for s in TRAINER_STAGES if stage_settings(run.spec, s).enabled and stage_settings(run.spec, s).trainer_args
    ]
    for stage in stages:
        err = _build_error(run, stage)
        if err:
            problems.append(f"spec.stages.{stage}.trainerArgs: {config_class(stage).__name__} refuses them: {err}")
    return problems


def _build_error(run: RLTRun, stage: str) -> str | None:
    """Build the stage's config as the stage would (CPU, one process, a scratch folder); the error, if any."""
    from rlt.contract.layout import RunLayout
    from rlt.stages.context import StageContext

    spec = run.spec.model_copy(deep=True)
    gen = generation(spec)
    if stage == "rl" and gen.mode == "server" and not gen.server_url:
        gen.server_url = "http://generator.invalid:8000"  # the operator fills it in
    if stage == "rl" and gen.mode == "colocate":
        gen.mode = "inprocess"  # colocate needs a GPU; the options are checked on CPU
    probe = run.model_copy(update={"spec": spec})
    with tempfile.TemporaryDirectory(prefix="rlt-validate-") as tmp, warnings.catch_warnings():
        # transformers' deprecation notes are about its own option names, not the user's spec
        warnings.simplefilter("ignore", FutureWarning)
        ctx = StageContext(probe, RunLayout.for_run(tmp, run.name), show_progress=False)
        try:
            if stage == "rl":
                from rlt.stages.rl import grpo_config

                grpo_config(ctx, "cpu")
            else:
                from rlt.stages.sft import sft_config

                sft_config(ctx, "cpu", stage)
        except (ValueError, TypeError) as exc:
            return str(exc).splitlines()[0]
    return None
