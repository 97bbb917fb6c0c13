"""Datasets: load rows from a built-in task, local files or the hub, map columns, report bad rows.

Every row becomes {"question", "solution", "reasoning_trace" (may be None), "row": source index}, plus
"keep": {column: value} for the columns spec.dataset.keepColumns carries into the distillation dataset.
A bad row (missing field, unclosed tag, over-long, tag inside a field) is rejected naming its line (JSONL, CSV:
1-based file lines) or row index, or skipped and reported when `badRows: skip` — never silently changed. A number
where text is expected (solution: 42) is used as its text ("42") and reported.
"""

from __future__ import annotations

import json
import logging
import math
import random
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlt.data.answers import between
from rlt.data.errors import DataError
from rlt.data.sources import Unparsable, Where, read_source
from rlt.method.prompts import PromptFormat, bundled_formats, resolve_format
from rlt.spec import reader
from rlt.spec.inputs import FILE_KINDS, DatasetSpec, FormatSpec
from rlt.spec.local_files import entry_exists

log = logging.getLogger(__name__)


@dataclass
class LoadedData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one message per bad row (all of them, also under reject)
    read: int = 0  # rows read from the source (good and bad)
    numbers: list[str] = field(default_factory=list)  # where a question/solution was a number, used as its text
    # How a message names a row by its "row" index: 'line N' for JSONL/CSV (what an editor shows), else 'row i'.
    where: Callable[[int], str] = field(default=lambda i: f"row {i}")


# Role names of a turn (`from` in ShareGPT, `role` in OpenAI chat): the common spellings of each side.
USER_ROLES = ("user", "human")
ASSISTANT_ROLES = ("assistant", "gpt")
CHAT_COLUMNS = ("conversations", "messages")


def _preset_with_tags(text: str, fmt: PromptFormat) -> str | None:
    """A bundled format preset, other than the one in use, whose solution tags close a block in `text`."""
    for name in bundled_formats():
        try:
            tags = resolve_format(FormatSpec(preset=name)).tags
        except ValueError:
            continue  # not a prompt format of this method (rcl's)
        if tags.solution_start != fmt.tags.solution_start and between(text, tags.solution_start, tags.solution_end):
            return name
    return None


def _from_conversations(raw: dict[str, Any], fmt: PromptFormat, column: str = "conversations") -> dict[str, Any]:
    where = column
    if column not in raw:
        others = [c for c in CHAT_COLUMNS if c in raw and c != column]
        hint = f"; map it: spec.dataset.columns.conversations: {others[0]}" if others else ""
        raise DataError(f"column {column!r} is missing (columns: {', '.join(sorted(raw))}){hint}")
    conv = raw[column]
    if not isinstance(conv, list) or len(conv) < 2:
        raise DataError(f"{where}: expected a list with a user turn and an assistant turn")
    for i, turn in enumerate(conv):
        if isinstance(turn, dict):
            for pair in (("from", "role"), ("value", "content")):
                if all(k in turn for k in pair):  # two spellings of one thing: which one is meant is a guess
                    raise DataError(
                        f"{column}[{i}]: has both {pair[0]!r} (ShareGPT) and {pair[1]!r} (OpenAI chat); give one"
                    )
    if all(isinstance(turn, dict) for turn in conv) and conv[0].get("from", conv[0].get("role")) == "system":
        conv = conv[1:]  # a leading system turn is not part of the question
        where = f"{column} (after its system turn)"
    if len(conv) < 2:
        raise DataError(f"{where}: expected a user turn and an assistant turn")
    if len(conv) > 2:  # the later turns would be dropped without a word
        raise DataError(
            f"{where}: {len(conv)} turns; a row is one question and one answer (a user turn, then an assistant "
            "turn): split the conversation into rows"
        )
    user, assistant = conv[0], conv[1]
    if not isinstance(user, dict) or not isinstance(assistant, dict):
        raise DataError(f"{where}: each turn must be an object with from/value (or role/content)")
    role = user.get("from", user.get("role"))
    if role not in USER_ROLES:
        raise DataError(f"{where}[0]: expected the user turn (from/role: {' or '.join(USER_ROLES)}), got {role!r}")
    role = assistant.get("from", assistant.get("role"))
    if role not in ASSISTANT_ROLES:
        raise DataError(
            f"{where}[1]: expected the assistant turn (from/role: {' or '.join(ASSISTANT_ROLES)}), got {role!r}"
        )
    question = _turn_text(user, f"{where}[0]")
    text = _turn_text(assistant, f"{where}[1]") or ""
    t = fmt.tags
    thought = between(text, t.thought_start, t.thought_end)
    solution = between(text, t.solution_start, t.solution_end)
    if solution is None:
        preset = _preset_with_tags(text, fmt)
        hint = (
            f"; the turn uses the tags of format preset {preset!r}: set spec.format.preset: {preset}" if preset else ""
        )
        raise DataError(f"{where}[1]: no closed {t.solution_start}…{t.solution_end} block{hint}")
    if thought is None and t.thought_start in text:
        raise DataError(f"{where}[1]: {t.thought_start} is never closed by {t.thought_end}")
    return {"question": question, "solution": solution, "reasoning_trace": thought}


def _turn_text(turn: dict[str, Any], where: str) -> str | None:
    """A turn's text (`value` in ShareGPT, `content` in OpenAI chat); a list, an object or a number is refused: a
    multi-part message would otherwise be read as its Python spelling."""
    key = "value" if "value" in turn else "content"
    text = turn.get(key)
    if text is not None and not isinstance(text, str):
        raise DataError(f"{where}.{key}: expected text, got {_describe(text).removeprefix('expected text, got ')}")
    return text


def _from_columns(raw: dict[str, Any], spec: DatasetSpec) -> dict[str, Any]:
    cols = spec.columns
    for needed in (cols.question, cols.solution):
        if needed not in raw:
            chat = [c for c in CHAT_COLUMNS if isinstance(raw.get(c), list)]
            fix = (
                f"the rows hold chat turns in {chat[0]!r}: set spec.dataset.layout: conversations"
                + ("" if chat[0] == "conversations" else f" and spec.dataset.columns.conversations: {chat[0]}")
                if chat
                else "map it in spec.dataset.columns"
            )
            raise DataError(f"column {needed!r} is missing (columns: {', '.join(sorted(raw))}); {fix}")
    trace = raw.get(cols.reasoning_trace) if cols.reasoning_trace else None
    return {"question": raw[cols.question], "solution": raw[cols.solution], "reasoning_trace": trace}


def _kept_columns(raw: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """spec.dataset.keepColumns: carried unchanged into the distillation dataset."""
    missing = [n for n in names if n not in raw]
    if missing:
        raise DataError(
            f"column {missing[0]!r} (spec.dataset.keepColumns) is missing (columns: {', '.join(sorted(raw))})"
        )
    return {n: raw[n] for n in names}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _as_text(row: dict[str, Any]) -> list[str]:
    """A numeric question or solution (42, 3.5) is used as its text ('42'); returns the fields converted."""
    converted = []
    for name in ("question", "solution", "reasoning_trace"):
        if _is_number(row.get(name)):
            row[name] = str(row[name])
            converted.append(name)
    return converted


def _describe(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "missing (null)"
    if isinstance(value, bool):
        return f"expected text, got the boolean {str(value).lower()}"
    if isinstance(value, str):
        return "empty"
    return f"expected text, got {type(value).__name__} {json.dumps(value, default=str)[:40]}"


# Characters that draw nothing though unicodedata files them as letters or symbols (fillers, the blank Braille cell).
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def visible(c: str) -> bool:
    """Whether a character draws something: not a space, a control or format character (zero-width space, joiners,
    the byte-order mark, bidirectional marks), a lone combining mark or a blank filler."""
    return unicodedata.category(c) not in ("Zs", "Zl", "Zp", "Cc", "Cf", "Cn", "Co", "Cs", "Mn", "Me") and (
        c not in _BLANK_LETTERS
    )


def check_row(row: dict[str, Any], fmt: PromptFormat, max_chars: int) -> None:
    """Raise DataError naming the field if the row cannot be used as-is."""
    for name in ("question", "solution"):
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{name}: {_describe(value)}")
        if not any(visible(c) for c in value):
            first = next(c for c in value if not c.isspace())
            raise DataError(
                f"{name}: only invisible characters (such as U+{ord(first):04X}, {unicodedata.name(first, 'unnamed')}); "
                "the model would see an empty text"
            )
    trace = row.get("reasoning_trace")
    if isinstance(trace, float) and math.isnan(trace):
        row["reasoning_trace"] = trace = None  # an empty CSV/Parquet cell: no trace
    if trace is not None and not isinstance(trace, str):
        raise DataError(f"reasoning_trace: {_describe(trace)}")
    tags = fmt.tags.model_dump().values()
    for name in ("question", "solution", "reasoning_trace"):
        value = row.get(name) or ""
        for tag in tags:
            if tag in value:
                raise DataError(f"{name}: contains the format tag {tag!r}, which would corrupt the prompt")
    total = sum(len(row.get(k) or "") for k in ("question", "solution", "reasoning_trace"))
    if total > max_chars:
        raise DataError(f"row is {total} characters, over spec.dataset.maxChars={max_chars}")


def _rows(n: int) -> str:
    return f"{n} bad row" if n == 1 else f"{n} bad rows"


def bad_rows_message(source: str, bad: list[str], good: int, policy: str, listed: bool = False) -> str:
    """One line: the first bad row, how many more, and the way out that would actually help."""
    more = ""
    if len(bad) > 1:
        plural = "s" if len(bad) > 2 else ""
        more = f" ({len(bad) - 1} more bad row{plural}" + (")" if listed else "; `rlt validate` lists them)")
    if good == 0:
        told = "set spec." in bad[0] or "map it:" in bad[0]  # the row's own message already names the fix
        return f"{source} {bad[0]}{more}; no row is usable, so badRows: skip would drop every row" + (
            "" if told else ": fix the data or spec.dataset.columns"
        )
    if policy == "reject":
        return f"{source} {bad[0]}{more}; set spec.dataset.badRows: skip to drop the {_rows(len(bad))}"
    return f"{source} {bad[0]}{more}"


def group_problems(bad: list[str], limit: int = 10) -> list[str]:
    """'line 3: solution: empty' lines grouped by problem: 'line 3, line 7 (+12 more): solution: empty'."""
    by_problem: dict[str, list[str]] = {}
    for b in bad:
        where, _, problem = b.partition(": ")
        by_problem.setdefault(problem, []).append(where)
    out = []
    for problem, wheres in list(by_problem.items())[:limit]:
        extra = f" (+{len(wheres) - 3} more)" if len(wheres) > 3 else ""
        out.append(f"{', '.join(wheres[:3])}{extra}: {problem}")
    if len(by_problem) > limit:
        out.append(f"... and {len(by_problem) - limit} other problems")
    return out


def data_system_prompt(spec: DatasetSpec) -> str | None:
    """The student's system prompt from the data's `columns.system` column (the rows the student was trained on
    carry it), None when no row has it. Rows that disagree are an error naming the first that differs: one student
    has one system prompt."""
    column = spec.columns.system
    if column is None:
        return None
    source, where = read_source(spec)
    source_name = spec.source
    found: tuple[int, str] | None = None
    for index, raw in enumerate(source):
        value = raw.get(column) if isinstance(raw, dict) else None
        if value is not None and not isinstance(value, str) and not (isinstance(value, float) and math.isnan(value)):
            raise DataError(f"{source_name} {where(index)}: {column}: {_describe(value)} (a system prompt)")
        if not isinstance(value, str) or not value.strip():
            continue
        if found is None:
            found = (index, value)
        elif value != found[1]:
            raise DataError(
                f"{where(index)}: {column}: a different system prompt than {where(found[0])}'s; the student has one: "
                f"set spec.format.studentSystemPrompt, or spec.dataset.columns.system: null"
            )
    return None if found is None else found[1]


def scan_rows(spec: DatasetSpec, fmt: PromptFormat) -> tuple[list[dict[str, Any]], list[str], int, list[str]]:
    """(usable rows, 'line N: problem' per bad row, rows read, where numbers were used as text); raises only when
    the source itself cannot be read."""
    return _scan(spec, fmt)[:4]


def _scan(spec: DatasetSpec, fmt: PromptFormat) -> tuple[list[dict[str, Any]], list[str], int, list[str], Where]:
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    numbers: list[str] = []
    source, where = read_source(spec)
    read = 0
    for index, raw in enumerate(source):
        read += 1
        try:
            if isinstance(raw, Unparsable):
                raise DataError(raw.problem)
            if not isinstance(raw, dict):
                raise DataError(f"expected an object with named fields, got {type(raw).__name__}")
            problem = reader.value_problem(raw)  # the bounds of the strict reader, whatever the source
            if problem:
                raise DataError(problem)
            row = (
                _from_conversations(raw, fmt, spec.columns.conversations)
                if spec.layout == "conversations"
                else _from_columns(raw, spec)
            )
            converted = _as_text(row)
            check_row(row, fmt, spec.max_chars)
            if spec.keep_columns:
                row["keep"] = _kept_columns(raw, spec.keep_columns)
        except DataError as err:
            bad.append(f"{where(index)}: {err}")
            continue
        numbers += [f"{where(index)}: {name}" for name in converted]
        row["row"] = index
        rows.append(row)
        if spec.limit and len(rows) >= spec.limit and spec.eval_fraction == 0:
            break
    return rows, bad, read, numbers, where


def load_data(spec: DatasetSpec, fmt: PromptFormat, warn: bool = True) -> LoadedData:
    """The usable rows. Every row up to `limit` is checked, so a rejection can say how many rows are bad and
    whether skipping them would leave anything; under `badRows: skip` one warning sums the skipped rows up."""
    rows, bad, read, numbers, where = _scan(spec, fmt)
    if bad and (spec.bad_rows == "reject" or not rows):
        raise DataError(bad_rows_message(spec.source, bad, len(rows), spec.bad_rows))
    if not rows:
        raise DataError(f"{spec.source}: no rows")
    if warn and bad:
        log.warning("skipping %d of %d rows of %s (badRows: skip), first %s", len(bad), read, spec.source, bad[0])
    if warn and numbers:
        log.warning(
            "%s: %d numeric question/solution values used as text, first at %s", spec.source, len(numbers), numbers[0]
        )
    train, held_out = rows, []
    if spec.eval_fraction > 0:
        order = list(range(len(rows)))
        random.Random(f"rlt-split-{spec.seed}").shuffle(order)
        n_eval = spec.held_out_rows(len(rows))
        eval_ids = set(order[:n_eval])
        held_out = [r for i, r in enumerate(rows) if i in eval_ids]
        train = [r for i, r in enumerate(rows) if i not in eval_ids]
    if spec.limit:
        train = train[: spec.limit]
    return LoadedData(
        train=train, eval=held_out, skipped=[f"{spec.source} {b}" for b in bad], read=read, numbers=numbers, where=where
    )


def is_reachable(spec: DatasetSpec) -> bool:
    """Whether the data can be checked here without a network: a built-in task or a local path."""
    return (
        spec.source.startswith("builtin:")
        or entry_exists(spec.source)
        or spec.source.startswith((".", "/", "~"))
        or Path(spec.source).suffix.lower() in FILE_KINDS
    )


def check_data(spec: DatasetSpec, fmt: PromptFormat, listed: bool = False) -> LoadedData:
    """Every row checked, none dropped silently: what `rlt validate` reports and `rlt run` checks before it starts.
    Raises DataError (one line) when the run would fail on its data; else returns what `badRows: skip` drops."""
    rows, bad, read, numbers, where = _scan(spec, fmt)
    if bad and (spec.bad_rows == "reject" or not rows):
        raise DataError(bad_rows_message(spec.source, bad, len(rows), spec.bad_rows, listed))
    if not rows:
        raise DataError(f"{spec.source}: no rows")
    return LoadedData(train=rows, skipped=[f"{spec.source} {b}" for b in bad], read=read, numbers=numbers, where=where)
