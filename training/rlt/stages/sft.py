"""Stage `sft`: warm up the teacher on teacher-format traces (TRL SFTTrainer, loss on the explanation only)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rlt.data.dataset import load_data
from rlt.data.errors import DataError
from rlt.data.models import load_tokenizer
from rlt.method.prompts import Formatter
from rlt.spec.inputs import ModelRef
from rlt.spec.run import stage_settings
from rlt.stages.context import StageContext
from rlt.stages.trainer import TrainerRun, trainer_options

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl.trainer.sft_config import SFTConfig

log = logging.getLogger(__name__)


def teacher_prompt_ids(
    formatter: Formatter, tokenizer: PreTrainedTokenizerBase, question: str, solution: str
) -> list[int]:
    """The teacher prompt's token ids, one definition for the sft, rl and distill stages."""
    ids: list[int] = tokenizer(
        formatter.teacher_prompt(tokenizer, question, solution), add_special_tokens=False
    ).input_ids
    return ids


def sft_rows(
    rows: list[dict[str, Any]],
    formatter: Formatter,
    tokenizer: PreTrainedTokenizerBase,
    bad_rows: str,
    max_length: int | None = None,
    where: Callable[[int], str] = lambda i: f"row {i}",
) -> list[dict[str, list[int]]]:
    """prompt = teacher chat up to the opening explanation tag; completion = the worked reasoning, closed.

    Tokenised here, prompt and completion apart, and handed to TRL as ids: the prompt is then the very token sequence
    the rl and distill stages sample after (`teacher_prompt_ids`). Tokenising prompt + completion as one text would
    merge the tag with a trace that starts with, say, "=" or "." (SmolLM2: `>=`), so SFT would train on a context
    the policy never sees. A row whose prompt fills `max_length` (TRL keeps its first max_length tokens) has no
    explanation token left: a bad row, named by `where(row)` ('line N'), not one TRL drops in silence."""
    out, skipped = [], []
    for r in rows:
        if not r.get("reasoning_trace"):
            msg = f"{where(r['row'])}: reasoning_trace is missing; stage sft learns explanations from it"
            if bad_rows == "reject":
                hint = ", or set badRows: skip" if any(x.get("reasoning_trace") for x in rows) else ""
                raise DataError(msg + f" (map spec.dataset.columns.reasoningTrace, disable stages.sft{hint})")
            skipped.append(msg)
            continue
        prompt = teacher_prompt_ids(formatter, tokenizer, r["question"], r["solution"])
        if max_length is not None and len(prompt) >= max_length:
            msg = (
                f"{where(r['row'])}: teacher prompt is {len(prompt)} tokens, at or over spec.stages.sft.maxLength="
                f"{max_length}, so no explanation token is left to learn (raise it)"
            )
            if bad_rows == "reject":
                raise DataError(msg)
            skipped.append(msg)
            continue
        completion = tokenizer(
            formatter.teacher_completion(r["reasoning_trace"], tokenizer.eos_token), add_special_tokens=False
        ).input_ids
        out.append({"input_ids": prompt + completion, "completion_mask": [0] * len(prompt) + [1] * len(completion)})
    if not out:
        raise DataError("stage sft: no usable rows" + (f" (first {skipped[0]})" if skipped else ""))
    if skipped:  # once per stage, not once per row
        log.warning("stage sft: skipping %d of %d rows (badRows: skip), first %s", len(skipped), len(rows), skipped[0])
    return out


def sft_config(ctx: StageContext, device: str, stage: str = "sft") -> SFTConfig:
    """TRL SFTConfig from spec.stages.<stage> (sft or student) and its trainerArgs (which may not repeat a key rlt
    sets)."""
    from trl import SFTConfig

    return SFTConfig(**sft_options(ctx, device, stage), **stage_settings(ctx.spec, stage).trainer_args)


def sft_options(ctx: StageContext, device: str, stage: str = "sft") -> dict[str, Any]:
    """The SFTConfig options rlt sets from spec.stages.<stage> (SftStage/StudentStage.owned_trainer_args list them)."""
    st = stage_settings(ctx.spec, stage)
    return dict(
        gradient_accumulation_steps=max(1, st.batch_size // (st.per_device_batch_size * ctx.world_size())),
        # The teacher warm-up uses the reference code's beta2; students keep AdamW's default (or trainerArgs').
        **({"adam_beta2": 0.95} if stage == "sft" else {}),
        num_train_epochs=st.epochs,
        max_steps=st.max_steps or -1,
        max_length=st.max_length,
        completion_only_loss=True,
        packing=False,
        # rows dealt across ranks and micro-steps by tokens (rlt.stages.sft_balance replaces the sampler)
        train_sampling_strategy="batch_rebalance",
        **trainer_options(ctx, stage, device),
    )


def train_sft(
    ctx: StageContext,
    device: str,
    rows: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    stage: str = "sft",
    model: ModelRef | None = None,
) -> str:
    """Supervised training on prompt/completion rows, loss on the completion only: config, record, final model.

    Shared by every SFT-like stage: the teacher warm-ups of both methods (`sft`) and the student's distillation
    (`student`); the stage's own settings come from spec.stages.<stage>."""
    from trl import SFTTrainer

    from rlt.stages.balance import BalanceFigures
    from rlt.stages.sft_balance import sft_measured

    run = TrainerRun(ctx, stage, model or ctx.spec.teacher, tokenizer, device)
    trainer_cls: type[SFTTrainer] = sft_measured(SFTTrainer)

    def step_values(step_seconds: float) -> dict[str, float]:
        return cast("BalanceFigures", trainer).balance_figures()  # the step's rank imbalance

    trainer = run.trainer(trainer_cls, sft_config(ctx, device, stage), rows, step_values)
    return run.train(trainer)


def run_sft(ctx: StageContext) -> str:
    spec = ctx.spec
    device = ctx.compute_device
    formatter = ctx.formatter
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(spec.teacher, padding_side="right")
    data = load_data(spec.dataset, formatter.fmt)
    rows = sft_rows(data.train, formatter, tokenizer, spec.dataset.bad_rows, spec.stages.sft.max_length, data.where)
    return train_sft(ctx, device, rows, tokenizer)
