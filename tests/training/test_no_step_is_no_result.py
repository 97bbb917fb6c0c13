"""A stage whose data gives no full batch trains no step: transformers only warns and would save the start model as
the stage's result. rl refuses before it loads anything (TRL's sampler deals whole steps of questions); any
TRL-trained stage that ends at step 0 fails instead of saving."""

from __future__ import annotations

import pytest
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.data.errors import DataError
from rlt.stages.context import StageContext


def _run(**stage):
    run = load_valid_run(TINY)
    raw = run.model_dump(by_alias=True)
    for name, settings in stage.items():
        raw["spec"]["stages"][name].update(settings)
    return run.model_validate(raw)


def test_rl_refuses_fewer_usable_rows_than_one_step_takes(tmp_path):
    from rlt.stages.rl import train_grpo

    run = _run(rl={"batchSize": 8, "numGenerations": 4, "perDeviceBatchSize": 8})
    ctx = StageContext(run, RunLayout(tmp_path), device="cpu", show_progress=False)
    row = {"prompt": "p", "question": "q", "solution": "s"}
    # the check comes first: the model, tokenizer, reward and rollout (None here) are never reached
    with pytest.raises(
        DataError, match=r"spec.stages.rl.batchSize: a step takes 2 questions .* has 1 usable training rows"
    ):
        train_grpo(ctx, "cpu", run.spec.teacher, None, [row], None, None, None)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_stage_that_trains_no_step_fails_instead_of_saving_its_start_model(tmp_path, formatter):
    from trl import SFTTrainer

    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.stages.sft import sft_config, sft_rows
    from rlt.stages.trainer import TrainerRun

    run = _run(
        sft={"maxSteps": 2, "batchSize": 4, "perDeviceBatchSize": 4, "trainerArgs": {"dataloader_drop_last": True}}
    )
    ctx = StageContext(run, RunLayout(tmp_path), device="cpu", show_progress=False)
    tok = load_tokenizer(run.spec.teacher, padding_side="right")
    rows = sft_rows(load_data(run.spec.dataset, formatter.fmt).train[:2], formatter, tok, "reject")
    stage = TrainerRun(ctx, "sft", run.spec.teacher, tok, "cpu")
    trainer = stage.trainer(SFTTrainer, sft_config(ctx, "cpu"), rows)  # 2 rows, batches of 4, the last dropped
    with pytest.raises(RuntimeError, match="sft: trained no step"):
        stage.train(trainer)
    assert not ctx.layout.stage_done("sft").exists() and not (ctx.layout.stage_dir("sft") / "model").exists()
