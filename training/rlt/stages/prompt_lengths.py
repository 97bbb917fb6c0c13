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
from rlt.spec.inputs import ModelRef
from rlt.spec.run import RLTRunSpec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_local_tokenizer(
    spec: RLTRunSpec, build: bool = False, ref: ModelRef | None = None, field: str = "spec.teacher.model"
) -> tuple[PreTrainedTokenizerBase | None, str]:
    """The tokenizer of spec.teacher (or of `ref`, the spec's `field`) if this machine has it (no download; a built-in
    is built only when `build`); else None and why not.
    A folder with tokenizer.json is read without transformers' model code (rlt.data.local_tokenizer: the door
    answers in a second); LocalFileError for a local tokenizer that cannot render prompts (no chat template)."""
    from rlt.checks.model_config import looks_local
    from rlt.data.local_tokenizer import FileTokenizer, has_tokenizer
    from rlt.data.models import builtin_model_dir

    ref = ref or spec.teacher
    model = ref.model
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
            found = try_to_load_from_cache(model, "tokenizer.json", revision=ref.revision)
        except ValueError:
            found = None
        folder = Path(found).parent if isinstance(found, str) else None
    if folder is not None and folder.is_dir() and has_tokenizer(folder):
        try:
            return cast("PreTrainedTokenizerBase", FileTokenizer(folder, field)), ""
        except LookupError:
            pass  # a tokenizer without a `tokenizers` backend: AutoTokenizer below
    try:  # a slow tokenizer, or a hub tokenizer cached without tokenizer.json
        from transformers import AutoTokenizer

        from rlt.data.models import resolve_model_path

        path = resolve_model_path(ref)
        return AutoTokenizer.from_pretrained(path, revision=ref.revision, local_files_only=True), ""
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
        eos = tokenizer.eos_token
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


StudentChats = dict[int, tuple[int, int]]  # row -> (chat tokens before the explanation, scored solution tokens)


def student_chats(data: LoadedData, formatter: Formatter, student_tokenizer: PreTrainedTokenizerBase) -> StudentChats:
    """Each training row's student chat, rendered and tokenized once for both checks below."""
    from rlt.method.prompts import student_chat_tokens

    return {
        r["row"]: student_chat_tokens(formatter, student_tokenizer, r["question"], r["solution"]) for r in data.train
    }


REWARD = "spec.stages.rl.reward"  # the rows its reward cannot score: a problem of every stage that scores with it
SCORED_BY = ("rl", "distill")


def unscorable_problems(spec: RLTRunSpec, data: LoadedData, chats: StudentChats) -> list[str]:
    """Rows whose solution has no token of its own in the student's chat (rlt.method.prompts.student_chat_tokens):
    the reward of rl and distill cannot score them (the stages refuse them, or skip them under badRows: skip)."""
    rows = data.train[: spec.stages.distill.limit] if not spec.stages.rl.enabled else data.train
    bad = [r for r in rows if chats[r["row"]][1] == 0]
    if not bad:
        return []
    shown = ", ".join(sorted({repr(r["solution"]) for r in bad})[:5])
    return [
        f"{REWARD}: {len(bad)} of {len(rows)} rows have a solution with no token of its own in "
        f"{spec.student.model}'s chat ({shown}: it merges into the answer tags), so the reward cannot score them: "
        f"{lines_of([r['row'] for r in bad], data.where)}; write the full answer"
    ]


CONTEXT = "spec.student.model"  # a problem of the run's shape, not of some rows: badRows: skip cannot help


def student_context_problems(spec: RLTRunSpec, data: LoadedData, chats: StudentChats) -> list[str]:
    """The reward's student reads question, explanation and solution in one chat: the longest row's chat with the
    longest explanation a stage writes must fit the student's positions (max_position_embeddings, from its config
    when it is here). Past them a RoPE model does not refuse; its log-probs are simply no reward."""
    from rlt.checks.shapes import read_shape

    shape, _ = read_shape(spec.student, build=False)
    top = shape.max_positions if shape is not None else None
    if not top or not chats:
        return []
    row, longest = max(((i, n) for i, (n, _) in chats.items()), key=lambda kv: kv[1])
    st, problems = spec.stages, []
    for name, field, tokens in (
        ("rl", "maxCompletionLength", st.rl.max_completion_length if st.rl.enabled else 0),
        ("distill", "maxNewTokens", st.distill.max_new_tokens if st.distill.enabled else 0),
    ):
        if tokens and longest + tokens > top:
            problems.append(
                f"{CONTEXT}: {spec.student.model} reads {top} positions (max_position_embeddings); its chat of "
                f"{data.where(row)} is {longest} tokens before the explanation and {longest + tokens} with "
                f"spec.stages.{name}.{field}={tokens}, and past its positions its log-probs are no reward: lower "
                f"spec.stages.{name}.{field} to at most {max(0, top - longest)}, or use a student with a longer context"
            )
    return problems


def check_prompt_lengths(
    spec: RLTRunSpec,
    tokenizer: PreTrainedTokenizerBase | None = None,
    student_tokenizer: PreTrainedTokenizerBase | None = None,
    build: bool = False,
) -> tuple[list[str], str]:
    """(problems, note) for the run's training rows: the teacher prompts' lengths, and the solutions the reward can
    score when the student's tokenizer is here; the note says when the lengths could not be checked. `build`: make
    a built-in model not made yet (a run about to train needs it anyway; `rlt validate` only reads)."""
    from rlt.data.dataset import is_reachable, load_data
    from rlt.method.prompts import resolve_format

    st = spec.stages
    scored = st.rl.enabled or st.distill.enabled
    if not method_info(spec.method).row_prompts or not (st.sft.enabled or scored):
        return [], ""
    if not is_reachable(spec.dataset):
        return [], ""
    from rlt.spec.local_files import LocalFileError

    if tokenizer is None:
        try:
            tokenizer, note = load_local_tokenizer(spec, build)
        except LocalFileError as err:
            return [str(err)], ""
        if tokenizer is None:
            return [], note
    formatter = Formatter(resolve_format(spec.format))
    data = load_data(spec.dataset, formatter.fmt, warn=False)
    special = special_token_problems(spec, data, tokenizer)
    try:  # a local chat template that cannot render the prompts is the folder's problem, in one line
        problems = special or length_problems(spec, data, formatter, tokenizer)
        if scored and not special and student_tokenizer is None:
            student_tokenizer, _ = load_local_tokenizer(spec, build, ref=spec.student, field="spec.student.model")
        if scored and not special and student_tokenizer is not None:
            chats = student_chats(data, formatter, student_tokenizer)
            problems += unscorable_problems(spec, data, chats)
            problems += student_context_problems(spec, data, chats)
        return problems, ""
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
