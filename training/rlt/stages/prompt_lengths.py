"""Token lengths of the teacher's rows against each stage's limits, checked before anything trains.

TRL keeps the first maxLength tokens of an SFT row, so a row whose teacher prompt alone fills stages.sft.maxLength
keeps no explanation token and teaches nothing (when every row is like that, TRL's sampler fails with
`num_samples=0`); the rl stage refuses prompts over stages.rl.maxPromptLength. `rlt validate` (when the teacher's
tokenizer is on this machine) and `rlt run` (before the first stage) report every limit that rows exceed, naming
the file lines, the field and the value that fits them all. The stages keep their own per-row checks for the pods.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rlt.contract.method_registry import method_info
from rlt.data.dataset import LoadedData
from rlt.method.prompts import Formatter
from rlt.spec.run import RLTRunSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_local_tokenizer(spec: RLTRunSpec, build: bool = False) -> tuple[PreTrainedTokenizerBase | None, str]:
    """The teacher's tokenizer if this machine has it (no download; a built-in is built only when `build`); else None
    and why not.
    A folder with tokenizer.json is read without transformers' model code (rlt.data.local_tokenizer: the door
    answers in a second); LocalFileError for a local tokenizer that cannot render prompts (no chat template)."""
    from rlt.checks.model_config import looks_local
    from rlt.data.local_tokenizer import FileTokenizer, has_tokenizer
    from rlt.data.models import builtin_model_dir

    model = spec.teacher.model
    not_here = (
        f"token lengths not checked: the tokenizer of {model} is not on this machine "
        "(the stages check each row when they run)"
    )
    folder: Path | None = None
    if model.startswith("builtin:"):
        if build:  # `rlt plan` makes a missing built-in (seconds); `rlt validate` does not
            from rlt.data.models import resolve_model_path

            resolve_model_path(model)
        folder = builtin_model_dir(model) if builtin_model_dir(model).is_dir() else None
        if folder is None:
            return None, f"token lengths not checked: {model} is not built yet (`rlt plan` or the first run builds it)"
    elif looks_local(model):
        folder = Path(model).expanduser()
    else:
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(model, "tokenizer.json", revision=spec.teacher.revision)
        except ValueError:
            found = None
        folder = Path(found).parent if isinstance(found, str) else None
    if folder is not None and folder.is_dir() and has_tokenizer(folder):
        try:
            return cast("PreTrainedTokenizerBase", FileTokenizer(folder, "spec.teacher.model")), ""
        except LookupError:
            pass  # a tokenizer without a `tokenizers` backend: AutoTokenizer below
    try:  # a slow tokenizer, or a hub tokenizer cached without tokenizer.json
        from transformers import AutoTokenizer

        from rlt.data.models import resolve_model_path

        path = resolve_model_path(spec.teacher)
        return AutoTokenizer.from_pretrained(path, revision=spec.teacher.revision, local_files_only=True), ""
    except Exception:  # noqa: BLE001 - any failure means "not here"; said as a note, never hidden
        return None, not_here


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
    from rlt.spec.local_files import LocalFileError

    if tokenizer is None:
        try:
            tokenizer, note = load_local_tokenizer(spec)
        except LocalFileError as err:
            return [str(err)], ""
        if tokenizer is None:
            return [], note
    formatter = Formatter(resolve_format(spec.format))
    data = load_data(spec.dataset, formatter.fmt, warn=False)
    special = special_token_problems(spec, data, tokenizer)
    try:  # a local chat template that cannot render the prompts is the folder's problem, in one line
        return special or length_problems(spec, data, formatter, tokenizer), ""
    except LocalFileError as err:
        return [str(err)], ""


def special_token_problems(spec: RLTRunSpec, data: LoadedData, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Rows whose text holds a special token of the teacher's tokenizer (<|im_end|>, <|im_start|>...): in the
    prompt it would end or open a chat turn (a prompt injection, or a row that teaches the wrong turn)."""
    from rlt.data.local_tokenizer import special_texts

    tokens = [t for t in special_texts(tokenizer) if t.strip()]
    hits = [
        (r["row"], name, token)
        for r in data.train + data.eval
        for name in ("question", "solution", "reasoning_trace")
        for token in tokens[:1000]
        if token in (r.get(name) or "")
    ]
    if not hits:
        return []
    row, name, token = hits[0]
    more = f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""
    return [
        f"spec.dataset: {spec.dataset.source} {data.where(row)}: {name} holds {token!r}, a special token of "
        f"{spec.teacher.model}'s tokenizer{more}; in the prompt it would end or open a chat turn: remove it"
    ]
