"""The teacher prompt ends on the same tokens in the sft, rl and distill stages, with SmolLM2's real tokenizer, even
when the explanation starts with a character that merges with the tag (`>` + `=` is one SmolLM2 token)."""

from __future__ import annotations

import pytest

from rlt.method.prompts import Formatter, resolve_format
from rlt.spec.inputs import FormatSpec
from rlt.stages.rl import rl_rows
from rlt.stages.sft import sft_rows, teacher_prompt_ids

ROWS = [
    {"row": 0, "question": "What is 2 + 2?", "solution": "4", "reasoning_trace": "\n\nAdd 2 and 2.\n\nSo 4."},
    {"row": 1, "question": "Is 3 ≥ 2?", "solution": "yes", "reasoning_trace": "= compare: 3 − 2 = 1 > 0, so yes."},
    {"row": 2, "question": "Quote it", "solution": "ok", "reasoning_trace": ". then > quoted ≤ text"},
]


@pytest.mark.parametrize("preset", ["stratos-tags"])
def test_sft_rl_and_distill_share_the_prompt_tokens(smol_tok, preset):
    from datasets import Dataset
    from reward_oracle import tiny_lm
    from trl import SFTConfig, SFTTrainer

    fmt = Formatter(resolve_format(FormatSpec(preset=preset)))
    sft = sft_rows(ROWS, fmt, smol_tok, "reject")
    rl = rl_rows(ROWS, fmt, smol_tok, 10_000, "reject")
    # what TRL's SFTTrainer trains on (the dataset after its own preparation)
    trainer = SFTTrainer(
        model=tiny_lm(len(smol_tok), seed=0),
        train_dataset=Dataset.from_list(sft),
        processing_class=smol_tok,
        args=SFTConfig(
            output_dir="/tmp/unused-sft",
            use_cpu=True,
            bf16=False,
            report_to="none",
            completion_only_loss=True,
            max_steps=1,
        ),
    )
    merged = 0
    for row, rl_row, prepared in zip(ROWS, rl, trainer.train_dataset, strict=True):
        rl_prompt = smol_tok(rl_row["prompt"], add_special_tokens=False).input_ids  # as the rl rollout tokenises
        distill_prompt = teacher_prompt_ids(fmt, smol_tok, row["question"], row["solution"])
        n = len(rl_prompt)
        assert distill_prompt == rl_prompt
        assert prepared["input_ids"][:n] == rl_prompt
        assert prepared["labels"] == [-100] * n + prepared["input_ids"][n:]  # the loss covers exactly the completion
        completion = smol_tok.decode(prepared["input_ids"][n:])
        assert completion == fmt.teacher_completion(row["reasoning_trace"], smol_tok.eos_token)
        # tokenising prompt + completion as one text (what TRL does with text columns) would merge the tag
        joint = smol_tok(rl_row["prompt"] + completion, add_special_tokens=False).input_ids
        merged += joint[:n] != rl_prompt
    assert merged == 2  # the traces starting with "=" and "." merge with the tag's ">"
