"""The two-pass protocol as text: the probe prompt, the teacher prompt (question + probe), guidance extraction,
and the student prompts with and without guidance. Every sentence and tag comes from a format YAML."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from rlt.contract.api import Strict
from rlt.data.answers import between, is_correct
from rlt.data.tasks import verify_builtin
from rlt.method.prompts import chat_text
from rlt.spec import reader
from rlt.spec.inputs import FORMATS_DIR
from rlt.spec.local_files import entry_problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RclFormat(Strict):
    """Keys of an rcl format file (camelCase in YAML)."""

    name: str = "custom"
    kind: Literal["rcl"] = Field(description="Marks the file as an rcl format (rlt formats have other keys).")
    probe_system_prompt: str = Field(min_length=1)
    probe_instruction: str = Field(min_length=1)
    teacher_system_prompt: str = Field(min_length=1)
    teacher_user_template: str = Field(min_length=1)
    diagnosis_start: str = Field(min_length=1)
    diagnosis_end: str = Field(min_length=1)
    guidance_start: str = Field(min_length=1)
    guidance_end: str = Field(min_length=1)
    student_system_prompt: str = Field(min_length=1)
    student_guidance_template: str = Field(min_length=1)
    answer_start: str = Field(min_length=1)
    answer_end: str = Field(min_length=1)
    sft_probe: str = Field(min_length=1)
    sft_diagnosis: str = Field(min_length=1)

    @model_validator(mode="after")
    def _placeholders(self) -> RclFormat:
        for field, keys in (
            ("teacherUserTemplate", ("{question}", "{probe}")),
            ("studentGuidanceTemplate", ("{question}", "{guidance}")),
        ):
            text = getattr(
                self, "teacher_user_template" if field.startswith("teacher") else "student_guidance_template"
            )
            missing = [k for k in keys if k not in text]
            if missing:
                raise ValueError(f"{field}: must contain {', '.join(missing)}")
        return self


# the `kind` an rcl format file carries (rlt's formats have none)
FORMAT_KIND = "rcl"


def bundled_rcl_formats() -> list[str]:
    return sorted(
        p.stem for p in FORMATS_DIR.glob("*.yaml") if (yaml.safe_load(p.read_text()) or {}).get("kind") == FORMAT_KIND
    )


def check_spec_format(spec: Any, local_files: bool = True) -> None:
    """Method rcl's format check (rlt.contract.method_registry): spec.rcl.format loads; a path is only checked
    where the files are (`local_files`), a bundled name everywhere."""
    if not local_files and Path(spec.rcl.format).suffix:
        return  # a path inside the pods: checked there
    load_rcl_format(spec.rcl.format)


@cache
def load_rcl_format(name_or_path: str) -> RclFormat:
    """A bundled rcl format by name, or a YAML file by path; errors name spec.rcl.format."""
    path = Path(name_or_path)
    if not path.suffix:
        path = FORMATS_DIR / f"{name_or_path}.yaml"
    problem = entry_problem(path, "spec.rcl.format", name_or_path)
    if problem:
        raise ValueError(problem)
    if not path.is_file():
        raise ValueError(
            f"spec.rcl.format: {name_or_path!r} is neither a file nor a bundled rcl format "
            f"({', '.join(bundled_rcl_formats())})"
        )
    try:
        docs = reader.load_yaml(reader.read_file(path))
    except (reader.InputError, yaml.YAMLError) as err:
        line = str(err) if isinstance(err, reader.InputError) else reader.yaml_error_line(err)
        raise ValueError(f"spec.rcl.format: {path}: {line}") from None
    try:
        return RclFormat.model_validate(docs[0] if len(docs) == 1 else docs)
    except ValidationError as err:
        raise ValueError(f"spec.rcl.format: {path} is not a valid rcl format:\n{err}") from None


def _fill(template: str, **values: str) -> str:
    # str.replace, not str.format: questions and probes may hold braces (LaTeX, sets)
    for k, v in values.items():
        template = template.replace("{" + k + "}", v)
    return template


class Protocol:
    """Renders the chats of both passes with the models' chat templates."""

    def __init__(self, fmt: RclFormat):
        self.fmt = fmt

    @property
    def answer_tags(self) -> tuple[str, str]:
        return self.fmt.answer_start, self.fmt.answer_end

    # pass 1
    def probe_prompt(self, tokenizer: PreTrainedTokenizerBase, question: str) -> str:
        messages = [
            {"role": "system", "content": self.fmt.probe_system_prompt},
            {"role": "user", "content": f"{question}\n\n{self.fmt.probe_instruction}"},
        ]
        return chat_text(tokenizer, messages, add_generation_prompt=True)

    # pass 2
    def teacher_messages(self, question: str, probe: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.fmt.teacher_system_prompt},
            {"role": "user", "content": _fill(self.fmt.teacher_user_template, question=question, probe=probe.strip())},
        ]

    def teacher_prompt(self, tokenizer: PreTrainedTokenizerBase, question: str, probe: str) -> str:
        return chat_text(tokenizer, self.teacher_messages(question, probe), add_generation_prompt=True)

    def teacher_target(self, diagnosis: str, guidance: str) -> str:
        """What a well-formed teacher turn looks like (the sft warm-up target)."""
        f = self.fmt
        return f"{f.diagnosis_start}{diagnosis}{f.diagnosis_end}\n{f.guidance_start}{guidance}{f.guidance_end}"

    def extract_guidance(self, completion: str) -> str | None:
        """The text between the guidance tags, or None when they are missing or unclosed (never the whole output).
        Closed tags around nothing are zero-length guidance (""): the teacher chose to add nothing, which the method
        asks for when the student's idea is already right, so it is scored as no teaching (eff = 1), not a format error."""
        inside = between(completion, self.fmt.guidance_start, self.fmt.guidance_end)
        return None if inside is None else inside.strip()

    # student answers
    def student_prompt(self, tokenizer: PreTrainedTokenizerBase, question: str, guidance: str | None = None) -> str:
        user = (
            question
            if guidance is None
            else _fill(self.fmt.student_guidance_template, question=question, guidance=guidance)
        )
        messages = [{"role": "system", "content": self.fmt.student_system_prompt}, {"role": "user", "content": user}]
        return chat_text(tokenizer, messages, add_generation_prompt=True)

    def student_answer_text(self, solution: str) -> str:
        """The reference solution as the student would write it (the dense variant scores this)."""
        return f"{self.fmt.answer_start}{solution}{self.fmt.answer_end}"

    def correct(self, output: str, question: str, solution: str) -> bool:
        """Graded as the evaluate stage grades `builtin` rows: a question a built-in checker knows (countdown, basic)
        is verified from the question itself (a countdown reference is one expression of many); any other answer is
        compared with the reference."""
        verdict = verify_builtin(question, output, self.answer_tags)[1]
        return verdict if verdict is not None else is_correct(output, solution, self.answer_tags)
