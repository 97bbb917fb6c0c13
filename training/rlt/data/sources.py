"""The one boundary around every data source (JSON Lines, JSON, CSV, Parquet, dataset folders, saved datasets, the
hub, built-in tasks): whatever a reader raises leaves here as one DataError line naming the file, the line or row
where known, and what was expected. Paths are asked what they are before anything opens them (a device, a pipe,
the filesystem root, a name too long for the filesystem), and nothing ambiguous is chosen silently (a key given
twice in a JSON row, a column given twice, two fields mapped to one column)."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlt.data import tasks
from rlt.data.errors import DataError
from rlt.data.jsonl import decoded_lines
from rlt.spec import reader
from rlt.spec.inputs import FILE_KINDS, MAX_BUILTIN_ROWS, DatasetSpec
from rlt.spec.local_files import path_words

_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes
_FOLDER_FILE_SUFFIXES = (*FILE_KINDS, ".arrow")  # a dataset folder may also hold saved Arrow shards


Where = Callable[[int], str]


class Unparsable:
    """A JSON-lines line that is not a JSON object (reported as that line's problem)."""

    def __init__(self, problem: str):
        self.problem = problem


def by_index(i: int) -> str:
    return f"row {i}"


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_source(spec: DatasetSpec) -> tuple[Iterable[Any], Where]:
    """The rows, and how to name row i in a message: 'line N' (1-based file line) for JSONL/CSV, 'row i' otherwise.
    Raises DataError only, in one line."""
    _check_columns(spec)
    try:
        return _read(spec)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - the boundary: any reader's failure is this source's problem, one line
        raise DataError(f"{spec.source}: cannot be read ({type(err).__name__}: {first_line(err)})") from None


def _check_columns(spec: DatasetSpec) -> None:
    """Two fields read from one column: the question would be its own answer, or the trace the solution."""
    cols = spec.columns
    named = {"question": cols.question, "solution": cols.solution, "reasoningTrace": cols.reasoning_trace}
    named["system"] = cols.system
    by_column: dict[str, list[str]] = {}
    for field, column in named.items():
        if column is not None:
            by_column.setdefault(column, []).append(field)
    for column, fields in by_column.items():
        if len(fields) > 1:
            raise DataError(
                f"spec.dataset.columns: {' and '.join(fields)} all name column {column!r}; each field needs a column "
                "of its own"
            )


def _read(spec: DatasetSpec) -> tuple[Iterable[Any], Where]:
    src = spec.source
    if src.startswith("builtin:"):
        # the spec's bound again, for a spec built without validation (model_construct): rows are held in memory
        if spec.size > MAX_BUILTIN_ROWS:
            raise DataError(
                f"spec.dataset.size: {spec.size} rows of {src} is over the {MAX_BUILTIN_ROWS} a built-in task "
                "generates (its rows are held in memory)"
            )
        return tasks.generate(src.removeprefix("builtin:"), spec.size, spec.seed), by_index
    path = Path(src).expanduser()  # `~/data.jsonl`, as a shell would read it
    problem = path_words(path)  # reader.path_problem's words, a symlink loop named as one
    if problem == "file not found":
        if src.startswith((".", "/", "~")) or path.suffix.lower() in FILE_KINDS:
            raise DataError(f"spec.dataset.source: file {src} does not exist")
        import datasets  # a hub dataset id

        with _quiet():
            return datasets.load_dataset(src, split=spec.split, revision=spec.revision), by_index
    if problem is not None:
        raise DataError(f"spec.dataset.source: {src}: {problem}")
    if path.resolve() == Path(path.anchor or "/"):
        raise DataError(f"spec.dataset.source: {src} is the filesystem root, not a dataset folder")
    if path.is_dir():
        return _read_folder(path, spec), by_index
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise DataError(
            f"spec.dataset.source: unsupported file type {path.suffix!r} (use .jsonl, .json, .parquet or .csv)"
        )
    if kind == "json":
        rows, lines = read_json_lines(path)
        return rows, ((lambda i: f"line {lines[i]}") if lines else by_index)
    if kind == "csv":
        starts = _csv_record_lines(path)
        ds = _load_file(path, "csv")
        if len(starts) != len(ds):  # records counted otherwise than pandas did: rows by index, never a wrong line
            return ds, by_index
        return ds, (lambda i: f"line {starts[i]}")
    _check_parquet(path)
    return _load_file(path, "parquet"), by_index


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bar, and a reader's failure said once (by us), not logged as well."""
    import datasets

    verbosity = datasets.utils.logging.get_verbosity()
    bars = datasets.utils.are_progress_bars_disabled()
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if not bars:
            datasets.enable_progress_bars()


# ---------------------------------------------------------------------------------------------- folders


def _data_files(folder: Path) -> list[Path]:
    """The data files `datasets` reads from a folder: not hidden, not under a hidden or `__` folder (editor and
    notebook copies such as .ipynb_checkpoints/)."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in _FOLDER_FILE_SUFFIXES
        and not any(part.startswith((".", "__")) for part in p.relative_to(folder).parts[:-1])
        and not p.name.startswith(".")
    )
    for path in files:  # `datasets` would open a device or a pipe named like a data file, and never return
        problem = reader.path_problem(path, folder_ok=True)
        if problem is not None and not path.is_dir():
            raise DataError(f"{path}: {problem}")
    return [p for p in files if p.is_file()]


def _read_folder(folder: Path, spec: DatasetSpec) -> Any:
    import datasets

    src = spec.source
    if any((folder / marker).exists() for marker in _SAVED_MARKERS):
        try:
            ds = datasets.load_from_disk(str(folder))
        except Exception as err:  # noqa: BLE001 - what is broken, in one line
            raise DataError(f"{src}: not a readable saved dataset (save_to_disk): {first_line(err)}") from None
        return _split(ds, spec) if isinstance(ds, datasets.DatasetDict) else ds
    files = _data_files(folder)
    if not files:
        raise DataError(
            f"spec.dataset.source: folder {src} holds no data files (.jsonl, .json, .parquet, .csv or a saved dataset)"
        )
    kinds = sorted({FILE_KINDS.get(p.suffix.lower(), p.suffix.lower()) for p in files})
    if len(kinds) > 1:  # `datasets` reads a folder as one format: the files of the others would be dropped
        counts = ", ".join(
            f"{sum(FILE_KINDS.get(p.suffix.lower(), p.suffix.lower()) == k for p in files)} {k}" for k in kinds
        )
        raise DataError(
            f"spec.dataset.source: folder {src} mixes data formats ({counts} files); a folder is read as one "
            "format, so the others' rows would be lost: keep one format per folder"
        )
    _same_columns(folder, files)
    for path in files:
        _check_file(path)
    try:
        with _quiet():
            _every_file_in_a_split(folder, files, src)
            options = _csv_as_text(files[0]) if kinds == ["csv"] else {}  # one table: the same columns (checked)
            return _split(datasets.load_dataset(str(folder), **options), spec)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001
        raise DataError(f"{src}: cannot be read as a dataset folder ({_cause(err)})") from None


def _every_file_in_a_split(folder: Path, files: list[Path], src: str) -> None:
    """`datasets` reads a folder by file names: once one file is named for a split (train.jsonl, test/…), it reads
    only the files named for one and ignores the rest without a word. Refuse that, naming the files left out."""
    import datasets

    by_split = datasets.load_dataset_builder(str(folder)).config.data_files or {}
    used = {Path(str(f)).resolve() for split_files in by_split.values() for f in split_files}
    left = [p for p in files if p.resolve() not in used]
    if left:
        names = ", ".join(str(p.relative_to(folder)) for p in left[:3]) + (
            f" and {len(left) - 3} more" if len(left) > 3 else ""
        )
        splits = ", ".join(f"{k}: {len(v)} files" for k, v in sorted(by_split.items(), key=lambda kv: str(kv[0])))
        raise DataError(
            f"spec.dataset.source: folder {src}: `datasets` reads only the files named for a split ({splits}) and "
            f"would ignore {names}: name every file for its split (train…, test…) or move the others out"
        )


def _check_file(path: Path) -> None:
    """A file of a folder held to a single file's rules (`datasets` reads it): its first bad line, named."""
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind == "json":
        rows, lines = read_json_lines(path)
        bad = next(((n, r) for n, r in zip(lines, rows, strict=True) if isinstance(r, Unparsable)), None)
        if bad:
            raise DataError(f"{path} line {bad[0]}: {bad[1].problem}")
    elif kind == "csv":
        _csv_record_lines(path)
    elif kind == "parquet":
        _check_parquet(path, rows_needed=False)  # one empty file of several is not an empty data set


def _split(ds: Any, spec: DatasetSpec) -> Any:
    if spec.split not in ds:
        raise DataError(
            f"spec.dataset.split: {spec.source} has no split {spec.split!r} (splits: {', '.join(sorted(ds))})"
        )
    return ds[spec.split]


def _columns(path: Path) -> list[str] | None:
    """The columns of a data file as its first row or header says, None when that cannot be told cheaply."""
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    if kind not in ("json", "csv"):
        return None
    with path.open("rb") as f:
        head = f.readline(1 << 20).decode("utf-8-sig", "replace")
    if kind == "csv":
        return next(csv.reader(io.StringIO(head)), [])
    try:
        row = json.loads(head)
    except json.JSONDecodeError:
        return None
    return list(row) if isinstance(row, dict) else None


def _same_columns(folder: Path, files: list[Path]) -> None:
    """The files of one folder make one table: a file with other columns is named, with the first file's."""
    first: tuple[Path, list[str]] | None = None
    for path in files:
        columns = _columns(path)
        if columns is None:
            continue
        if first is None:
            first = (path, columns)
        elif sorted(columns) != sorted(first[1]):
            raise DataError(
                f"{folder}: its files have different columns ({first[0].relative_to(folder)}: "
                f"{', '.join(first[1])}; {path.relative_to(folder)}: {', '.join(columns)}); one folder is one table"
            )


def _cause(err: BaseException) -> str:
    cause: BaseException | None = err
    while cause is not None and type(cause).__name__ == "DatasetGenerationError":
        cause = cause.__cause__ or cause.__context__  # the reader's error, which says the line
    return first_line(cause or err)


# ---------------------------------------------------------------------------------------------- files


def _load_file(path: Path, kind: str) -> Any:
    import datasets

    options = _csv_as_text(path) if kind == "csv" else {}
    try:
        with _quiet():
            return datasets.load_dataset(kind, data_files=str(path), split="train", **options)
    except Exception as err:  # noqa: BLE001 - any reader failure is a problem of this file, said in one line
        raise DataError(f"{path}: cannot be read as {path.suffix} ({_read_error(path, kind, err)})") from None


def _csv_as_text(path: Path) -> dict[str, Any]:
    """`datasets` options that read every CSV cell as the text it is: pandas would type a column (`41` beside an empty
    cell becomes `41.0`, `007` becomes `7`, `True` a boolean, `NA` or `None` a missing value). An empty cell is missing."""
    import datasets

    columns = [name or f"Unnamed: {i}" for i, name in enumerate(_columns(path) or [])]  # pandas' name of a blank one
    features = datasets.Features({name: datasets.Value("string") for name in columns}) if columns else None
    return {"features": features, "keep_default_na": False, "na_values": [""]}


def _csv_record_lines(path: Path) -> list[int]:
    """The file line (1-based) where each CSV record after the header starts: a quoted cell may hold newlines, so
    record i is not line i + 2. Also refuses a header that names a column twice (datasets would rename one)."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        return []  # the reader's error names the line: _read_error
    records = csv.reader(io.StringIO(text, newline=""))
    try:
        return _record_starts(path, records)
    except csv.Error:  # a cell past the csv module's size limit (pandas has none): rows are named by index
        return []


def _record_starts(path: Path, records: Any) -> list[int]:
    starts: list[int] = []
    header: list[str] | None = None
    end = 0
    for record in records:
        start, end = end + 1, records.line_num
        if not record:  # a blank line: pandas skips it too
            continue
        if header is None:
            header = record
            seen = set()
            for name in header:
                if name in seen:
                    raise DataError(f"{path} line {start}: column {name!r} is given twice in the header")
                seen.add(name)
            continue
        starts.append(start)
    return starts


def _check_parquet(path: Path, rows_needed: bool = True) -> None:
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        raise DataError(f"{path}: an empty file (0 bytes), not a Parquet file")
    try:
        meta = pq.read_metadata(path)
    except Exception as err:  # noqa: BLE001
        raise DataError(f"{path}: cannot be read as .parquet (not a Parquet file: {first_line(err)})") from None
    names = meta.schema.to_arrow_schema().names
    if meta.num_rows == 0 and rows_needed:
        raise DataError(f"{path}: no rows (a Parquet file with the columns {', '.join(names)} and no rows)")
    seen = set()
    for name in names:
        if name in seen:
            raise DataError(f"{path}: column {name!r} is given twice (a Parquet schema may repeat a name)")
        seen.add(name)


def _read_error(path: Path, kind: str, err: BaseException) -> str:
    """Why `datasets` could not read a CSV or Parquet file, naming the line (CSV) or row group (Parquet): its
    own message only says "An error occurred while generating the dataset"."""
    if kind == "csv":
        lines = list(decoded_lines(path.read_bytes()))
        bad = next(((n, p) for n, _, p in lines if p), None)
        if bad:
            return f"line {bad[0]}: {bad[1]}"
        if sum(1 for _, text, _ in lines if text and text.strip()) <= 1:
            return "a header line and no rows" if any(text and text.strip() for _, text, _ in lines) else "empty"
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - the reader's own words, in one line
            return f"not a Parquet file: {first_line(exc)}"
        for group in range(pf.num_row_groups):
            try:
                pf.read_row_group(group)
            except Exception as exc:  # noqa: BLE001
                return f"row group {group} of {pf.num_row_groups}: {first_line(exc)}"
    return _cause(err)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:
            raise ValueError(f"key {key!r} is given twice")
        row[key] = value
    return row


def read_json_lines(path: Path) -> tuple[list[Any], list[int]]:
    """Rows of a JSONL file (or a JSON array) with the 1-based line of each row.

    Read here rather than by `datasets`: it gives line numbers, reports a broken line (not JSON, not UTF-8, a key
    given twice, beyond the strict reader's bounds: rlt.spec.reader) as that row's problem instead of failing the
    file (so badRows: skip applies to it), and keeps a column whose values mix numbers and text (Arrow refuses to
    type such a column)."""
    data = path.read_bytes()
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith((b"[", b"{")):
        whole = _whole_json(path, data, head)
        if whole is not None:
            return whole, []
    rows: list[Any] = []
    lines: list[int] = []
    for n, line, problem in decoded_lines(data):
        if problem is not None:
            rows.append(Unparsable(problem))
            lines.append(n)
            continue
        if line is None or not line.strip():
            continue
        value: Any
        try:
            value = reader.load_json(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            value = Unparsable(f"not valid JSON ({err.msg} at column {err.colno})")
        except ValueError as err:
            value = Unparsable(str(err))
        if not isinstance(value, (dict, Unparsable)):
            value = Unparsable(f"expected a JSON object, got {type(value).__name__}")
        rows.append(value)
        lines.append(n)
    return rows, lines


def _whole_json(path: Path, data: bytes, head: bytes) -> list[Any] | None:
    """The rows of a file that is one JSON list; None when it is JSON Lines after all."""
    try:
        whole = reader.load_json(data.decode("utf-8-sig"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as err:
        if head.startswith(b"["):
            raise DataError(
                f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at byte offset {err.start})"
            ) from None
        return None
    except json.JSONDecodeError as err:
        # "Extra data": one whole value, then more: JSON Lines whose first row is a list (that row's problem)
        if head.startswith(b"[") and err.msg != "Extra data":
            raise DataError(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
        return None
    except ValueError as err:  # valid JSON beyond the bounds, or a key given twice
        if head.startswith(b"["):
            raise DataError(f"{path}: {err}") from None
        return None
    if isinstance(whole, list):
        return whole
    if isinstance(whole, dict) and b"\n" in data.strip():  # one object over several lines: not JSON Lines
        lists = [k for k, v in whole.items() if isinstance(v, list)]
        hint = f"; are the rows its list {lists[0]!r}? write them one object per line" if lists else ""
        raise DataError(
            f"{path}: one JSON object over several lines (keys: {', '.join(list(whole)[:5])}), not one "
            f"row per line (JSON Lines) or a JSON list of rows{hint}"
        )
    return None
