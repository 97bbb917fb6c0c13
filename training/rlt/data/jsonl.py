"""JSON Lines files of the run (distillation rows, per-question answers, problems, metrics.jsonl): one reader,
one writer, one appender, so every file is read and written the same way; and the camelCase JSON form of the
typed records written into report files."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic.alias_generators import to_camel

from rlt.contract.layout import atomic_write_text
from rlt.data.errors import DataError

if TYPE_CHECKING:  # typeshed's name for "an instance of any dataclass"; it exists only for the checker
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


def camel_json(record: DataclassInstance) -> dict[str, Any]:
    """A dataclass record as a JSON object: its fields in order, names in camelCase (the report files' style)."""
    return {to_camel(k): v for k, v in asdict(record).items()}


def from_camel_json(cls: type[R], doc: dict[str, Any]) -> R:
    """The record `camel_json` wrote; a missing key is a KeyError naming it."""
    return cls(**{f.name: doc[to_camel(f.name)] for f in fields(cls)})


def decoded_lines(data: bytes) -> Iterator[tuple[int, str | None, str | None]]:
    """(1-based line, text, None) per line of UTF-8 bytes split at '\\n' only (as editors count lines), or
    (line, None, problem) for a line that is not UTF-8, naming the byte, its column and its offset in the file."""
    offset = 0
    if data.startswith(codecs.BOM_UTF8):
        data, offset = data[len(codecs.BOM_UTF8) :], len(codecs.BOM_UTF8)
    for n, raw in enumerate(data.split(b"\n"), start=1):
        try:
            yield n, raw.decode("utf-8").removesuffix("\r"), None
        except UnicodeDecodeError as err:
            yield (
                n,
                None,
                f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}, "
                f"byte offset {offset + err.start})",
            )
        offset += len(raw) + 1


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every object of the file, blank lines skipped; a line that is not UTF-8 JSON is a DataError naming file and
    line."""
    rows = []
    for n, line, problem in decoded_lines(Path(path).read_bytes()):
        if problem is not None:
            raise DataError(f"{path} line {n}: {problem}")
        if line is not None and line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"{path} line {n}: not JSON ({err})") from None
    return rows


def dumps_line(row: Any) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> None:
    """The whole file at once, atomically (readers never see half of it)."""
    atomic_write_text(path, "".join(dumps_line(r) for r in rows))


def append_jsonl(path: str | Path, row: Any) -> None:
    """One more line (metrics.jsonl grows a step at a time)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(dumps_line(row))
