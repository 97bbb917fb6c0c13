"""fp32 master weights wherever DeepSpeed does not hold them: a one-process run whose model is `dtype: bfloat16`
trains fp32 parameters (the Trainer autocasts to bf16 where precision asks for it), so a tiny learning rate still
moves them. Pure bf16 weights round away any update below their 8-bit mantissa's step (2^-8 of the weight)."""

from __future__ import annotations

import pytest
import torch
from suite_helpers import TINY

from rlt.checks.validation import load_valid_run
from rlt.contract.layout import RunLayout
from rlt.stages.context import StageContext

pytestmark = pytest.mark.slow


def test_one_process_bf16_model_trains_fp32_weights_that_a_tiny_lr_moves(tmp_path, formatter):
    from trl import SFTTrainer

    from rlt.data.dataset import load_data
    from rlt.data.models import load_tokenizer
    from rlt.stages.sft import sft_config, sft_rows
    from rlt.stages.trainer import TrainerRun

    run = load_valid_run(TINY)
    raw = run.model_dump(by_alias=True)
    raw["spec"]["teacher"]["dtype"] = "bfloat16"
    raw["spec"]["stages"]["sft"].update(
        maxSteps=1, learningRate=1e-6, lrScheduler="constant", warmupRatio=0.0, batchSize=2, perDeviceBatchSize=2
    )
    run = run.model_validate(raw)
    ctx = StageContext(run, RunLayout(tmp_path), device="cpu", show_progress=False)
    tok = load_tokenizer(run.spec.teacher, padding_side="right")
    data = load_data(run.spec.dataset, formatter.fmt)
    rows = sft_rows(data.train[:2], formatter, tok, "reject")
    trainer = TrainerRun(ctx, "sft", run.spec.teacher, tok, "cpu").trainer(SFTTrainer, sft_config(ctx, "cpu"), rows)
    params = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert {p.dtype for p in params.values()} == {torch.float32}
    before = {n: p.detach().clone() for n, p in params.items()}
    trainer.train()
    moved = sum(int((p.detach() != before[n]).sum()) for n, p in params.items())
    total = sum(p.numel() for p in params.values())
    # AdamW's first step moves every weight with a gradient by ~lr: all of them here, none in pure bf16
    assert moved / total > 0.5, f"only {moved} of {total} weights changed at lr 1e-6"
