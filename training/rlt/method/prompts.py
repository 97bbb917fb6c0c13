"""Teacher and student formats. The text of every prompt and tag lives in YAML (rlt/method/formats/), not here.

Teacher (RLT): system = teacher prompt; user = question; assistant = solution block, then the
explanation the teacher writes:   <sol>S</sol>{sep}<expl>E</expl>
Student: system = student prompt; user = question; assistant = <think>E</think>{sep}<sol>S</sol>
The student never sees the solution before the thought: the reward asks how well E predicts S.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import yaml
from pydantic import Field, ValidationError

from rlt.contract.api import Strict
from rlt.spec import reader
from rlt.spec.inputs import FORMATS_DIR, FormatSpec
from rlt.spec.local_files import entry_problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from typing_extensions import Unpack


class Tags(Strict):
    thought_start: str = Field(min_length=1)
    thought_end: str = Field(min_length=1)
    solution_start: str = Field(min_length=1)
    solution_end: str = Field(min_length=1)
    explanation_start: str = Field(min_length=1)
    explanation_end: str = Field(min_length=1)


class PromptFormat(Strict):
    name: str = "custom"
    tags: Tags
    separator: str = "\n"
    student_system_prompt: str = Field(min_length=1)
    teacher_system_prompt: str = Field(min_length=1)


class ChatOptions(TypedDict, total=False):
    """The chat-template switches the prompts use; only those given are passed (stand-in tokenizers take fewer)."""

    add_generation_prompt: bool
    continue_final_message: bool


def chat_text(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], **options: Unpack[ChatOptions]
) -> str:
    """`messages` rendered by the tokenizer's chat template, as text (not token ids)."""
    # transformers types the result as the union of every mode's; with tokenize=False it is the text
    return cast(str, tokenizer.apply_chat_template(messages, tokenize=False, **options))


def bundled_formats() -> list[str]:
    return sorted(p.stem for p in FORMATS_DIR.glob("*.yaml"))


def _load_file(path: str) -> dict[str, Any]:
    """The format file's mapping, read again when it is another file (a relative path from another working directory)
    or the same file changed: a cache keyed by the name alone answered with the first file's format."""
    st = Path(path).stat()
    return _load_file_at(path, os.path.abspath(path), st.st_mtime_ns, st.st_size)  # noqa: PTH100


@cache
def _load_file_at(path: str, _where: str, _mtime: int, _size: int) -> dict[str, Any]:
    try:
        docs = reader.load_yaml(reader.read_file(path))
    except (reader.InputError, yaml.YAMLError) as err:
        line = str(err) if isinstance(err, reader.InputError) else reader.yaml_error_line(err)
        raise ValueError(f"spec.format.file: {path}: {line}") from None
    data = docs[0] if len(docs) == 1 else None
    if not isinstance(data, dict):
        raise ValueError(f"spec.format.file: {path}: a format file must be a mapping")
    return data


def check_spec_format(spec: Any, local_files: bool = True) -> None:
    """Method rlt's format check (rlt.contract.method_registry): spec.format resolves; a file is only checked
    where the files are (`local_files`), a preset everywhere."""
    if not local_files and spec.format.file:
        return  # a path inside the pods: checked there
    resolve_format(spec.format)


def resolve_format(spec: FormatSpec) -> PromptFormat:
    """Preset (or file), then the spec's overrides. Errors name the file or preset."""
    if spec.file:
        source = spec.file
        problem = entry_problem(spec.file, "spec.format.file")  # a loop, a device, a pipe, a name too long
        if problem:
            raise ValueError(problem)
        if not Path(spec.file).is_file():
            raise ValueError(f"spec.format.file: {spec.file} does not exist")
    else:
        path = FORMATS_DIR / f"{spec.preset}.yaml"
        if not path.is_file():
            raise ValueError(
                f"spec.format.preset: unknown format {spec.preset!r} (bundled: {', '.join(bundled_formats())})"
            )
        source = str(path)
    data = dict(_load_file(source))
    field = "spec.format.file" if spec.file else "spec.format.preset"
    tags = data.get("tags", {})
    if not isinstance(tags, dict):  # the overrides merge into it: a mapping or nothing
        raise ValueError(f"{field}: {source}: tags is a {type(tags).__name__}; a format's tags are a mapping")
    data["tags"] = {**tags, **spec.tags.model_dump(by_alias=True, exclude_none=True)}
    if spec.student_system_prompt:
        data["studentSystemPrompt"] = spec.student_system_prompt
    if spec.teacher_system_prompt:
        data["teacherSystemPrompt"] = spec.teacher_system_prompt
    try:
        return PromptFormat.model_validate(data)
    except ValidationError as err:
        missing = ", ".join(".".join(str(p) for p in e["loc"]) for e in err.errors()[:4])
        named = source if spec.file else repr(spec.preset)  # a preset by its name, not its install path
        raise ValueError(f"{field}: {named} is not an rlt prompt format (problems at: {missing})") from None


@dataclass(frozen=True)
class Span:
    """Character range [start, end) inside a rendered text."""

    start: int
    end: int


def span_positions(offsets: list[tuple[int, int]], span: Span) -> list[int]:
    """The tokens scored for a span (rlt.method.scoring): those wholly inside it, never the first token (nothing
    predicts it). A token that straddles the span's edge ("<answer>." as one token) is not scored: a span can have
    none."""
    return [t for t, (s, e) in enumerate(offsets) if t > 0 and e > s >= span.start and e <= span.end]


class Formatter:
    """Renders teacher and student chats with a tokenizer's chat template and locates the parts by character."""

    def __init__(self, fmt: PromptFormat):
        self.fmt = fmt
        self.t = fmt.tags

    # ---- text blocks
    def solution_block(self, solution: str) -> str:
        return f"{self.t.solution_start}{solution}{self.t.solution_end}"

    def teacher_prefix(self, solution: str) -> str:
        """What the teacher's turn starts with: the given solution, then the opening explanation tag."""
        return f"{self.solution_block(solution)}{self.fmt.separator}{self.t.explanation_start}"

    def student_answer(self, explanation: str, solution: str) -> str:
        return f"{self.t.thought_start}{explanation}{self.t.thought_end}{self.fmt.separator}{self.solution_block(solution)}"

    def split_explanation(self, completion: str) -> tuple[str, bool]:
        """The explanation E inside a teacher completion and whether its closing tag was written."""
        end = completion.find(self.t.explanation_end)
        if end < 0:
            return completion, False
        return completion[:end], True

    # ---- chats
    def teacher_prompt(self, tokenizer: PreTrainedTokenizerBase, question: str, solution: str) -> str:
        """Rendered teacher prompt, ending right after the opening explanation tag (the teacher continues)."""
        messages = [
            {"role": "system", "content": self.fmt.teacher_system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.teacher_prefix(solution)},
        ]
        text = chat_text(tokenizer, messages, continue_final_message=True)
        if not text.endswith(self.t.explanation_start):
            raise ValueError(
                "the teacher chat template altered the assistant prefix; use a template that keeps it verbatim"
            )
        return text

    def teacher_completion(self, explanation: str, eos: str | None) -> str:
        """SFT target after the teacher prompt: the explanation, its closing tag and the end of turn (the tokenizer's
        eos token; nothing when it has none)."""
        return f"{explanation}{self.t.explanation_end}{eos or ''}"

    def student_chat(
        self, tokenizer: PreTrainedTokenizerBase, question: str, explanation: str, solution: str
    ) -> tuple[str, Span, Span]:
        """Rendered student chat and the character spans of the explanation and of the solution inside it."""
        answer = self.student_answer(explanation, solution)
        messages = [
            {"role": "system", "content": self.fmt.student_system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
        text = chat_text(tokenizer, messages)
        at = text.rfind(answer)
        if at < 0:
            raise ValueError(
                "the student chat template altered the assistant answer; use a template that keeps it verbatim"
            )
        e0 = at + len(self.t.thought_start)
        s0 = e0 + len(explanation) + len(self.t.thought_end) + len(self.fmt.separator) + len(self.t.solution_start)
        return text, Span(e0, e0 + len(explanation)), Span(s0, s0 + len(solution))

    def student_messages(self, question: str, explanation: str, solution: str) -> list[dict[str, str]]:
        """The distillation row as chat messages (student format)."""
        return [
            {"role": "system", "content": self.fmt.student_system_prompt},
            {"role": "user", "content": question},
            {"role": "assistant", "content": self.student_answer(explanation, solution)},
        ]


def student_chat_tokens(formatter: Formatter, tokenizer: Any, question: str, solution: str) -> tuple[int, int]:
    """(tokens, scored) of a row's student chat with no explanation (`tokenizer`: the student's, fast or
    rlt.data.local_tokenizer's): its length before an explanation is added, and how many of its solution tokens the
    reward's r_SS scores. The explanation cannot change the scored ones (the tags stand between), so none is
    rendered. scored 0: the solution merges into the tags around it ("<answer>." is one token); no reward exists."""
    text, _, span = formatter.student_chat(tokenizer, question, "", solution)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
    return len(offsets), len(span_positions(offsets, span))


def scored_solution_tokens(formatter: Formatter, tokenizer: Any, question: str, solution: str) -> int:
    """How many of a row's solution tokens the reward's r_SS scores in the student's chat (student_chat_tokens)."""
    return student_chat_tokens(formatter, tokenizer, question, solution)[1]
