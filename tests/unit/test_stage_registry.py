"""The stage table (rlt.contract.stage_registry) against what reads it: the spec model, the layout, the dispatch."""

from __future__ import annotations

import pytest

from rlt.contract import stage_registry as reg
from rlt.contract.layout import RunLayout
from rlt.contract.method_registry import METHODS
from rlt.spec.stages import Stages, TrainerOptions


def test_the_table_and_the_spec_name_the_same_stages_in_the_same_order():
    assert reg.STAGE_ORDER == tuple(Stages.model_fields) == ("sft", "rl", "distill", "student", "evaluate")
    for info in reg.STAGES:
        settings = Stages.model_fields[info.name].annotation
        # a Trainer stage has the Trainer's options (deepspeedZeroStage, precision, trainerArgs); the others none
        assert issubclass(settings, TrainerOptions) == info.trainer, info.name


def test_every_stage_of_every_method_dispatches_to_a_function_that_is_there():
    for method, row in METHODS.items():
        for stage in reg.method_stages(method):
            fn = reg.stage_function(stage, method)
            assert callable(fn) and fn.__name__ == row.function(stage).split(":")[1]
    assert reg.method_stages("rcl") == ("sft", "rl", "evaluate")
    with pytest.raises(ValueError, match=r"method rcl has no stage 'distill' \(stages: sft, rl, evaluate\)"):
        reg.stage_function("distill", "rcl")
    with pytest.raises(ValueError, match=r"unknown stage 'train' \(stages: sft, rl, distill, student, evaluate\)"):
        reg.stage_function("train")


def test_newest_teacher_is_the_last_teacher_stage_before_the_asking_one():
    assert reg.TEACHER_STAGES == ("sft", "rl")
    assert reg.teacher_stages_before("rl") == ("sft",)
    assert reg.teacher_stages_before("distill") == reg.teacher_stages_before("evaluate") == ("rl", "sft")
    assert reg.teacher_stages_before("sft") == ()
    assert reg.newest_teacher_stage(["sft", "rl", "distill"]) == "rl"
    assert reg.newest_teacher_stage(["sft", "distill"], before="distill") == "sft"
    assert reg.newest_teacher_stage(["sft", "rl", "distill"], before="rl") == "sft"
    assert reg.newest_teacher_stage(["distill", "student"]) is None


def test_layout_folders_come_from_the_table():
    layout = RunLayout.for_run("/data", "r")
    assert [layout.stage_dir(s.name).name for s in reg.STAGES] == ["sft", "rl", "distill", "student", "eval"]
    assert layout.eval_dir == layout.stage_dir("evaluate")
    assert layout.distill_dataset == layout.stage_dir("distill") / "dataset.jsonl"
    with pytest.raises(ValueError, match="unknown stage 'evl'"):
        layout.stage_dir("evl")
