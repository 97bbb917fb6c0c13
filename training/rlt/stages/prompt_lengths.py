"""Token lengths of the teacher's rows against each stage's limits, checked before anything trains.

TRL keeps the first maxLength tokens of an SFT row, so a row whose teacher prompt alone fills stages.sft.maxLength
keeps no explanation token and teaches nothing (when every row is like that, TRL's sampler fails with
`num_samples=0`); the rl stage refuses prompts over stages.rl.maxPromptLength. `rlt validate` (when the teacher's
tokenizer is on this machine) and `rlt run` (before the first stage) report every limit that rows exceed, naming
the file lines, the field and the value that fits them all. The stages keep their own per-row checks for the pods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlt.contract.method_registry import method_info
from rlt.data.dataset import LoadedData
from rlt.method.prompts import Formatter
from rlt.spec.run import RLTRunSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_local_tokenizer(spec: RLTRunSpec) -> tuple[PreTrainedTokenizerBase | None, str]:
    """The teacher's tokenizer if this machine has it (no download); else None and why not."""
    from transformers import AutoTokenizer

    from rlt.data.models import resolve_model_path

    try:
        path = resolve_model_path(spec.teacher)
        return AutoTokenizer.from_pretrained(path, revision=spec.teacher.revision, local_files_only=True), ""
    except Exception:  # noqa: BLE001 - any failure means "not here"; said as a note, never hidden
        return None, (
            f"token lengths not checked: the tokenizer of {spec.teacher.model} is not on this machine "
            "(the stages check each row when they run)"
        )


def lines_of(indexes: list[int], where: Callable[[int], str], shown: int = 5) -> str:
    names = ", ".join(where(i) for i in indexes[:shown])
    return names + (f" (+{len(indexes) - shown} more)" if len(indexes) > shown else "")


def over_limit(
    field: str, limit: int, what: str, over: list[tuple[int, int]], total: int, where: Callable[[int], str], fits: int
) -> str:
    """One problem line for every row over one limit."""
    lengths = [n for _, n in over]
    span = f"{min(lengths)}" if min(lengths) == max(lengths) else f"{min(lengths)}–{max(lengths)}"
    return (
        f"{field}={limit}: {len(over)} of {total} rows have a longer teacher prompt ({span} tokens){what}: "
        f"{lines_of([i for i, _ in over], where)}; raise {field} to at least {fits}"
    )


def length_problems(
    spec: RLTRunSpec, data: LoadedData, formatter: Formatter, tokenizer: PreTrainedTokenizerBase
) -> list[str]:
    """Every stage limit the training rows exceed, one line each (method rlt; rcl's prompts carry probes and are
    checked by its stages)."""
    if not method_info(spec.method).row_prompts:
        return []
    rows = data.train
    st = spec.stages
    prompts = {
        r["row"]: len(
            tokenizer(
                formatter.teacher_prompt(tokenizer, r["question"], r["solution"]), add_special_tokens=False
            ).input_ids
        )
        for r in rows
    }
    problems = []
    if st.sft.enabled:
        eos = tokenizer.eos_token or ""
        full = {
            r["row"]: prompts[r["row"]]
            + len(
                tokenizer(formatter.teacher_completion(r["reasoning_trace"], eos), add_special_tokens=False).input_ids
            )
            for r in rows
            if r.get("reasoning_trace")
        }
        over = [(i, prompts[i]) for i in full if prompts[i] >= st.sft.max_length]
        if over:
            problems.append(
                over_limit(
                    "spec.stages.sft.maxLength",
                    st.sft.max_length,
                    ", so no explanation token is left to learn",
                    over,
                    len(full),
                    data.where,
                    max(full.values()),
                )
            )
    if st.rl.enabled:
        over = [(i, n) for i, n in prompts.items() if n > st.rl.max_prompt_length]
        if over:
            problems.append(
                over_limit(
                    "spec.stages.rl.maxPromptLength",
                    st.rl.max_prompt_length,
                    "",
                    over,
                    len(prompts),
                    data.where,
                    max(prompts.values()),
                )
            )
    return problems


def check_prompt_lengths(spec: RLTRunSpec, tokenizer: PreTrainedTokenizerBase | None = None) -> tuple[list[str], str]:
    """(problems, note) for the run's training rows; the note says when the lengths could not be checked."""
    from rlt.data.dataset import is_reachable, load_data
    from rlt.method.prompts import resolve_format

    if not method_info(spec.method).row_prompts or not (spec.stages.sft.enabled or spec.stages.rl.enabled):
        return [], ""
    if not is_reachable(spec.dataset):
        return [], ""
    if tokenizer is None:
        tokenizer, note = load_local_tokenizer(spec)
        if tokenizer is None:
            return [], note
    formatter = Formatter(resolve_format(spec.format))
    return length_problems(spec, load_data(spec.dataset, formatter.fmt, warn=False), formatter, tokenizer), ""
