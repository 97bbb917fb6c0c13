"""The stages of a run, in order. Each is a plain function of a StageContext that returns its output path."""

from __future__ import annotations

from rlt.spec import STAGE_ORDER


def stage_function(name: str, method: str = "rlt"):
    """The function running stage `name` for teaching method `method` (stages shared by both methods ignore it)."""
    if method == "rcl":  # rcl has its own stages (rlt.rcl.stages); RCL_STAGES lists them
        from rlt.spec import RCL_STAGES

        if name not in RCL_STAGES:
            raise ValueError(f"method rcl has no stage {name!r} (stages: {', '.join(RCL_STAGES)})")
        from rlt.rcl import stages as rcl

        return {"sft": rcl.run_rcl_sft, "rl": rcl.run_rcl_rl, "evaluate": rcl.run_rcl_evaluate}[name]
    if name == "sft":
        from rlt.stages.sft import run_sft as fn
    elif name == "rl":
        from rlt.stages.rl import run_rl as fn
    elif name == "distill":
        from rlt.stages.distill import run_distill as fn
    elif name == "student":
        from rlt.stages.student import run_student as fn
    elif name == "evaluate" and method == "rlt":
        from rlt.stages.evaluate import run_evaluate as fn
    else:
        raise ValueError(f"unknown stage {name!r} for method {method!r} (stages: {', '.join(STAGE_ORDER)})")
    return fn
