"""Loading RLTRun YAML and reporting every problem as one 'path.to.field: message' line."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rlt.spec import reader
from rlt.spec.inputs import DATA_SUFFIXES
from rlt.spec.run import RLTRun, RLTRunSpec

_NAMED_MSG = re.compile(r"^([A-Za-z][A-Za-z0-9]*(?:\.(?:[A-Za-z][A-Za-z0-9]*|[0-9]+))*): ")  # list items: finalizers.1


class SpecError(ValueError):
    """An invalid RLTRun; `problems` lists 'path.to.field: message' lines."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid RLTRun\n" + "\n".join(f"  {p}" for p in problems))


def _known_fields(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str] | None:
    """The YAML names of the fields of the object at `loc` (a pydantic error location), for did-you-mean."""
    import typing

    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return None
        ann = field.annotation
        models = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = models[0] if models else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    return [f.alias or n for n, f in model.model_fields.items()]


def _did_you_mean(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    import difflib

    known = _known_fields(root, loc[:-1]) or []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if not close:  # case slips (batchsize) and snake_case (batch_size) are close too
        lowered = {k.lower().replace("_", ""): k for k in known}
        close = (
            [lowered[str(loc[-1]).lower().replace("_", "")]] if str(loc[-1]).lower().replace("_", "") in lowered else []
        )
    return f" (did you mean {close[0]}?)" if close else ""


def format_validation_error(err: ValidationError, prefix: str = "", root: type[BaseModel] | None = None) -> list[str]:
    """pydantic errors → 'spec.stages.rl.numGenerations: Input should be greater than 1'."""
    lines = []
    for e in err.errors():
        parts = [str(p) for p in e["loc"] if p not in ("function-after",)]
        msg = e["msg"].removeprefix("Value error, ")
        if parts[-2:-1] and parts[-1] == "[key]":  # a map's key: name the map, then the key
            msg = f"key {msg}" if msg.startswith(repr(parts[-2])) else f"key {parts[-2]!r}: {msg}"
            parts = parts[:-2]
        base = ".".join(parts)
        base = f"{prefix}.{base}" if prefix and base else (prefix or base)
        # A cross-field validator says "field: problem", one line per broken rule; fold each field into the path.
        for raw in msg.split("\n") if e["type"] == "value_error" else [msg]:
            loc, one = base, raw
            named = _NAMED_MSG.match(raw)
            if e["type"] == "value_error" and named:
                loc = f"{loc}.{named.group(1)}" if loc else named.group(1)
                one = raw[named.end() :]
            if (
                e["type"] == "string_type"
                and isinstance(e.get("input"), (int, float))
                and not isinstance(e["input"], bool)
            ):
                one += f" (a number here is text: quote it, '{e['input']}')"
            if e["type"] == "extra_forbidden":
                one = "unknown field" + (_did_you_mean(root, tuple(e["loc"])) if root is not None else "")
            lines.append(f"{loc or '<root>'}: {one}")
    return lines


def _without(doc: Any, locs: list[tuple[Any, ...]]) -> Any:
    """The document without the values at `locs` (pydantic error locations; list items removed last first)."""
    import copy

    doc = copy.deepcopy(doc)
    for loc in sorted(locs, key=lambda loc: [str(p) for p in loc], reverse=True):
        node = doc
        for part in loc[:-1]:
            node = (
                node[part]
                if isinstance(node, dict)
                and part in node
                or isinstance(node, list)
                and isinstance(part, int)
                and part < len(node)
                else None
            )
        if isinstance(node, dict):
            node.pop(loc[-1], None)
        elif isinstance(node, list) and isinstance(loc[-1], int) and loc[-1] < len(node):
            node.pop(loc[-1])
    return doc


def _about_dropped(line: str, gone: set[str]) -> bool:
    """Whether a problem found after dropping the fields `gone` is about them rather than the file: it is at (or
    inside) a dropped field, or it names one (an invalid fieldRef, dropped, left its valueFrom with no source:
    "give exactly one of ..., fieldRef, ..." would be false of the file; a rule across fields, "batchSize must be
    divisible by numGenerations (64)", would be about the default that took the dropped value's place). A true
    problem hidden so is reported once the dropped field is mended."""
    where, _, message = line.partition(": ")
    for g in gone:
        if where == g or where.startswith(g + "."):
            return True
        name = g.rpartition(".")[2]
        if not name.isdigit() and re.search(rf"\b{re.escape(name)}\b", message):
            return True
    return False


_Model = TypeVar("_Model", bound=BaseModel)


def _validate_all(model: type[_Model], doc: Any, prefix: str = "") -> tuple[_Model | None, list[str]]:
    """Validate, reporting every problem in one pass: pydantic skips a model's cross-field checks while one of its
    fields is invalid or unknown, so those are reported, dropped, and the rest validated again. A problem found
    then at (or inside) a dropped field is left out: it would be about the default that took its place.

    By the YAML (camelCase) names only: the API server knows no other, so a snake_case key that Python code may use
    would pass here and then be refused, or silently dropped, by the cluster."""
    try:
        return model.model_validate(doc, by_alias=True, by_name=False), []
    except ValidationError as err:
        problems = format_validation_error(err, prefix, model)
        dropped = [tuple(e["loc"]) for e in err.errors() if e["loc"]]
    for _ in range(3):  # each round can only reveal checks hidden by the previous round's fields
        if not dropped:
            break
        doc = _without(doc, dropped)
        try:
            model.model_validate(doc, by_alias=True, by_name=False)
            break
        except ValidationError as err:
            gone = {".".join(filter(None, [prefix, *map(str, loc)])) for loc in dropped}
            for line in format_validation_error(err, prefix, model):
                if line not in problems and not _about_dropped(line, gone):
                    problems.append(line)
            dropped = [tuple(e["loc"]) for e in err.errors() if e["loc"] and e["type"] != "missing"]
    return None, problems


def parse_run(doc: Any, source: str = "<input>") -> RLTRun:
    if not isinstance(doc, dict):
        raise SpecError(source, [f"<root>: expected a mapping (an RLTRun object), got {type(doc).__name__}"])
    run, problems = _validate_all(RLTRun, doc)
    if problems or run is None:
        raise SpecError(source, problems)
    return run


def parse_spec(spec: Any, source: str = "<spec>") -> RLTRunSpec:
    """Validate only `.spec` (what the operator receives from Kopf)."""
    parsed, problems = _validate_all(RLTRunSpec, spec, "spec")
    if problems or parsed is None:
        raise SpecError(source, problems)
    return parsed


ENV_SOURCE = "env:"  # `--config env:NAME`: the YAML is the value of environment variable NAME
STDIN_SOURCE = "-"  # `rlt validate -`: the YAML on standard input (relative paths in it: from the working folder)


def _read_source(path: Path) -> str:
    """The text of a file, or of an environment variable for `env:NAME` (the operator's trainer pods get the spec
    their gang was created with that way: a Job's pod template is immutable, a mounted ConfigMap is not)."""
    text = str(path)
    if text == STDIN_SOURCE:
        return reader.read_stdin()
    if text.startswith(ENV_SOURCE):
        value = os.environ.get(text[len(ENV_SOURCE) :])
        if value is None:
            raise SpecError(text, ["environment variable not set"])
        return value
    return reader.read_file(path)  # at most reader.MAX_BYTES; a device, a pipe or a folder named as such


def expand_run_files(given: list[str]) -> tuple[list[str], list[str]]:
    """(the run files a command was given, what it skips): a folder stands for its *.yaml and *.yml files (sorted,
    not recursive: kubectl's `-f DIR`), less those that hold no RLTRun (a kustomization, a chart's values), each
    named in the second list, as is a folder with no YAML file at all."""
    files: list[str] = []
    skipped: list[str] = []
    for name in given:
        found = [] if name == STDIN_SOURCE or name.startswith(ENV_SOURCE) else _yaml_files_in(Path(name))
        for path in found:
            holds = _holds_instead_of_a_run(path)
            if holds:
                skipped.append(f"{path}: skipped, no RLTRun in it ({holds})")
            else:
                files.append(path)
        if not found and _is_folder(name):
            skipped.append(f"{name}: skipped, a folder with no *.yaml or *.yml file in it")
        elif not found:
            files.append(name)  # a file, standard input, env:VAR, or nothing there: the reader says which
    return files, skipped


def _is_folder(name: str) -> bool:
    try:
        return Path(name).is_dir()
    except OSError:  # a name too long: not a folder here; the reader names the problem
        return False


def _holds_instead_of_a_run(path: str) -> str | None:
    """What a folder's YAML file holds when no document of it is an RLTRun; None when one is, or when the file
    cannot be read (the reader then says why, as for a file named on its own)."""
    try:
        docs = reader.load_yaml(reader.read_file(path))
    except (reader.InputError, yaml.YAMLError, OSError, UnicodeDecodeError):
        return None
    runs = [d for d in docs if isinstance(d, dict) and (d.get("kind") == "RLTRun" or _rlt_api(d.get("apiVersion")))]
    if runs:
        return None
    kinds = [str(d["kind"]) for d in docs if isinstance(d, dict) and isinstance(d.get("kind"), str)]
    return ", ".join(kinds) if kinds else "no kind"


def _rlt_api(api: Any) -> bool:
    return isinstance(api, str) and api.startswith("rlt.dev/")


def _yaml_files_in(folder: Path) -> list[str]:
    try:
        if not folder.is_dir():
            return []
        return sorted(str(p) for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    except OSError:  # a name too long, a loop, no permission: the reader names the problem in one line
        return []


def read_runs(path: str | Path) -> list[RLTRun]:
    """Every RLTRun document in a YAML file (multi-document files allowed), or in `env:NAME`, checked against the
    model only.

    Not a loader to call: rlt.checks.validation.load_valid_run(s) reads through this and adds every other rule
    (what `rlt validate`, `rlt run`, `rlt stage` and the tests use)."""
    path = Path(path)
    try:
        docs = reader.load_yaml(_read_source(path))
    except reader.InputError as err:
        raise SpecError(str(path), [err.problem if err.where == "<file>" and not err.line else str(err)]) from None
    except FileNotFoundError:
        raise SpecError(str(path), ["file not found"]) from None
    except UnicodeDecodeError as err:
        raise SpecError(
            str(path),
            [
                f"not a UTF-8 text file (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
                "an RLTRun file is YAML text"
            ],
        ) from None
    except (IsADirectoryError, PermissionError) as err:
        raise SpecError(str(path), [f"cannot read the file: {err.strerror}"]) from None
    except yaml.YAMLError as err:
        raise SpecError(str(path), ["<yaml>: " + reader.yaml_error_line(err)]) from None
    if not docs:
        raise SpecError(str(path), ["<root>: file holds no YAML document"])
    others = [d for d in docs if other_kind(d)]
    if others and len(others) == len(docs):
        kinds = ", ".join(str(other_kind(d)) for d in others)
        raise SpecError(str(path), [f"<root>: no RLTRun document (the file holds {kinds})"])
    runs, problems = [], []
    first: dict[tuple[str | None, str], int] = {}  # (namespace, name) -> the document that names it first
    for i, doc in enumerate(docs):
        if other_kind(doc):
            continue  # a Namespace or ServiceAccount applied with the run: kubectl takes it, rlt checks the runs
        src = f"{path}" if len(docs) == 1 else f"{path}[document {i}]"
        try:
            run = parse_run(doc, src)
        except SpecError as err:
            problems += [p if len(docs) == 1 else f"document {i}: {p}" for p in err.problems]
            continue
        key = (run.metadata.namespace, run.name)
        if key in first:  # kubectl apply would make the later one replace the earlier
            problems.append(f"document {i}: metadata.name: {run.name!r} is document {first[key]}'s run too")
        first.setdefault(key, i)
        runs.append(run)
    if problems:
        raise SpecError(str(path), problems)
    return runs


def other_kind(doc: Any) -> str | None:
    """'Namespace (document 0)'-style name of a document that is another Kubernetes object than an RLTRun (its
    apiVersion is not rlt.dev's and it names a kind), None for an RLTRun or anything that should be one."""
    if not isinstance(doc, dict):
        return None
    kind, api = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or kind == "RLTRun" or not isinstance(api, str) or api.startswith("rlt.dev/"):
        return None
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
    return f"{kind}/{name}" if isinstance(name, str) else kind


def other_documents(path: str | Path) -> list[str]:
    """The objects of a run file that are not RLTRuns (`rlt validate` says it checked the runs only)."""
    try:
        docs = reader.load_yaml(_read_source(Path(path)))
    except (reader.InputError, yaml.YAMLError, OSError, UnicodeDecodeError, SpecError):
        return []
    return [k for k in (other_kind(d) for d in docs) if k]


def dump_run(run: RLTRun) -> str:
    """The run as YAML in camelCase, the form the operator writes into the run's ConfigMap."""
    text: str = reader.dump_yaml(run.model_dump(mode="json", by_alias=True, exclude_none=True))
    return text


def _relative_local(value: str | None, base: Path, looks_local: bool) -> str | None:
    """`value` as a path from `base` when it is a relative local path that means something else from the working
    directory; None when it is kept as written."""
    if not value or value.startswith(("builtin:", "/", "~")) or "://" in value:
        return None
    from rlt.spec.local_files import entry_exists

    if not (looks_local or value.startswith(("./", "../")) or entry_exists(base / value)):
        return None  # a hub id (org/name) or a name: not a path
    # the entry itself, not where its links lead: a link's suffix says what it is, and a loop has no end
    joined = os.path.abspath(base / value)  # noqa: PTH100 - resolve() follows links and fails on loops
    return None if joined == os.path.abspath(value) else joined  # noqa: PTH100


def resolve_local_paths(run: RLTRun, base: str | Path) -> RLTRun:
    """Relative local paths of a run file (datasets, a format file, local models) taken from the file's folder
    `base`, as `rlt run`/`validate`/`compare` on this machine read them; unchanged when the working directory is
    that folder (so earlier runs' fingerprints stay valid). Not for pods: there they are paths in the container."""
    base = Path(base)
    doc = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = doc["spec"]
    targets: list[tuple[dict[str, Any], str, bool]] = [(spec["dataset"], "source", True)]
    stages = spec.get("stages") or {}
    if isinstance((stages.get("evaluate") or {}).get("dataset"), dict):
        targets.append((stages["evaluate"]["dataset"], "source", True))
    if "file" in (spec.get("format") or {}):
        targets.append((spec["format"], "file", True))
    if Path(str((spec.get("rcl") or {}).get("format", ""))).suffix:  # a file path, not a bundled format's name
        targets.append((spec["rcl"], "format", True))
    for holder in (spec.get("teacher"), spec.get("student"), (stages.get("student") or {}).get("model")):
        if isinstance(holder, dict):
            targets.append((holder, "model", False))
    if isinstance((stages.get("evaluate") or {}).get("model"), dict):
        targets.append((stages["evaluate"]["model"], "model", False))
    changed = False
    for holder, key, is_file in targets:
        value = holder.get(key)
        new = _relative_local(
            value, base, is_file and (key in ("file", "format") or str(value).endswith(DATA_SUFFIXES))
        )
        if new is not None:
            holder[key] = new
            changed = True
    return parse_run(doc, run.name) if changed else run
