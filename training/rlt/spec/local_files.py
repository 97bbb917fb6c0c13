"""One guarded reader for the local files the door opens beside the run file (a model's config.json and tokenizer
files): each refusal is one line naming the spec field, for a missing file, a symlink loop, a device file or pipe, a
name too long for the filesystem, an absurd size or text that does not parse. Reads are bounded (rlt.spec.reader's
rules, the same the run file is read with)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from rlt.spec import reader

CONFIG_BYTES = 16 * 1024 * 1024  # a model's config.json is a few KiB; a multimodal one tens of KiB
TOKENIZER_BYTES = 256 * 1024 * 1024  # tokenizer.json of a 256k-token vocabulary is ~35 MB


class LocalFileError(ValueError):
    """A local file the door cannot use; str(err) is one 'field: why' line."""


def path_words(path: str | Path) -> str | None:
    """Why `path` cannot be opened, in words, or None (a symlink loop named as one)."""
    try:
        Path(path).stat()
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop (a link that leads back to itself)"
    return reader.path_problem(path, folder_ok=True)


def read_text(path: str | Path, field: str, limit: int) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes, or LocalFileError naming `field`."""
    problem = path_words(path)
    if problem is None and Path(path).is_dir():
        problem = "a folder, not a file"
    if problem is None:
        size = Path(path).stat().st_size
        if size > limit:
            problem = f"{size} bytes, more than a file of its kind holds (at most {limit})"
    if problem is not None:
        raise LocalFileError(f"{field}: {path}: {problem}")
    try:
        with Path(path).open("rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise LocalFileError(f"{field}: {path}: cannot read it ({err.strerror})") from None
    if len(data) > limit:
        raise LocalFileError(f"{field}: {path}: grew past {limit} bytes while read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LocalFileError(f"{field}: {path}: not UTF-8 text (byte offset {err.start})") from None


def read_json_object(path: str | Path, field: str, limit: int = CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a local file, or LocalFileError naming `field` (a truncated file says where it ends)."""
    text = read_text(path, field, limit)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        cut = " (the file ends early: truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise LocalFileError(f"{field}: {path}: not valid JSON at line {err.lineno}: {err.msg}{cut}") from None
    except RecursionError:
        raise LocalFileError(f"{field}: {path}: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise LocalFileError(f"{field}: {path}: holds a JSON {type(value).__name__}, not an object")
    return value


def entry_exists(path: str | Path) -> bool:
    """Whether anything is at `path` (a dangling link, a loop, a name too long to look up count as something: they
    are refused by name, not taken for a hub id)."""
    try:
        os.lstat(path)
    except OSError as err:
        return err.errno not in (errno.ENOENT, errno.ENOTDIR)
    return True


def entry_problem(path: str | Path, field: str, shown: str | None = None) -> str | None:
    """'field: path: why' for a local entry no reader can open (a loop, a device file, a pipe, a socket, a name too
    long for the filesystem); None for a readable file or folder and for a missing one (said by its reader)."""
    problem = path_words(path)
    if problem is None or problem == "file not found":
        return None
    return f"{field}: {shown if shown is not None else path}: {problem}"
