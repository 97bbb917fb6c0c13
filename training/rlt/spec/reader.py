"""The one strict reader of what users hand rlt: run and format files (YAML) and data rows (JSON).

What it reads is what the API server would decode, or refused in one line naming the field and the line — never a
traceback, never a silent choice:
- YAML 1.2 (core schema): `1e-5` is a number, `yes`/`on` are text. A plain scalar that kubectl's YAML 1.1 reader
  reads otherwise (yes/no/on/off/y/n, 0777, 0b101, 1_000, the merge key `<<`) is refused: quote it or write it
  unambiguously, so the file means one thing to `rlt validate` and to `kubectl apply`.
- A mapping key given twice is refused (the API server's strict decoding refuses it; PyYAML keeps the last), and so
  are two plain keys kubectl sends as one (`0x1` and `1`, `true` and `TRUE`: rlt.spec.kubectl_keys), a plain key it
  sends as another text, and a null key.
- At most MAX_BYTES of text, MAX_DOCUMENTS documents and MAX_VALUES values (aliases expanded), each bound applied
  while reading, so reading stops at the bound; time linear in the text (PyYAML's scanner and parser are).
- Integers within int64, numbers finite (JSON, and so the API server, has no infinity or NaN), text without lone
  UTF-16 surrogates (they cannot be encoded, and break tokenizers), nesting at most MAX_DEPTH deep, and no alias inside the node it names.
"""

from __future__ import annotations

import json
import math
import re
import stat
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, cast

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from rlt.spec.kubectl_keys import NullKey, kubectl_key

MAX_DEPTH = 64  # the deepest legitimate spec structure (affinity terms) is about 10
# Bounds applied while reading, each tripping the moment it is passed (a run file is a few KiB, a few hundred values,
# one document; the operator hands a run to its pods in a ConfigMap, which holds at most 1 MiB):
MAX_BYTES = 4 * 1024 * 1024  # of text, checked before parsing
MAX_DOCUMENTS = 1_000  # of one text, counted as each document starts
MAX_VALUES = 100_000  # of one text, aliases expanded, counted as each value is composed
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class InputError(ValueError):
    """One problem of a file: `where` (a field path, a row) and `line` (1-based, None when unknown)."""

    def __init__(self, where: str, line: int | None, problem: str):
        self.where, self.line, self.problem = where, line, problem
        super().__init__(f"{where}: " + (f"line {line}: " if line else "") + problem)


# ------------------------------------------------------------------------------------------------- scalars

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
# Plain scalars YAML 1.1 readers (kubectl's go-yaml v2) resolve otherwise than YAML 1.2.
_YAML11_BOOL = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)$")
# Octal and binary, and decimal or hex with '_' (checked apart: `[0-9_]*_[0-9_]*` backtracks quadratically on a long
# run of digits and underscores that does not match, and a run file's scalar may be megabytes long).
_YAML11_INT = re.compile(r"(?:[-+]?0[0-9_]+|[-+]?0b[01_]+)")
_YAML11_UNDERSCORED = re.compile(r"(?:[-+]?[0-9][0-9_]*|[-+]?0x[0-9a-fA-F_]*)")


def _yaml11_int(value: str) -> bool:
    return bool(_YAML11_INT.fullmatch(value) or ("_" in value and _YAML11_UNDERSCORED.fullmatch(value)))


def _ambiguity(value: str) -> str | None:
    if _YAML11_BOOL.match(value):
        return f"{value!r} is a boolean to YAML 1.1 readers (kubectl) and text to YAML 1.2: write true or false, or quote it"
    if _yaml11_int(value):
        return f"{value!r} is read as a different number by YAML 1.1 readers (kubectl, octal or binary or with '_'): write it in decimal, or quote it"
    return None


def int_problem(value: int) -> str | None:
    if not INT64_MIN <= value <= INT64_MAX:
        return f"{_short(str(value))} is outside the 64-bit integer range"
    return None


def _short(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}…({len(text)} characters)"


def _int_text(text: str) -> int:
    """A decimal, 0o or 0x integer, its size checked before Python converts it (5,000 digits would take a while and
    raise past 4,300)."""
    if len(text.lstrip("+-")) > 24:
        raise ValueError(f"{_short(text)} is outside the 64-bit integer range")
    value = int(text, 0) if text.lstrip("+-").startswith(("0o", "0x")) else int(text, 10)
    problem = int_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# kubectl turns YAML into JSON through Go's float64: a whole number below 1e21 is written as an integer (8.0 and 1e3
# reach the API server as 8 and 1000, accepted by integer fields), larger ones in exponent form (a float).
_GO_INTEGER_BOUND = 1e21


def _number_text(text: str) -> float | int:
    """A YAML float as kubectl sends it: an int when whole and below 1e21, else the float."""
    value = _float_text(text)
    if value.is_integer() and abs(value) < _GO_INTEGER_BOUND:
        whole = int(value)
        if int_problem(whole):  # the API server reads it as an int64, the stages as an int: neither holds it
            raise ValueError(f"{text} is {whole}, outside the 64-bit integer range")
        return whole
    return value


def _float_text(text: str) -> float:
    value = float(
        text.replace(".inf", "inf")
        .replace(".Inf", "inf")
        .replace(".INF", "inf")
        .replace(".nan", "nan")
        .replace(".NaN", "nan")
        .replace(".NAN", "nan")
    )
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number (JSON, and so the API server, has no infinity or NaN)")
    return value


# ------------------------------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core tag resolution and the bounds above checked as nodes are composed
    (where the field path and the line are known)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}

    def __init__(self, stream: str):
        super().__init__(stream)
        self._path: list[str] = []
        self._open: set[str] = set()  # anchors whose node is being composed
        self._sizes: dict[int, int] = {}  # values of each composed node, aliases expanded
        self._values = 0  # values composed so far in the whole text, aliases expanded

    def _count(self, mark: Any, values: int) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            self._fail(mark, f"the text holds more than {MAX_VALUES} values (MAX_VALUES, aliases expanded)")

    def _where(self) -> str:
        parts = self._path if len(self._path) <= 12 else [*self._path[:6], f"…({len(self._path)} levels)"]
        return ".".join(parts) or "<root>"

    def _fail(self, mark: Any, problem: str) -> NoReturn:
        raise InputError(self._where(), mark.line + 1 if mark is not None else None, problem)

    def _peek(self) -> yaml.Event:
        # types-PyYAML leaves Parser.peek_event unannotated; an event is there whenever a node is being composed
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        return event

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        pushed = parent is not None and index is not None  # a mapping key (index None) has its mapping's path
        if pushed:
            self._path.append(str(index.value) if isinstance(index, ScalarNode) else str(index))
        event = self._peek()
        if len(self._path) > MAX_DEPTH:
            self._fail(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        anchor = getattr(event, "anchor", None)
        if isinstance(event, yaml.AliasEvent):
            if anchor in self._open:
                self._fail(event.start_mark, f"alias *{anchor} is inside the node &{anchor} it names (a loop)")
            if anchor in self.anchors:  # an unknown alias is PyYAML's error, said below
                self._count(event.start_mark, self._sizes[id(self.anchors[anchor])])
        else:
            self._count(event.start_mark, 1)  # before its children: a list never closed trips at the bound
            if anchor is not None:
                self._open.add(anchor)
        # the stub says Node | None, but PyYAML composes a node for every event (None is get_node's stream end)
        node = cast(Node, super().compose_node(parent, index))
        if not isinstance(event, yaml.AliasEvent):
            self._open.discard(anchor)
            self._check(node)
        if pushed:
            self._path.pop()
        return node

    def _check(self, node: Node) -> None:
        if isinstance(node, ScalarNode):
            self._sizes[id(node)] = 1
            if _SURROGATE.search(node.value):
                self._fail(node.start_mark, "holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text")
            if node.style is None:
                problem = _ambiguity(node.value)
                if problem:
                    self._fail(node.start_mark, problem)
            try:
                if node.tag == "tag:yaml.org,2002:int":
                    _int_text(node.value)
                elif node.tag == "tag:yaml.org,2002:float":
                    _number_text(node.value)  # a whole float is an integer to kubectl: its range too
            except ValueError as err:
                self._fail(node.start_mark, str(err))
        elif isinstance(node, SequenceNode):
            self._sizes[id(node)] = 1 + sum(self._sizes[id(v)] for v in node.value)
        elif isinstance(node, MappingNode):
            self._sizes[id(node)] = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
            seen: dict[str, int] = {}
            for key, _ in node.value:
                if not isinstance(key, ScalarNode):
                    self._fail(key.start_mark, "a mapping key must be a plain value, not a list or a mapping")
                if key.value in seen:
                    self._fail(
                        key.start_mark,
                        f"key {key.value!r} is given twice (lines {seen[key.value]} and {key.start_mark.line + 1})",
                    )
                seen[key.value] = key.start_mark.line + 1
            self._check_kubectl_keys(node)

    def _check_kubectl_keys(self, node: MappingNode) -> None:
        """Each plain key as kubectl sends it (rlt.spec.kubectl_keys): two keys that arrive as one are refused naming
        both (kubectl would keep the last without a word), and so is a key that arrives as another text."""
        sent: list[tuple[ScalarNode, str]] = []
        for key, _ in node.value:
            if not isinstance(key, ScalarNode) or key.tag == _MERGE:
                continue
            try:
                sent.append((key, key.value if key.style is not None else kubectl_key(key.value)))
            except NullKey:
                self._fail(key.start_mark, f"key {key.value!r} is a null key, which kubectl refuses: quote it")
        first: dict[str, ScalarNode] = {}
        for key, text in sent:
            if text in first:
                a = first[text]
                self._fail(
                    key.start_mark,
                    f"keys {a.value!r} (line {a.start_mark.line + 1}) and {key.value!r} (line {key.start_mark.line + 1})"
                    f" are one key to kubectl, {text!r} (YAML 1.1 reads a plain number or boolean key as its value): "
                    "it would keep only the last; give one of them",
                )
            first[text] = key
        for key, text in sent:
            if text != key.value:
                self._fail(
                    key.start_mark,
                    f"key {key.value!r} reaches the API server as {text!r} (kubectl's YAML 1.1 reads the plain key as "
                    f"a number or boolean): write {text!r}, or quote the key",
                )


def _text_keys(loader: _Loader, node: MappingNode) -> dict[Any, Any]:
    # A mapping key is text, as the API server's YAML-to-JSON conversion makes it: `1e5:` or `true:` is the key
    # "1e5" or "true" (an unknown field named like any other), not a number or a bool that no field can match.
    for key, _ in node.value:
        if isinstance(key, ScalarNode) and key.tag != _MERGE:
            key.tag = "tag:yaml.org,2002:str"
    return loader.construct_mapping(node)  # flattens merge keys (`<<: *defaults`); the mapping's own keys win


_MERGE = "tag:yaml.org,2002:merge"


def _resolve(tag: str, regexp: re.Pattern[str], first: list[str]) -> None:
    _Loader.add_implicit_resolver(tag, regexp, first)  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML


_Loader.add_constructor("tag:yaml.org,2002:map", _text_keys)
_resolve("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])
_resolve("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
_resolve("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_resolve("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
_Loader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: _int_text(node.value))
_Loader.add_constructor("tag:yaml.org,2002:float", lambda loader, node: _number_text(node.value))
# Merge keys are YAML 1.1, not 1.2, but kubectl (go-yaml) applies them, so a run file that uses them is valid.
_resolve(_MERGE, re.compile(r"^<<$"), ["<"])
_Loader.add_constructor("tag:yaml.org,2002:bool", lambda loader, node: node.value.lower() == "true")


def load_yaml(text: str) -> list[Any]:
    """Every document of a YAML text (empty ones dropped). Raises InputError (one line, with the field path and
    the line) or yaml.YAMLError (a syntax error, with its line)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise InputError("<file>", None, f"{size} bytes, over {MAX_BYTES} bytes (MAX_BYTES); a run file is a few KiB")
    loader = _Loader(text)
    try:
        docs: list[Any] = []
        while loader.check_node():
            if len(docs) == MAX_DOCUMENTS:
                mark = loader._peek().start_mark
                raise InputError(
                    "<file>", mark.line + 1, f"the text holds more than {MAX_DOCUMENTS} YAML documents (MAX_DOCUMENTS)"
                )
            node = loader.get_node()
            # construct_document and dispose are unannotated in types-PyYAML
            docs.append(None if node is None else loader.construct_document(node))  # type: ignore[no-untyped-call]
        return [d for d in docs if d is not None]
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


# ------------------------------------------------------------------------------------------------- files

_NOT_FILES = (
    (stat.S_ISDIR, "a folder, not a file"),
    (stat.S_ISCHR, "a device file, not a file with contents"),
    (stat.S_ISBLK, "a device file, not a file with contents"),
    (stat.S_ISFIFO, "a named pipe, not a file (reading it would wait for a writer)"),
    (stat.S_ISSOCK, "a socket, not a file"),
)


def path_problem(path: str | Path, folder_ok: bool = False) -> str | None:
    """Why `path` cannot be read as a file, in words (missing, a folder, a device file, a pipe, a name too long for
    the filesystem, not allowed), or None. Asked before opening: a device such as /dev/zero never ends and opening a
    pipe blocks."""
    try:
        mode = Path(path).stat().st_mode
    except FileNotFoundError:
        return "file not found"
    except OSError as err:
        if err.errno == 36:  # ENAMETOOLONG
            longest = max(len(part.encode()) for part in Path(path).parts)
            return f"the path is too long for the filesystem ({err.strerror}; its longest name is {longest} bytes)"
        return f"cannot read the file: {err.strerror}"
    for test, words in _NOT_FILES:
        if test(mode) and not (folder_ok and stat.S_ISDIR(mode)):
            return words
    return None


def _read_bounded(path: str | Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file; InputError('<file>', ...) for anything else or for more."""
    problem = path_problem(path)
    if problem:
        raise InputError("<file>", None, problem)
    try:
        with Path(path).open("rb") as f:
            return _at_most(f, limit)
    except OSError as err:
        raise InputError("<file>", None, f"cannot read the file: {err.strerror}") from None


def _at_most(stream: BinaryIO, limit: int) -> bytes:
    """What `stream` holds, refused (one line) when it holds more than `limit` bytes."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputError("<file>", None, f"over {limit} bytes (MAX_BYTES); a run file is a few KiB")
    return data


def read_file(path: str | Path) -> str:
    """The UTF-8 text of a run or format file, at most MAX_BYTES of it read (UnicodeDecodeError when not UTF-8)."""
    return _read_bounded(path, MAX_BYTES).decode("utf-8")


_stdin_text: list[str] = []  # standard input can be read once; every later read of `-` gets the same text


def read_stdin() -> str:
    """The UTF-8 text on standard input (`rlt validate -`, as kubectl's `-f -`), at most MAX_BYTES, read once."""
    import sys

    if not _stdin_text:
        if sys.stdin is None or sys.stdin.closed:
            raise InputError(
                "<file>", None, "standard input is closed: pipe the run file in (`rlt validate - < run.yaml`)"
            )
        if sys.stdin.isatty():  # kubectl waits silently; say what is awaited
            print("reading the run file from standard input (end it with Ctrl-D)", file=sys.stderr)
        _stdin_text.append(_at_most(sys.stdin.buffer, MAX_BYTES).decode("utf-8"))
    return _stdin_text[0]


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting every string this reader would read as something else (PyYAML quotes by YAML
    1.1's rules: `y`, `1e5` or `0o7` would come back as a refusal, a float or an int)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    plain_elsewhere = any(r.match(value) for r in (_NULL, _BOOL, _INT, _FLOAT)) or _ambiguity(value) is not None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'" if plain_elsewhere else None)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """YAML that load_yaml reads back as `data` (the run the operator hands its pods)."""
    text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
    return text


def yaml_error_line(err: yaml.YAMLError) -> str:
    """A PyYAML syntax error in one line: 'line 3: mapping values are not allowed here'."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    if isinstance(err, ComposerError) and getattr(err, "context", None):
        problem = f"{err.context}; {problem}"
    return (f"line {mark.line + 1}: " if mark is not None else "") + str(problem)


# ------------------------------------------------------------------------------------------------- JSON rows


def _json_int(text: str) -> int:
    return _int_text(text)


def _json_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows (no NaN or infinity)")


def value_problem(value: Any) -> str | None:
    """Why a decoded JSON value breaks the bounds (depth, int64, finite, no lone surrogates), as 'path: problem';
    iterative, so no depth can overflow the stack."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    count = 0
    while stack:
        v, where, depth = stack.pop()
        count += 1
        at = f"{where}: " if where else ""
        if depth > MAX_DEPTH:
            return f"{at}nested deeper than {MAX_DEPTH} levels"
        if count > MAX_VALUES:
            return f"more than {MAX_VALUES} values"
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            problem = int_problem(v)
            if problem:
                return at + problem
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{at}{v} is not a finite number"
        elif isinstance(v, str) and _SURROGATE.search(v):
            return f"{at}holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
        elif isinstance(v, dict):
            for k, sub in v.items():
                if isinstance(k, str) and _SURROGATE.search(k):
                    return f"{at}a key holds a lone UTF-16 surrogate (\\ud800-\\udfff)"
                stack.append((sub, f"{where}.{k}" if where else str(k), depth + 1))
        elif isinstance(v, list):
            stack += [(sub, f"{where}[{i}]", depth + 1) for i, sub in enumerate(v)]
    return None


def load_json(text: str, object_pairs_hook: Any = None) -> Any:
    """One JSON value within the bounds, or ValueError saying what breaks them (a JSONDecodeError for bad syntax);
    `object_pairs_hook` as json.loads takes it (the data readers refuse a key given twice with it)."""
    try:
        value = json.loads(
            text, parse_int=_json_int, parse_constant=_json_constant, object_pairs_hook=object_pairs_hook
        )
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    problem = value_problem(value)
    if problem:
        raise ValueError(problem)
    return value
