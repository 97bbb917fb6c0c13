"""The stages of a run, in order. Each is a plain function of a StageContext that returns its output path."""

from __future__ import annotations

from rlt.spec import STAGE_ORDER


def stage_function(name: str):
    if name == "sft":
        from rlt.stages.sft import run_sft as fn
    elif name == "rl":
        from rlt.stages.rl import run_rl as fn
    elif name == "distill":
        from rlt.stages.distill import run_distill as fn
    else:
        raise ValueError(f"unknown stage {name!r} (stages: {', '.join(STAGE_ORDER)})")
    return fn
