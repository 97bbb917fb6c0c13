"""`rlt validate`'s check of spec.stages.<stage>.trainerArgs against the installed TRL config classes.

A name the class does not have is an error naming the field (with the closest real name); values are checked by
building the stage's real config (the same function the stage calls), so TRL's and transformers' own validation
runs on them before any pod starts."""

from __future__ import annotations

import dataclasses
import difflib
import tempfile

from rlt.spec.run import stage_settings
from rlt.spec.stage_registry import TRAINER_STAGES, stage_info


def config_class(stage: str):
    import trl

    name = stage_info(stage).trl_config
    if name is None:
        raise ValueError(f"stage {stage} has no Trainer, so no TRL config")
    return getattr(trl, name)


def check_trainer_args(run) -> list[str]:
    """Problems ('spec.stages.rl.trainerArgs.x: ...') of every enabled trained stage's trainerArgs."""
    stages = [
        s for s in TRAINER_STAGES if stage_settings(run.spec, s).enabled and stage_settings(run.spec, s).trainer_args
    ]
    if not stages or run.spec.method not in ("rlt", "rcl"):
        return []
    problems: list[str] = []
    for stage in stages:
        cls = config_class(stage)
        known = {f.name for f in dataclasses.fields(cls)}
        for key in stage_settings(run.spec, stage).trainer_args:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(f"spec.stages.{stage}.trainerArgs.{key}: not a {cls.__name__} option{hint}")
    if problems:
        return problems
    for stage in stages:
        err = _build_error(run, stage)
        if err:
            problems.append(f"spec.stages.{stage}.trainerArgs: {config_class(stage).__name__} refuses them: {err}")
    return problems


def _build_error(run, stage: str) -> str | None:
    """Build the stage's config as the stage would (CPU, one process, a scratch folder); the error, if any."""
    from rlt.run.layout import RunLayout
    from rlt.stages.context import StageContext

    spec = run.spec.model_copy(deep=True)
    if stage == "rl" and spec.stages.rl.generation.mode == "server" and not spec.stages.rl.generation.server_url:
        spec.stages.rl.generation.server_url = "http://generator.invalid:8000"  # the operator fills it in
    probe = run.model_copy(update={"spec": spec})
    with tempfile.TemporaryDirectory(prefix="rlt-validate-") as tmp:
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
