"""Stage `student`: supervised distillation of a student on the run's distillation dataset (TRL SFTTrainer).

Each row's `messages` (student system prompt, question, thought + solution) becomes a conversational
prompt/completion pair, so the loss covers the assistant turn only, whatever the chat template.
Rows longer than `maxLength` follow the `overLong` policy; what happened to each row is written to
student/rows.json, so nothing is dropped or cropped without a record.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from rlt.contract.layout import MissingStageInput, atomic_write_json
from rlt.data.errors import DataError
from rlt.data.jsonl import read_jsonl
from rlt.data.models import load_tokenizer
from rlt.method.prompts import Formatter
from rlt.spec.inputs import ModelRef
from rlt.stages.context import StageContext
from rlt.stages.sft import train_sft

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedTokenizerBase

    from rlt.spec.run import RLTRunSpec

log = logging.getLogger(__name__)


def student_ref(spec: RLTRunSpec) -> ModelRef:
    return spec.stages.student.model or spec.student


def choose_rows(
    rows: list[dict[str, Any]],
    length: Callable[[list[dict[str, str]]], int],
    max_length: int,
    policy: str,
    formatter: Formatter,
    prompt_length: Callable[[list[dict[str, str]]], int] | None = None,
) -> tuple[list[list[dict[str, str]]], list[dict[str, Any]]]:
    """The chat of every usable row under the over-long policy, and one record per row of what was done.

    drop: rows over max_length are left out. truncate: kept whole; the trainer cuts them at max_length, except a row
    whose prompt (`prompt_length` of system + user, the generation prompt included) alone fills max_length: TRL,
    keeping the start, would keep no completion token of it and drop it unsaid, so it is recorded dropped here
    (`prompt_length` None: the trainer keeps the end, and every row keeps its completion).
    best_fit: the best-rewarded candidate whose chat fits (the row's own trace first); none fits → dropped."""
    if policy not in ("drop", "truncate", "best_fit"):
        raise ValueError(f"stages.student.overLong: unknown policy {policy!r}")
    chats, records = [], []
    for i, row in enumerate(rows):
        messages = row.get("messages")
        if not isinstance(messages, list) or len(messages) != 3 or messages[-1].get("role") != "assistant":
            raise DataError(f"distillation row {i}: `messages` must be [system, user, assistant]")
        tokens = length(messages)
        record: dict[str, Any] = {"row": i, "source_row": row.get("source_row"), "tokens": tokens}
        if tokens <= max_length:
            record["action"] = "kept"
            chats.append(messages)
        elif policy == "truncate":
            prompt = prompt_length(messages[:2]) if prompt_length is not None else 0
            if prompt >= max_length:
                record.update(action="dropped", prompt_tokens=prompt)  # nothing of the answer would be left
            else:
                record["action"] = "truncated"
                chats.append(messages)
        elif policy == "drop":
            record["action"] = "dropped"
        else:
            record["action"] = "dropped"
            ranked = sorted(row.get("candidates") or [], key=lambda c: -c["reward"])
            for rank, cand in enumerate(ranked):
                alt = formatter.student_messages(row["question"], cand["reasoning_trace"], row["solution"])
                alt_tokens = length(alt)
                if alt_tokens <= max_length:
                    if alt[-1]["content"] != messages[-1]["content"]:
                        record.update(
                            action="replaced", candidate_rank=rank, candidate_reward=cand["reward"], tokens=alt_tokens
                        )
                    else:  # the best candidate is the row itself; it cannot fit
                        continue
                    chats.append(alt)
                    break
        records.append(record)
    return chats, records


def run_student(ctx: StageContext) -> str:
    spec, st = ctx.spec, ctx.spec.stages.student
    device = ctx.compute_device
    formatter = ctx.formatter
    # the product of the last enabled dataset stage before this one (distill, or a stage inserted after it)
    source = ctx.layout.input_of("student", "dataset", spec.stages.enabled())
    if not source.exists():
        raise MissingStageInput(
            f"stage student needs the distillation dataset at {source}; run stage {source.parent.name} first"
        )
    ref = student_ref(spec)
    tokenizer: PreTrainedTokenizerBase = load_tokenizer(ref, padding_side="right")

    def length(messages: list[dict[str, str]], prompt: bool = False) -> int:  # a prompt as TRL tokenises one
        chat = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, add_generation_prompt=prompt)
        return len(cast("BatchEncoding", chat)["input_ids"])  # return_dict: a BatchEncoding

    # TRL cuts an over-long row to maxLength and drops one left with no completion token. Keeping the start (its
    # default) that is a row whose prompt fills maxLength; keeping the end (trainerArgs.truncation_mode) none is.
    from trl import SFTConfig

    mode = st.trainer_args.get("truncation_mode", SFTConfig.__dataclass_fields__["truncation_mode"].default)
    prompt_length = partial(length, prompt=True) if mode == "keep_start" else None
    chats, records = choose_rows(read_jsonl(source), length, st.max_length, st.over_long, formatter, prompt_length)
    counts = Counter(r["action"] for r in records)
    if ctx.is_main:
        atomic_write_json(
            ctx.layout.student_dataset_report,
            {"policy": st.over_long, "maxLength": st.max_length, "counts": dict(counts), "rows": records},
        )
    for r in records:
        if r["action"] != "kept":
            log.warning(
                "student: distillation row %d (%d tokens > maxLength %d): %s",
                r["row"],
                r["tokens"],
                st.max_length,
                r["action"],
            )
    if not chats:
        raise DataError(
            f"stage student: no distillation row fits stages.student.maxLength={st.max_length} "
            f"(policy {st.over_long}: {dict(counts)})"
        )

    rows = [{"prompt": m[:2], "completion": m[2:]} for m in chats]
    return train_sft(ctx, device, rows, tokenizer, stage="student", model=ref)
