"""Datasets: load rows from a built-in task, local files or the hub, map columns, report bad rows.

Every row becomes {"question", "solution", "reasoning_trace" (may be None), "row": source index}, plus
"keep": {column: value} for the columns spec.dataset.keepColumns carries into the distillation dataset.
A bad row (missing field, unclosed tag, over-long, tag inside a field) is rejected with its index,
or skipped and reported when `badRows: skip` — never silently changed.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from rlt.prompts import PromptFormat
from rlt.spec import DatasetSpec
from rlt import tasks

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A dataset problem; the message names the row and the field."""


@dataclass
class LoadedData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one message per skipped row


def _read_source(spec: DatasetSpec) -> Iterable[dict[str, Any]]:
    src = spec.source
    if src.startswith("builtin:"):
        return tasks.generate(src.removeprefix("builtin:"), spec.size, spec.seed)
    import datasets  # heavy: only when a real dataset is read

    path = Path(src)
    if path.exists():
        if path.is_dir():
            if (path / "dataset_info.json").exists() or (path / "state.json").exists():
                ds = datasets.load_from_disk(str(path))
                return ds[spec.split] if isinstance(ds, datasets.DatasetDict) else ds
            return datasets.load_dataset(str(path), split=spec.split)
        suffix = path.suffix.lower()
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(suffix)
        if kind is None:
            raise DataError(f"spec.dataset.source: unsupported file type {suffix!r} (use .jsonl, .json, .parquet or .csv)")
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    if src.startswith((".", "/")):
        raise DataError(f"spec.dataset.source: {src} does not exist")
    return datasets.load_dataset(src, split=spec.split, revision=spec.revision)


def _between(text: str, start: str, end: str) -> str | None:
    i = text.find(start)
    if i < 0:
        return None
    j = text.find(end, i + len(start))
    return None if j < 0 else text[i + len(start) : j]


def _from_conversations(raw: dict[str, Any], fmt: PromptFormat) -> dict[str, Any]:
    conv = raw.get("conversations")
    if not isinstance(conv, list) or len(conv) < 2:
        raise DataError("conversations: expected a list with a user turn and an assistant turn")
    user, assistant = conv[0], conv[1]
    if user.get("from", user.get("role")) != "user":
        raise DataError("conversations[0]: expected the user turn")
    if assistant.get("from", assistant.get("role")) != "assistant":
        raise DataError("conversations[1]: expected the assistant turn")
    text = assistant.get("value", assistant.get("content")) or ""
    t = fmt.tags
    thought = _between(text, t.thought_start, t.thought_end)
    solution = _between(text, t.solution_start, t.solution_end)
    if solution is None:
        raise DataError(f"conversations[1]: no closed {t.solution_start}…{t.solution_end} block")
    if thought is None and t.thought_start in text:
        raise DataError(f"conversations[1]: {t.thought_start} is never closed by {t.thought_end}")
    return {"question": user.get("value", user.get("content")), "solution": solution, "reasoning_trace": thought}


def _from_columns(raw: dict[str, Any], spec: DatasetSpec) -> dict[str, Any]:
    cols = spec.columns
    for needed in (cols.question, cols.solution):
        if needed not in raw:
            raise DataError(f"column {needed!r} is missing (columns: {', '.join(sorted(raw))}); map it in spec.dataset.columns")
    trace = raw.get(cols.reasoning_trace) if cols.reasoning_trace else None
    return {"question": raw[cols.question], "solution": raw[cols.solution], "reasoning_trace": trace}


def _kept_columns(raw: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """spec.dataset.keepColumns: carried unchanged into the distillation dataset."""
    missing = [n for n in names if n not in raw]
    if missing:
        raise DataError(f"column {missing[0]!r} (spec.dataset.keepColumns) is missing (columns: {', '.join(sorted(raw))})")
    return {n: raw[n] for n in names}


def check_row(row: dict[str, Any], fmt: PromptFormat, max_chars: int) -> None:
    """Raise DataError naming the field if the row cannot be used as-is."""
    for name in ("question", "solution"):
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{name}: missing or empty")
    if row.get("reasoning_trace") is not None and not isinstance(row["reasoning_trace"], str):
        raise DataError("reasoning_trace: expected text")
    tags = fmt.tags.model_dump().values()
    for name in ("question", "solution", "reasoning_trace"):
        value = row.get(name) or ""
        for tag in tags:
            if tag in value:
                raise DataError(f"{name}: contains the format tag {tag!r}, which would corrupt the prompt")
    total = sum(len(row.get(k) or "") for k in ("question", "solution", "reasoning_trace"))
    if total > max_chars:
        raise DataError(f"row is {total} characters, over spec.dataset.maxChars={max_chars}")


def load_data(spec: DatasetSpec, fmt: PromptFormat) -> LoadedData:
    rows, skipped = [], []
    for index, raw in enumerate(_read_source(spec)):
        try:
            row = _from_conversations(raw, fmt) if spec.layout == "conversations" else _from_columns(raw, spec)
            check_row(row, fmt, spec.max_chars)
            if spec.keep_columns:
                row["keep"] = _kept_columns(raw, spec.keep_columns)
        except DataError as err:
            message = f"{spec.source} row {index}: {err}"
            if spec.bad_rows == "reject":
                raise DataError(message + " (set spec.dataset.badRows: skip to drop such rows)") from None
            log.warning("skipping %s", message)
            skipped.append(message)
            continue
        row["row"] = index
        rows.append(row)
        if spec.limit and len(rows) >= spec.limit and spec.eval_fraction == 0:
            break
    if not rows:
        raise DataError(f"{spec.source}: no usable rows" + (f" ({len(skipped)} skipped)" if skipped else ""))
    train, held_out = rows, []
    if spec.eval_fraction > 0:
        order = list(range(len(rows)))
        random.Random(f"rlt-split-{spec.seed}").shuffle(order)
        n_eval = max(1, int(len(rows) * spec.eval_fraction))
        eval_ids = set(order[:n_eval])
        held_out = [r for i, r in enumerate(rows) if i in eval_ids]
        train = [r for i, r in enumerate(rows) if i not in eval_ids]
    if spec.limit:
        train = train[: spec.limit]
    return LoadedData(train=train, eval=held_out, skipped=skipped)
