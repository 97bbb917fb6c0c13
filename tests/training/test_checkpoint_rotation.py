"""saveTotalLimit without staged saves: the previous complete checkpoint stays until the new one is marked complete.
transformers' own rotation runs inside its save, before rlt's marker; with a limit of 1 it deleted the only
complete checkpoint first, so a kill during the rest of the save (fsync, the marker's barrier) left nothing to
resume from (or, mid-delete, a marked checkpoint missing files)."""

from __future__ import annotations

import pytest
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import CHECKPOINT_COMPLETE, RunLayout, checkpoints
from rlt.stages.context import StageContext

pytestmark = pytest.mark.slow


def sft_stage(tmp_path, formatter, rows: int, **sft):
    """(context, TrainerRun, its SFTTrainer) of the tiny model's sft stage on `rows` rows, under settings `sft`."""
    from trl import SFTTrainer

    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.stages.sft import sft_config, sft_rows
    from rlt.stages.trainer import TrainerRun

    run = load_valid_run(TINY)
    raw = run.model_dump(by_alias=True)
    raw["spec"]["stages"]["sft"].update(sft)
    run = run.model_validate(raw)
    ctx = StageContext(run, RunLayout(tmp_path), device="cpu", show_progress=False)
    tok = load_tokenizer(run.spec.teacher, padding_side="right")
    data = sft_rows(load_data(run.spec.dataset, formatter.fmt).train[:rows], formatter, tok, "reject")
    stage = TrainerRun(ctx, "sft", run.spec.teacher, tok, "cpu")
    return ctx, stage, stage.trainer(SFTTrainer, sft_config(ctx, "cpu"), data)


def test_a_limit_of_one_keeps_the_last_complete_checkpoint_through_the_next_save(tmp_path, formatter):
    ctx, stage, trainer = sft_stage(
        tmp_path,
        formatter,
        6,
        maxSteps=3,
        saveSteps=1,
        saveTotalLimit=1,
        batchSize=2,
        perDeviceBatchSize=2,
        gradientCheckpointing=False,
    )
    folder = ctx.layout.checkpoints_dir("sft")
    save, seen = trainer._save_checkpoint, []

    def watched(model, trial):  # the moment between transformers' save and rlt's marker
        save(model, trial)
        seen.append(
            (trainer.state.global_step, [s for s, p in checkpoints(folder) if (p / CHECKPOINT_COMPLETE).exists()])
        )

    trainer._save_checkpoint = watched
    stage.train(trainer)
    assert seen == [(1, []), (2, [1]), (3, [2])], seen  # step k saved, k - 1 still complete
    assert [s for s, _p in checkpoints(folder)] == [3]  # the limit kept: one checkpoint at the end


def test_a_kill_while_the_finished_stage_prunes_leaves_it_done(tmp_path, formatter, monkeypatch):
    """The last checkpoint loses its optimizer states when a finished stage prunes: a stage killed then, without its
    DONE marker, would resume from that checkpoint (DeepSpeed refuses it on every restart). DONE comes first."""
    from rlt.stages import trainer as trainer_module

    class Killed(BaseException):
        pass

    def killed(directory):
        raise Killed

    ctx, stage, trainer = sft_stage(tmp_path, formatter, 2, maxSteps=1, saveSteps=1, batchSize=2, perDeviceBatchSize=2)
    monkeypatch.setattr(trainer_module, "prune_finished_checkpoints", killed)
    with pytest.raises(Killed):
        stage.train(trainer)
    assert ctx.layout.stage_done("sft").exists()  # a restart skips the stage; its model is written
