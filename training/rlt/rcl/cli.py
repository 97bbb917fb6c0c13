"""`rlt eval`: the rcl teaching evaluation of one teacher (or none) into <output>/<run>/eval/<label>/."""

from __future__ import annotations

import re
from pathlib import Path

from rlt.layout import RunLayout
from rlt.spec import RLTRun


def resolve_teacher(ctx, teacher: str | None, label: str | None):
    """(ModelRef or None, label) for --teacher."""
    from rlt.rcl.stages import final_teacher

    if teacher is None:
        ref, name = final_teacher(ctx)
    elif teacher == "none":
        ref, name = None, "none"
    elif teacher == "initial":
        ref, name = ctx.spec.teacher, "initial"
    else:
        ref = ctx.spec.teacher.model_copy(update={"model": teacher, "revision": None})
        shown = "-".join(Path(teacher).parts[-2:]) if Path(teacher).exists() else teacher
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", shown).strip("-")
    return ref, label or name


def run_eval(
    run: RLTRun,
    output: str | Path = "results",
    teacher: str | None = None,
    label: str | None = None,
    device: str | None = None,
) -> Path:
    from rlt.rcl.stages import evaluate
    from rlt.runner import quiet_libraries
    from rlt.stages.common import StageContext

    quiet_libraries()
    layout = RunLayout.for_run(output, run.name)
    ctx = StageContext(run, layout, None, device, show_progress=False)
    ref, name = resolve_teacher(ctx, teacher, label)
    out_dir = layout.eval_dir
    evaluate(ctx, ref, name, out_dir)
    return out_dir / "report.md"
