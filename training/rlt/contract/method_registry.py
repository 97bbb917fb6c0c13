"""The teaching methods in one table: what differs between rlt and rcl, so that no other module names a method.

The spec (which names a method may have, which settings it fingerprints), the stage table (which stages a method
has and the function running each), the validators (the prompt format a method reads), the capacity plan, `rlt eval`
and `rlt compare` read a method's row instead of comparing its name. Functions are named as "module:function"
strings and imported on first use (like the stage functions): this module sits on the lowest floor and imports
nothing else of rlt, while the functions live on the floors above (method/, rcl/, stages/).

A new method is one row here plus its own modules; `tests/unit/test_method_registry.py` registers a dummy row and
runs the validation and dispatch path for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MethodInfo:
    name: str
    # the function running each of its stages, {stage} filled in: "module:function"
    stage_functions: str
    # its prompt format's check, "module:function" called as fn(spec, local_files) and raising ValueError or
    # pydantic's ValidationError on an unusable format; `format_field` is the spec field an error names
    format_check: str
    format_field: str
    # the stages it has (each a stage of rlt.contract.stage_registry; run order comes from that table); None: every
    # stage of the table, so that a stage added as a row there joins the full recipe without an edit here
    stages: tuple[str, ...] | None = None
    # the spec field holding its own settings (spec.<settings>), None when it has none; its settings take part in
    # every stage's fingerprint
    settings: str | None = None
    # its training prompts are spec.format's teacher prompts over the rows (question + solution), so the stages'
    # prompt limits can be checked and the plan can measure them before a run (rcl's carry the student's probe)
    row_prompts: bool = False
    # it samples from the frozen student during rl (rcl's probes and answers), so the student stays whole on every
    # rank; otherwise only scored, it is partitioned under ZeRO-3
    samples_student: bool = False
    # `rlt compare` distils this method's teachers into students
    comparable: bool = False
    # `rlt eval`'s function, "module:function" (None: the method evaluates in its evaluate stage only)
    teaching_eval: str | None = None
    # the function of a stage by name, where it is not the pattern's ("module:function"): a method reuses another's
    # stage functions (rlt's run_sft, run_distill, ...) under their own names and writes only the ones it changes
    functions: Mapping[str, str] = field(default_factory=dict)

    def function(self, stage: str) -> str:
        """The "module:function" running `stage` for this method."""
        return self.functions.get(stage) or self.stage_functions.format(stage=stage)


# The table. A dict so that a test can register a row (monkeypatch.setitem) and every lookup sees it.
METHODS: dict[str, MethodInfo] = {
    "rlt": MethodInfo(
        "rlt",
        stage_functions="rlt.stages.{stage}:run_{stage}",
        format_check="rlt.method.prompts:check_spec_format",
        format_field="spec.format",
        row_prompts=True,
        comparable=True,
    ),
    "rcl": MethodInfo(
        "rcl",
        # rcl teaches at answer time: no distillation dataset, no student stage
        stages=("sft", "rl", "evaluate"),
        stage_functions="rlt.stages.rcl:run_rcl_{stage}",
        format_check="rlt.rcl.protocol:check_spec_format",
        format_field="spec.rcl.format",
        settings="rcl",
        samples_student=True,
        teaching_eval="rlt.stages.rcl:run_teaching_eval",
    ),
}
# the methods the CRD and docs/spec.md list (a row registered later is not in the generated files)
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


def method_info(name: str) -> MethodInfo:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown teaching method {name!r} (methods: {', '.join(METHODS)})") from None


def load_function(ref: str) -> Callable[..., Any]:
    """The function a "module:function" string of the table names (imported now: the modules are heavy)."""
    module, function = ref.split(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return fn
