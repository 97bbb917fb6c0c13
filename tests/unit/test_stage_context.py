"""What every stage shares, resolved once: the device and prompt format on StageContext; TrainingArguments'
precision as a pure function (the process group is made by join_process_group alone)."""

import pytest
from suite_helpers import tiny_doc

from rlt.contract.layout import RunLayout
from rlt.method.prompts import resolve_format
from rlt.spec.loading import parse_run
from rlt.stages.context import StageContext
from rlt.stages.trainer import trainer_precision


def _run():
    """The tiny example run with its own solution tags (a format override the context must keep)."""
    doc = tiny_doc()
    doc["spec"]["format"] = {"tags": {"solutionStart": "<final>", "solutionEnd": "</final>"}}
    return parse_run(doc)


def test_context_resolves_device_and_format_once(tmp_path):
    ctx = StageContext(_run(), RunLayout(tmp_path), device="cpu")
    assert ctx.compute_device == "cpu"
    assert ctx.formatter is ctx.formatter  # one Formatter per context, not one per caller
    assert ctx.formatter.t.solution_start == "<final>"  # the run's own format, overrides included
    fmt, preset = ctx.formatter.fmt, resolve_format(parse_run(tiny_doc()).spec.format)
    assert (fmt.tags.solution_start, fmt.tags.solution_end) == ("<final>", "</final>")  # the override, in the format
    assert (preset.tags.solution_start, fmt.tags.thought_start) == ("<answer>", preset.tags.thought_start)
    assert fmt.model_copy(update={"tags": preset.tags}) == preset  # the rest: the preset's


@pytest.mark.parametrize(
    "device,precision,processes,want",
    [
        ("cpu", "auto", 1, {"bf16": False, "fp16": False, "use_cpu": True}),
        (
            "cpu",
            "auto",
            2,
            {"bf16": False, "fp16": False, "use_cpu": False, "accelerator_config": {"use_configured_state": True}},
        ),
        ("cuda:0", "auto", 4, {"bf16": True, "fp16": False}),
        ("cuda", "fp16", 1, {"bf16": False, "fp16": True}),
    ],
)
def test_trainer_precision_is_pure(monkeypatch, device, precision, processes, want):
    import torch.distributed as dist
    from accelerate import PartialState

    monkeypatch.setenv("WORLD_SIZE", str(processes))
    # Earlier tests in the same process may have made accelerate's state: start from an empty one, so that a state
    # made by trainer_precision shows (accelerate's Borg dict is a plain class attribute; monkeypatch restores it).
    monkeypatch.setattr(PartialState, "_shared_state", {})
    assert trainer_precision(device, precision, processes) == want
    assert not dist.is_initialized() and not PartialState._shared_state  # no process group made as a side effect
